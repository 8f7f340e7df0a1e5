"""Merge Megatron datasets in a fixed order (``tools/merge_datasets.py``, ``megatron-gamma
merge``), with megatron-core's ``IndexedDatasetBuilder.add_index``.

Two forms:

* :func:`merge_shards`: the outputs of a sharded ``preprocess`` run
  (``{P}-shard{i:05d}-of-{n:05d}_*``), every output name (e.g. ``zh_text_document``) merged over
  shards 0..n-1 into ``{P}_{name}``, and their statistics summed into ``{P}.stats.json``. The
  bytes equal those of one unsharded run over the same files.
* :func:`merge_datasets`: any dataset prefixes, in the order given, into ``{P}.bin/.idx``
  (Megatron-LM's ``tools/merge_datasets.py``; a directory stands for its ``*.idx`` prefixes in
  sorted order).

Both commit through :mod:`megatron_gamma.data.resume`: temporary files, renames, a done-marker,
so an interrupted merge is simply rerun. Each merged output carries its inputs' common tokenizer
fingerprint (:mod:`megatron_gamma.data.tokenizer_fingerprint`); inputs made with different
tokenizers are refused.
"""

from __future__ import annotations

import logging
import os

from tqdm import tqdm

from megatron_gamma.config import ConfigError
from megatron_gamma.data.indexed import compact_builder, indexed_dataset
from megatron_gamma.data.resume import UnitOutput, check_output_prefix, read_marker
from megatron_gamma.data.sharding import find_num_shards, shard_prefix
from megatron_gamma.data.stats import (
    add_counts,
    counts_from_document,
    read_json,
    stats_document,
    write_json,
)
from megatron_gamma.data.tokenizer_fingerprint import SUFFIX as FINGERPRINT
from megatron_gamma.data.tokenizer_fingerprint import merged_fingerprint

log = logging.getLogger(__name__)


def _dtype(prefix: str) -> type:
    return indexed_dataset().IndexedDataset(prefix).index.dtype


def _concat(prefixes: list[str], out_prefix: str, progress: bool, desc: str) -> None:
    """Concatenate datasets ``prefixes`` into ``out_prefix``.bin/.idx."""
    dtypes = {p: _dtype(p) for p in prefixes}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{p}: {d.__name__}" for p, d in dtypes.items())
        raise ConfigError(
            f"cannot merge datasets of different token dtypes ({listing}). Fix: preprocess them "
            "with the same tokenizer"
        )
    builder = compact_builder(out_prefix + ".bin", dtypes[prefixes[0]])
    bar = tqdm(prefixes, desc=desc, unit="dataset", disable=None if progress else True)
    for prefix in bar:
        builder.add_index(prefix)
    builder.finalize(out_prefix + ".idx")


def _merge_fingerprint(prefixes: list[str], out_prefix: str, suffix: str) -> list[str]:
    """Write the common tokenizer fingerprint of ``prefixes`` for ``out_prefix``; return the
    suffixes written ([] when an input has none: a warning says so).

    Raises:
        ConfigError: the inputs were made with different tokenizers.
    """
    doc = merged_fingerprint(prefixes)
    if doc is None:
        log.warning(
            "%s: some inputs have no tokenizer fingerprint (%s); the merged dataset gets none",
            out_prefix,
            FINGERPRINT,
        )
        return []
    write_json(out_prefix + FINGERPRINT, doc)
    return [suffix + FINGERPRINT]


def _run(unit: UnitOutput, work) -> dict:
    with unit.locked():
        marker = unit.completed()
        if marker is not None:
            log.info("%s: already merged, skipped", unit.base)
            return marker
        unit.begin()
        try:
            suffixes, counts = work()
            return unit.commit(suffixes, counts)
        except BaseException:
            unit.abort()
            raise


def merge_shards(output_prefix: str, num_shards: int | None = None, progress: bool = True) -> dict:
    """Merge the shard outputs of a sharded preprocessing run into ``output_prefix``.

    Args:
        output_prefix: the ``--output-prefix`` the shards were written with.
        num_shards: the run's ``--num-shards`` (found from the done-markers when None).
        progress: show a bar.

    Returns:
        The merged statistics (the ``{output_prefix}.stats.json`` document).

    Raises:
        ConfigError: a shard is not complete (named, with the command that finishes it), or
            ``output_prefix`` names a directory or cannot be written (:func:`check_output_prefix`).
    """
    check_output_prefix(output_prefix)
    n = num_shards if num_shards is not None else find_num_shards(output_prefix)
    bases = [shard_prefix(output_prefix, i, n) for i in range(n)]
    markers = []
    for i, base in enumerate(bases):
        marker = read_marker(base)
        if marker is None:
            raise ConfigError(
                f"shard {i} of {n} ({base}) is not complete. Fix: rerun preprocess with "
                f"--shard-index {i} --num-shards {n} (same other flags), then merge again"
            )
        markers.append(marker)
    fingerprint = {"merge_of": [[b, m["files"]] for b, m in zip(bases, markers, strict=True)]}
    unit = UnitOutput(output_prefix, fingerprint)

    def work():
        docs = [read_json(f"{b}.stats.json") for b in bases]
        names = sorted({name for d in docs for name in d["outputs"]})
        suffixes = []
        for name in names:
            parts = [
                f"{b}_{name}" for b, d in zip(bases, docs, strict=True) if name in d["outputs"]
            ]
            _concat(parts, unit.temp(f"_{name}"), progress, f"merge {name}")
            suffixes += [f"_{name}.bin", f"_{name}.idx"]
            suffixes += _merge_fingerprint(parts, unit.temp(f"_{name}"), f"_{name}")
        total: dict = {}
        for d in docs:
            add_counts(total, counts_from_document(d))
        stats = stats_document(output_prefix, total)
        write_json(unit.temp(".stats.json"), stats)
        return suffixes + [".stats.json"], {"shards": n}

    _run(unit, work)
    return read_json(unit.stats)


def dataset_prefixes(inputs: list[str]) -> list[str]:
    """Dataset prefixes from ``--input`` arguments: a prefix (``P`` for ``P.bin/.idx``) or a
    directory (its ``*.idx`` prefixes, sorted).

    Raises:
        ConfigError: an argument that is neither, or a prefix without its .bin or .idx.
    """
    prefixes = []
    for item in inputs:
        if os.path.isdir(item):
            names = sorted(f for f in os.listdir(item) if f.endswith(".idx"))
            found = [os.path.join(item, f[: -len(".idx")]) for f in names]
            if not found:
                raise ConfigError(
                    f"input directory {item!r} holds no .idx files. Fix: give a directory of "
                    "preprocessed .bin/.idx pairs, or the prefixes themselves"
                )
            prefixes += found
        else:
            prefixes.append(item[: -len(".bin")] if item.endswith((".bin", ".idx")) else item)
    for p in prefixes:
        for ext in (".bin", ".idx"):
            if not os.path.isfile(p + ext):
                raise ConfigError(
                    f"input {p!r}: {p + ext} does not exist. Fix: give dataset prefixes "
                    "(without .bin/.idx) or a directory of them"
                )
    return prefixes


def merge_datasets(inputs: list[str], output_prefix: str, progress: bool = True) -> str:
    """Concatenate datasets in the given order into ``{output_prefix}.bin/.idx``.

    Args:
        inputs: dataset prefixes or directories (see :func:`dataset_prefixes`).
        output_prefix: the merged dataset's prefix.
        progress: show a bar.

    Returns:
        ``output_prefix``.

    Raises:
        ConfigError: nothing to merge, or ``output_prefix`` names a directory or cannot be
            written (:func:`check_output_prefix`).
    """
    check_output_prefix(output_prefix)
    prefixes = dataset_prefixes(inputs)
    if not prefixes:
        raise ConfigError("nothing to merge. Fix: pass --input PREFIX|DIR [...]")
    sizes = [[p, os.path.getsize(p + ".bin"), os.path.getsize(p + ".idx")] for p in prefixes]
    fingerprint = {"merge_of": sizes}
    unit = UnitOutput(output_prefix, fingerprint)

    def work():
        _concat(prefixes, unit.temp(""), progress, "merge")
        fingerprint = _merge_fingerprint(prefixes, unit.temp(""), "")
        return [".bin", ".idx", *fingerprint], {"datasets": len(prefixes)}

    _run(unit, work)
    return output_prefix
