"""Merge Megatron datasets in a fixed order (``tools/merge_datasets.py``, ``megatron-gamma
merge``), with megatron-core's ``IndexedDatasetBuilder.add_index``.

Two forms:

* :func:`merge_shards`: the outputs of a sharded ``preprocess`` run
  (``{P}-shard{i:05d}-of-{n:05d}_*``), every output name (e.g. ``zh_text_document``) merged over
  shards 0..n-1 into ``{P}_{name}``, and their statistics summed into ``{P}.stats.json``. The
  bytes equal those of one unsharded run over the same files.
* :func:`merge_datasets`: any dataset prefixes, in the order given, into ``{P}.bin/.idx``
  (Megatron-LM's ``tools/merge_datasets.py``; a directory stands for its ``*.idx`` prefixes in
  sorted order). Inputs holding a merged dataset together with datasets it was merged from (a
  sharded run's directory holds both) are refused: their documents would be in the output twice.

Both commit through :mod:`megatron_gamma.data.resume`: temporary files, renames, a done-marker,
so an interrupted merge is simply rerun; a merge whose inputs changed since (a shard redone,
a dataset rewritten: its files' sizes and modification times) is done again. Each merged output
carries its inputs' common tokenizer fingerprint
(:mod:`megatron_gamma.data.tokenizer_fingerprint`); inputs made with different tokenizers are
refused.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Callable

from tqdm import tqdm

from megatron_gamma.config import ConfigError
from megatron_gamma.data.indexed import compact_builder, finalize_index, indexed_dataset
from megatron_gamma.data.resume import (
    Reconcile,
    UnitOutput,
    check_output_prefix,
    read_marker,
    read_marker_file,
)
from megatron_gamma.data.sharding import find_num_shards, shard_prefix
from megatron_gamma.data.stats import (
    add_counts,
    counts_from_document,
    read_json,
    stats_document,
    write_json,
)
from megatron_gamma.data.tokenizer_fingerprint import SUFFIX as FINGERPRINT
from megatron_gamma.data.tokenizer_fingerprint import (
    describe,
    merged_fingerprint,
    other_tokenizers,
    read_fingerprint,
    tokenizer_flags,
)

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
    finalize_index(builder, out_prefix + ".idx")


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


def _merged_again(why: str, name: Callable[[str], str]) -> Reconcile:
    """A merged output of the same inputs (``merge_of`` entries: [prefix, ...what identifies
    its files], a recorded prefix compared as ``name`` gives it: markers written before prefixes
    were recorded as they are now) counts as done when its inputs' files are the same, and is
    merged again, with ``why``, rather than refused when they changed since (a shard redone after
    its input changed, a dataset rewritten): it is made from its inputs alone
    (:data:`~megatron_gamma.data.resume.Reconcile`)."""

    def reconcile(recorded: dict, current: dict) -> tuple[dict, str | None]:
        old = recorded.get("merge_of")
        now = current["merge_of"]
        if not isinstance(old, list) or not all(isinstance(e, list) and e for e in old):
            return current, None
        if [name(str(e[0])) for e in old] != [e[0] for e in now]:
            return current, None
        return recorded, None if [e[1:] for e in old] == [e[1:] for e in now] else why

    return reconcile


def _shard_datasets(base: str) -> list[tuple[str, dict]]:
    """(dataset prefix, tokenizer fingerprint) of every output that finished shard ``base``
    lists in its done-marker: the datasets :func:`merge_shards` would merge. The marker and
    its files are read as they are, not verified (hashing every sibling's ``.bin`` would cost
    each shard as much as reading them); [] for a shard without a marker, or with an unreadable
    one (``merge`` names it)."""
    try:
        marker = read_marker_file(f"{base}.done.json")
        files = marker.get("files", {})
        names = [base + f[: -len(FINGERPRINT)] for f in files if f.endswith(FINGERPRINT)]
        docs = [(prefix, read_fingerprint(prefix)) for prefix in names]
    except (FileNotFoundError, ConfigError):
        return []
    return [(prefix, doc) for prefix, doc in docs if doc is not None]


def check_sibling_shards(
    output_prefix: str, num_shards: int, shard_index: int | None, tokenizer: dict
) -> None:
    """Refuse, before a sharded ``preprocess`` tokenizes anything, a run whose tokenizer
    (fingerprint ``tokenizer``) is not the one the finished shards of the same run
    (``output_prefix`` and ``num_shards``; every shard but ``shard_index``) were made with: the
    comparison :func:`merge_shards` makes of their datasets
    (:func:`~megatron_gamma.data.tokenizer_fingerprint.other_tokenizers`), which would
    otherwise refuse them only once every shard had run. Shards without a done-marker, or
    without tokenizer fingerprints (written before they existed), are not compared.

    Raises:
        ConfigError: naming the shard(s) made with the other tokenizer, both tokenizers (files
            and sha256) and the fix: this run with their tokenizer, or those shards redone.
    """
    other = []
    for j in range(num_shards):
        base = shard_prefix(output_prefix, j, num_shards)
        if j != shard_index and (found := other_tokenizers(_shard_datasets(base), tokenizer)):
            other.append((j, base, *found[0]))
    if not other:
        return
    j, base, prefix, doc = other[0]
    shards = ", ".join(str(o[0]) for o in other[:3]) + (", ..." if len(other) > 3 else "")
    markers = " ".join(shlex.quote(f"{o[1]}.done.json") for o in other[:3]) + (
        " ..." if len(other) > 3 else ""
    )
    this = "this shard" if shard_index is not None else "this run"
    raise ConfigError(
        f"output_prefix={output_prefix!r}: {this} would be tokenized with {describe(tokenizer)}, "
        f"but {len(other)} finished shard(s) of the same {num_shards}-shard run ({shards}) "
        f"were tokenized with another tokenizer: shard {j} ({prefix}) with {describe(doc)}. "
        "merge refuses shards of two tokenizers. Fix: give "
        f"{this} the finished shards' tokenizer ({tokenizer_flags(doc)}); or, if this run's "
        f"is the right one, delete {markers} and rerun preprocess with it for shard(s) "
        f"{shards} (--shard-index I --num-shards {num_shards}), then merge"
    )


def merge_shards(output_prefix: str, num_shards: int | None = None, progress: bool = True) -> dict:
    """Merge the shard outputs of a sharded preprocessing run into ``output_prefix``.

    Args:
        output_prefix: the ``--output-prefix`` the shards were written with.
        num_shards: the run's ``--num-shards`` (found from the done-markers when None).
        progress: show a bar.

    Returns:
        The merged statistics (the ``{output_prefix}.stats.json`` document).

    Raises:
        ConfigError: no shard of a ``num_shards``-shard run has finished there (the shard
            counts that are there named; :func:`~megatron_gamma.data.sharding.find_num_shards`),
            a shard is not complete (named, with the command that finishes it), or
            ``output_prefix`` names a directory or cannot be written (:func:`check_output_prefix`).
    """
    check_output_prefix(output_prefix)
    n = find_num_shards(output_prefix, num_shards)
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
    # the shards by name: they lie beside the output, however its prefix is spelled
    names = [os.path.basename(b) for b in bases]
    fingerprint = {"merge_of": [[b, m["files"]] for b, m in zip(names, markers, strict=True)]}
    why = "its shards changed since they were merged"
    unit = UnitOutput(output_prefix, fingerprint, _merged_again(why, os.path.basename))

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


def merged_from(prefix: str) -> list[str]:
    """The datasets that dataset ``prefix`` was merged from, as absolute prefixes in merge order,
    read from the done-marker of the merge that wrote it (:func:`merge_shards`: ``{B}_{name}``
    from ``{B}-shard{i:05d}-of-{n:05d}_{name}``, i < n, beside it; :func:`merge_datasets`: the
    prefixes it was given, taken from the directory the merge ran in); [] for a dataset that
    no merge wrote, or without a done-marker. The files are not verified.

    Raises:
        ConfigError: the done-marker is empty or torn.
    """
    folder, name = os.path.split(os.path.abspath(prefix))
    for cut in [len(name)] + [i for i, c in enumerate(name) if c == "_"]:
        base, suffix = os.path.join(folder, name[:cut]), name[cut:]
        if not os.path.isfile(f"{base}.done.json"):
            continue
        marker = read_marker_file(f"{base}.done.json")
        if f"{suffix}.bin" not in marker.get("files", {}):
            continue
        sources = marker.get("fingerprint", {}).get("merge_of", [])
        if suffix:  # merge_shards: one entry per shard
            return [shard_prefix(base, i, len(sources)) + suffix for i in range(len(sources))]
        return [os.path.abspath(entry[0]) for entry in sources]
    return []


def _leaves(prefix: str, within: tuple[str, ...] = ()) -> list[str]:
    """The absolute prefixes of the datasets no merge wrote that ``prefix`` holds: itself, or
    (for a merged dataset, :func:`merged_from`) the leaves of what it was merged from. A dataset
    met again inside its own chain (merged into one of its own inputs) counts as a leaf."""
    path = os.path.abspath(prefix)
    sources = [] if path in within else merged_from(prefix)
    if not sources:
        return [path]
    return [leaf for source in sources for leaf in _leaves(source, (*within, path))]


def check_not_merged_twice(prefixes: list[str]) -> None:
    """Refuse two inputs that hold the same documents by way of a merge (their
    :func:`merged_from` chains meet): e.g. ``--input DIR`` on the directory of a sharded
    ``preprocess``, which holds the shards and their merge, or two merges of the same shards.
    The output would hold those documents twice. A prefix given twice is refused before, by
    :func:`check_inputs_distinct`.

    Raises:
        ConfigError: naming both inputs, a dataset they share, and the fix.
    """
    owner: dict[str, str] = {}
    for prefix in prefixes:
        for leaf in _leaves(prefix):
            other = owner.setdefault(leaf, prefix)
            if other != prefix:
                raise ConfigError(
                    f"inputs {other!r} and {prefix!r} both hold the documents of {leaf!r} (their "
                    "done-markers say what each was merged from): the output would hold them "
                    "twice. Fix: give the merged dataset alone, or the datasets it was merged "
                    "from without it (a directory holding a sharded run's shards and their "
                    "merge cannot be given whole)"
                )


def _same_dataset(a: str, b: str) -> bool:
    """True if prefixes ``a`` and ``b`` name the same dataset: one absolute path, or a ``.bin``
    or ``.idx`` of one that is the other's file (a symbolic link, a linked directory)."""
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    return any(
        os.path.exists(a + ext) and os.path.exists(b + ext) and os.path.samefile(a + ext, b + ext)
        for ext in (".bin", ".idx")
    )


def check_output_not_an_input(prefixes: list[str], output_prefix: str) -> None:
    """Refuse an ``output_prefix`` that is one of the input datasets ``prefixes`` (compared
    by :func:`_same_dataset`): the merge would replace that input with the merged dataset.

    Raises:
        ConfigError: naming the input and the fix.
    """
    for prefix in prefixes:
        if _same_dataset(prefix, output_prefix):
            raise ConfigError(
                f"--output-prefix {output_prefix!r} is the input dataset {prefix!r}: the merge "
                f"would replace that input with the merged dataset. Fix: a new --output-prefix, "
                f"e.g. {output_prefix}_merged"
            )


def check_inputs_distinct(prefixes: list[str]) -> None:
    """Refuse a dataset given twice among ``prefixes`` (compared by :func:`_same_dataset`: ``P``
    and ``P.bin``, relative and absolute, a link to its files): the output would hold its
    documents twice.

    Raises:
        ConfigError: naming the dataset and the fix.
    """
    for i, prefix in enumerate(prefixes):
        for earlier in prefixes[:i]:
            if _same_dataset(earlier, prefix):
                given = (
                    f"input {prefix!r} is given twice"
                    if earlier == prefix
                    else f"inputs {earlier!r} and {prefix!r} are the same dataset"
                )
                raise ConfigError(
                    f"{given}: the output would hold its documents twice. Fix: name each "
                    "dataset once (to sample one more often, weight it in the --data-path blend)"
                )


def dataset_counts(prefix: str) -> dict[str, int]:
    """``{"documents", "sequences", "tokens"}`` of dataset ``prefix``, read from its ``.idx``."""
    dataset = indexed_dataset().IndexedDataset(prefix)
    lengths = dataset.sequence_lengths
    return {
        "documents": len(dataset.document_indices) - 1,
        "sequences": len(lengths),
        "tokens": int(lengths.sum(dtype="int64")),
    }


def _stamp(path: str) -> list[int]:
    """[size, modification time in ns] of ``path``: what tells a rewritten input dataset, as
    make and rsync tell a changed file (a hash would read every input on every rerun)."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def merge_datasets(inputs: list[str], output_prefix: str, progress: bool = True) -> str:
    """Concatenate datasets in the given order into ``{output_prefix}.bin/.idx``.

    Args:
        inputs: dataset prefixes or directories (see :func:`dataset_prefixes`).
        output_prefix: the merged dataset's prefix.
        progress: show a bar.

    Returns:
        ``output_prefix``.

    Raises:
        ConfigError: nothing to merge, ``output_prefix`` one of the inputs
            (:func:`check_output_not_an_input`), a dataset given twice
            (:func:`check_inputs_distinct`), inputs holding a merged dataset and datasets it
            was merged from (:func:`check_not_merged_twice`), or ``output_prefix`` names a
            directory or cannot be written (:func:`check_output_prefix`).
    """
    check_output_prefix(output_prefix)
    prefixes = dataset_prefixes(inputs)
    if not prefixes:
        raise ConfigError("nothing to merge. Fix: pass --input PREFIX|DIR [...]")
    check_output_not_an_input(prefixes, output_prefix)
    check_inputs_distinct(prefixes)
    check_not_merged_twice(prefixes)
    stamps = [[os.path.abspath(p), *_stamp(p + ".bin"), *_stamp(p + ".idx")] for p in prefixes]
    why = (
        "its inputs changed since they were merged (sizes or modification times), or were "
        "merged by an older megatron-gamma, which did not record their times"
    )
    unit = UnitOutput(output_prefix, {"merge_of": stamps}, _merged_again(why, os.path.abspath))

    def work():
        _concat(prefixes, unit.temp(""), progress, "merge")
        fingerprint = _merge_fingerprint(prefixes, unit.temp(""), "")
        return [".bin", ".idx", *fingerprint], {"datasets": len(prefixes)}

    _run(unit, work)
    return output_prefix
