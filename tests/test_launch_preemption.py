"""Clean stops with a checkpoint, without SLURM: SIGUSR1 to one rank of a 2-rank gloo run, SIGTERM
(``scancel``'s signal) to a single-process run, and the ``--exit-duration-in-mins`` budget; a
library ``Trainer`` without the preemption callback leaves the signals their previous handlers.
(Requeue and resume under a real SLURM: tests/slurm/.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from distributed import run_distributed
from helpers import TINY_MODEL, cli_command, cli_env, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pretrain_cmd(run_dir, data_prefix: str, *flags: str, nproc: int = 1) -> list[str]:
    return cli_command(
        [
            "pretrain", "--data-path", data_prefix, "--run-dir", str(run_dir), *TINY_MODEL,
            "--eval-interval", "1000", "--save", str(run_dir / "checkpoints"), *flags,
        ],
        nproc,
    )  # fmt: skip


def _train_iterations(run_dir) -> list[int]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r["iteration"] for r in map(json.loads, f) if r["split"] == "train"]


def _logged_train_iterations(metrics) -> list[int]:
    """The train iterations of the complete lines of a ``metrics.jsonl`` being written (none
    while it does not exist). Rank 1 may already be past the last of them: a stop it is sent
    then lands at that iteration or a later one."""
    if not metrics.exists():
        return []
    lines = metrics.read_text().split("\n")[:-1]  # the last piece may be a line half-written
    return [r["iteration"] for r in map(json.loads, lines) if r["split"] == "train"]


def _rank_of(proc: psutil.Process) -> int | None:
    try:
        return int(proc.environ().get("RANK", -1))
    except (psutil.Error, ValueError):
        return None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigusr1_to_one_rank_stops_all_ranks_with_a_checkpoint(tmp_path, demo_prefix):
    run_dir = tmp_path / "run"
    cmd = _pretrain_cmd(run_dir, demo_prefix, "--train-iters", "400", nproc=2)
    agent = subprocess.Popen(cmd, env=cli_env(), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while len(seen := _logged_train_iterations(metrics)) < 2:
            assert agent.poll() is None and time.monotonic() < deadline, "training ended early"
            time.sleep(0.1)
        (rank1,) = [p for p in psutil.Process(agent.pid).children() if _rank_of(p) == 1]
        os.kill(rank1.pid, signal.SIGUSR1)
        out, _ = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, out[-3000:]
    iterations = _train_iterations(run_dir)
    k = iterations[-1]
    assert seen[-1] <= k < 400 and iterations == list(range(1, k + 1))
    assert f"stopping at iteration {k} (SIGUSR1)" in out
    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(k)
    assert (ckpt / f"iter_{k:07d}" / "metadata.json").is_file()
    assert sorted(os.listdir(ckpt)) == [f"iter_{k:07d}", "latest_checkpointed_iteration.txt"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_saves_at_the_next_iteration_and_resumes_to_the_uninterrupted_losses(
    tmp_path, demo_prefix
):
    quiet = ["--train-iters", "400", "--log-diagnostics-interval", "0"]
    run_dir = tmp_path / "run"
    cmd = _pretrain_cmd(run_dir, demo_prefix, *quiet, "--exit-signal-handler")
    proc = subprocess.Popen(cmd, env=cli_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, "training ended early"
            time.sleep(0.1)
        done = len(_train_iterations(run_dir))
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    iterations = _train_iterations(run_dir)
    k = iterations[-1]
    assert done <= k < 400 and iterations == list(range(1, k + 1))
    assert f"stopping at iteration {k} (SIGTERM)" in out
    ckpt = run_dir / "checkpoints"
    assert sorted(os.listdir(ckpt)) == [f"iter_{k:07d}", "latest_checkpointed_iteration.txt"]

    # resume for 3 iterations (--exit-interval) and compare with an uninterrupted run
    stop = ["--exit-interval", str(k + 3)]
    for name, flags in (("resumed", ["--load", str(ckpt)]), ("uninterrupted", [])):
        cmd = _pretrain_cmd(tmp_path / name, demo_prefix, *quiet, *stop, *flags)
        done = subprocess.run(cmd, env=cli_env(), cwd=REPO, capture_output=True, text=True,
                              timeout=200)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    resumed = read_metrics(tmp_path / "resumed")["train"]
    full = read_metrics(tmp_path / "uninterrupted")["train"]
    assert sorted(resumed) == [k + 1, k + 2, k + 3] and sorted(full) == list(range(1, k + 4))
    for it in resumed:
        assert resumed[it] == full[it], it
    tracker = tmp_path / "resumed" / "checkpoints" / "latest_checkpointed_iteration.txt"
    assert tracker.read_text().strip() == str(k + 3)  # --exit-interval saves where it stops


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_exit_duration_budget_saves_and_exits_cleanly(tmp_path, demo_prefix):
    run_dir = tmp_path / "run"
    cmd = _pretrain_cmd(run_dir, demo_prefix, "--train-iters", "50", "--exit-duration-in-mins",
                        "1e-6")  # fmt: skip
    proc = subprocess.run(cmd, env=cli_env(), cwd=REPO, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stopping at iteration 1 (1e-06 min budget)" in proc.stdout
    assert _train_iterations(run_dir) == [1]
    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"


def test_exit_duration_must_be_positive():
    from megatron_gamma.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"exit_duration_in_mins=0\.0: must be > 0.*Fix:"):
        load_config(None, {"exit_duration_in_mins": 0.0})


_GUARD = """
import os, signal, sys, time
from megatron_gamma.training.preemption import PreemptionGuard
guard = PreemptionGuard(None)
if sys.argv[1] == "armed":
    guard.arm()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
print("recorded", guard.signalled)
"""


@pytest.mark.parametrize("armed", [False, True])
def test_sigterm_before_the_first_training_step_ends_the_process_at_once(armed):
    """Before the first training step there is nothing new to save: SIGTERM ends the process as
    the default action does (killed by SIGTERM). After it, SIGTERM is recorded for the next
    iteration's end."""
    proc = subprocess.run(
        [sys.executable, "-c", _GUARD, "armed" if armed else "start-up"],
        env=cli_env(), cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if armed:
        assert proc.returncode == 0 and "recorded SIGTERM" in proc.stdout, proc.stderr[-2000:]
    else:
        assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
        assert "SIGTERM before the first training step: nothing to save" in proc.stdout
        assert "recorded" not in proc.stdout


@pytest.mark.parametrize("exit_signal_handler", [True, False])
def test_release_puts_back_the_handlers_the_guard_displaced(exit_signal_handler):
    from megatron_gamma.training.preemption import PreemptionGuard

    def usr1(signum, frame):
        pass

    def term(signum, frame):
        pass

    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGUSR1, usr1)
        signal.signal(signal.SIGTERM, term)
        guard = PreemptionGuard(None, exit_signal_handler)
        handled = signal.getsignal(signal.SIGUSR1)
        assert handled == guard._on_signal
        assert signal.getsignal(signal.SIGTERM) == (handled if exit_signal_handler else term)
        guard.release()
        assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)) == (usr1, term)
        guard.release()  # a no-op once released
        assert signal.getsignal(signal.SIGUSR1) is usr1
        guard.install()
        assert signal.getsignal(signal.SIGUSR1) == handled
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


_TRAINER = """
import os, signal, sys
from megatron_gamma.config import load_config
from megatron_gamma.training.callback import Callback
from megatron_gamma.training.loop import Trainer
from megatron_gamma.training.run_callbacks import PreemptionCallback

class SigtermAtIteration2(Callback):
    def on_step_end(self, trainer, step):
        print("step", step.iteration, flush=True)
        if step.iteration == 2:
            os.kill(os.getpid(), signal.SIGTERM)

overrides = {"data_path": [sys.argv[1]], "run_dir": sys.argv[2], "num_layers": 1}
overrides.update(hidden_size=32, num_attention_heads=2, seq_length=16, micro_batch_size=2)
overrides.update(global_batch_size=2, train_iters=5, split="95,5,0", init_audit="off")
overrides.update(progress_bar=False, log_diagnostics_interval=0)
trainer = Trainer(load_config(None, overrides))
trainer.callbacks = [SigtermAtIteration2()]
if sys.argv[3] == "preemption":
    trainer.callbacks.append(PreemptionCallback(trainer.preemption))
try:
    print("trained to", trainer.train().iteration, flush=True)
finally:
    trainer.close()
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("callbacks", ["preemption", "none"])
def test_a_trainer_without_the_preemption_callback_leaves_sigterm_its_default(
    callbacks, tmp_path, demo_prefix
):
    """SIGTERM at iteration 2 of 5: with the preemption callback the loop stops there and the
    process exits 0; without it nothing would act on the recorded signal, so the trainer gives
    SIGTERM back to its default, which ends the process at once, at iteration 2 (before the
    fix it trained on to iteration 5 and exited 0)."""
    proc = subprocess.run(
        [sys.executable, "-c", _TRAINER, demo_prefix, str(tmp_path / "run"), callbacks],
        env=cli_env(), cwd=REPO, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    steps = [line for line in proc.stdout.splitlines() if line.startswith(("step", "trained"))]
    if callbacks == "preemption":
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert steps == ["step 1", "step 2", "trained to 2"]
        assert "stopping at iteration 2 (SIGTERM); checkpoint none (no --save)" in proc.stdout
    else:
        assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr[-3000:])
        assert steps == ["step 1", "step 2"]


SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


def _mine(signum, frame):
    """A caller's own handler, which pretrain must leave in place."""


def test_a_pretrain_refused_at_start_gives_the_signals_back(tmp_path):
    """The trainer takes SIGUSR1 and SIGTERM before its preflight; a run refused there (a
    missing dataset) left them to a guard nothing would ever act on."""
    from megatron_gamma.config import ConfigError, load_config
    from megatron_gamma.training.loop import pretrain

    before = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        for s in SIGNALS:
            signal.signal(s, _mine)
        missing = str(tmp_path / "missing")
        cfg = load_config(None, {"data_path": [missing], "run_dir": str(tmp_path / "run")})
        with pytest.raises(ConfigError, match=f"{missing}.bin does not exist"):
            pretrain(cfg)
        assert [signal.getsignal(s) for s in SIGNALS] == [_mine, _mine]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _tiny(run_dir: str):
    """The config of a 2-iteration run of a tiny model on mock data."""
    from megatron_gamma.config import load_config

    overrides = {"mock_data": True, "run_dir": run_dir, "num_layers": 1, "hidden_size": 32}
    overrides.update(num_attention_heads=2, seq_length=16, micro_batch_size=2)
    overrides.update(global_batch_size=2, train_iters=2, init_audit="off", progress_bar=False)
    overrides.update(log_diagnostics_interval=0, eval_iters=0)
    return load_config(None, overrides)


def _handlers_around_pretrain(run_dir: str) -> dict:
    """Train 2 iterations of a tiny model on mock data in this process with ``pretrain``; the
    iteration reached and, per signal, whether its handler afterwards is the one before (SIGUSR1:
    a handler of the caller's, SIGTERM: the default)."""
    from megatron_gamma.training.loop import pretrain

    signal.signal(signal.SIGUSR1, _mine)
    before = {s: signal.getsignal(s) for s in SIGNALS}
    result = pretrain(_tiny(run_dir))
    kept = {s.name: signal.getsignal(s) == before[s] for s in SIGNALS}
    return {"iteration": result.iteration, **kept}


def _pretrain_again_after_a_failed_start(run_dir: str) -> dict:
    """A pretrain that raises after taking the run directory's lock and the process group (its
    W&B start fails), then the same pretrain in the same process: what the first left behind,
    and how far the second got."""
    import torch.distributed as dist

    from megatron_gamma.training import loop

    def fail(cfg):
        raise RuntimeError("W&B refused")

    start_wandb, loop.start_wandb = loop.start_wandb, fail
    try:
        loop.pretrain(_tiny(run_dir))
    except RuntimeError as e:
        error = str(e)
    finally:
        loop.start_wandb = start_wandb
    left = {
        "lock": os.path.exists(os.path.join(run_dir, ".run.lock")),
        "group": dist.is_initialized(),
    }
    return {"error": error, **left, "iteration": loop.pretrain(_tiny(run_dir)).iteration}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_pretrain_that_fails_after_its_locks_releases_them_for_the_next(tmp_path):
    """A construction that raised after claiming the run directory kept its lock and process
    group, so calling pretrain again in the same process (a notebook, a sweep) found its own
    run directory locked."""
    (got,) = run_distributed(_pretrain_again_after_a_failed_start, 1, str(tmp_path / "run"))
    assert got == {"error": "W&B refused", "lock": False, "group": False, "iteration": 2}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pretrain_in_a_process_leaves_its_signal_handlers_as_they_were(tmp_path):
    """SIGUSR1 (a handler of the caller's) and SIGTERM (the default) have their handlers back
    after an in-process pretrain returns. They stayed with its guard, which only records a
    signal: the caller's handler was never called again, and a SIGTERM no longer ended the
    process."""
    (got,) = run_distributed(_handlers_around_pretrain, 1, str(tmp_path / "run"))
    assert got == {"iteration": 2, "SIGUSR1": True, "SIGTERM": True}


def test_release_can_send_a_recorded_signal_on_to_the_handler_it_puts_back():
    """``release(resend=True)``: the signal the guard recorded reaches the handler it displaced,
    once; a plain ``release`` sends nothing."""
    from megatron_gamma.training.preemption import PreemptionGuard

    calls = []
    before = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
        mine = signal.getsignal(signal.SIGUSR1)
        guard = PreemptionGuard(None, exit_signal_handler=False)
        signal.raise_signal(signal.SIGUSR1)
        assert (guard.signalled, calls) == ("SIGUSR1", [])
        guard.release(resend=True)
        assert calls == [signal.SIGUSR1] and guard.signalled is None
        assert signal.getsignal(signal.SIGUSR1) is mine
        guard.install()
        signal.raise_signal(signal.SIGUSR1)
        guard.release()
        assert calls == [signal.SIGUSR1] and guard.signalled == "SIGUSR1"
    finally:
        signal.signal(signal.SIGUSR1, before)


def _sigusr1_while_a_trainer_is_built(run_dir: str) -> list[str]:
    """Build a Trainer (tiny model, mock data) while a SIGUSR1 arrives, during its preflight, and
    train it 1 iteration without the preemption callback; what this process's own SIGUSR1
    handler saw, in order with the training."""
    from megatron_gamma.config import load_config
    from megatron_gamma.training import loop

    seen: list[str] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append("SIGUSR1"))
    real = loop.preflight

    def preflight(cfg):
        signal.raise_signal(signal.SIGUSR1)
        return real(cfg)

    loop.preflight = preflight
    overrides = {"mock_data": True, "run_dir": run_dir, "num_layers": 1, "hidden_size": 32}
    overrides.update(num_attention_heads=2, seq_length=16, micro_batch_size=2)
    overrides.update(global_batch_size=2, train_iters=1, init_audit="off", progress_bar=False)
    overrides.update(log_diagnostics_interval=0, eval_iters=0)
    trainer = loop.Trainer(load_config(None, overrides))
    seen.append("built")
    try:
        seen.append(f"trained to {trainer.train().iteration}")
    finally:
        trainer.close()
    return seen


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sigusr1_while_a_trainer_is_built_reaches_the_handler_before_it(tmp_path):
    """A trainer without the preemption callback acts on no signal: the SIGUSR1 its guard
    recorded during construction was dropped when it gave the handlers back, so the process's
    own handler (by default: the end of the process) never saw it. It is sent on when training
    starts."""
    (seen,) = run_distributed(_sigusr1_while_a_trainer_is_built, 1, str(tmp_path / "run"))
    assert seen == ["built", "SIGUSR1", "trained to 1"]
