"""``megatron-gamma evaluate CKPT``: held-out loss and perplexity without training.

The checkpoint (any saved TP/PP/EP layout) is loaded into an fp32 GPTModel with TP = PP = 1
(dist_checkpointing reshards it) on every launched process (one by default; under torchrun or
srun the processes split the work, data-parallel, and all-reduce the sums). What it scores is
the first of:

1. ``data_path`` given here (``--data-path``): it replaces the run's data paths (the config is
   rebuilt through ``Config.replace`` with only the evaluation blend);
2. the run's ``valid_data_path`` (per-split paths, megatron-core ``blend_per_split``);
3. the run's own validation split, for a run trained on ``data_path`` with ``split`` (the
   README's recipe): the samples pretrain's validation scored, built as pretrain builds them
   (:func:`megatron_gamma.data.datasets.build_datasets`, megatron-core's GPTDataset), scored as
   pretrain scores them (:func:`split_loss`).

In cases 1 and 2, ``eval_tokens // seq_length`` windows of ``seq_length + 1`` consecutive
tokens are scored: for one prefix its first windows (documents concatenated in order,
:func:`megatron_gamma.diagnostics.compare.token_windows`); for a Megatron blend
'W1 P1 W2 P2 ...' each prefix gets windows in proportion to its weight (largest remainder). The
loss is the mean next-token cross-entropy (nats) over every scored token, the perplexity its
exponential.

In case 3 the samples are the first ``eval_iters x global_batch_size`` of the run's validation
GPTDataset (its seed, seq_length, blend, split, ``eod_mask_loss``, ``reset_attention_mask``),
fed with their position ids, attention masks and labels; the loss is, as pretrain's validation
loss, the mean over the run's micro-batches (``micro_batch_size`` consecutive samples each) of
each micro-batch's mean cross-entropy over its ``loss_mask`` tokens. The checkpoint of
iteration N so scores the validation loss pretrain logged at iteration N (``metrics.jsonl``,
``"split": "valid"``), in fp32 (a bf16 run's validation ran in bf16, so there the two differ
by bf16 rounding; a TP/PP run's by the order of its sums, within 2e-6 nats as tested).
``eval_tokens`` and ``seq_length`` choose other samples than pretrain's and are refused there.
megatron-core's index caches of the run's three splits (as pretrain builds them: the train
split's over its ``train_iters x global_batch_size`` samples, which takes a while for a long
run) are built in a scratch
directory of each process, removed when it exits, never where the checkpoint's config points;
with ``data_cache_path`` (``--data-cache-path``, e.g. ``RUN/data_cache``, where pretrain built
them by default) they are read from there, or built there once (rank 0 first, as pretrain
builds them) and kept for the next call.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Optional

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, default_collate

from megatron_gamma import parallel
from megatron_gamma.config import Config, ConfigError, RecordedPaths
from megatron_gamma.config.sections import split_shares
from megatron_gamma.data.datasets import build_datasets, check_splits
from megatron_gamma.diagnostics.compare import score_tokens, token_windows
from megatron_gamma.evaluation.windows import (
    check_data_cache_path,
    evaluation_blend,
    window_count,
    window_shares,
)
from megatron_gamma.rundir import checkpoint, loader

DEFAULT_MICRO_BATCH_SIZE = 4
"""Windows per forward pass on ``--data-path`` or ``valid_data_path`` by default."""


def uses_run_split(cfg: Config, data_path: Optional[list[str]]) -> bool:
    """Whether :func:`evaluate` scores the run's own validation split: no ``data_path`` given
    here, and a run trained on ``data_path`` cut by ``split`` (no per-split paths, which need a
    ``train_data_path``; no mock data)."""
    d = cfg.data
    return not data_path and not d.train_data_path and not d.mock_data and bool(d.data_path)


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


def check_run_split(
    cfg: Config,
    eval_tokens: Optional[int] = None,
    seq_length: Optional[int] = None,
    recorded: Optional[RecordedPaths] = None,
) -> int:
    """Check that the run's own validation split can be scored as pretrain scored it.

    Args:
        cfg: the run's config (a ``data_path`` run, :func:`uses_run_split`).
        eval_tokens: the ``eval_tokens`` asked for (None: not given).
        seq_length: the ``seq_length`` asked for (None: not given).
        recorded: where the run's relative paths were looked for
            (:attr:`~megatron_gamma.rundir.checkpoint.RunCheckpoint.recorded`), named by the
            error of a missing prefix.

    Returns:
        The samples pretrain's validation scored: ``eval_iters x global_batch_size``.

    Raises:
        ConfigError: the split gives validation weight 0 (e.g. ``100,0,0``) or the run had
            ``eval_iters`` 0 (it validated on nothing), ``eval_tokens`` or ``seq_length`` given
            (they would choose other samples than pretrain's), the blend's files missing, or a
            split without a document of some prefix (:func:`check_splits`); each names the fix.
    """
    d, t = cfg.data, cfg.training
    where = f"data_path {' '.join(d.data_path)}, split {d.split}"
    fix = "Fix: pass --data-path PREFIX (or a blend W1 P1 W2 P2 ...) of held-out data"
    if split_shares(d.split)[1] == 0:
        raise ConfigError(
            f"split={d.split!r}: the run's validation split has weight 0 ({where}), so pretrain "
            f"validated on nothing and there is no validation split to score. {fix}"
        )
    if t.eval_iters == 0:
        raise ConfigError(
            f"eval_iters=0: the run turned validation off ({where}), so pretrain scored no "
            f"sample of its validation split. {fix}"
        )
    samples = t.eval_iters * t.global_batch_size
    for name, value in (("eval_tokens", eval_tokens), ("seq_length", seq_length)):
        if value is not None:
            raise ConfigError(
                f"{name}={value}: the run's validation split ({where}) is scored as pretrain's "
                f"validation scored it, eval_iters x global_batch_size = {t.eval_iters} x "
                f"{t.global_batch_size} = {samples} samples of seq_length "
                f"{cfg.model.seq_length}; {name} would score other samples. Fix: drop "
                f"--{name.replace('_', '-')}, or pass --data-path PREFIX to score windows of a "
                "dataset"
            )
    prefixes, _ = d.blend(recorded)
    check_splits(prefixes, d.split, cfg.model.seq_length, ("valid",))
    return samples


@torch.no_grad()
def sample_losses(
    model: torch.nn.Module,
    dataset: Dataset,
    samples: int,
    batch_size: int,
    rank: int = 0,
    world: int = 1,
) -> torch.Tensor:
    """Loss-masked next-token cross-entropy of the first ``samples`` samples of a megatron-core
    GPTDataset (or BlendedDataset), each fed as pretrain feeds it: tokens, position ids, its
    attention mask when it carries one (``reset_attention_mask``) and labels, through the
    model's own loss (``model(..., labels=...)``, per-token nats in fp32).

    Args:
        model: a GPTModel in eval mode (TP = PP = 1).
        dataset: the samples (dicts of tokens, labels, loss_mask, position_ids: (seq_length,)
            tensors; attention_mask (1, seq_length, seq_length) bool; dataset_id for a blend).
        samples: how many, from sample 0.
        batch_size: samples per forward pass.
        rank: this process's rank; it scores samples ``rank, rank + world, ...``.
        world: processes sharing the samples (all-reduced when more than one).

    Returns:
        float64 (3, samples): per sample the summed cross-entropy over its ``loss_mask`` tokens
        (nats), the count of those tokens, and its ``dataset_id`` (0 without a blend); on
        every rank.
    """
    device = next(model.parameters()).device
    out = torch.zeros(3, samples, dtype=torch.float64)
    mine = list(range(rank, samples, world))
    for start in range(0, len(mine), batch_size):
        index = mine[start : start + batch_size]
        batch = default_collate([dataset[i] for i in index])
        mask = batch.get("attention_mask")
        losses = model(
            batch["tokens"].to(device),
            batch["position_ids"].to(device),
            None if mask is None else mask.to(device),
            labels=batch["labels"].to(device),
        )
        loss_mask = batch["loss_mask"].to(device).float()
        out[0, index] = (losses.float() * loss_mask).sum(1).double().cpu()
        out[1, index] = loss_mask.sum(1).double().cpu()
        if "dataset_id" in batch:
            out[2, index] = torch.as_tensor(batch["dataset_id"]).double()
    if world > 1:
        out = out.to(device)
        dist.all_reduce(out)
        out = out.cpu()
    return out


def split_loss(per_sample: torch.Tensor, micro_batch_size: int) -> float:
    """Pretrain's validation loss from :func:`sample_losses`: the mean, over micro-batches of
    ``micro_batch_size`` consecutive samples (as pretrain's sampler cuts them, whatever its
    data-parallel size), of each micro-batch's summed cross-entropy over its loss-mask token
    count (megatron-gamma's ``_loss_func``; Megatron-LM averages these per-micro-batch means).

    Args:
        per_sample: float64 (3, samples) of :func:`sample_losses`; ``samples`` a multiple of
            ``micro_batch_size`` (``global_batch_size`` is).
        micro_batch_size: the run's ``micro_batch_size``.

    Returns:
        The loss in nats.
    """
    nll = per_sample[0].view(-1, micro_batch_size).sum(1)
    count = per_sample[1].view(-1, micro_batch_size).sum(1)
    return float((nll / count).mean())


def _score_run_split(
    run: checkpoint.RunCheckpoint, samples: int, batch_size: int, data_cache_path: Optional[str]
) -> dict:
    """:func:`evaluate` on the run's own validation split (module docstring, case 3)."""
    shared = data_cache_path is not None
    cache = data_cache_path if shared else os.path.join(loader.scratch_dir(), "data_cache")
    cfg = run.cfg.replace(data_cache_path=cache)
    d, t, seq = cfg.data, cfg.training, cfg.model.seq_length
    prefixes, weights = d.blend()
    weights = weights or [1.0] * len(prefixes)
    tokenizer = loader.run_tokenizer(cfg)
    # A scratch cache is built before any process group, by each launched process in its own
    # directory (megatron-core's builder under torch.distributed has the ranks other than 0 read
    # rank 0's caches, which would lie in rank 0's scratch directory); a shared one inside the
    # group, rank 0 first, so that no two processes write the same file.
    valid = None if shared else build_datasets(cfg, tokenizer)[1]
    with _processes(cfg) as (rank, world):
        if shared:
            valid = build_datasets(cfg, tokenizer)[1]
        model, iteration = checkpoint.load_model(run)
        per_sample = sample_losses(model, valid, samples, batch_size, rank, world)
    loss = split_loss(per_sample, t.micro_batch_size)
    per_prefix = []
    for i, (prefix, weight) in enumerate(zip(prefixes, weights, strict=True)):
        mine = per_sample[2] == i
        nll, count = per_sample[0, mine].sum(), per_sample[1, mine].sum()
        per_prefix.append(
            {
                "prefix": prefix,
                "weight": weight / sum(weights),
                "windows": int(mine.sum()),
                "loss": float(nll / count) if count else None,
            }
        )
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "tokens": int(per_sample[1].sum()),
        "windows": samples,
        "seq_length": seq,
        "iteration": iteration,
        "checkpoint": run.path,
        "processes": world,
        "data": per_prefix,
        "source": "split",
        "scored": (
            f"the run's validation split (data_path {' '.join(d.data_path)}, split {d.split}): "
            f"eval_iters x global_batch_size = {t.eval_iters} x {t.global_batch_size} = "
            f"{samples} samples of {seq} tokens"
        ),
    }


def evaluate(
    ckpt: str,
    data_path: Optional[list[str]] = None,
    *,
    config: Optional[str] = None,
    eval_tokens: Optional[int] = None,
    seq_length: Optional[int] = None,
    micro_batch_size: Optional[int] = None,
    data_cache_path: Optional[str] = None,
) -> dict:
    """Held-out loss and perplexity of one checkpoint (module docstring).

    Args:
        ckpt: ``SAVE/iter_N``, a checkpoint root or a run directory.
        data_path: a prefix or blend; default the run's ``valid_data_path``, else the run's own
            validation split (a ``data_path`` + ``split`` run).
        config: a config.yaml that overrides the checkpoint's own config.
        eval_tokens: tokens to score on ``data_path`` or ``valid_data_path`` (default
            :data:`~megatron_gamma.evaluation.windows.DEFAULT_EVAL_TOKENS`); rounded down to
            whole windows (the count used is returned). Refused on the run's split, which
            scores pretrain's samples.
        seq_length: window length in tokens (default the run's; at most
            max_position_embeddings). Refused on the run's split.
        micro_batch_size: windows (samples) per forward pass (default
            :data:`DEFAULT_MICRO_BATCH_SIZE`; on the run's split the run's ``micro_batch_size``);
            on the run's split the loss is still averaged over the run's micro-batches.
        data_cache_path: on the run's split, the directory of megatron-core's index caches to
            read or build (default: a scratch directory per process, removed at exit). Refused
            elsewhere, where no index cache is built.

    Returns:
        {'loss', 'perplexity', 'tokens', 'windows', 'seq_length', 'iteration', 'checkpoint',
        'processes', 'data': [{'prefix', 'weight', 'windows', 'loss'}], 'source', 'scored'};
        losses in nats; ``tokens``: the tokens whose loss counts (on the run's split those of
        its ``loss_mask``); ``windows``: windows or samples of ``seq_length`` tokens;
        ``processes``: how many launched processes shared them; ``source``: ``'data_path'``,
        ``'valid_data_path'`` or ``'split'`` (the run's validation split); ``scored``: one line
        that says what was scored (data, split, counts).

    Raises:
        CheckpointError, TokenizerNotFoundError: see :func:`checkpoint.resolve`.
        ConfigError: no data, a bad blend, a window longer than the model's positions, a
            prefix with fewer tokens than one window or than its share (fix: lower
            --eval-tokens), or ``data_cache_path`` off the run's split
            (:mod:`~megatron_gamma.evaluation.windows`); on the run's split, see
            :func:`check_run_split`.
    """
    run = checkpoint.resolve(ckpt, config)
    if uses_run_split(run.cfg, data_path):
        samples = check_run_split(run.cfg, eval_tokens, seq_length, run.recorded)
        batch_size = micro_batch_size or run.cfg.training.micro_batch_size
        return _score_run_split(run, samples, batch_size, data_cache_path)
    # the checks the command line ran before torch where its flags decide them (cli.py)
    check_data_cache_path(data_cache_path, data_path)
    micro_batch_size = micro_batch_size or DEFAULT_MICRO_BATCH_SIZE
    m = run.cfg.model
    seq = m.seq_length if seq_length is None else seq_length
    n = window_count(eval_tokens, seq, m.max_position_embeddings)
    prefixes, weights = evaluation_blend(run.cfg, data_path, run.recorded)
    counts = window_shares(eval_tokens, seq, prefixes, weights)
    windows = [
        token_windows(prefix, count, seq) if count else torch.zeros(0, seq + 1, dtype=torch.long)
        for prefix, count in zip(prefixes, counts, strict=True)
    ]
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
    source = "data_path" if data_path else "valid_data_path"
    named = "data_path" if data_path else "the run's valid_data_path"
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
        "source": source,
        "scored": (
            f"{named} {' '.join(data_path or run.cfg.data.valid_data_path)}: {n} windows of "
            f"{seq} tokens"
        ),
    }
