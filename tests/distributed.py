"""Run a test's own function on N gloo processes and get every rank's return value back.

In the manner of OLMo-core's ``run_distributed_test``: the body of a distributed test lives in
the test module, next to its assertions, instead of in a worker script that writes JSON.
Each process is a fresh ``forkserver`` child (megatron-core's process-wide state never leaks
into pytest), started with the test's environment plus torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), so :func:`megatron_gamma.parallel.initialize` sets up the group as in a
real run. The fork server, one per pytest process, has imported torch and megatron-core (with
nothing initialized) before its first fork, so a rank starts without those imports (about 5 CPU-s
each on a 2-core CI machine, a spawned child's import of them); megatron-gamma itself is imported
in each child, with the test's environment.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import traceback
from collections.abc import Callable
from typing import Any

from helpers import check_nproc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PRELOAD = ["torch", "megatron.core"]
"""Imported once by the fork server (:func:`context`): third-party only, whose import reads no
variable a test sets."""


def context() -> mp.context.ForkServerContext:
    """The ``forkserver`` context with :data:`PRELOAD` (the server starts at the first use)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _child(fn: Callable, rank: int, world: int, port: int, args: tuple, queue, env: dict) -> None:
    os.environ.clear()  # the test's environment (``env``), not the fork server's
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHDYNAMO_DISABLE="1",
        OMP_NUM_THREADS="1",
    )
    try:
        # Plain pickle copies tensor storage into the bytes. The queue's own pickler would share
        # it through a file descriptor served by this process, which may have exited by the
        # time the parent reads the result (FileNotFoundError on the resource sharer's socket).
        queue.put((rank, True, pickle.dumps(fn(*args))))
    except BaseException:  # report any failure, with its traceback, to the parent
        queue.put((rank, False, traceback.format_exc()))


def run_distributed(fn: Callable[..., Any], nproc: int, *args, timeout: float = 600) -> list:
    """Run ``fn(*args)`` on ``nproc`` processes; return the ranks' results in rank order.

    ``fn`` must be a module-level function (picklable by reference) and return a picklable
    value. The process group is ``fn``'s to create (usually through ``parallel.initialize``).

    Raises:
        AssertionError: a rank raised (its traceback is in the message), or exited without a
            result within ``timeout`` seconds; ``nproc`` > 1 in a test not marked ``slow``
            (:func:`helpers.check_nproc`).
    """
    check_nproc(nproc)
    ctx = context()
    queue = ctx.Queue()
    port, env = _free_port(), dict(os.environ)
    procs = [
        ctx.Process(target=_child, args=(fn, r, nproc, port, args, queue, env))
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    failures = []
    try:
        for _ in range(nproc):
            rank, ok, value = queue.get(timeout=timeout)
            if ok:
                results[rank] = pickle.loads(value)
            else:
                failures.append(f"rank {rank}:\n{value}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if failures else 60)
            if p.is_alive():
                p.kill()
                p.join()
    assert not failures, "\n".join(failures)
    return [results[r] for r in range(nproc)]
