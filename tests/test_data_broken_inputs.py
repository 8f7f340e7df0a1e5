"""Broken inputs under ``--on-error skip``: every complete record before a break is written, and
what could not be read is counted with where reading stopped.

The expected record counts come from an independent reader (zlib / zstandard incremental
decoders that keep what decodes before the cut, pyarrow row-group metadata), never from the code
under test.
"""

import gzip
import io
import json
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import DEMO_TOKENIZER

from megatron_gamma.data.encode import EncodeOptions
from megatron_gamma.data.preprocess import preprocess
from megatron_gamma.data.stats import read_json

TEXTS = [f"Record number {i} says the quick brown fox jumps over the lazy dog." for i in range(400)]
LINES = b"".join(json.dumps({"text": t}).encode() + b"\n" for t in TEXTS)


def _complete_lines(decoded: bytes) -> int:
    return decoded.count(b"\n")


def _gzip_cut(path) -> int:
    blob = gzip.compress(LINES, mtime=0)
    cut = blob[: len(blob) * 3 // 5]
    path.write_bytes(cut)
    return _complete_lines(zlib.decompressobj(wbits=31).decompress(cut))


def _zstd_cut(path) -> int:
    """One zstd frame of many blocks (flushed every 20 lines, as streaming writers do)."""
    out = io.BytesIO()
    writer = zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False)
    lines = LINES.splitlines(keepends=True)
    for i in range(0, len(lines), 20):
        writer.write(b"".join(lines[i : i + 20]))
        writer.flush(zstandard.FLUSH_BLOCK)
    writer.close()
    blob = out.getvalue()
    cut = blob[: len(blob) * 3 // 5]
    path.write_bytes(cut)
    reader = zstandard.ZstdDecompressor().decompressobj()
    return _complete_lines(reader.decompress(cut))


def _parquet_cut(path) -> int:
    """Three row groups of 150/150/100 rows; the last group's data pages overwritten."""
    table = pa.table({"text": TEXTS})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=150, compression="zstd")
    blob = bytearray(buf.getvalue())
    meta = pq.ParquetFile(io.BytesIO(bytes(blob))).metadata
    last = meta.row_group(meta.num_row_groups - 1).column(0)
    start = last.dictionary_page_offset if last.has_dictionary_page else last.data_page_offset
    size = last.total_compressed_size
    blob[start + 32 : start + size - 8] = b"\xff" * (size - 40)
    path.write_bytes(bytes(blob))
    return sum(meta.row_group(i).num_rows for i in range(meta.num_row_groups - 1))


@pytest.mark.parametrize(
    "name, cut",
    [("a.jsonl.gz", _gzip_cut), ("a.jsonl.zst", _zstd_cut), ("a.parquet", _parquet_cut)],
)
@pytest.mark.parametrize("chunk_size", [1, 64, 1000])
def test_truncated_file_keeps_every_complete_record(tmp_path, caplog, name, cut, chunk_size):
    path = tmp_path / name
    complete = cut(path)
    assert 0 < complete < len(TEXTS)
    with caplog.at_level("WARNING"):
        stats = preprocess(
            [str(path)], DEMO_TOKENIZER, str(tmp_path / "out"), chunk_size=chunk_size,
            progress=False, options=EncodeOptions(on_error="skip"),
        )  # fmt: skip
    [skipped] = [m for m in caplog.messages if m.startswith("skipped")]
    records = "rows" if name.endswith(".parquet") else "complete lines"
    assert skipped.endswith(f"re-fetch it (its {complete} {records} before the break are kept)")
    doc = read_json(stats.stats_path)
    assert sum(o["documents"] for o in doc["outputs"].values()) == complete
    assert doc["errors"]["unreadable_file"] == 1
    assert doc["unreadable_files"][str(path)]["records"] == complete
    if not name.endswith(".parquet"):
        assert doc["unreadable_files"][str(path)]["byte"] == len(
            b"".join(LINES.splitlines(keepends=True)[:complete])
        )


def _members(cut: slice | None = None, tail: bytes = b"") -> bytes:
    """LINES as three gzip members (as ``cat a.gz b.gz c.gz`` makes), cut and/or followed by
    ``tail``."""
    third = len(LINES) // 3
    parts = [LINES[:third], LINES[third : 2 * third], LINES[2 * third :]]
    blob = b"".join(gzip.compress(p, mtime=0) for p in parts)
    return (blob[cut] if cut else blob) + tail


@pytest.mark.parametrize(
    "blob",
    [
        _members(),
        _members(tail=b"\0" * 16),
        _members(tail=b"garbage"),
        _members(slice(0, -9)),
        _members(slice(0, 700)),
        _members(slice(0, -4), tail=b"\1\2\3\4"),
    ],
    ids=["whole", "zero-padded", "garbage-after", "truncated-end", "truncated-early", "bad-size"],
)
def test_gzip_reads_as_pythons_gzip_module_does(tmp_path, blob):
    """The ISA-L reader hands a broken stream to zlib at the byte it stopped: the lines, where
    reading stops and the error equal Python's ``gzip`` reading the same file line by line."""
    from megatron_gamma.data.readers import InputError, iter_chunks

    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(blob)
    expected, expected_error = [], None
    try:
        with gzip.open(path, "rb") as f:
            expected.extend(f)
    except (OSError, EOFError, zlib.error) as e:
        expected_error = str(e)
    got, error = [], None
    try:
        for chunk in iter_chunks(str(path), chunk_docs=7):
            got.extend(chunk.items)
    except InputError as e:
        error = str(e)
    assert got == expected
    assert (error is None) == (expected_error is None)
    if error is not None:
        assert f"({expected_error}). Fix: re-fetch it, or --on-error skip to keep its " in error
        assert f"after line {len(expected)} " in error
