"""canonical_tokenizer_json writes the bytes of the standard library's ``json.dumps(doc,
sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` on every document, whichever writer
it uses (``orjson`` where the document holds no float): the digest recorded beside every dataset
must not change with the writer."""

import json
import random
import sys

import pytest

from megatron_gamma.data.tokenizer import (
    NO_OP_POST_PROCESSOR,
    canonical_tokenizer_json,
)

DEMO = "megatron_gamma/data/demo/tokenizer.json"


def reference(data: bytes) -> bytes:
    """The canonical form as the standard library writes it (the definition the digests of
    datasets already made were taken with)."""
    doc = json.loads(data.decode("utf-8"))
    post = doc.get("post_processor") if isinstance(doc, dict) else None
    if post is not None and json.dumps(post, sort_keys=True) == json.dumps(
        NO_OP_POST_PROCESSOR, sort_keys=True
    ):
        doc["post_processor"] = None
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def outcome(canonical, data: bytes) -> bytes | type:
    """The bytes ``canonical(data)`` returns, or the type of the error it raises (both raise
    UnicodeEncodeError on a lone surrogate, which UTF-8 cannot hold)."""
    try:
        return canonical(data)
    except ValueError as e:
        return type(e)


def same(data: bytes) -> bool:
    return outcome(canonical_tokenizer_json, data) == outcome(reference, data)


def every_code_point() -> list[str]:
    """Every Unicode scalar value, 4096 to a string (surrogates are not scalar values)."""
    points = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    return ["".join(points[i : i + 4096]) for i in range(0, len(points), 4096)]


def test_the_demo_tokenizer_equals_the_standard_librarys_form():
    with open(DEMO, "rb") as f:
        data = f.read()
    assert canonical_tokenizer_json(data) == reference(data)


def test_every_code_point_in_keys_and_values_equals_the_standard_librarys_form():
    """Escapes (control characters, quote, backslash, U+007F, U+2028) and the order of keys
    (astral characters sort after U+FFFF, by code point, not by UTF-16 unit)."""
    texts = every_code_point()
    doc = {
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(texts)}},
        "added_tokens": [{"content": t} for t in texts],
        "keys": {c: c for c in '\x00\x1f"\\\x7f\u2028\ufeff\uffff\U00010000\U0010ffff é A a'},
    }
    data = json.dumps(doc, ensure_ascii=True).encode()  # escaped input, as some writers leave it
    assert canonical_tokenizer_json(data) == reference(data)


@pytest.mark.parametrize(
    "text",
    [
        '{"model": {"type": "Unigram", "vocab": [["a", -1e-05], ["b", -12.345678901234567]]}}',
        '{"model": {"dropout": 0.1, "x": 1e+16, "y": 1E300, "z": -0.0}}',
        '{"model": {"dropout": NaN, "a": Infinity, "b": -Infinity}}',
        '{"model": {"big": 18446744073709551616, "neg": -9223372036854775809}}',
        '{"model": {"lone": "\\ud800", "pair": "\\ud83d\\ude00"}}',
        '{"a": ' * 300 + "1" + "}" * 300,
        '{"post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", '
        '"type_id": 0}}], "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": '
        '"B", "type_id": 1}}], "special_tokens": {}}, "z": 1, "a": [true, false, null]}',
        '{"post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", '
        '"type_id": 0.0}}]}, "k": 2}',
        '{"a": 1, "a": 2, "b": {"c": 9223372036854775807, "d": -9223372036854775808}}',
        "[1, 2, 3]",
    ],
    ids=[
        "unigram-scores",
        "float-forms",
        "constants",
        "integers-beyond-64-bits",
        "surrogates",
        "nested-300-deep",
        "no-op-post-processor",
        "float-post-processor",
        "duplicate-key-and-64-bit-bounds",
        "not-an-object",
    ],
)
def test_documents_orjson_writes_otherwise_or_refuses_equal_the_standard_librarys_form(text):
    data = text.encode()
    assert same(data)


def test_random_documents_equal_the_standard_librarys_form():
    """Random nests of the JSON types (integers of every size, floats of every magnitude)."""
    rng = random.Random(0)

    def value(depth: int):
        kind = rng.randrange(8 if depth < 4 else 5)
        if kind == 0:
            return rng.choice([None, True, False])
        if kind == 1:
            return rng.randrange(-(2**70), 2**70) >> rng.randrange(70)
        if kind == 2:
            return rng.uniform(-1, 1) * 10 ** rng.randrange(-30, 30)
        if kind in (3, 4):
            return "".join(chr(rng.randrange(0x10000)) for _ in range(rng.randrange(6)))
        if kind in (5, 6):
            return {value(4).__str__(): value(depth + 1) for _ in range(rng.randrange(5))}
        return [value(depth + 1) for _ in range(rng.randrange(5))]

    for _ in range(300):
        doc = {"model": value(0), "k": value(1)}
        data = json.dumps(doc).encode()
        assert same(data)
        raw = json.dumps(doc, ensure_ascii=False)
        if not any(0xD800 <= ord(c) <= 0xDFFF for c in raw):  # else not UTF-8
            assert same(raw.encode())
