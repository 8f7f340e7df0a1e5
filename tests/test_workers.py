"""SharedMap (megatron_gamma.data.workers): the results of a plain in-order ``map`` whatever the
process count and whoever computes each item, errors at their item's turn, dead workers named,
no deadlock on items and results larger than a pipe, bounded read-ahead, no worker left behind."""

import os
import signal
import time

import psutil
import pytest

from megatron_gamma.data.workers import PIPE_BYTES, SharedMap

MAIN = os.getpid()


def square_and_pid(x: int) -> tuple[int, int]:
    time.sleep(0.01)
    return x * x, os.getpid()


def children() -> set[int]:
    """Live child processes of this one (other tests may have left some: compare sets)."""
    return {p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE}


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_results_are_a_plain_map_in_input_order_and_every_process_works(workers):
    before = children()
    with SharedMap(workers, square_and_pid) as pool:
        out = list(pool.map(range(60), window=4 * workers))
    assert [v for v, _ in out] == [x * x for x in range(60)]
    pids = {pid for _, pid in out}
    assert MAIN in pids  # the main process computes what the workers have no room for
    assert len(pids) == workers  # and every worker computes some
    assert children() <= before


def fail_from(k: int):
    def fn(x: int) -> int:
        if os.getpid() != MAIN:
            time.sleep(0.03)  # so the main process reaches its later failures first
        if x >= k:
            raise ValueError(f"item {x} is bad")
        return x

    return fn


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("k", [0, 1, 2, 5, 9])
def test_the_first_failing_item_is_the_error_whichever_process_ran_it(workers, k):
    before, got = children(), []
    with pytest.raises(ValueError, match=f"^item {k} is bad$"):
        with SharedMap(workers, fail_from(k)) as pool:
            for x in pool.map(range(20), window=8):
                got.append(x)
    assert got == list(range(k))
    assert children() <= before


def die_in_worker(x: int) -> int:
    if os.getpid() != MAIN:
        os._exit(7)
    return x


def test_a_dead_worker_is_an_error_naming_its_exit_code():
    before = children()
    with pytest.raises(RuntimeError, match=r"worker process \d+ exited with code 7"):
        with SharedMap(2, die_in_worker) as pool:
            list(pool.map(range(10), window=8))
    assert children() <= before


def reverse(b: bytes) -> bytes:
    return b[::-1]


@pytest.mark.timeout(60)
def test_items_and_results_larger_than_a_pipe_pass_without_deadlock():
    items = [bytes([i]) * (3 * PIPE_BYTES) + os.urandom(1000) for i in range(8)]
    with SharedMap(2, reverse) as pool:
        assert list(pool.map(items, window=8)) == [b[::-1] for b in items]


@pytest.mark.parametrize("window", [1, 3, 9])
def test_read_ahead_never_exceeds_the_window(window):
    pulled = []

    def items():
        for x in range(40):
            pulled.append(x)
            yield x

    with SharedMap(3, square_and_pid) as pool:
        bound = max(window, pool.depth * 2 + 1)
        for n, _ in enumerate(pool.map(items(), window=window), start=1):
            assert len(pulled) - n <= bound - 1
    assert n == 40


def test_an_error_in_the_consumer_kills_and_reaps_the_workers():
    before = children()
    with pytest.raises(KeyError):
        with SharedMap(3, square_and_pid) as pool:
            for _ in pool.map(range(100), window=8):
                assert len(children() - before) == 2
                raise KeyError("consumer failed")
    assert children() <= before


def test_zero_workers_is_refused_by_value():
    with pytest.raises(ValueError, match="workers=0: need at least 1"):
        SharedMap(0, reverse)


class KeywordOnlyError(Exception):
    def __init__(self, message: str, *, code: int):
        super().__init__(message)
        self.code = code


def raise_keyword_only(x: int) -> int:
    if os.getpid() != MAIN:
        raise KeywordOnlyError(f"bad item {x}", code=3)
    return x


def test_an_error_that_cannot_be_rebuilt_arrives_as_its_type_and_message():
    """Item 0 always goes to a worker; its error cannot be unpickled as itself."""
    with pytest.raises(RuntimeError, match=r"^KeywordOnlyError: bad item 0 \(in worker process"):
        with SharedMap(2, raise_keyword_only) as pool:
            list(pool.map(range(5), window=8))


def test_workers_leave_ctrl_c_to_the_main_process():
    """SIGINT (a terminal's Ctrl-C reaches every process of the group) does not kill a worker
    mid-run; the main process's KeyboardInterrupt stops them."""
    before = children()
    out = []
    with SharedMap(2, square_and_pid) as pool:
        for i, (value, _) in enumerate(pool.map(range(30), window=8)):
            if i == 0:
                for pid in children() - before:
                    os.kill(pid, signal.SIGINT)
            out.append(value)
    assert out == [x * x for x in range(30)]
    assert children() <= before


def test_ctrl_c_while_a_worker_starts_does_not_kill_it(monkeypatch, capfd):
    """A SIGINT that reaches a worker before it ignores SIGINT (between the fork and its first
    line: a Ctrl-C as the workers of the next shard start) stays pending, and is dropped when
    it does; it killed the worker with a 'Process ForkProcess-N' traceback."""
    from megatron_gamma.data import workers

    serve = workers._serve

    def interrupted_first(*args):
        os.kill(os.getpid(), signal.SIGINT)
        serve(*args)

    monkeypatch.setattr(workers, "_serve", interrupted_first)
    with SharedMap(2, square_and_pid) as pool:
        out = list(pool.map(range(30), window=8))
    assert [v for v, _ in out] == [x * x for x in range(30)]
    assert len({pid for _, pid in out}) == 2  # the worker lived and worked
    assert "KeyboardInterrupt" not in capfd.readouterr().err
