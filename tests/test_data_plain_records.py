"""A chunk of records that need no check is parsed in one pass (``readers.plain_records``); every
other chunk goes record by record (``readers.iter_records``). Both give the same decoded texts,
counts, messages and errors: checked against the record-by-record path and, for the texts of a
clean chunk, against the standard library's ``json``."""

import gzip
import json
import os
import random

import pytest

import megatron_gamma.data.encode as encode
from megatron_gamma.data.encode import EncodeOptions, decoded_texts
from megatron_gamma.data.filters import Filters
from megatron_gamma.data.langid import LANGUAGES
from megatron_gamma.data.readers import Chunk, InputError, LongLine, plain_records

DEBIAN = os.path.join(os.path.dirname(__file__), "..", "examples", "studies", "data", "debian-docs")
# Texts with what JSON escapes: quotes, backslashes, tabs and newlines, non-BMP characters.
TRICKY = ['say "hi"', "back\\slash", "tab\there\nnewline\r", "\U0001f600 \u4e2d\u6587", "", " "]


def _line(record) -> bytes:
    return (json.dumps(record) + "\n").encode("utf-8")


def _clean_lines() -> list[bytes]:
    rng = random.Random(7)
    with gzip.open(os.path.join(DEBIAN, "zh.jsonl.gz"), "rb") as f:
        lines = [line for _, line in zip(range(40), f, strict=False)]
    lines += [_line({"text": t, "title": t[::-1], "n": 3}) for t in TRICKY]
    lines += [
        (json.dumps({"text": t, "title": "x"}, ensure_ascii=False) + "\n").encode() for t in TRICKY
    ]
    rng.shuffle(lines)
    for i, line in enumerate(lines):  # the corpus lines hold no title: give them one
        record = json.loads(line)
        record.setdefault("title", f"t{i}")
        lines[i] = (json.dumps(record, ensure_ascii=False) + "\n").encode()
    return lines[:-1] + [lines[-1].rstrip(b"\n")]  # a file's last line may lack its newline


# Each line makes its chunk go record by record: (name, line, the error it is, or None for a
# record kept or a line skipped silently, whether only the escapes scan finds it).
NEEDS_A_CHECK = [
    ("blank line", b"\n", None, False),
    ("malformed", b"{not json\n", "malformed_json", False),
    ("not an object", b"[1, 2]\n", "malformed_json", False),
    ("missing key", _line({"title": "no text"}), "missing_key", False),
    ("null text", _line({"text": None, "title": "x"}), "missing_key", False),
    ("number text", _line({"text": 5, "title": "x"}), "bad_value", False),
    ("nested value", _line({"text": "a", "title": "x", "meta": {"k": [1]}}), None, False),
    ("lone surrogate", b'{"text": "\\ud800", "title": "x"}\n', "invalid_utf8", False),
    ("NaN", b'{"text": "a", "title": "x", "v": NaN}\n', None, False),
    ("too long", LongLine(9_000_000, 8_000_000), "line_too_long", False),
    ("control escape", b'{"text": "a\\u0000b\\u001bc", "title": "x"}\n', None, True),
    ("backspace escape", b'{"text": "a\\bb", "title": "x"}\n', None, True),
    ("form feed escape", b'{"text": "a\\fb", "title": "x"}\n', None, True),
]
OPTIONS = {
    "default": EncodeOptions(on_error="skip"),
    "two-keys-cap-normalized": EncodeOptions(
        json_keys=("text", "title"), nfkc=True, punct_width="half", on_error="skip",
        filters=Filters(max_document_chars=30),
    ),
}  # fmt: skip


def _chunk(lines: list) -> Chunk:
    sizes = sum(x.nbytes if isinstance(x, LongLine) else len(x) for x in lines)
    return Chunk("records.jsonl", 1, list(lines), sizes, 0)


def _by_record(monkeypatch, chunk, opt, escapes):
    with monkeypatch.context() as m:
        m.setattr(encode, "plain_records", lambda *a, **k: None)
        return _decoded(chunk, opt, escapes)


def _decoded(chunk, opt, escapes):
    counts: dict = {}
    messages: list[str] = []
    try:
        kept = _rows(decoded_texts(chunk, opt, counts, messages, escapes), opt)
    except InputError as e:
        return "raised", e.kind, str(e)
    return kept, counts, messages


def _rows(decoded, opt):
    """(key, text, control characters removed, truncated, language label or None) of each text
    of ``decoded``, whose character counts are checked against its texts."""
    assert decoded.chars.tolist() == [len(text) for text in decoded.texts]
    columns = (decoded.keys.tolist(), decoded.texts, decoded.controls.tolist())
    columns += (decoded.truncated.tolist(), decoded.labels.tolist())
    return [
        (opt.json_keys[k], text, controls, cut, LANGUAGES[label] if label >= 0 else None)
        for k, text, controls, cut, label in zip(*columns, strict=True)
    ]


@pytest.mark.parametrize("escapes", [True, False])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_a_clean_chunk_is_parsed_in_one_pass_as_json_parses_it(monkeypatch, name, escapes):
    opt = OPTIONS[name]
    lines = _clean_lines()
    chunk = _chunk(lines)
    records = plain_records(chunk, opt.json_keys, escapes)
    assert records == [json.loads(line) for line in lines]
    got = _decoded(chunk, opt, escapes)
    assert got == _by_record(monkeypatch, chunk, opt, escapes)
    kept = got[0]
    assert len(kept) == len(lines) * len(opt.json_keys)
    if name == "default":
        assert [text for _, text, _, _, _ in kept] == [json.loads(x)["text"] for x in lines]
    else:
        assert any(cut for _, _, _, cut, _ in kept)  # the cap was applied on this path too


@pytest.mark.parametrize("on_error", ["skip", "stop"])
@pytest.mark.parametrize("escapes", [True, False])
@pytest.mark.parametrize("case", NEEDS_A_CHECK, ids=[c[0] for c in NEEDS_A_CHECK])
def test_a_chunk_with_a_line_to_check_goes_record_by_record(monkeypatch, case, escapes, on_error):
    _, bad, kind, escapes_only = case
    opt = EncodeOptions(json_keys=("text", "title"), on_error=on_error)
    lines = _clean_lines()
    lines.insert(len(lines) // 2, bad)
    lines[-1] += b"\n"
    chunk = _chunk(lines)
    one_pass = plain_records(chunk, opt.json_keys, escapes)
    assert (one_pass is not None) == (escapes_only and not escapes)
    got = _decoded(chunk, opt, escapes)
    assert got == _by_record(monkeypatch, chunk, opt, escapes)
    if kind is not None and on_error == "stop":
        assert got[:2] == ("raised", kind)
    else:
        errors = {k: v for k, v in got[1]["errors"].items() if v}
        assert errors == ({kind: 1} if kind else {})
        controls = sum(c for _, _, c, _, _ in got[0])
        assert controls == (
            2 if "control" in case[0] and escapes else int(escapes_only and escapes)
        )


def test_parquet_rows_and_a_language_key_go_record_by_record(monkeypatch):
    rows = [{"text": "a", "lang": "en"}, {"text": "\u4e2d\u6587", "lang": None}]
    chunk = Chunk("rows.parquet", 1, rows, 10, 0)
    assert plain_records(chunk, ("text",)) is None
    lines = _chunk([_line(r) for r in rows])
    opt = EncodeOptions(lang_key="lang")
    got = _decoded(lines, opt, True)
    assert got == _by_record(monkeypatch, lines, opt, True)
    assert [label for *_, label in got[0]] == ["en", None]
    assert got[1]["lang_key_records"] == 1
