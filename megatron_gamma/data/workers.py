"""An ordered map over a stream of items, computed by the main process and N - 1 forked workers.

The workers inherit the function through fork (no pickling, no re-initialization: a tokenizer
loaded once serves every process).

Built for preprocessing (:mod:`.preprocess`), where an item (a chunk of records) takes a few
milliseconds and the main process also reads the input and writes the output:

- Work goes where there is room: an item is sent to the worker with the fewest items in flight
  when it has fewer than ``depth``, otherwise the main process computes it. The main process,
  which also reads and writes, so computes the share its other work leaves it time for.
- The main process runs no helper threads. ``multiprocessing.Pool`` runs three (task feeding,
  result collection, worker upkeep), which take the GIL from the main process's own work for
  every task and result.
- Each worker takes items through a reader thread of its own, so the main process never waits
  on a worker that is sending a result (no deadlock at any item size), and the pipes are widened
  to 1 MiB where Linux allows, so most items and results pass in one system call.
- Results come out in input order, whoever computed them. An error is raised when its item's
  turn comes, as if the items had been computed in order; a worker that dies is an error naming
  its exit code.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator

PIPE_BYTES = 1 << 20


class WorkerDied(RuntimeError):
    """A worker process ended without being asked to; the message names its exit code and
    the fix."""


class _Slot:
    """One item's place in the output order: its result or error once known."""

    __slots__ = ("done", "value", "error")

    def __init__(self):
        self.done, self.value, self.error = False, None, None

    def fill(self, ok: bool, value) -> None:
        self.done = True
        if ok:
            self.value = value
        else:
            self.error = value

    def get(self):
        if self.error is not None:
            raise self.error
        return self.value


def _set_parent_death_signal() -> None:
    """Linux: end this worker if the main process dies (e.g. SIGKILL), so none is orphaned."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _widen(conn) -> None:
    """Give ``conn``'s pipe PIPE_BYTES of buffer where the OS allows (Linux F_SETPIPE_SZ)."""
    try:
        import fcntl

        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass  # the default buffer: sends wait for the reader more often, results are the same


def _portable(error: Exception) -> Exception:
    """``error`` if it survives pickling, else a RuntimeError with its type and message (an
    exception whose constructor takes other arguments than its ``args`` cannot be rebuilt)."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001  (whatever rebuilding it raises)
        return RuntimeError(f"{type(error).__name__}: {error} (in worker process {os.getpid()})")
    return error


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Block SIGINT in this thread for the block (a forked worker inherits the mask): a Ctrl-C
    meanwhile is delivered, as KeyboardInterrupt, when the block ends."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _serve(tasks, results, close: list, fn: Callable) -> None:
    """Worker process: ``fn`` over the items the main process sends, in order, until it sends
    None (or its end of the pipe closes). Ctrl-C is the main process's to handle: it stops the
    workers. SIGINT is blocked from the fork (:meth:`SharedMap.__init__`) until it is ignored
    here, so a Ctrl-C as a worker starts cannot kill it with a traceback of its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # drops a SIGINT held since the fork
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _set_parent_death_signal()
    for conn in close:
        conn.close()
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        while True:
            try:
                item = tasks.recv()
            except (EOFError, OSError):
                item = None
            inbox.put(item)
            if item is None:
                return

    threading.Thread(target=read, daemon=True).start()
    while (item := inbox.get()) is not None:
        try:
            out = (True, fn(item))
        except Exception as e:  # noqa: BLE001  (raised in the main process, in order)
            out = (False, _portable(e))
        try:
            results.send(out)
        except Exception as e:  # noqa: BLE001  (an unpicklable result or error)
            results.send((False, RuntimeError(f"worker {os.getpid()}: {e!r}")))


class _Worker:
    def __init__(self, process, tasks, results):
        self.process, self.tasks, self.results = process, tasks, results
        self.waiting: deque[_Slot] = deque()

    def send(self, item) -> _Slot:
        try:
            self.tasks.send(item)
        except OSError:
            raise self.died() from None
        slot = _Slot()
        self.waiting.append(slot)
        return slot

    def receive(self) -> None:
        try:
            ok, value = self.results.recv()
        except (EOFError, OSError):
            raise self.died() from None
        self.waiting.popleft().fill(ok, value)

    def died(self) -> WorkerDied:
        self.process.join(timeout=5)
        return WorkerDied(
            f"worker process {self.process.pid} exited with code {self.process.exitcode} "
            "(negative: killed by that signal, e.g. -9 by the out-of-memory killer). Fix: give "
            "the job more memory or fewer --workers, then rerun (finished outputs are kept)"
        )


class SharedMap:
    """``fn`` over items in input order, in the main process and ``workers`` - 1 forked worker
    processes (started here). Items and results are pickled; ``fn`` is not.

    Use as a context manager, or call :meth:`close`; that stops the workers.

    Args:
        workers: processes in all, the main one included (>= 1; 1 computes everything here).
        fn: item -> result; it must not depend on which process runs it.
        depth: items in flight per worker before the main process computes the next itself
            (2 measured best in ``tools/bench_preprocess.py``).

    Raises:
        ValueError: ``workers`` < 1.
    """

    def __init__(self, workers: int, fn: Callable, depth: int = 2):
        if workers < 1:
            raise ValueError(f"workers={workers}: need at least 1. Fix: --workers 1 or more")
        self.fn, self.depth = fn, depth
        self._workers: list[_Worker] = []
        ctx = mp.get_context("fork")
        parent_ends: list = []
        try:
            with _sigint_held():  # until each worker is registered, and ignores SIGINT itself
                for _ in range(workers - 1):
                    task_out, task_in = ctx.Pipe(duplex=False)
                    result_out, result_in = ctx.Pipe(duplex=False)
                    _widen(task_in)
                    _widen(result_in)
                    parent_ends += [task_in, result_out]
                    process = ctx.Process(
                        target=_serve,
                        args=(task_out, result_in, list(parent_ends), fn),
                        daemon=True,
                    )
                    process.start()
                    task_out.close()
                    result_in.close()
                    self._workers.append(_Worker(process, task_in, result_out))
        except BaseException:
            self.close(kill=True)
            raise

    def __enter__(self) -> SharedMap:
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.close(kill=kind is not None)

    def close(self, kill: bool = False) -> None:
        """Stop the workers: ask them to finish (or SIGTERM them with ``kill``) and reap them."""
        for w in self._workers:
            if not kill:
                try:
                    w.tasks.send(None)
                except OSError:
                    pass
            w.tasks.close()
            w.results.close()
            if kill:
                w.process.terminate()
        for w in self._workers:
            w.process.join(timeout=10 if kill else None)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
        self._workers = []

    def _collect(self) -> None:
        """Take every result that has arrived, without waiting."""
        for w in self._workers:
            while w.waiting and w.results.poll():
                w.receive()

    def map(self, items: Iterable, window: int) -> Iterator:
        """Results of ``items`` in input order, with at most ``window`` items read ahead of the
        result last yielded (so memory stays bounded however long the stream).

        Raises:
            the error of an item, when its turn comes; WorkerDied when a worker dies.
        """
        window = max(window, self.depth * len(self._workers) + 1)
        pending: deque[tuple[_Slot, _Worker | None]] = deque()
        for item in items:
            self._collect()
            w = min(self._workers, key=lambda w: len(w.waiting), default=None)
            if w is not None and len(w.waiting) < self.depth:
                pending.append((w.send(item), w))
            else:
                slot = _Slot()
                try:
                    slot.fill(True, self.fn(item))
                except Exception as e:  # noqa: BLE001  (raised by get, in input order)
                    slot.fill(False, e)
                pending.append((slot, None))
            while pending and (pending[0][0].done or len(pending) >= window):
                yield self._next(pending)
        while pending:
            yield self._next(pending)

    @staticmethod
    def _next(pending: deque) -> object:
        slot, w = pending.popleft()
        while not slot.done:
            w.receive()
        return slot.get()
