"""``megatron-gamma evaluate CKPT``: held-out loss and perplexity without training.

The checkpoint (any saved TP/PP/EP layout) is loaded into an fp32 GPTModel with TP = PP = 1
(dist_checkpointing reshards it) on every launched process (one by default; under torchrun or
srun the processes split the windows, data-parallel, and all-reduce the sums), then scores
``eval_tokens // seq_length`` windows of ``seq_length + 1`` consecutive tokens: for one prefix
its first windows (documents concatenated in order,
:func:`megatron_gamma.diagnostics.compare.token_windows`); for a Megatron blend
'W1 P1 W2 P2 ...' each prefix gets windows in proportion to its weight (largest remainder).
The loss is the mean next-token cross-entropy (nats) over every scored token, the perplexity its
exponential. Data paths given here replace the run's ``data_path`` (the config is rebuilt
through ``Config.replace`` with only the evaluation blend).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Optional

import torch
import torch.distributed as dist

from megatron_gamma import parallel
from megatron_gamma.config import Config, ConfigError
from megatron_gamma.diagnostics.compare import score_tokens, token_windows
from megatron_gamma.rundir import checkpoint, loader


def evaluation_blend(cfg, data_path: Optional[list[str]]) -> tuple[list[str], list[float]]:
    """(prefixes, weights) to evaluate: ``data_path`` if given, else the run's validation blend.

    The run config is rebuilt with ``data_path`` replacing its data paths, so the blend is
    checked by :meth:`megatron_gamma.config.DataConfig.blend` (files exist, weights pair up).

    Raises:
        ConfigError: no data path here and no ``valid_data_path`` in the run; a bad blend.
    """
    data = list(data_path or cfg.data.valid_data_path)
    if not data:
        raise ConfigError(
            "data_path=[]: nothing to evaluate on (the run has no valid_data_path). Fix: pass "
            "--data-path PREFIX (or a blend W1 P1 W2 P2 ...) of held-out data"
        )
    only = cfg.replace(data_path=data, train_data_path=[], valid_data_path=[], test_data_path=[])
    prefixes, weights = only.data.blend()
    weights = weights or [1.0] * len(prefixes)
    total = sum(weights)
    return prefixes, [w / total for w in weights]


def _allocate(n: int, weights: list[float]) -> list[int]:
    exact = [n * w for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


@contextlib.contextmanager
def _processes(cfg: Config) -> Iterator[tuple[int, int]]:
    """(rank, world size) inside initialized megatron-core state with TP = PP = 1: one process
    by default (:func:`~megatron_gamma.rundir.loader.single_process`), else every rank that
    torchrun or srun launched (:func:`megatron_gamma.parallel.read_dist_env`), data-parallel."""
    world = parallel.read_dist_env().world_size
    if world == 1:
        with loader.single_process(cfg):
            yield 0, 1
        return
    parallel.initialize(cfg.replace(micro_batch_size=1, global_batch_size=world))
    try:
        yield dist.get_rank(), world
    finally:
        parallel.destroy()


def evaluate(
    ckpt: str,
    data_path: Optional[list[str]] = None,
    *,
    config: Optional[str] = None,
    eval_tokens: int = 65536,
    seq_length: Optional[int] = None,
    micro_batch_size: int = 4,
) -> dict:
    """Validation loss and perplexity of one checkpoint (module docstring).

    Args:
        ckpt: ``SAVE/iter_N``, a checkpoint root or a run directory.
        data_path: a prefix or blend; default the run's ``valid_data_path``.
        config: a config.yaml that overrides the checkpoint's own config.
        eval_tokens: tokens to score; rounded down to whole windows (the count used is
            returned).
        seq_length: window length (default the run's; at most max_position_embeddings).
        micro_batch_size: windows per forward pass.

    Returns:
        {'loss', 'perplexity', 'tokens', 'windows', 'seq_length', 'iteration', 'checkpoint',
        'processes', 'data': [{'prefix', 'weight', 'windows', 'loss'}]}; losses in nats;
        ``processes``: how many launched processes shared the windows.

    Raises:
        CheckpointError, TokenizerNotFoundError: see :func:`checkpoint.resolve`.
        ConfigError: no data, a bad blend, a window longer than the model's positions, or a
            prefix with fewer tokens than its share (fix: lower --eval-tokens).
    """
    run = checkpoint.resolve(ckpt, config)
    m = run.cfg.model
    seq = m.seq_length if seq_length is None else seq_length
    if not 1 <= seq <= m.max_position_embeddings:
        raise ConfigError(
            f"seq_length={seq}: must lie in [1, max_position_embeddings="
            f"{m.max_position_embeddings}]. Fix: use a shorter --seq-length"
        )
    n = eval_tokens // seq
    if n < 1:
        raise ConfigError(
            f"eval_tokens={eval_tokens}: fewer than one window of {seq} tokens. Fix: raise it"
        )
    prefixes, weights = evaluation_blend(run.cfg, data_path)
    counts = _allocate(n, weights)
    windows = []
    for prefix, count in zip(prefixes, counts, strict=True):
        w = (
            token_windows(prefix, count, seq)
            if count
            else torch.zeros(0, seq + 1, dtype=torch.long)
        )
        if w.size(0) < count:
            raise ConfigError(
                f"eval_tokens={eval_tokens}: {prefix} holds {w.size(0)} windows of {seq} tokens, "
                f"its share needs {count}. Fix: lower --eval-tokens or add data"
            )
        windows.append(w)
    sums = torch.zeros(len(windows), dtype=torch.float64)  # summed nll per prefix
    with _processes(run.cfg) as (rank, world):
        model, iteration = checkpoint.load_model(run)
        for i, w in enumerate(windows):
            mine = w[rank::world]
            if len(mine):
                sums[i] = -score_tokens(model, mine, micro_batch_size).double().sum()
        if world > 1:
            sums = sums.to(next(model.parameters()).device)
            dist.all_reduce(sums)
            sums = sums.cpu()
    per_prefix = [
        {
            "prefix": p,
            "weight": w,
            "windows": c,
            "loss": float(total / (c * seq)) if c else None,
        }
        for p, w, c, total in zip(prefixes, weights, counts, sums.tolist(), strict=True)
    ]
    loss = float(sums.sum() / (n * seq))
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "tokens": n * seq,
        "windows": n,
        "seq_length": seq,
        "iteration": iteration,
        "checkpoint": run.path,
        "processes": world,
        "data": per_prefix,
    }
