"""jsonl / jsonl.gz / jsonl.zst / parquet -> Megatron indexed binaries (.bin/.idx), streaming,
in parallel, sharded, resumable.

Pipeline: the main process reads the input files in order (:mod:`.readers`) and cuts them into
bounded chunks of raw records, which are decoded, normalized, tagged, filtered, split and tokenized
(:mod:`.encode`): with ``workers`` = N > 1, by the main process and N - 1 forked worker processes
(:mod:`.workers`: a chunk goes to a worker with room, else the main process encodes it, so N
processes share N cores); the main process writes the results in input order (:mod:`.indexed`: the
``.bin`` chunk by chunk, the ``.idx`` at the end by megatron-core's
``IndexedDatasetBuilder.finalize``). At most ``4 x workers`` chunks are in flight, so memory does
not grow with the input. The tokenizer backend (``gigatoken`` or HF ``tokenizers``) is chosen once
per call, when the first shard that is not complete starts, by
:func:`~megatron_gamma.data.token_backend.resolve_backend` on the first texts of up to
:data:`SAMPLE_FILES` input files, so every shard and worker uses the same one, loaded once (the
check's); a call that finds every shard complete loads no tokenizer backend. Each document is
handled on its own, so the bytes written do not depend on the worker count, and the file list is
split into contiguous shards (:mod:`.sharding`), so merging shard outputs in order gives the bytes
of one run.

Layout (Megatron-LM's names): each output is ``{output_prefix}_{key}_{level}`` (``level`` is
``document``, or ``sentence`` with sentence splitting), or ``{output_prefix}_{lang}_{key}_{level}``
with one output per language; ``{output_prefix}.stats.json`` holds the counts
(:mod:`.stats`) and ``{output_prefix}.done.json`` marks the work complete (:mod:`.resume`).
Documents end with the EOD token (``append_eod``, on by default unlike Megatron-LM's flag,
because GPT pretraining needs document boundaries).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest

from tqdm import tqdm

from megatron_gamma.atomic import output_dirs
from megatron_gamma.config import ConfigError, DataConfig
from megatron_gamma.data import CHUNK_DOCS
from megatron_gamma.data.encode import ChunkEncoder, EncodeOptions, filtered_texts
from megatron_gamma.data.indexed import ChunkWriter, token_dtype
from megatron_gamma.data.merge import check_sibling_shards, merge_shards
from megatron_gamma.data.readers import (
    MAX_MESSAGES,
    Chunk,
    InputError,
    as_skipped,
    check_readable,
    expand_inputs,
    file_size,
    iter_chunks,
    line_cap,
    unused_lang_key,
)
from megatron_gamma.data.resume import UnitOutput, check_output_prefix
from megatron_gamma.data.sharding import check_shards, shard_files, shard_prefix
from megatron_gamma.data.stats import add_counts, read_json, stats_document, write_json
from megatron_gamma.data.token_backend import (
    BACKENDS,
    MAX_SAMPLE_CHARS,
    GigatokenBackend,
    HFBackend,
    make_backend,
    resolve_backend,
)
from megatron_gamma.data.token_stats import TokenTextStats
from megatron_gamma.data.tokenizer import BilingualTokenizer
from megatron_gamma.data.tokenizer_fingerprint import SUFFIX as FINGERPRINT
from megatron_gamma.data.tokenizer_fingerprint import fingerprint
from megatron_gamma.data.tokenizer_types import load_tokenizer
from megatron_gamma.data.workers import SharedMap

log = logging.getLogger(__name__)
SAMPLE_FILES = 8
SAMPLE_CHUNK = 8  # records per read while taking a file's share of the check's sample


@dataclass
class PreprocessStats:
    """What a preprocessing run (or one shard of it) wrote.

    Attributes:
        prefix: the first output's dataset prefix (the only one for the default single output).
        documents, tokens, characters: totals over all outputs (tokens include EOD).
        seconds: wall time of this call.
        prefixes: ``{output name: dataset prefix}``.
        stats: the ``.stats.json`` document (:mod:`megatron_gamma.data.stats`).
        skipped: shards found complete and not redone.
        units: shards this call covered (1 without sharding).
        stats_path: the ``.stats.json`` written.
        tokenizer_backend: 'gigatoken' or 'hf', with the reason it was chosen (:data:`UNCHECKED`
            when every shard was complete).
    """

    prefix: str
    documents: int
    tokens: int
    characters: int
    seconds: float
    prefixes: dict[str, str]
    stats: dict
    skipped: int = 0
    units: int = 1
    stats_path: str = ""
    tokenizer_backend: str = ""


def _read_chunks(
    files: list[str],
    options: EncodeOptions,
    chunk_size: int,
    counts: dict,
    messages: list[str],
) -> Iterator[Chunk]:
    columns = list(options.json_keys) + ([options.lang_key] if options.lang_key else [])
    cap = line_cap(options.filters.max_document_chars, len(options.json_keys))
    for path in files:
        try:
            check_readable(path)
            yield from iter_chunks(path, chunk_size, columns=columns, max_line_bytes=cap)
        except InputError as e:
            if options.on_error != "skip":
                raise
            errors = counts.setdefault("errors", {})
            errors[e.kind] = errors.get(e.kind, 0) + 1
            if e.stopped is not None:
                counts.setdefault("unreadable_files", {})[path] = dict(e.stopped)
            messages.append(str(e))


FINGERPRINT_FORMAT = 2
"""Format of a unit's fingerprint: 2 records each input's path, size and modification time; 1
(before) its path and size only."""


def _input_entry(path: str) -> list:
    """[absolute path, size, modification time in ns] of an input file ([path, 0, 0] if it cannot
    be stat'ed: that is reported when it is read). Size and time, as make and rsync compare,
    not a hash: hashing a trillion-token input on every rerun would take as long as reading it."""
    try:
        st = os.stat(path)
    except OSError:
        return [os.path.abspath(path), 0, 0]
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]


def _fingerprint(
    files: list[str], options: EncodeOptions, tok: BilingualTokenizer, shard: tuple[int, int]
) -> dict:
    fp = {
        "format": FINGERPRINT_FORMAT,
        "inputs": [_input_entry(p) for p in files],
        "options": dataclasses.asdict(options),
        "tokenizer_sha256": tok.sha256,
        "shard": list(shard),
    }
    return json.loads(json.dumps(fp))  # tuples -> lists, as read back from the marker


def _reconcile(recorded: dict, current: dict) -> tuple[dict, str | None]:
    """Which recorded fingerprint counts as ``current``'s work
    (:data:`~megatron_gamma.data.resume.Reconcile`):

    * one with ``on_error`` 'stop' for a run with 'skip': a unit finished under 'stop' met no
      bad record, so its bytes are those 'skip' writes (not the reverse: a unit finished under
      'skip' may have skipped records);
    * a format-1 marker, which recorded no modification times, when its inputs' paths and sizes
      and everything else match; its unit is redone (an input edited in place since would
      otherwise go unnoticed).
    """
    want = current
    was = recorded.get("options", {}).get("on_error")
    if was == "stop" and current["options"]["on_error"] == "skip":
        want = dict(current, options=dict(current["options"], on_error="stop"))
    if recorded.get("format") != 1:
        return want, None
    want = dict(want, format=1, inputs=[entry[:2] for entry in current["inputs"]])
    return want, (
        "done-marker of an older megatron-gamma, which did not record the inputs' modification "
        "times, so an input edited in place since cannot be told apart"
    )


UNCHECKED = "not chosen: every output was complete, nothing was tokenized"
"""``PreprocessStats.tokenizer_backend`` of a call that tokenized nothing."""


class _Backend:
    """The run's tokenizer backend, chosen (:func:`_choose_backend`) on first use."""

    def __init__(self, *choice):
        self._choice, self.reason, self._backend = choice, UNCHECKED, None

    def get(self) -> HFBackend | GigatokenBackend:
        if self._backend is None:
            self._backend, self.reason = _choose_backend(*self._choice)
        return self._backend


def _choose_backend(
    files: list[str], tok: BilingualTokenizer, options: EncodeOptions, requested: str
) -> tuple[HFBackend | GigatokenBackend, str]:
    """Resolve ``requested`` on the first texts of up to SAMPLE_FILES files, an equal share of
    MAX_SAMPLE_CHARS from each, interleaved (so the size cap keeps every file); log the choice.

    Returns:
        The chosen backend, loaded (the check's own where it loaded one), and the reason of
        :func:`~megatron_gamma.data.token_backend.resolve_backend`.
    """
    per_file: list[list[str]] = []
    head = files[:SAMPLE_FILES]
    for path in head if requested != "hf" else []:
        texts: list[str] = []
        chars = 0
        for chunk in _read_chunks([path], options, SAMPLE_CHUNK, {}, []):
            new = [text for _, _, text in filtered_texts(chunk, options, {}, [])]
            texts += new
            chars += sum(map(len, new))
            if chars >= MAX_SAMPLE_CHARS // len(head):
                break
        per_file.append(texts)
    sample = [t for group in zip_longest(*per_file) for t in group if t is not None]
    loaded: dict = {}
    plain = tok.special_texts
    hf = tok.hf_tokenizer
    backend, reason = resolve_backend(requested, tok.path, sample, loaded, plain, hf)
    (log.info if backend == "gigatoken" or requested == "hf" else log.warning)(
        "tokenizer backend %s", reason
    )
    return loaded.get(backend) or make_backend(backend, tok.path, plain, hf), reason


def _result(
    base: str, doc: dict, seconds: float, skipped: int, backend: str, units: int = 1
) -> PreprocessStats:
    # the prefixes as given now (``base``): the stats file records them as given when written
    prefixes = {name: f"{base}_{name}" for name in doc["outputs"]}
    return PreprocessStats(
        prefix=next(iter(prefixes.values())),
        documents=sum(o["documents"] for o in doc["outputs"].values()),
        tokens=sum(o["tokens"] for o in doc["outputs"].values()),
        characters=sum(lang["characters"] for lang in doc["languages"].values()),
        seconds=seconds,
        prefixes=prefixes,
        stats=doc,
        skipped=skipped,
        units=units,
        stats_path=f"{base}.stats.json",
        tokenizer_backend=backend,
    )


_DROP_FLAGS = {
    "empty": "the text is empty or blank: check --json-keys names the text field",
    "min_chars": "lower --min-chars",
    "min_tokens": "lower --min-tokens",
    "max_symbol_ratio": "raise --max-symbol-ratio",
}
"""The fix for each document filter that dropped every document (filters.DROP_REASONS)."""


def _empty_fixes(dropped: dict, errors: dict) -> list[str]:
    """The fixes for a run that wrote nothing, one per cause that occurred, most common first:
    a missing key (wrong ``--json-keys``), bad records, or a filter that dropped the rest."""
    key = (
        "pass the field that holds the text as --json-keys (the skipped records' messages list "
        "each record's keys)"
    )
    repair = "repair the input (the skipped records' messages name each bad line)"
    fixes = [key if kind == "missing_key" else repair for kind in _most_first(errors)]
    return list(dict.fromkeys(fixes + [_DROP_FLAGS[r] for r in _most_first(dropped)]))


def _most_first(counts: dict) -> list[str]:
    """The keys of ``counts``, the largest count first (ties by name)."""
    return sorted(counts, key=lambda k: (-counts[k], k))


def _empty_error(files: list[str], counts: dict) -> ValueError:
    dropped = {}
    for lang in counts.get("languages", {}).values():
        add_counts(dropped, lang.get("dropped", {}))
    errors = {k: v for k, v in counts.get("errors", {}).items() if v}
    what = f"{len(files)} input file(s) starting with {files[0]!r}"
    if dropped or errors:
        detail = ", ".join(f"{k}: {v}" for k, v in sorted((dropped | errors).items()))
        return ValueError(
            f"no documents to write: every record of {what} was dropped or skipped ({detail}). "
            f"Fix: {'; '.join(_empty_fixes(dropped, errors))}"
        )
    return ValueError(f"no documents to write: {what} hold no records. Fix: give non-empty input")


def _run_unit(
    files: list[str],
    base: str,
    tok: BilingualTokenizer,
    options: EncodeOptions,
    shard: tuple[int, int],
    workers: int,
    chunk_size: int,
    progress: bool,
    log_interval: int,
    backend: _Backend,
    seen: dict,
    tok_fingerprint: dict,
) -> tuple[dict, bool]:
    """Preprocess ``files`` into the outputs under ``base``; return (stats doc, was skipped).

    Progress is the bar on a terminal; without it (``progress`` False, or stderr not a terminal:
    a SLURM log, nohup, CI) a line is logged each time the documents written pass a multiple of
    ``log_interval``, after the chunk that passes it (:func:`_progress_line`). ``seen`` counts,
    over the units this call writes, ``units`` and ``lang_key_records``. ``tok_fingerprint``
    (``fingerprint(tok)``) is written beside each output."""
    unit = UnitOutput(base, _fingerprint(files, options, tok, shard), _reconcile)
    with unit.locked():
        if unit.completed() is not None:
            log.info("%s: complete (done-marker verified), skipped", base)
            return read_json(unit.stats), True
        chosen = backend.get()  # before begin(): a refused backend leaves the unit as it was
        unit.begin()
        dtype = token_dtype(tok.vocab_size)
        counts: dict = {}
        messages: list[str] = []
        writers: dict[str, ChunkWriter] = {}
        sizes = [file_size(p) for p in files]
        starts = {p: sum(sizes[:i]) for i, p in enumerate(files)}
        desc = "preprocess" if shard[1] == 1 else f"shard {shard[0]}/{shard[1]}"
        bar = tqdm(
            total=sum(sizes), unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
            disable=None if progress else True,
        )  # fmt: skip
        who = f"shard {shard[0]}/{shard[1]}: " if shard[1] > 1 else ""
        env = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker
        # The objects of the imports (torch, for the token statistics kernel) leave the
        # collector's reach while chunks are encoded: a full collection over the ~0.5M of torch
        # and megatron-core together cost ~0.3 CPU-s (measured when both were imported here).
        gc.freeze()
        try:
            chunks = _read_chunks(files, options, chunk_size, counts, messages)
            stats = TokenTextStats.for_backend(chosen)
            encoder = ChunkEncoder(chosen, options, dtype, tok.eod, stats)
            start, raw, docs, tokens, logged = time.time(), 0, 0, 0, 0
            with SharedMap(workers, encoder) as pool:
                for r in pool.map(chunks, 4 * workers):
                    for name, out in r.outputs.items():
                        if name not in writers:
                            writers[name] = ChunkWriter(unit.temp(f"_{name}"), tok.vocab_size)
                        writers[name].add(out.tokens, out.sequence_lengths, out.document_sequences)
                        docs += len(out.document_sequences)
                        tokens += len(out.tokens)
                    add_counts(counts, r.counts)
                    messages += r.messages
                    raw += r.raw_bytes
                    bar.update(starts[r.path] + r.disk_pos - bar.n)
                    dt = max(time.time() - start, 1e-9)
                    bar.set_postfix_str(
                        f"{docs / dt:.0f} docs/s, {raw / dt / 1e6:.1f} MB/s uncompressed, "
                        f"{tokens / dt:.0f} tok/s",
                        refresh=False,
                    )
                    if bar.disable and docs // log_interval > logged // log_interval:
                        logged = docs
                        log.info("%s%s", who, _progress_line(docs, tokens, raw, dt))
            for msg in messages[: 4 * MAX_MESSAGES]:
                log.warning("skipped: %s", as_skipped(msg))
            if not writers:
                raise _empty_error(files, counts)
            add_counts(seen, {"units": 1, "lang_key_records": counts.get("lang_key_records", 0)})
            for writer in writers.values():
                writer.finalize()
            doc = stats_document(base, counts)
            write_json(unit.temp(".stats.json"), doc)
            for name in writers:
                write_json(unit.temp(f"_{name}{FINGERPRINT}"), tok_fingerprint)
            suffixes = [
                f"_{n}{ext}" for n in sorted(writers) for ext in (".bin", ".idx", FINGERPRINT)
            ]
            totals = {"documents": docs, "tokens": tokens}
            hashed = {f"_{n}.bin": writer.bin_sha256 for n, writer in writers.items()}
            unit.commit(suffixes + [".stats.json"], totals, hashed)
            return doc, False
        except BaseException:
            for writer in writers.values():
                writer.abort()
            unit.abort()
            raise
        finally:
            gc.unfreeze()
            bar.close()
            if env is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = env


def _progress_line(docs: int, tokens: int, raw: int, seconds: float) -> str:
    """``Processed N documents (X docs/s, Y MB/s), T tokens (Z tok/s), S s elapsed``: Megatron-LM's
    progress line (its ``tools/preprocess_data.py``, every ``--log-interval`` documents) with the
    tokens and the time; MB are of uncompressed input (1 MB = 10^6 bytes)."""
    return (
        f"Processed {docs} documents ({docs / seconds:.0f} docs/s, "
        f"{raw / seconds / 1e6:.1f} MB/s), {tokens} tokens ({tokens / seconds:.0f} tok/s), "
        f"{seconds:.1f} s elapsed"
    )


def check_run_settings(
    workers: int, chunk_size: int, log_interval: int, tokenizer_backend: str
) -> None:
    """The settings :func:`preprocess` checks first, before any input is read.

    Raises:
        ValueError: ``workers``, ``chunk_size`` or ``log_interval`` below 1.
        ConfigError: an unknown ``tokenizer_backend``.
    """
    if workers < 1:
        raise ValueError(f"workers={workers}: must be >= 1. Fix: --workers 1")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size}: must be >= 1. Fix: e.g. {CHUNK_DOCS}")
    if log_interval < 1:
        raise ValueError(
            f"log_interval={log_interval}: must be >= 1 (documents between progress lines). "
            "Fix: e.g. --log-interval 1000 (the default)"
        )
    if tokenizer_backend not in BACKENDS:
        raise ConfigError(
            f"tokenizer_backend={tokenizer_backend!r}: unknown. Fix: one of {', '.join(BACKENDS)}"
        )


def preprocess(
    inputs: list[str],
    tokenizer_path: str | None,
    output_prefix: str,
    workers: int = 1,
    json_key: str = "text",
    chunk_size: int = CHUNK_DOCS,
    progress: bool = True,
    options: EncodeOptions | None = None,
    shard_index: int | None = None,
    num_shards: int = 1,
    tokenizer_backend: str = "auto",
    tokenizer_type: str = "HuggingFaceTokenizer",
    vocab_file: str | None = None,
    merge_file: str | None = None,
    log_interval: int = 1000,
) -> PreprocessStats:
    """Tokenize the input into Megatron indexed datasets (module docstring).

    Args:
        inputs: files, directories or globs (:func:`~megatron_gamma.data.readers.expand_inputs`).
        tokenizer_path: tokenizer.json with an EOD token, or a directory holding one (with
            ``tokenizer_type`` 'HuggingFaceTokenizer'; None for GPT-2 BPE).
        output_prefix: where the outputs go (see the layout above).
        workers: processes that encode (one core each): the main process and ``workers - 1``
            worker processes.
        json_key: the text field, when ``options`` is None.
        chunk_size: records per work item.
        progress: show a bar (bytes, with docs/s, MB/s and tok/s) where stderr is a terminal;
            without it, progress lines are logged instead (``log_interval``).
        options: text handling, filters and outputs (default: ``json_keys=(json_key,)``).
        shard_index: with ``num_shards > 1``, process only this shard (a SLURM array task) into
            ``{output_prefix}-shard{i:05d}-of-{n:05d}``; None runs every shard in turn and then
            merges them into ``output_prefix``.
        num_shards: split the file list into this many contiguous shards.
        tokenizer_backend: 'auto' (gigatoken when it gives HF tokenizers' ids on a sample of
            the input, else hf, saying why), 'gigatoken' (required) or 'hf'
            (:mod:`megatron_gamma.data.token_backend`).
        tokenizer_type, vocab_file, merge_file: Megatron-LM's tokenizer flags
            (:mod:`megatron_gamma.data.tokenizer_types`); GPT-2 BPE's tokenizer.json is written
            into the output prefix's directory.
        log_interval: without a bar, log a progress line every this many documents written
            (Megatron-LM's ``--log-interval``; per shard).

    Each output gets its tokenizer's fingerprint beside it
    (:mod:`megatron_gamma.data.tokenizer_fingerprint`), which ``pretrain`` checks.

    Returns:
        Counts and output prefixes (of the shard when ``shard_index`` is given).

    Raises:
        InputError: a missing input, or (with ``on_error='stop'``) a bad record or unreadable
            file, named by file and line (a ``ValueError``).
        ConfigError: bad shard flags, an output prefix that names a directory or cannot be
            written (:func:`~megatron_gamma.data.resume.check_output_prefix`) or holds a run
            with other settings, finished shards of the same sharded run made with another
            tokenizer (:func:`~megatron_gamma.data.merge.check_sibling_shards`, before any
            tokenization), an unknown ``tokenizer_backend``, 'gigatoken' when it cannot
            give HF's ids, a missing tokenizer file, or tokenizer flags that do not fit the
            tokenizer type.
        ValueError: no document to write, ``workers < 1``, ``chunk_size < 1`` or
            ``log_interval < 1``.
    """
    check_run_settings(workers, chunk_size, log_interval, tokenizer_backend)
    cores = len(os.sched_getaffinity(0))
    if workers > cores:
        log.warning(
            "--workers %d: more than the %d core(s) this process may run on; the encoding "
            "processes will share them, each with its own tokenizer in memory, for no gain in "
            "speed. Fix: --workers %d",
            workers,
            cores,
            cores,
        )
    check_output_prefix(output_prefix)
    options = options or EncodeOptions(json_keys=(json_key,))
    start = time.time()
    files = expand_inputs(inputs)
    check_shards(len(files), shard_index, num_shards)
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    tokenizer = DataConfig(
        tokenizer_type=tokenizer_type,
        tokenizer_model=tokenizer_path,
        vocab_file=vocab_file,
        merge_file=merge_file,
    )
    with output_dirs(out_dir):
        tok = load_tokenizer(tokenizer, out_dir)
        # Before any unit: its canonical digest parses the whole tokenizer.json (+70 MiB for a
        # moment with a 100k vocabulary), best done while little else is resident.
        tok_fingerprint = fingerprint(tok)
        if num_shards > 1:
            check_sibling_shards(output_prefix, num_shards, shard_index, tok_fingerprint)
        backend = _Backend(files, tok, options, tokenizer_backend)
        seen: dict = {}
        run = {"tok": tok, "options": options, "workers": workers, "chunk_size": chunk_size}
        run["log_interval"] = log_interval
        run |= {"backend": backend, "seen": seen, "progress": progress}
        run["tok_fingerprint"] = tok_fingerprint
        if num_shards == 1 or shard_index is not None:
            i = shard_index or 0
            base = shard_prefix(output_prefix, i, num_shards)
            part = shard_files(files, i, num_shards)
            doc, skipped = _run_unit(part, base, shard=(i, num_shards), **run)
            _check_lang_key(options, seen)
            return _result(base, doc, time.time() - start, int(skipped), backend.reason)
        skipped = 0
        for i in range(num_shards):
            base = shard_prefix(output_prefix, i, num_shards)
            part = shard_files(files, i, num_shards)
            skipped += _run_unit(part, base, shard=(i, num_shards), **run)[1]
        _check_lang_key(options, seen)
        doc = merge_shards(output_prefix, num_shards, progress=progress)
        return _result(output_prefix, doc, time.time() - start, skipped, backend.reason, num_shards)


def _check_lang_key(options: EncodeOptions, seen: dict) -> None:
    """Warn, once per call, when ``options.lang_key`` is set and no record of the units written
    had that field (a misspelt name silently tags by script)."""
    if options.lang_key and seen.get("units") and not seen.get("lang_key_records"):
        log.warning("%s", unused_lang_key(options.lang_key))


def format_summary(result: PreprocessStats) -> str:
    """A multi-line human summary of a run: outputs, per-language counts, drops, documents cut
    to ``--max-document-chars`` and control characters removed (where any), errors, speed
    (tokens per second only when every shard was written by this call)."""
    doc = result.stats
    lines = []
    done = "already complete, nothing redone:" if result.skipped == result.units else "wrote"
    for o in doc["outputs"].values():
        lines.append(
            f"{done} {o['prefix']}.bin/.idx: {o['documents']} documents, {o['sequences']} "
            f"sequences, {o['tokens']} tokens"
        )
    for lang, c in doc["languages"].items():
        dropped = ", ".join(f"{k} {v}" for k, v in c["dropped"].items() if v) or "none"
        line = (
            f"  {lang}: {c['documents']} documents, {c['tokens']} tokens, {c['characters']} "
            f"characters; dropped: {dropped}"
        )
        if c["truncated"]:
            line += f"; truncated to --max-document-chars: {c['truncated']}"
        if c["control_characters"]:
            line += f"; control characters removed: {c['control_characters']}"
        lines.append(line)
    errors = ", ".join(f"{k} {v}" for k, v in doc["errors"].items() if v)
    if errors:
        lines.append(f"  skipped bad input: {errors}")
    if result.tokenizer_backend:
        lines.append(f"  tokenizer backend {result.tokenizer_backend}")
    speed = f"{result.tokens / max(result.seconds, 1e-9):.0f} tokens/s; "
    if result.skipped:
        lines.append(f"  {result.skipped} of {result.units} shard(s) were already complete")
        speed = ""
    lines.append(f"  {result.seconds:.1f}s, {speed}stats and blend: {result.stats_path}")
    return "\n".join(lines)
