"""megatron-core GPT datasets for a run, and the micro-batch iterator that feeds the schedule."""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial

import torch
import torch.distributed as dist
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.blended_megatron_dataset_config import (
    convert_split_vector_to_split_matrix,
    parse_and_normalize_split,
)
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.indexed_dataset import IndexedDataset
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

from megatron_gamma.compat import patch_index_cache_load
from megatron_gamma.config import Config, ConfigError
from megatron_gamma.data.tokenizer import BilingualTokenizer

_SPLITS = ("train", "valid", "test")


def _check_split_tokens(name: str, where: str, tokens: int, seq_length: int, fix: str) -> None:
    """One sample of megatron-core's GPTDataset reads ``seq_length + 1`` tokens (inputs plus the
    shifted labels); a split holding fewer would repeat itself within one sample.

    Raises:
        ConfigError: naming the split, where its tokens come from, its token count, the
            seq_length and the fix.
    """
    if tokens < seq_length + 1:
        raise ConfigError(
            f"seq_length={seq_length}: the {name} split ({where}) holds {tokens:,} tokens, but one "
            f"sample needs seq_length + 1 = {seq_length + 1:,}. Fix: a --seq-length below "
            f"{tokens}, or {fix}"
        )


def check_splits(prefixes: list[str], split: str, seq_length: int, read: tuple[str, ...]) -> None:
    """Every split with a non-zero weight in ``split`` must receive at least one document of
    every prefix (megatron-core's GPTDataset loops forever on an empty split), and each split
    the run reads at least ``seq_length + 1`` tokens of it (one sample). The documents of a
    split are megatron-core's: ``round(bound x document count)`` for both bounds of the split.

    Args:
        prefixes: the ``--data-path`` blend's dataset prefixes.
        split: ``--split``, e.g. ``'949,50,1'``.
        seq_length: ``--seq-length``, in tokens.
        read: the splits the run reads (``train``; ``valid`` when it evaluates; never ``test``,
            which is built but not read).

    Raises:
        ConfigError: an empty split (naming the prefix, its document count and the split) or
            a read one shorter than a sample (naming the split, its token count and the
            seq_length).
    """
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    for prefix in prefixes:
        dataset = IndexedDataset(prefix)  # kept open: collecting it unmaps sequence_lengths
        lengths = dataset.sequence_lengths
        count = len(lengths)
        bounds = {
            name: (round(b[0] * count), round(b[1] * count))
            for name, b in zip(_SPLITS, matrix, strict=True)
            if b is not None
        }
        for name, (beg, end) in bounds.items():
            if beg == end:
                raise ConfigError(
                    f"split={split!r}: the {name} split of {prefix} ({count} documents) is empty. "
                    f"Fix: give {name} a larger share, or 0 to disable it (e.g. '98,2,0')"
                )
        for name, (beg, end) in bounds.items():
            if name not in read:
                continue
            _check_split_tokens(
                name,
                f"--split {split} of {prefix}",
                int(lengths[beg:end].sum()),
                seq_length,
                f"more data (a larger {name} share of --split, or a larger corpus)"
                + ("" if name == "train" else ", or 0 to disable it and --eval-iters 0"),
            )
        del lengths, dataset


def check_split_paths(
    blends: list[tuple[list[str], list[float] | None] | None],
    seq_length: int,
    read: tuple[str, ...],
) -> None:
    """With per-split paths (``--train-data-path`` etc., megatron-core ``blend_per_split``)
    every dataset of a split the run reads must hold at least ``seq_length + 1`` tokens (one
    sample; each is read whole).

    Args:
        blends: [train, valid, test] blends, None where not given
            (:meth:`~megatron_gamma.config.DataConfig.blend_per_split`).
        seq_length: ``--seq-length``, in tokens.
        read: the splits the run reads (see :func:`check_splits`).

    Raises:
        ConfigError: naming the split, the dataset, its token count and the seq_length.
    """
    for name, blend in zip(_SPLITS, blends, strict=True):
        for prefix in blend[0] if blend is not None and name in read else []:
            dataset = IndexedDataset(prefix)  # kept open while its lengths are summed
            tokens = int(dataset.sequence_lengths.sum())
            del dataset
            _check_split_tokens(
                name,
                f"--{name}-data-path {prefix}",
                tokens,
                seq_length,
                f"a larger dataset in --{name}-data-path",
            )


def build_datasets(
    cfg: Config, tokenizer: BilingualTokenizer
) -> tuple[Dataset, Dataset | None, Dataset | None]:
    """Train / valid / test GPTDatasets over the configured blend and split; their index caches
    load without pickle (:func:`~megatron_gamma.compat.patch_index_cache_load`).

    Wraps megatron-core ``BlendedMegatronDatasetBuilder(GPTDataset, sizes, ...)``. Sizes in
    samples: train ``train_samples``, else ``train_iters x global_batch_size``; valid and test
    ``eval_iters x global_batch_size`` (validation re-reads the same held-out samples at every
    evaluation, so the numbers are comparable across a run). Rank 0 builds the index caches
    first, then the others read them.

    With per-split paths (``train_data_path``, ``valid_data_path``, ``test_data_path``) each
    split is its own blend (megatron-core ``blend_per_split``, no ``split``); a split without a
    path is None. With ``mock_data``: megatron-core's ``MockGPTDataset`` for all three splits.

    ``reset_position_ids``, ``reset_attention_mask`` and ``eod_mask_loss`` are megatron-core's
    ``GPTDatasetConfig`` fields; with ``reset_attention_mask`` each sample carries its
    ``attention_mask`` (1, s, s) bool, True where attention is masked out (megatron-core's
    convention), cut after every EOD.

    Raises:
        ConfigError: empty or missing ``data_path`` (named by ``DataConfig.blend``); an index
            cache that holds pickled data (named, with the fix).
    """
    patch_index_cache_load()
    t, d = cfg.training, cfg.data
    per_split = None if d.mock_data else d.blend_per_split()
    blend, split = None, None  # mock data (megatron-core splits it "1,1,1"), or per-split blends
    if not d.mock_data and per_split is None:
        blend, split = d.blend(), d.split
    cache = cfg.data.data_cache_path or os.path.join(cfg.logging.run_dir, "data_cache")
    ds_cfg = GPTDatasetConfig(
        random_seed=t.seed,
        sequence_length=cfg.model.seq_length,
        blend=blend,
        blend_per_split=per_split,
        split=split,
        path_to_cache=cache,
        tokenizer=tokenizer,
        reset_position_ids=d.reset_position_ids,
        reset_attention_mask=d.reset_attention_mask,
        eod_mask_loss=d.eod_mask_loss,
        create_attention_mask=d.reset_attention_mask,
        mmap_bin_files=d.mmap_bin_files,
        num_dataset_builder_threads=d.num_dataset_builder_threads,
    )
    cls = MockGPTDataset if d.mock_data else GPTDataset
    eval_samples = t.eval_iters * t.global_batch_size
    sizes = [t.train_samples or t.train_iters * t.global_batch_size, eval_samples, eval_samples]
    rank = dist.get_rank() if dist.is_initialized() else 0
    datasets = None
    if rank == 0:
        datasets = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, ds_cfg).build()
    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        datasets = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, ds_cfg).build()
    return tuple(datasets)


class _RankBatches(Sampler):
    """Index lists of one data-parallel rank's micro-batches from ``first`` on (see
    :func:`micro_batches`)."""

    def __init__(self, size: int, first: int, micro_batch_size: int, step: int):
        self.size, self.first, self.mbs, self.step = size, first, micro_batch_size, step

    def __len__(self) -> int:
        return max(0, (self.size - self.first - self.mbs) // self.step + 1)

    def __iter__(self) -> Iterator[list[int]]:
        first = self.first
        while first + self.mbs <= self.size:
            yield list(range(first, first + self.mbs))
            first += self.step


def _collate(keep_mask: bool, samples: list[dict]) -> dict[str, torch.Tensor]:
    batch = default_collate(samples)
    return {k: v for k, v in batch.items() if k != "attention_mask" or keep_mask}


def micro_batches(
    dataset: Dataset,
    start_sample: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    num_workers: int = 0,
) -> Iterator[dict[str, torch.Tensor]]:
    """Yield this data-parallel rank's micro-batches from ``start_sample`` on.

    Samples are consumed in order, ``micro_batch_size x dp_size`` at a time, rank r taking the
    r-th slice (Megatron-LM's pretraining sampler), so resuming at ``consumed_samples`` continues
    exactly where the interrupted run was. Each batch: tokens, labels, loss_mask, position_ids,
    each (micro_batch_size, seq_length), plus attention_mask (micro_batch_size, 1, seq_length,
    seq_length) bool when the dataset makes one (``--reset-attention-mask``).

    Read through a torch ``DataLoader`` with ``num_workers`` worker processes (Megatron-LM's
    ``--num-workers``; 0 reads in this process), which returns the batches in sampler order: the
    batches do not depend on the worker count. The loader seeds its workers from a generator of
    its own, so starting it leaves the global torch RNG (dropout's) untouched and a resumed run
    draws the dropout masks of the uninterrupted one.
    """
    sampler = _RankBatches(
        len(dataset),
        start_sample + dp_rank * micro_batch_size,
        micro_batch_size,
        micro_batch_size * dp_size,
    )
    keep_mask = bool(getattr(dataset, "config", None) and dataset.config.reset_attention_mask)
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=partial(_collate, keep_mask),
        pin_memory=torch.cuda.is_available(),
        generator=torch.Generator().manual_seed(0),  # not the global RNG that dropout draws from
    )
    yield from loader
