"""Streaming input: jsonl, jsonl.gz, jsonl.zst and parquet files, named as files, directories or
globs, read in a fixed order in bounded chunks, with every bad record named by file and line.
A UTF-8 byte-order mark at the start of a jsonl file is stripped and counted
(``byte_order_marks`` in ``stats.json``).

Reading happens in the main process and only moves raw bytes (jsonl) or column values (parquet);
JSON decoding (``orjson``, with the standard library's parser for what orjson refuses, so the
values are the same), UTF-8 validation and key lookup run in the workers (:func:`iter_records`),
so the reader is never the bottleneck. Memory is bounded by one chunk per worker in flight,
whatever the size of the input: a jsonl line is read at most ``max_line_bytes`` at a time
(:func:`line_cap`, from ``--max-document-chars``), and a longer line is not read (an error, or
skipped under ``--on-error skip``), even in a gzip bomb; JSON nested deeper than
:data:`MAX_JSON_DEPTH` is refused: orjson stops at 1,024 levels by itself, and a line it refuses
is measured before the standard library's recursive parser sees it.

Errors (all :class:`InputError`, a ``ValueError``, with a ``kind`` used for the skip counts):

=================  ==========================================================================
kind               raised for
=================  ==========================================================================
no_input           a file, directory or glob that names nothing readable
unsupported        a file whose name does not end in a supported extension
unreadable_file    a file that cannot be opened or whose compressed stream is corrupt
malformed_json     a line that is not a JSON object
invalid_utf8       a line that is not valid UTF-8, or a text holding a lone surrogate (from a
                   ``\ud800``-style JSON escape in a valid UTF-8 line)
line_too_long      a jsonl line longer than the line cap (:func:`line_cap`)
json_too_deep      a line whose JSON nests arrays/objects deeper than :data:`MAX_JSON_DEPTH`
missing_key        a record without one of ``--json-keys`` (or with a null value)
bad_value          a ``--json-keys`` value that is not a string, or an unknown language label
=================  ==========================================================================
"""

from __future__ import annotations

import codecs
import errno
import glob
import gzip
import io
import json
import logging
import os
import re
import shlex
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from megatron_gamma.data import CHUNK_BYTES, CHUNK_DOCS
from megatron_gamma.data.langid import language_label

log = logging.getLogger(__name__)

EXTENSIONS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".jsonl.gz": "gzip",
    ".json.gz": "gzip",
    ".jsonl.zst": "zstd",
    ".json.zst": "zstd",
    ".parquet": "parquet",
}
"""Supported file name endings and their reader."""

ERROR_KINDS = (
    "unreadable_file",
    "malformed_json",
    "invalid_utf8",
    "line_too_long",
    "json_too_deep",
    "missing_key",
    "bad_value",
)
"""Per-record or per-file problems that ``--on-error skip`` counts and skips."""

MAX_MESSAGES = 5
"""Skipped problems whose full message is kept per chunk (all are counted)."""

MAX_JSON_DEPTH = 100
"""Deepest nesting of JSON arrays and objects accepted in a record (a text record needs 1-3)."""

LINE_CAP_SLACK = 1 << 20
"""Bytes a jsonl line may hold besides its texts (other fields), in :func:`line_cap`."""


def line_cap(max_document_chars: int, texts: int = 1) -> int:
    """The longest jsonl line read, in bytes: ``texts`` texts of ``max_document_chars``
    characters each written as 6-byte ``\\uXXXX`` escapes (JSON's longest form), plus
    :data:`LINE_CAP_SLACK` (7 MiB for the default 1,000,000 characters and one text)."""
    return 6 * max_document_chars * texts + LINE_CAP_SLACK


DEFAULT_LINE_CAP = line_cap(1_000_000)
"""The line cap where no ``--max-document-chars`` applies (the flag's default)."""


@dataclass(frozen=True)
class LongLine:
    """Stands in a chunk for a jsonl line longer than the cap (:func:`iter_chunks`), which is
    not read. ``nbytes``: its length; ``cap``: the cap it exceeded."""

    nbytes: int
    cap: int


class InputError(ValueError):
    """A problem with the input, named by file (and line); ``kind`` is one of the table above.

    ``stopped``: for a stream that breaks ('unreadable_file'), where reading stopped:
    ``{"records": complete records read, "byte": uncompressed bytes read}`` (parquet: rows, and
    byte 0); None otherwise."""

    def __init__(self, kind: str, message: str, stopped: dict | None = None):
        super().__init__(message)
        self.kind = kind
        self.stopped = stopped

    def __reduce__(self):
        return InputError, (self.kind, str(self), self.stopped)


_KEEP_RECORDS = re.compile(
    r", or --on-error skip to keep its (\d+ (?:complete lines|rows)) before the break$"
)


def as_skipped(message: str) -> str:
    """An :class:`InputError`'s message as logged once ``--on-error skip`` has skipped it:
    without the advice to pass that flag (a broken stream's or parquet file's says which lines
    or rows were kept)."""
    message = message.removesuffix(", or --on-error skip")
    return _KEEP_RECORDS.sub(r" (its \1 before the break are kept)", message)


def input_format(path: str) -> str | None:
    """The reader for ``path`` ('jsonl', 'gzip', 'zstd', 'parquet'), or None if unsupported."""
    name = path.lower()
    for ext in sorted(EXTENSIONS, key=len, reverse=True):
        if name.endswith(ext):
            return EXTENSIONS[ext]
    return None


TEXT_EXTENSIONS = (".txt", ".text")
"""Plain-text endings, refused with a command that converts one document per line to JSONL."""

TEXT_TO_JSONL = (
    'python -c \'import json, sys; [print(json.dumps({"text": line.rstrip("\\r\\n")}, '
    "ensure_ascii=False)) for line in sys.stdin if line.strip()]'"
)
"""A shell command reading plain text on stdin, writing one ``{"text": LINE}`` record for each
line that is not blank (a CRLF line's ``\\r`` dropped with its newline)."""


def _unsupported(path: str) -> str:
    """Why ``path`` is not read, with the fix: the supported endings, and for plain text a
    command that converts it, one document per line."""
    why = f"input {path!r}: unsupported file type. Fix: use one of {', '.join(EXTENSIONS)}"
    stem, ext = os.path.splitext(path)
    if ext.lower() not in TEXT_EXTENSIONS:
        return why
    return (
        f"{why}; for plain text with one document per line: {TEXT_TO_JSONL} < "
        f"{shlex.quote(path)} > {shlex.quote(stem + '.jsonl')}"
    )


def _no_data_files(folder: str, bare_json: list[str]) -> str:
    """Why the directory ``folder`` gave no input, with the fix; ``bare_json``: its ``.json``
    files, which a directory's expansion skips on purpose."""
    read = "/".join(ext for ext in EXTENSIONS if ext != ".json")
    if not bare_json:
        return (
            f"input directory {folder!r} holds no {read} files. Fix: point --input at the data "
            "files"
        )
    return (
        f"input directory {folder!r} holds no {read} files, only {len(bare_json)} bare .json "
        f"file(s) (e.g. {bare_json[0]!r}), which a directory's expansion skips on purpose: they "
        "are more often configs than data. Fix: name them (--input "
        f"{shlex.join(bare_json[:3])}{' ...' if len(bare_json) > 3 else ''}), or rename them "
        "to .jsonl"
    )


SKIPPED_NAMED = 5
"""Files a directory's expansion skipped that its warning names, per reason (all are counted)."""


def _skipped_in_directory(folder: str, walked: list[str], found: list[str]) -> str:
    """The line naming the files below ``folder`` (``walked``) that its expansion skipped (not in
    ``found``), by reason, paths relative to ``folder``."""
    kept = set(found)
    skipped = [p for p in walked if p not in kept]
    bare = [p for p in skipped if input_format(p) is not None]
    other = [p for p in skipped if input_format(p) is None]

    def names(paths: list[str]) -> str:
        shown = ", ".join(os.path.relpath(p, folder) for p in paths[:SKIPPED_NAMED])
        more = len(paths) - SKIPPED_NAMED
        return shown + (f" and {more} more" if more > 0 else "")

    reasons = []
    if bare:
        why = "bare .json: name such files in --input, or rename them to .jsonl"
        reasons.append(f"{names(bare)} ({why})")
    if other:
        reasons.append(f"{names(other)} (not a supported data file: {', '.join(EXTENSIONS)})")
    return f"skipped {len(skipped)} files in {folder}: {'; '.join(reasons)}"


def expand_inputs(specs: list[str]) -> list[str]:
    """Turn ``--input`` arguments into the ordered list of files to read.

    Each argument is a file, a directory (all supported files below it, recursively, sorted by
    path, except bare ``.json`` files, which are more often configs than data; name those
    explicitly; a warning names the files it skipped and why) or a glob pattern (its matches,
    sorted). Arguments keep their order. The result
    is the same on every machine given the same file tree, which is what makes
    ``--shard-index`` and ``--num-shards`` deterministic.

    Raises:
        InputError: no arguments, an argument matching nothing ('no_input'), a file with an
            unsupported extension ('unsupported') or a file listed twice ('no_input').
    """
    if not specs:
        raise InputError("no_input", "no input given. Fix: pass --input FILE|DIR|GLOB [...]")
    files: list[str] = []
    for spec in specs:
        if os.path.isdir(spec):
            walked = sorted(
                os.path.join(root, name) for root, _, names in os.walk(spec) for name in names
            )
            data = [p for p in walked if input_format(p) is not None]
            found = [p for p in data if not p.lower().endswith(".json")]
            if not found:
                raise InputError("no_input", _no_data_files(spec, data))
            if len(found) < len(walked):
                log.warning("%s", _skipped_in_directory(spec, walked, found))
        elif os.path.exists(spec) or os.path.islink(spec):
            found = [spec]
        else:
            found = sorted(p for p in glob.glob(spec, recursive=True) if not os.path.isdir(p))
            if not found:
                raise InputError(
                    "no_input",
                    f"input {spec!r}: no such file and no glob match. Fix: check the path "
                    "(quote a glob so that megatron-gamma, not the shell, expands it)",
                )
        for path in found:
            if input_format(path) is None:
                raise InputError("unsupported", _unsupported(path))
        files.extend(found)
    seen: set[str] = set()
    for path in files:
        if path in seen:
            raise InputError(
                "no_input", f"input {path!r} is listed twice. Fix: name each file once"
            )
        seen.add(path)
    return files


@dataclass
class Chunk:
    """A run of consecutive records of one file, the unit of work handed to a worker.

    Attributes:
        path: the file.
        first_line: 1-based line (jsonl) or row (parquet) number of ``items[0]``.
        items: raw lines (bytes, jsonl; a :class:`LongLine` for one over the cap) or
            ``{column: value}`` dicts (parquet), in file order.
        raw_bytes: uncompressed bytes these items occupy (for MB/s).
        disk_pos: on-disk bytes of the file read up to the end of this chunk (for the bar).
        byte_order_marks: 1 when a UTF-8 byte-order mark was stripped from the file's first
            line (in this chunk), else 0.
    """

    path: str
    first_line: int
    items: list = field(default_factory=list)
    raw_bytes: int = 0
    disk_pos: int = 0
    byte_order_marks: int = 0


class _GzipStream(io.RawIOBase):
    """Decompressed bytes of a (multi-member) gzip file, inflated by ISA-L (``isal``'s
    ``IGzipFile``, about 3x faster than zlib). Where ISA-L stops on a broken stream (truncated,
    corrupt, trailing garbage), Python's zlib-based ``gzip`` takes over at the same uncompressed
    byte, so the bytes delivered before the break and the error raised are zlib's: ISA-L inflates
    in larger blocks and stops earlier in a truncated file (fewer complete lines), and a file is
    read the same whichever inflater is installed."""

    def __init__(self, raw: io.BufferedIOBase):
        from isal import igzip, isal_zlib

        self._errors = (*_STREAM_ERRORS, isal_zlib.error)
        self._raw, self._pos = raw, 0
        self._f: io.BufferedIOBase = igzip.IGzipFile(fileobj=raw, mode="rb")
        self._zlib = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self._f.read1(len(buffer))  # read1: what inflated before a break is kept
        except self._errors:
            if self._zlib:
                raise
            self._zlib = True
            self._raw.seek(0)
            self._f = gzip.GzipFile(fileobj=self._raw, mode="rb")
            self._f.seek(self._pos)
            data = self._f.read1(len(buffer))
        n = len(data)
        buffer[:n] = data
        self._pos += n
        return n


class _ZstdStream(io.RawIOBase):
    """Decompressed bytes of a (multi-frame) zstd file; raises EOFError when the file ends inside
    a frame (zstandard's own stream reader ends silently there, as if the file were whole)."""

    def __init__(self, raw: io.BufferedIOBase):
        import zstandard

        self._raw, self._new = raw, zstandard.ZstdDecompressor().decompressobj
        self._dobj, self._out = self._new(), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._out:
            data = self._raw.read(1 << 20)
            if not data:
                if not self._dobj.eof and self._started:
                    raise EOFError("zstd stream ends inside a frame (truncated file)")
                return 0
            self._started = True
            while data:
                if self._dobj.eof:
                    self._dobj = self._new()
                self._out += self._dobj.decompress(data)
                data = self._dobj.unused_data if self._dobj.eof else b""
        n = min(len(buffer), len(self._out))
        buffer[:n], self._out = self._out[:n], self._out[n:]
        return n

    _started = False


def _open_binary(path: str, fmt: str) -> tuple[io.BufferedIOBase, io.RawIOBase]:
    """(line-iterable decompressed stream, the raw file under it)."""
    raw = open(path, "rb")
    if fmt == "jsonl":
        return raw, raw
    if fmt == "gzip":
        return io.BufferedReader(_GzipStream(raw), buffer_size=1 << 20), raw
    return io.BufferedReader(_ZstdStream(raw), buffer_size=1 << 20), raw


_STREAM_ERRORS = (OSError, EOFError, zlib.error)


def _zstd_errors() -> tuple:
    try:
        import zstandard
    except ImportError:
        return ()
    return (zstandard.ZstdError,)


def iter_chunks(
    path: str,
    chunk_docs: int = CHUNK_DOCS,
    chunk_bytes: int = CHUNK_BYTES,
    columns: list[str] | None = None,
    max_line_bytes: int = DEFAULT_LINE_CAP,
) -> Iterator[Chunk]:
    """Yield ``path``'s records in order, at most ``chunk_docs`` items or about ``chunk_bytes``
    uncompressed bytes per chunk.

    Args:
        path: a file with a supported extension.
        chunk_docs: records per chunk at most.
        chunk_bytes: uncompressed bytes per chunk at most (a single longer record is its own
            chunk).
        columns: parquet columns to read (the json keys and language key that exist).
        max_line_bytes: a jsonl line longer than this (newline excluded) is read in pieces of
            this size and dropped, a :class:`LongLine` in its place (:func:`iter_records` names
            or counts it), so memory stays bounded whatever the line.

    Raises:
        InputError: 'unreadable_file' when the file cannot be opened or its stream breaks;
            every complete line before the break has been yielded, and ``stopped`` says where.
    """
    fmt = input_format(path)
    if fmt == "parquet":
        yield from _iter_parquet(path, chunk_docs, chunk_bytes, columns)
        return
    errors = _STREAM_ERRORS + _zstd_errors()
    lineno = offset = 0
    chunk = Chunk(path, 1)
    broken = None
    try:
        f, raw = _open_binary(path, fmt)
        with raw, f:
            while line := f.readline(max_line_bytes + 1):
                lineno += 1
                offset += len(line)
                size = len(line)
                if size > max_line_bytes and not line.endswith(b"\n"):
                    while rest := f.readline(max_line_bytes + 1):
                        size += len(rest)
                        if rest.endswith(b"\n"):
                            break
                    offset += size - len(line)
                    line = LongLine(size, max_line_bytes)
                elif lineno == 1 and line.startswith(codecs.BOM_UTF8):
                    line = line[len(codecs.BOM_UTF8) :]  # a file-level mark, not JSON
                    chunk.byte_order_marks = 1
                chunk.items.append(line)
                chunk.raw_bytes += size
                if len(chunk.items) >= chunk_docs or chunk.raw_bytes >= chunk_bytes:
                    chunk.disk_pos = raw.tell()
                    yield chunk
                    chunk = Chunk(path, lineno + 1)
            chunk.disk_pos = os.fstat(raw.fileno()).st_size
    except errors as e:
        broken = InputError(
            "unreadable_file",
            f"{path}: unreadable after line {lineno} (uncompressed byte {offset}) ({e}). Fix: "
            f"re-fetch it, or --on-error skip to keep its {lineno} complete lines before the break",
            {"records": lineno, "byte": offset},
        )
    if chunk.items:  # the complete lines read before a break are kept
        yield chunk
    if broken is not None:
        raise broken


PARQUET_BATCH_ROWS = 64
"""Rows read from a parquet file at a time. A chunk takes rows until it holds ``chunk_docs`` rows
or ``chunk_bytes`` characters of text, so it passes the cap by less than one row, and no more than
one batch is held beside it however long its rows."""


def _iter_parquet(
    path: str, chunk_docs: int, chunk_bytes: int, columns: list[str] | None
) -> Iterator[Chunk]:
    import pyarrow
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pyarrow.ArrowException) as e:
        raise InputError(
            "unreadable_file",
            f"{path}: unreadable parquet file, 0 rows kept ({e}). Fix: re-fetch it",
            {"records": 0, "byte": 0},
        ) from e
    present = set(pf.schema_arrow.names)
    wanted = [c for c in (columns or []) if c in present]
    row = 1
    total_rows, size = max(pf.metadata.num_rows, 1), os.path.getsize(path)
    chunk = Chunk(path, 1)
    batch_rows = min(chunk_docs, PARQUET_BATCH_ROWS)
    broken = None
    try:
        # One row group at a time: a corrupt group loses only itself, never rows of the groups
        # before it that a batch spanning the boundary would take down with it.
        batches = (
            batch
            for group in range(pf.num_row_groups)
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[group], columns=wanted)
        )
        for batch in batches:
            cols = {name: batch.column(name).to_pylist() for name in wanted}
            for i in range(batch.num_rows):
                item = {k: v[i] for k, v in cols.items()}
                chunk.items.append(item)
                chunk.raw_bytes += sum(len(s) for s in item.values() if isinstance(s, str))
                row += 1
                if len(chunk.items) >= chunk_docs or chunk.raw_bytes >= chunk_bytes:
                    chunk.disk_pos = size * (row - 1) // total_rows
                    yield chunk
                    chunk = Chunk(path, row)
        chunk.disk_pos = size
    except (OSError, pyarrow.ArrowException) as e:
        broken = InputError(
            "unreadable_file",
            f"{path}: unreadable after row {row - 1} ({e}). Fix: re-fetch it, or --on-error "
            f"skip to keep its {row - 1} rows before the break",
            {"records": row - 1, "byte": 0},
        )
    if chunk.items:  # the rows read before a break are kept
        yield chunk
    if broken is not None:
        raise broken


def file_size(path: str) -> int:
    """On-disk size of ``path``, or 0 if it cannot be stat'ed (reported when read)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def check_readable(path: str) -> None:
    """Raise InputError('unreadable_file') if ``path`` cannot be opened for reading, with the fix
    for the reason: a symbolic link that leads back to itself (``ELOOP``), or else permissions."""
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        fix = "check permissions"
        if e.errno == errno.ELOOP:
            fix = (
                f"{path} is a symbolic link (to {os.readlink(path)!r}) that leads back to itself, "
                "never to a file: replace it with the file it should stand for, or remove it"
            )
        raise InputError(
            "unreadable_file", f"{path}: cannot be read ({e.strerror}). Fix: {fix}"
        ) from e


@dataclass
class Record:
    """One parsed input record: its line (or row) number and its ``{key: value}`` fields.

    ``plain``: its strings can hold no lone surrogate (parsed by orjson, which refuses them) and,
    when the escapes were scanned (:func:`iter_records`), no C0 control character either (a line
    without a ``\\u00``, ``\\b`` or ``\\f`` escape; JSON strings cannot hold raw control
    characters), so the per-text checks for them can be skipped."""

    line: int
    fields: dict
    plain: bool = False


def iter_records(
    chunk: Chunk,
    on_error: str,
    errors: dict[str, int],
    messages: list[str],
    escapes: bool = True,
) -> Iterator[Record]:
    """Decode a chunk's items into records one at a time (blank jsonl lines are skipped), so that
    a caller checking each record adds its own messages in line order with these.

    Args:
        chunk: from :func:`iter_chunks`.
        on_error: 'stop' raises on the first bad line; 'skip' counts it in ``errors`` (by kind)
            and goes on.
        errors: skip counters, updated in place.
        messages: the first few skipped problems' messages, appended in place.
        escapes: scan each line for the escapes of control characters, so that ``plain`` also
            rules them out; False leaves that to a caller that finds them in the text itself
            (:class:`~megatron_gamma.data.encode.ChunkEncoder`, by tokens).

    Raises:
        InputError: 'line_too_long', 'json_too_deep', 'malformed_json' or 'invalid_utf8',
            naming ``path:line``, when ``on_error='stop'``.
    """
    for offset, item in enumerate(chunk.items):
        line = chunk.first_line + offset
        if isinstance(item, dict):
            yield Record(line, item)
            continue
        try:
            fields, plain = _parse_line(chunk.path, line, item, escapes)
        except InputError as e:
            if on_error != "skip":
                raise
            errors[e.kind] = errors.get(e.kind, 0) + 1
            if len(messages) < MAX_MESSAGES:
                messages.append(str(e))
            continue
        if fields is not None:
            yield Record(line, fields, plain)


def plain_records(chunk: Chunk, keys: Sequence[str], escapes: bool = True) -> list[dict] | None:
    """The fields of every line of ``chunk`` in one pass, when each line is a record that
    :func:`iter_records` would yield ``plain`` with nothing to check: a JSON object that orjson
    parses, with no array or object among its values and a string at every one of ``keys``,
    and, with ``escapes``, no escape of a control character in the chunk. Otherwise None, and
    the caller takes the chunk record by record through :func:`iter_records`, which finds the
    line that is not such a record and names or counts it; the fields it yields for the other
    lines are these.

    Args:
        chunk: jsonl lines (a parquet chunk, or one holding a :class:`LongLine`, gives None).
        keys: the fields that must hold strings (``--json-keys``).
        escapes: as :func:`iter_records` takes it.

    Returns:
        ``{key: value}`` per line, in order, or None.
    """
    try:
        records = list(map(orjson.loads, chunk.items))  # TypeError: a dict or LongLine item
    except (orjson.JSONDecodeError, TypeError):
        return None
    for fields in records:
        if type(fields) is not dict or _holds_containers(fields):
            return None
        for key in keys:
            if type(fields.get(key)) is not str:
                return None
    # A line's escapes end with it: only the file's last line lacks its newline.
    if escapes and _CONTROL_ESCAPE.search(b"".join(chunk.items)) is not None:
        return None
    return records


_CONTROL_ESCAPE = re.compile(rb"\\(?:u00|b|f)")
"""JSON escapes that can put a C0 control character in a string (also matched after an escaped
backslash, ``\\\\b``, which only costs a needless check)."""


def _nested_too_deep(item: bytes) -> bool:
    """True if the JSON of ``item`` nests arrays and objects deeper than MAX_JSON_DEPTH
    (brackets inside strings do not count). Vectorized: a few arrays of the line's length."""
    if item.count(b"[") + item.count(b"{") <= MAX_JSON_DEPTH:
        return False
    a = np.frombuffer(item, np.uint8)
    pos = np.arange(len(a), dtype=np.int32)
    last_plain = np.maximum.accumulate(np.where(a != 0x5C, pos, -1))  # last non-backslash
    quotes = np.flatnonzero(a == 0x22)
    before = np.where(quotes > 0, last_plain[np.maximum(quotes - 1, 0)], -1)
    toggles = np.zeros(len(a), np.int8)
    toggles[quotes[(quotes - 1 - before) % 2 == 0]] = 1  # unescaped quotes open/close strings
    inside = np.cumsum(toggles, dtype=np.int32) & 1
    step = (np.isin(a, (0x5B, 0x7B)).astype(np.int32) - np.isin(a, (0x5D, 0x7D))) * (1 - inside)
    return int(np.cumsum(step).max()) > MAX_JSON_DEPTH


def _parse_line(
    path: str, line: int, item: bytes | LongLine, escapes: bool
) -> tuple[dict | None, bool]:
    """One jsonl line's object (None for a blank line) and whether it is plain (:class:`Record`;
    ``escapes`` as :func:`iter_records` takes it).

    Raises:
        InputError: 'line_too_long', 'json_too_deep', 'invalid_utf8' or 'malformed_json'.
    """
    if isinstance(item, LongLine):
        raise InputError(
            "line_too_long",
            f"{path}:{line}: line of {item.nbytes} bytes, longer than the {item.cap}-byte cap "
            "derived from --max-document-chars (6 bytes per character per --json-keys text, "
            "plus 1 MiB), so it is not read. Fix: raise --max-document-chars, or --on-error skip",
        )
    try:
        fields = orjson.loads(item)
    except orjson.JSONDecodeError:  # refused: the standard parser decides (and explains)
        fields, plain = _parse_refused(path, line, item)
        if fields is None:
            return None, False
    else:
        # orjson nests up to 1024 levels: only a record holding an array or object can be
        # deeper than MAX_JSON_DEPTH, so only such a record's brackets are counted.
        if _holds_containers(fields) and _nested_too_deep(item):
            raise _too_deep(path, line)
        plain = not escapes or _CONTROL_ESCAPE.search(item) is None
    if not isinstance(fields, dict):
        raise InputError(
            "malformed_json",
            f"{path}:{line}: malformed JSON ({_article(type(fields).__name__)}, not an object). "
            "Fix: one JSON object per line, or --on-error skip",
        )
    return fields, plain


def _parse_refused(path: str, line: int, item: bytes) -> tuple[object, bool]:
    """A line orjson refused, parsed by the standard library's parser (which takes a lone
    surrogate, NaN), or the error that parser explains: (value, False), or (None, False) for a
    blank line.

    Raises:
        InputError: 'json_too_deep', 'invalid_utf8' or 'malformed_json'.
    """
    if _nested_too_deep(item):
        raise _too_deep(path, line)
    try:
        text = item.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            "invalid_utf8",
            f"{path}:{line}: invalid UTF-8 (byte 0x{item[e.start]:02x} at byte "
            f"{e.start + 1} of the line). Fix: re-encode the file as UTF-8, or --on-error skip",
        ) from None
    if not text.strip():
        return None, False
    try:  # without the line's end, which an unterminated string would report as a control char
        return json.loads(text.rstrip("\r\n")), False
    except json.JSONDecodeError as e:
        raise InputError(
            "malformed_json",
            f"{path}:{line}: malformed JSON ({e.msg.removesuffix(' at')} at column "
            f"{e.colno}). Fix: one JSON object per line, or --on-error skip",
        ) from None


_CONTAINERS = frozenset((dict, list))


def _holds_containers(value: object) -> bool:
    """True for an array, or an object with an array or object among its values (JSON parsers
    give exactly these types)."""
    if type(value) is dict:
        return not _CONTAINERS.isdisjoint(map(type, value.values()))
    return type(value) is list


def _too_deep(path: str, line: int) -> InputError:
    return InputError(
        "json_too_deep",
        f"{path}:{line}: JSON nested deeper than {MAX_JSON_DEPTH} arrays/objects. Fix: "
        "flatten the record, or --on-error skip",
    )


def _article(noun: str) -> str:
    """``noun`` with its indefinite article: 'an int', 'a list'."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def record_text(path: str, record: Record, key: str) -> str:
    """``record.fields[key]`` as a string.

    Raises:
        InputError: 'missing_key' (absent, or null: said so) or 'bad_value' (not a string),
            naming ``path:line`` and the key.
    """
    value = record.fields.get(key)
    if value is None and key in record.fields:
        raise InputError(
            "missing_key",
            f"{path}:{record.line}: {key!r} is null, not a string: the record has no text. "
            "Fix: give it a text or drop it, or --on-error skip",
        )
    if value is None:
        have = ", ".join(sorted(k for k, v in record.fields.items() if v is not None))
        raise InputError(
            "missing_key",
            f"{path}:{record.line}: no key {key!r} (keys: {have or 'none'}). "
            "Fix: pass the right --json-keys, or --on-error skip",
        )
    if not isinstance(value, str):
        raise InputError(
            "bad_value",
            f"{path}:{record.line}: {key!r} is {_article(type(value).__name__)}, not a string. "
            "Fix: store the text as a JSON string, or --on-error skip",
        )
    return value


def unused_lang_key(lang_key: str) -> str:
    """The warning for a ``--lang-key`` that no record read had: a misspelt field name would
    otherwise tag every document by script unnoticed."""
    return (
        f"--lang-key {lang_key!r}: no record read had that field (or it was null in every "
        "one), so every document was tagged by script. Fix: check the field's name, or drop "
        "--lang-key to tag by script"
    )


def record_language(path: str, record: Record, lang_key: str | None) -> str | None:
    """The language tag of ``record``'s ``lang_key`` field ('zh', 'en', 'mixed'), or None when
    ``lang_key`` is None or the field is absent or null (the script rule then applies).

    Raises:
        InputError: 'bad_value' for a label other than zh*, en*, cmn* or mixed.
    """
    if lang_key is None or record.fields.get(lang_key) is None:
        return None
    label = language_label(record.fields[lang_key])
    if label is None:
        raise InputError(
            "bad_value",
            f"{path}:{record.line}: {lang_key}={record.fields[lang_key]!r} is not zh*, en* or "
            "mixed. Fix: drop --lang-key to tag by script, or --on-error skip",
        )
    return label
