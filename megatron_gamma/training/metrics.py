"""Rank-0 training telemetry: a summary line per logging interval, a progress bar, TensorBoard
scalars and ``metrics.jsonl`` (one JSON object per iteration or evaluation, each with its
wall-clock ``time`` in seconds since the epoch)."""

from __future__ import annotations

import json
import math
import os
import sys
import time

from tqdm import tqdm

from megatron_gamma.atomic import open_in_place
from megatron_gamma.rundir.layout import (
    METRICS,
    continue_metrics,
    continue_tensorboard,
    superseded_note,
)


class MetricsLogger:
    """Writes what the loop reports; a no-op on every rank but the one that logs.

    Args:
        run_dir: where ``metrics.jsonl`` goes.
        tensorboard_dir: TensorBoard event directory.
        active: True on the logging rank.
        total_iters: length of the progress bar.
        start_iter: the iteration this run resumes after (0: a fresh start); the records of
            ``metrics.jsonl`` past it, from an earlier run, are moved aside
            (:func:`~megatron_gamma.rundir.layout.continue_metrics`), and so are the event files
            of an earlier run on a fresh start; on a resume TensorBoard drops the earlier
            events past it (:func:`~megatron_gamma.rundir.layout.continue_tensorboard`).
        progress_bar: show tqdm (only when stderr is a terminal: a SLURM log gets the summary
            lines alone).
        tensorboard_log_interval: write per-iteration training scalars to TensorBoard every
            this many iterations (``--tensorboard-log-interval``; metrics.jsonl gets all).
        validation_ppl_to_tensorboard: write ``valid/ppl`` (``--log-validation-ppl-to-
            tensorboard``).
        mirror: a second scalar sink with TensorBoard's ``add_scalar(tag, value, step)`` and
            ``close()`` (:class:`~.telemetry.WandbWriter`), or None.
    """

    def __init__(
        self,
        run_dir: str,
        tensorboard_dir: str,
        active: bool,
        total_iters: int,
        start_iter: int,
        progress_bar: bool,
        tensorboard_log_interval: int = 1,
        validation_ppl_to_tensorboard: bool = True,
        mirror=None,
    ):
        self.active = active
        self.tb_interval = tensorboard_log_interval
        self.valid_ppl_to_tb = validation_ppl_to_tensorboard
        self._mirror = mirror
        self._jsonl = None
        self._tb = None
        self._bar = None
        if not active:
            return
        os.makedirs(run_dir, exist_ok=True)
        moved = [continue_metrics(run_dir, start_iter)]
        path = os.path.join(run_dir, METRICS)  # appended to: never through a symbolic link
        self._jsonl = open(path, "a", encoding="utf-8", opener=open_in_place)
        from torch.utils.tensorboard import SummaryWriter

        tb_moved, purge_step = continue_tensorboard(tensorboard_dir, start_iter)
        moved.append(tb_moved)
        self._tb = SummaryWriter(tensorboard_dir, purge_step=purge_step)
        self._bar = tqdm(
            total=total_iters,
            initial=start_iter,
            unit="it",
            desc="pretrain",
            disable=not (progress_bar and sys.stderr.isatty()),
            file=sys.stderr,
        )
        for line in filter(None, moved):
            self.message(line)
        if any(moved):
            self.message(superseded_note(run_dir))

    def _scalar(self, tag: str, value: float, step: int) -> None:
        self._tb.add_scalar(tag, value, step)
        if self._mirror is not None:
            self._mirror.add_scalar(tag, value, step)

    def _record(self, record: dict) -> None:
        self._jsonl.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")
        self._jsonl.flush()

    def train_step(self, iteration: int, values: dict) -> None:
        """Record one iteration: loss, lr, weight_decay, grad_norm, global_batch_size,
        tokens_per_s,
        consumed_samples, consumed_tokens, memory (+ anything numeric)."""
        if not self.active:
            return
        self._record({"iteration": iteration, "split": "train", **values})
        if iteration % self.tb_interval == 0:
            for key, value in values.items():
                self._scalar(f"train/{key}", value, iteration)
        self._bar.update(1)
        self._bar.set_postfix(loss=f"{values['loss']:.4f}")

    def interval_summary(
        self, iteration: int, total: int, values: dict, moe_losses: dict | None = None
    ) -> None:
        """The Megatron-style one-line summary of a logging interval; its throughput figures
        (tokens/s, ms/iter, TFLOP/s per device, MFU), where ``values`` has them, also go to
        TensorBoard as ``throughput/*``; params norm and zeros in the gradients where given;
        ``moe_losses`` ({name: mean over the interval's iterations}, an MoE model's router
        auxiliary losses) after the loss, in Megatron-LM's names and format (``%.6E``)."""
        if not self.active:
            return
        for key in ("tokens_per_s", "ms_per_iter", "tflops_per_device", "mfu"):
            if key in values:
                self._scalar(f"throughput/{key}", values[key], iteration)
        line = f"iteration {iteration:6d}/{total} | loss {values['loss']:.6f} | "
        for name, value in (moe_losses or {}).items():
            line += f"{name} {value:.6E} | "
        line += f"lr {values['lr']:.3e} | grad norm {values['grad_norm']:.4f}"
        if "params_norm" in values:
            line += f" | params norm {values['params_norm']:.4f}"
        if "num_zeros_in_grad" in values:
            line += f" | zeros in grad {values['num_zeros_in_grad']:.0f}"
        if "ms_per_iter" in values:
            line += (
                f" | tokens/s {values['tokens_per_s']:.0f} | ms/iter {values['ms_per_iter']:.1f}"
                f" | TFLOP/s/device {values['tflops_per_device']:.3f}"
            )
        if "mfu" in values:
            line += f" | MFU {100 * values['mfu']:.1f}%"
        self._bar.write(line, file=sys.stdout)

    def validation(self, iteration: int, loss: float) -> None:
        """Record a validation loss (mean over the held-out batches) and its perplexity."""
        if not self.active:
            return
        ppl = math.exp(min(loss, 700.0))
        self._record({"iteration": iteration, "split": "valid", "loss": loss, "ppl": ppl})
        self._scalar("valid/loss", loss, iteration)
        if self.valid_ppl_to_tb:
            self._scalar("valid/ppl", ppl, iteration)
        self._bar.write(
            f"validation at iteration {iteration:6d} | loss {loss:.6f} | perplexity {ppl:.3f}",
            file=sys.stdout,
        )

    def scalars(self, iteration: int, values: dict, split: str) -> None:
        """Record named scalars of one iteration under ``split`` (TensorBoard tag
        ``split/key``; one metrics.jsonl object with ``"split": split``)."""
        if not self.active:
            return
        self._record({"iteration": iteration, "split": split, **values})
        for key, value in values.items():
            self._scalar(f"{split}/{key}", value, iteration)

    def message(self, text: str) -> None:
        """A free-form line on the console."""
        if self.active:
            self._bar.write(text, file=sys.stdout)

    def close(self) -> None:
        if not self.active:
            return
        self._bar.close()
        self._tb.close()
        if self._mirror is not None:
            self._mirror.close()
        self._jsonl.close()
