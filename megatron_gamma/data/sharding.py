"""Deterministic split of the input file list among SLURM array tasks, and the shard names.

``--num-shards n --shard-index i`` gives task i the contiguous block
``files[floor(i * F / n) : floor((i + 1) * F / n)]`` of the ordered file list (F files, order of
:func:`megatron_gamma.data.readers.expand_inputs`). Blocks are contiguous, so concatenating the
shard outputs in index order (``megatron-gamma merge``) gives the bytes of one unsharded run.
Task i writes its outputs under ``{output_prefix}-shard{i:05d}-of-{n:05d}``.
"""

from __future__ import annotations

import os
import re

from megatron_gamma.config import ConfigError

_SHARD_RE = r"-shard(\d{5})-of-(\d{5})"


def check_shards(num_files: int, shard_index: int | None, num_shards: int) -> None:
    """Validate the shard flags against the number of input files.

    Raises:
        ConfigError: ``num_shards < 1``, ``shard_index`` outside ``[0, num_shards)`` (named
            as a missing ``--num-shards`` when that is 1), or more shards than files (a shard
            would be empty).
    """
    if num_shards < 1:
        raise ConfigError(f"num_shards={num_shards}: must be >= 1. Fix: --num-shards 1")
    if shard_index is not None and shard_index > 0 and num_shards == 1:
        raise ConfigError(
            f"--shard-index {shard_index} without --num-shards: one shard has only index 0. Fix: "
            "pass --num-shards N, the number of tasks that share the input"
        )
    if shard_index is not None and not 0 <= shard_index < num_shards:
        raise ConfigError(
            f"shard_index={shard_index}: must lie in [0, {num_shards}). Fix: with SLURM arrays use "
            f"--array=0-{num_shards - 1} and --shard-index $SLURM_ARRAY_TASK_ID"
        )
    if num_shards > num_files:
        raise ConfigError(
            f"num_shards={num_shards}: more shards than the {num_files} input files, so a shard "
            f"would be empty. Fix: --num-shards {num_files} or fewer (shards split the file list)"
        )


def shard_files(files: list[str], shard_index: int, num_shards: int) -> list[str]:
    """Shard ``shard_index``'s contiguous block of ``files`` (module docstring)."""
    n = len(files)
    return files[shard_index * n // num_shards : (shard_index + 1) * n // num_shards]


def shard_prefix(output_prefix: str, shard_index: int, num_shards: int) -> str:
    """``{output_prefix}-shard{i:05d}-of-{n:05d}`` (``output_prefix`` itself for one shard)."""
    if num_shards == 1:
        return output_prefix
    return f"{output_prefix}-shard{shard_index:05d}-of-{num_shards:05d}"


def finished_shards(output_prefix: str) -> dict[int, int]:
    """``{shard count: shards finished}`` of the sharded runs beside ``output_prefix``, from the
    names of their done-markers (``{output_prefix}-shardIIIII-of-NNNNN.done.json``)."""
    folder = os.path.dirname(output_prefix) or "."
    pattern = re.compile(re.escape(os.path.basename(output_prefix)) + _SHARD_RE + r"\.done\.json$")
    counts: dict[int, int] = {}
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            if m := pattern.match(name):
                counts[int(m.group(2))] = counts.get(int(m.group(2)), 0) + 1
    return counts


def _runs_there(counts: dict[int, int]) -> str:
    """The sharded runs of :func:`finished_shards` for messages: 'a 2-shard run (2 of 2 shards
    finished)'."""
    return ", ".join(
        f"a {n}-shard run ({k} of {n} shards finished)" for n, k in sorted(counts.items())
    )


def find_num_shards(output_prefix: str, num_shards: int | None = None) -> int:
    """The shard count of the sharded run beside ``output_prefix`` that ``merge`` merges:
    ``num_shards`` when given and at least one shard of a run of that many has finished
    there (its done-marker exists), else the one count whose done-markers are there.

    Raises:
        ConfigError: ``num_shards`` < 1; no shard of a ``num_shards``-shard run finished there
            (naming the shard counts whose runs are there, and how many of their shards
            finished); without ``num_shards``, no shard done-marker found, or markers of
            different shard counts.
    """
    folder = os.path.dirname(output_prefix) or "."
    counts = finished_shards(output_prefix)
    name = os.path.basename(output_prefix)
    expected = f"{name}-shardIIIII-of-NNNNN.done.json"
    where = f"in {os.path.abspath(folder)!r}"
    if num_shards is not None and num_shards < 1:
        raise ConfigError(
            f"num_shards={num_shards}: must be >= 1. Fix: the --num-shards the sharded "
            "preprocess was given, or leave it out to find it from the done-markers"
        )
    if num_shards is not None and num_shards not in counts:
        run = f"output_prefix={output_prefix!r}: no shard of a {num_shards}-shard run has "
        markers = f"({name}-shardIIIII-of-{num_shards:05d}.done.json) {where}"
        if not counts:
            raise ConfigError(
                f"{run}finished there {markers}, nor of any other sharded run. Fix: give the "
                "--output-prefix that the sharded preprocess was given, or run preprocess "
                f"--num-shards {num_shards} --shard-index I for I = 0..{num_shards - 1} first"
            )
        fix = " or ".join(f"--num-shards {n}" for n in sorted(counts))
        raise ConfigError(
            f"{run}finished there {markers}; what is there: {_runs_there(counts)}. Fix: pass "
            f"{fix} to merge that run, or run preprocess --num-shards {num_shards} "
            f"--shard-index I for I = 0..{num_shards - 1} first"
        )
    if num_shards is not None:
        return num_shards
    if not counts:
        raise ConfigError(
            f"output_prefix={output_prefix!r}: no shard done-marker ({expected}) {where}. Fix: "
            "give the --output-prefix that the sharded preprocess (--num-shards N) was given, or "
            "--input PREFIX... to merge datasets"
        )
    if len(counts) > 1:
        raise ConfigError(
            f"output_prefix={output_prefix!r}: done-markers ({expected}) of several sharded runs: "
            f"{_runs_there(counts)}. Fix: pass --num-shards N to choose one"
        )
    return next(iter(counts))
