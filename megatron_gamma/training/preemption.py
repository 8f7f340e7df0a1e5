"""Stop training cleanly, with a checkpoint, on SIGUSR1 or SIGTERM or when a wall-clock budget
runs out.

SLURM sends SIGUSR1 before a job's time limit (``--signal=B:USR1@SECONDS``, forwarded by the
batch script) or by hand (``scancel --signal=USR1``); a plain ``scancel``, a node drain and
torchrun's shutdown send SIGTERM, which stops the same way unless ``--no-exit-signal-handler``
(Megatron-LM's ``--exit-signal-handler``, on by default here); ``--exit-duration-in-mins``
(Megatron-LM's flag) gives the same stop without SLURM. SLURM kills the job ``KillWait`` seconds
(default 30) after SIGTERM, so the iteration in flight plus one save must fit in that time.

Until the first step of this process has changed the weights there is nothing new to save, so
a SIGTERM then (during start-up: loading, building, the diagnostics at initialization) ends the
process at once, as if no handler were installed. After that, signals arrive at arbitrary
points, so the handler only records them; at the end of each iteration
:meth:`PreemptionGuard.stop` agrees across all ranks
(an all-reduce MAX, so every rank stops at the same iteration even if only some got the signal),
saves a checkpoint unless one was just written, and tells the loop to stop. The process then
exits 0; requeueing is the batch script's job (``scontrol requeue``), and ``--load`` of the same
directory resumes from that checkpoint.

Only :class:`~megatron_gamma.training.run_callbacks.PreemptionCallback` calls
:meth:`PreemptionGuard.stop`; a trainer trained without it puts the signal handlers it
displaced back (:meth:`PreemptionGuard.release`), so that no signal is recorded and then ignored,
and sends a signal it recorded while it was built (a SIGUSR1 during start-up) on to them.
Every trainer puts them back when it is closed, or when its construction fails, so that an
in-process ``pretrain`` leaves the process's handlers as it found them.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Optional

import torch
import torch.distributed as dist

from megatron_gamma.rundir.layout import checkpoint_dir

STOP_SIGNAL = signal.SIGUSR1
_SIGNAL_CODES = (None, "SIGUSR1", "SIGTERM")  # all-reduced as an index: MAX picks SIGTERM


class PreemptionGuard:
    """Watches for SIGUSR1 (and SIGTERM) and the ``exit_duration_in_mins`` budget.

    Args:
        exit_duration_in_mins: wall-clock budget in minutes, counted from construction; None for
            no budget.
        exit_signal_handler: also stop cleanly on SIGTERM (``--exit-signal-handler``).
    """

    def __init__(self, exit_duration_in_mins: Optional[float], exit_signal_handler: bool = True):
        self.budget_s = None if exit_duration_in_mins is None else 60.0 * exit_duration_in_mins
        self.start = time.monotonic()
        self.signalled: Optional[str] = None
        self.armed = False
        self._signals = (STOP_SIGNAL, signal.SIGTERM) if exit_signal_handler else (STOP_SIGNAL,)
        self._previous: dict[signal.Signals, object] = {}
        self.install()

    def install(self) -> None:
        """Handle SIGUSR1 (and SIGTERM with ``exit_signal_handler``) here, remembering the
        handlers in place for :meth:`release`. Done by the constructor; a no-op where already
        installed or off the main thread (Python sets signal handlers there only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self._signals:
            if signum not in self._previous:
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def release(self, resend: bool = False) -> None:
        """Put back the handlers :meth:`install` replaced (the default action where they were
        not set from Python), so that these signals act as they did before; a no-op where not
        installed or off the main thread. Called by the trainer when none of its callbacks acts
        on this guard, when it is closed, and when its construction fails.

        Args:
            resend: then send the signal recorded meanwhile (:attr:`signalled`; SIGTERM where
                both came) again, to the handler put back, and forget it. The trainer does so
                when none of its callbacks acts on this guard: a SIGUSR1 that came while it was
                being built then acts as it would have without the guard (Python's default ends
                the process), instead of being recorded and never acted on.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous = {}
        if resend and self.signalled is not None:
            pending, self.signalled = self.signalled, None
            signal.raise_signal(signal.Signals[pending])

    def arm(self) -> None:
        """From now on a SIGTERM is recorded for :meth:`stop`, not acted on at once (called by
        the trainer once its first step has changed the weights)."""
        self.armed = True

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGTERM and not self.armed:
            print("SIGTERM before the first training step: nothing to save, exiting", flush=True)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if _SIGNAL_CODES.index(name) > _SIGNAL_CODES.index(self.signalled):
            self.signalled = name

    def _reason(self, device: torch.device) -> Optional[str]:
        """'SIGTERM', 'SIGUSR1' (a signal any rank got; SIGTERM wins), 'time' or None,
        identical on every rank."""
        over_time = self.budget_s is not None and time.monotonic() - self.start >= self.budget_s
        code = _SIGNAL_CODES.index(self.signalled)
        flags = torch.tensor([float(code), float(over_time)], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0] > 0:
            return _SIGNAL_CODES[int(flags[0])]
        return "time" if flags[1] > 0 else None

    def stop(
        self, trainer, iteration: int, last_checkpoint: Optional[str]
    ) -> tuple[bool, Optional[str]]:
        """Called once at the end of every iteration, on every rank.

        Args:
            trainer: the :class:`~megatron_gamma.training.loop.Trainer` (its ``save()`` and
                ``device`` are used).
            iteration: the iteration just completed.
            last_checkpoint: the newest checkpoint the loop wrote (None if none yet).

        Returns:
            (stop, checkpoint): whether the loop must stop, and the checkpoint directory holding
            ``iteration`` (written here unless the loop saved it this iteration; None when the
            run has no ``--save``).
        """
        reason = self._reason(trainer.device)
        if reason is None:
            return False, None
        saved = last_checkpoint is not None and os.path.basename(
            last_checkpoint
        ) == os.path.basename(checkpoint_dir("", iteration))
        if saved:
            path = last_checkpoint
        else:
            path = trainer.save() if trainer.cfg.checkpoint.save else None
        if dist.get_rank() == 0:
            why = f"{self.budget_s / 60:g} min budget" if reason == "time" else reason
            where = path or "none (no --save)"
            print(f"stopping at iteration {iteration} ({why}); checkpoint {where}", flush=True)
        return True, path
