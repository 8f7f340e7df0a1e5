"""Hostile text input (issue 27 item 6): JSON nested without bound, a line longer than memory (a
gzip bomb), and documents with nothing visible. Each is named by file and line, or skipped and
counted under ``--on-error skip``; the documents kept are written as megatron-core's
per-document path writes them (the reference)."""

import gzip
import json
import os
import subprocess
import sys
import zlib

import pytest
from helpers import DEMO_TOKENIZER, megatron_core_dataset, read_dataset

from megatron_gamma.data import CHUNK_BYTES
from megatron_gamma.data.encode import EncodeOptions
from megatron_gamma.data.filters import Filters
from megatron_gamma.data.preprocess import preprocess
from megatron_gamma.data.readers import InputError, expand_inputs, iter_chunks

GOOD = [f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(5)]


def line(record: dict) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode() + b"\n"


@pytest.mark.parametrize(
    "deep",
    [
        b'{"text": "x", "meta": ' + b"[" * 100 + b"]" * 100 + b"}\n",  # 101 levels
        b'{"text": "x", "meta": ' + b"[" * 1000 + b"]" * 1000 + b"}\n",  # orjson parses it
        b'{"text": "x", "meta": ' + b"[" * 5000 + b"]" * 5000 + b"}\n",  # orjson refuses it
        b"[" * 101 + b"]" * 101 + b"\n",  # not an object, and too deep: depth is named first
    ],
    ids=["101", "1001", "5001", "array"],
)
def test_deep_json_is_named_or_skipped_and_brackets_in_text_are_not(tmp_path, deep):
    brackets = "[{" * 300 + ' code with brackets \\" [[ ' + "}]" * 10
    path = tmp_path / "a.jsonl"
    path.write_bytes(line({"text": GOOD[0]}) + deep + line({"text": brackets, "m": [[1]]}))
    with pytest.raises(InputError, match=r"a\.jsonl:2: JSON nested deeper than 100") as e:
        preprocess([str(path)], DEMO_TOKENIZER, str(tmp_path / "stop"), progress=False)
    assert e.value.kind == "json_too_deep"
    opts = EncodeOptions(on_error="skip")
    r = preprocess([str(path)], DEMO_TOKENIZER, str(tmp_path / "o"), options=opts, progress=False)
    assert r.stats["errors"]["json_too_deep"] == 1
    assert read_dataset(r.prefix) == read_dataset(
        megatron_core_dataset([GOOD[0], brackets], str(tmp_path / "ref"))
    )


BOMB = """
import gzip, resource, sys
from megatron_gamma.data.encode import EncodeOptions
from megatron_gamma.data.filters import Filters
from megatron_gamma.data.preprocess import preprocess
path, tokenizer, out = sys.argv[1:]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
opts = EncodeOptions(on_error="skip", filters=Filters(max_document_chars=1000))
r = preprocess([path], tokenizer, out, options=opts, progress=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(r.stats["errors"]["line_too_long"], r.documents, (after - before) // 1024)
"""


@pytest.mark.slow
def test_a_gzip_bomb_line_is_skipped_unread_with_bounded_memory(tmp_path):
    """One 400 MB line (400 KB of gzip) between two good ones: skipped and counted, and peak RSS
    grows by far less than the line (the line cap is 6 x 1000 characters + 1 MiB)."""
    path = tmp_path / "bomb.jsonl.gz"
    block = b"a" * (1 << 20)
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(z.compress(line({"text": GOOD[0]}) + b'{"text": "'))
        for _ in range(400):
            f.write(z.compress(block))
        f.write(z.compress(b'"}\n' + line({"text": GOOD[1]})))
        f.write(z.flush())
    assert os.path.getsize(path) < 1 << 20
    cmd = [sys.executable, "-c", BOMB, str(path), DEMO_TOKENIZER, str(tmp_path / "o")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    skipped, documents, growth_mib = map(int, out.stdout.split())
    assert (skipped, documents) == (1, 2)
    assert growth_mib < 100, f"peak RSS grew by {growth_mib} MiB reading a 400 MiB line"
    assert read_dataset(str(tmp_path / "o_text_document")) == read_dataset(
        megatron_core_dataset(GOOD[:2], str(tmp_path / "ref"))
    )


def test_a_long_line_stops_the_run_by_name_without_skip(tmp_path, caplog):
    path = tmp_path / "a.jsonl.gz"
    long = line({"text": "b" * 1_100_000})  # over 6 x 10 characters + 1 MiB
    with gzip.open(path, "wb") as f:
        f.write(line({"text": GOOD[0]}) + long)
    opts = EncodeOptions(filters=Filters(max_document_chars=10))
    with pytest.raises(InputError) as e:
        preprocess([str(path)], DEMO_TOKENIZER, str(tmp_path / "o"), options=opts, progress=False)
    assert e.value.kind == "line_too_long"
    said = (
        f"{path}:2: line of {len(long)} bytes, longer than the 1048636-byte cap derived from "
        "--max-document-chars (6 bytes per character per --json-keys text, plus 1 MiB), so it "
        "is not read. Fix: raise --max-document-chars"
    )
    assert str(e.value) == said + ", or --on-error skip"
    # under skip: the same, as skipped
    skip = EncodeOptions(filters=Filters(max_document_chars=10), on_error="skip")
    with caplog.at_level("WARNING", logger="megatron_gamma.data"):
        r = preprocess(
            [str(path)], DEMO_TOKENIZER, str(tmp_path / "s"), options=skip, progress=False
        )
    assert caplog.messages == [f"skipped: {said}"]
    assert (r.documents, r.stats["errors"]["line_too_long"]) == (1, 1)
    # under the cap a long document is cut to --max-document-chars, as before
    opts = EncodeOptions(filters=Filters(max_document_chars=200_000))
    r = preprocess([str(path)], DEMO_TOKENIZER, str(tmp_path / "k"), options=opts, progress=False)
    assert r.documents == 2 and r.stats["languages"]["en"]["truncated"] == 1


def test_documents_with_nothing_visible_are_counted_as_empty(tmp_path):
    invisible = ["\u200b\u200d\ufeff", "\u200b \u3000\n\u200d", "\ufeff\u2060\u200c\t"]
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"".join(line({"text": t}) for t in [GOOD[0], *invisible, GOOD[1]]))
    r = preprocess([str(path)], DEMO_TOKENIZER, str(tmp_path / "o"), progress=False)
    dropped = sum(lang["dropped"]["empty"] for lang in r.stats["languages"].values())
    assert (r.documents, dropped) == (2, 3)
    assert read_dataset(r.prefix) == read_dataset(
        megatron_core_dataset(GOOD[:2], str(tmp_path / "ref"))
    )


def test_plain_text_is_refused_with_a_command_that_converts_it(tmp_path):
    """Trial 15: a .txt corpus, the commonest first corpus, got "unsupported file type" alone.
    The fix now carries a shell command converting one document per line to JSONL; run as
    printed (paths with a space quoted), it writes records whose texts are the lines that are
    not blank, without their line ends (CRLF included)."""
    lines = ["第一行：中文，带“引号”", 'English with "quotes", a \\ backslash and a tab\t.', "end"]
    folder = tmp_path / "my data"
    folder.mkdir()
    text = folder / "corpus.txt"  # a CRLF line and blank lines (trial 16): no \r, no empty text
    raw = f"{lines[0]}\r\n\n{lines[1]}\n   \n{lines[2]}\n"
    text.write_bytes(raw.encode("utf-8"))
    with pytest.raises(InputError) as e:
        expand_inputs([str(text)])
    message = str(e.value)
    assert message.startswith(f"input {str(text)!r}: unsupported file type. Fix: use one of ")
    command = message.split("for plain text with one document per line: ", 1)[1]
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    subprocess.run(command, shell=True, check=True, cwd=tmp_path, env=env)
    out = folder / "corpus.jsonl"
    assert [json.loads(x)["text"] for x in out.read_text(encoding="utf-8").splitlines()] == lines
    assert expand_inputs([str(out)]) == [str(out)]
    with pytest.raises(InputError, match=r"\.parquet$"):  # another ending: the endings alone
        expand_inputs([str(text.rename(folder / "corpus.csv"))])


@pytest.mark.parametrize(
    ("rows", "chars", "sizes"),
    [
        # 100,000 characters a row: the 11th row takes a chunk past 1 MiB (10 rows do not).
        (40, 100_000, [11, 11, 11, 7]),
        # 10 characters a row: the row cap, 4096, ends the chunks.
        (10_000, 10, [4096, 4096, 1808]),
    ],
)
def test_parquet_chunks_stop_at_the_row_cap_or_about_a_mebibyte(tmp_path, rows, chars, sizes):
    """A parquet file is chunked as a jsonl file is: at most CHUNK_DOCS rows, and a chunk ends
    with the row that takes its text to CHUNK_BYTES characters, whatever the file's batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "long.parquet")
    texts = [f"{i:09d}".ljust(chars, "x")[:chars] for i in range(rows)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=rows)
    chunks = list(iter_chunks(path, columns=["text"]))
    assert [len(c.items) for c in chunks] == sizes
    assert [item["text"] for c in chunks for item in c.items] == texts
    assert [c.first_line for c in chunks] == [1 + sum(sizes[:i]) for i in range(len(sizes))]
    assert all(c.raw_bytes < CHUNK_BYTES + chars for c in chunks)
    assert chunks[-1].disk_pos == os.path.getsize(path)
