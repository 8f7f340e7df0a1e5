"""Optional telemetry: Weights & Biases (``--wandb-project``) and profiling (``--profile``).

- :class:`WandbWriter` mirrors every TensorBoard scalar of :class:`~.metrics.MetricsLogger` to a
  W&B run (same tag, same iteration as the W&B step); ``WANDB_MODE=offline`` writes the run
  files under ``--wandb-save-dir`` without a network.
- :class:`ProfilerCallback` profiles iterations [``--profile-step-start``,
  ``--profile-step-end``) (0-based, as Megatron-LM's ``training.py``) on the ranks of
  ``--profile-ranks``: with ``--use-pytorch-profiler`` through ``torch.profiler`` with
  ``tensorboard_trace_handler`` (one ``rank{R}.*.pt.trace.json`` per rank in the TensorBoard
  directory, opened by TensorBoard's profile plugin and by Perfetto), otherwise by calling
  ``cudaProfilerStart`` / ``cudaProfilerStop`` for an nsys run with
  ``--capture-range=cudaProfilerApi``.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from megatron_gamma.config import Config, ConfigError, redacted_dict
from megatron_gamma.training.callback import Callback, StepOutput

if TYPE_CHECKING:
    from megatron_gamma.training.loop import Trainer


def check_telemetry(cfg: Config) -> None:
    """Checks of the logging flags that need this machine, before any process group exists.

    Raises:
        ConfigError: ``--wandb-project`` without the wandb package; ``--profile`` without
            ``--use-pytorch-profiler`` where CUDA is absent (nsys's cudaProfilerApi range).
    """
    lg = cfg.logging
    if lg.wandb_project is not None and importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            f"wandb_project={lg.wandb_project!r}: Weights & Biases is not installed. Fix: pip "
            'install --no-build-isolation -e ".[wandb]" in the megatron-gamma checkout, or drop '
            "--wandb-project"
        )
    if lg.profile and not lg.use_pytorch_profiler and not torch.cuda.is_available():
        raise ConfigError(
            "profile=True: without --use-pytorch-profiler, Megatron-LM's --profile only calls "
            "cudaProfilerStart/Stop for an external nsys, and this machine has no CUDA. Fix: "
            "add --use-pytorch-profiler (a torch.profiler trace in the TensorBoard directory)"
        )


class WandbWriter:
    """A W&B run that takes TensorBoard-style scalars (rank 0 only).

    Args:
        cfg: the run config (``--wandb-project``, ``--wandb-exp-name``, ``--wandb-save-dir``;
            the resolved config, ``cluster.env`` values redacted, is stored as the run's config).
    """

    def __init__(self, cfg: Config):
        import wandb

        lg = cfg.logging
        save_dir = lg.wandb_save_dir or os.path.join(lg.run_dir, "wandb")
        os.makedirs(save_dir, exist_ok=True)
        self._run = wandb.init(
            project=lg.wandb_project,
            name=lg.wandb_exp_name or os.path.basename(os.path.normpath(lg.run_dir)),
            dir=save_dir,
            config=redacted_dict(cfg),
        )

    def add_scalar(self, tag: str, value: Any, step: int) -> None:
        """Log ``value`` under ``tag`` at W&B step ``step`` (the iteration)."""
        self._run.log({tag: value}, step=step)

    def close(self) -> None:
        """Finish the run (offline: its files are complete under the save directory)."""
        self._run.finish()


def start_wandb(cfg: Config) -> WandbWriter | None:
    """Start the W&B run of ``--wandb-project`` on rank 0 and broadcast the outcome, so that a
    failure on rank 0 (no API key, no network, an unwritable ``--wandb-save-dir``) stops every
    rank with the same error instead of leaving the others waiting at the next collective.
    Collective over the world group: call it on every rank at the same point (the trainer
    does once the checkpoint load has passed, so that a refused resume opens no W&B run).

    Returns:
        The run's writer on rank 0; None on the other ranks and without ``--wandb-project``.

    Raises:
        ConfigError: on every rank, naming rank 0's failure.
    """
    if cfg.logging.wandb_project is None:
        return None
    writer, outcome = None, [None]
    if dist.get_rank() == 0:
        try:
            writer = WandbWriter(cfg)
        except Exception as e:  # wandb raises many types (usage, communication, OS errors)
            outcome[0] = (
                f"wandb_project={cfg.logging.wandb_project!r}: Weights & Biases did not start on "
                f"rank 0 ({type(e).__name__}: {e}). Fix: log in (wandb login, or WANDB_API_KEY),"
                " or set WANDB_MODE=offline to write the run under --wandb-save-dir, or drop "
                "--wandb-project"
            )
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0] is not None:
        raise ConfigError(outcome[0])
    return writer


class ProfilerCallback(Callback):
    """Profile the iterations of ``--profile-step-start`` .. ``--profile-step-end`` on the
    ranks of ``--profile-ranks`` (module docstring). Iteration i (1-based, as logged) is
    profiled when ``start < i <= end``, i.e. 0-based indices [start, end)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._prof = None
        self._cuda = False  # inside or ahead of a cudaProfilerApi window
        self._window = (0, 0)

    def on_train_start(self, trainer: Trainer) -> None:
        lg = self.cfg.logging
        first = trainer.state.iteration  # 0-based index of the next iteration
        if trainer.rank not in lg.profile_ranks or lg.profile_step_end <= first:
            return
        start = max(lg.profile_step_start, first)
        if not lg.use_pytorch_profiler:
            self._cuda = True
            self._window = (start, lg.profile_step_end)
            if start == first:
                torch.cuda.cudart().cudaProfilerStart()
            return
        wait = start - first
        tb_dir = lg.tensorboard_path()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=max(wait - 1, 0),
                warmup=1 if wait > 0 else 0,
                active=lg.profile_step_end - start,
                repeat=1,
            ),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                tb_dir, worker_name=f"rank{trainer.rank}"
            ),
            record_shapes=True,
        )
        self._prof.start()

    def on_step_end(self, trainer: Trainer, step: StepOutput) -> None:
        if self._cuda:
            start, end = self._window
            if step.iteration == start:
                torch.cuda.cudart().cudaProfilerStart()
            elif step.iteration == end:
                torch.cuda.cudart().cudaProfilerStop()
                self._cuda = False
            return
        if self._prof is None:
            return
        self._prof.step()
        if step.iteration >= self.cfg.logging.profile_step_end:
            self._prof.stop()
            self._prof = None

    def on_train_end(self, trainer: Trainer) -> None:
        if self._prof is not None:  # the run ended inside the window
            self._prof.stop()
            self._prof = None
        if self._cuda:
            torch.cuda.cudart().cudaProfilerStop()
            self._cuda = False
