"""Stop training cleanly, with a checkpoint, on SIGUSR1 or when a wall-clock budget runs out.

SLURM sends SIGUSR1 before a job's time limit (``--signal=B:USR1@SECONDS``, forwarded by the
batch script) or by hand (``scancel --signal=USR1``); ``--exit-duration-in-mins`` (Megatron-LM's
flag) gives the same stop without SLURM. Signals arrive at arbitrary points, so the handler only
records them; at the end of each iteration :meth:`PreemptionGuard.stop` agrees across all ranks
(an all-reduce MAX, so every rank stops at the same iteration even if only some got the signal),
saves a checkpoint unless one was just written, and tells the loop to stop. The process then
exits 0; requeueing is the batch script's job (``scontrol requeue``), and ``--load`` of the same
directory resumes from that checkpoint.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Optional

import torch
import torch.distributed as dist

from megatron_gamma.training.checkpointing import checkpoint_dir

STOP_SIGNAL = signal.SIGUSR1


class PreemptionGuard:
    """Watches for SIGUSR1 and the ``exit_duration_in_mins`` budget.

    Args:
        exit_duration_in_mins: wall-clock budget in minutes, counted from construction; None for
            no budget.
    """

    def __init__(self, exit_duration_in_mins: Optional[float]):
        self.budget_s = None if exit_duration_in_mins is None else 60.0 * exit_duration_in_mins
        self.start = time.monotonic()
        self.signalled = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(STOP_SIGNAL, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.signalled = True

    def _reason(self, device: torch.device) -> Optional[str]:
        """'signal', 'time' or None, identical on every rank."""
        over_time = self.budget_s is not None and time.monotonic() - self.start >= self.budget_s
        flags = torch.tensor([float(self.signalled), float(over_time)], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0] > 0:
            return "signal"
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
            why = "SIGUSR1" if reason == "signal" else f"{self.budget_s / 60:g} min budget"
            where = path or "none (no --save)"
            print(f"stopping at iteration {iteration} ({why}); checkpoint {where}", flush=True)
        return True, path
