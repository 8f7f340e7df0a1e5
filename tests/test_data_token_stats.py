"""Per-document text counts read off token ids (``megatron_gamma.data.token_stats``) against the
text itself (``langid.script_units_batch``, ``filters.INVISIBLE``) on the Debian corpus and on
adversarial text, and the chunk encoder's two ways (by tokens, by text) against each other."""

import gzip
import json
import os
import random

import numpy as np
import pytest

from megatron_gamma.data import demo_dir
from megatron_gamma.data.encode import ChunkEncoder, EncodeOptions
from megatron_gamma.data.filters import INVISIBLE, Filters
from megatron_gamma.data.langid import han_mask, latin_mask, script_units_batch
from megatron_gamma.data.normalize import CONTROL_CHARACTERS
from megatron_gamma.data.readers import Chunk
from megatron_gamma.data.token_backend import GigatokenBackend, HFBackend
from megatron_gamma.data.token_stats import TokenTextStats

TOKENIZER = os.path.join(demo_dir(), "tokenizer.json")
DEBIAN = os.path.join(os.path.dirname(__file__), "..", "examples", "studies", "data", "debian-docs")
# Characters at the edges of the classes counted: Han ranges (3- and 4-byte), Latin letters
# (ASCII, U+00C0..U+024F without x and /), invisible ones, and their neighbours outside.
EDGES = (
    "aZzA\u00c0\u00d6\u00d7\u00d8\u00f6\u00f7\u00f8\u024f\u0250\u00bf"
    "\u3400\u4dbf\u4dc0\u4e00\u9fff\ua000\uf8ff\uf900\ufaff\ufb00"
    "\U00020000\U0002a6df\U0003134f\U00031350\U0001f600"
    " \n\t\r\u3000\u200b\u200c\u200d\u2060\ufeff\u00a0\u2028\x85\x00\x1b-1_'"
)


@pytest.fixture(scope="module")
def backend():
    return GigatokenBackend(TOKENIZER)


def _extension_built() -> bool:
    try:
        from megatron_gamma import _C  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(
    scope="module",
    params=[
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(
                not _extension_built(),
                reason="megatron_gamma._C (csrc/token_stats_cpu.cpp) not built",
            ),
        ),
    ],
    ids=["numpy", "compiled"],
)
def stats(backend, request):
    tables = TokenTextStats.for_backend(backend)
    assert tables is not None  # the demo tokenizer is a byte-level BPE without normalizer
    return TokenTextStats(backend.tok.vocab, compiled=request.param)


def reference(texts: list[str]) -> dict[str, list[int]]:
    han, words = script_units_batch(texts)
    visible = [sum(c not in INVISIBLE for c in t) for t in texts]
    controls = [any(ord(c) in CONTROL_CHARACTERS for c in t) for t in texts]
    return {"han": han.tolist(), "words": words.tolist(), "visible": visible, "controls": controls}


def counted(stats: TokenTextStats, backend, texts: list[str]) -> dict[str, list[int]]:
    got = stats.documents(*backend.encode_batch(texts))
    counts = {k: got[k].tolist() for k in ("han", "words", "visible")}
    return counts | {"controls": (got["controls"] > 0).tolist()}


def adversarial_edges(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = ["", "a", "\u00e9", "a\u00e9\u00e9b", "ab\u6c49cd", "\U00020000" * 5, "\u200b \u3000"]
    texts += ["".join(rng.choice(EDGES) for _ in range(rng.randint(0, 80))) for _ in range(n)]
    texts += [""]  # an empty document last
    return texts


def test_counts_equal_the_text_on_the_debian_corpus(stats, backend):
    texts = []
    for name in ("en.jsonl.gz", "zh.jsonl.gz"):
        with gzip.open(os.path.join(DEBIAN, name), "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f]
    ids, _ = backend.encode_batch(texts)
    assert (stats.flags[ids] & 4).sum() > 10_000  # many Han characters are cut by tokens here
    for start in range(0, len(texts), 500):  # chunk-sized batches, as preprocessing calls it
        batch = texts[start : start + 500]
        assert counted(stats, backend, batch) == reference(batch), start


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counts_equal_the_text_on_adversarial_text(stats, backend, seed):
    from tests.test_token_backend import adversarial

    texts = adversarial_edges(400, seed) + adversarial(30, seed=seed)
    expected = reference(texts)
    assert 0 < sum(expected["controls"]) < len(texts)
    assert counted(stats, backend, texts) == expected


def test_ids_that_are_not_utf8_are_refused(stats, backend):
    """Ids whose bytes end inside a character, or cut a character that the next token does not
    continue, or lie outside the vocabulary: a ValueError (IndexError from numpy for the last)."""
    cut = next(int(t) for t in np.flatnonzero(stats.flags & 4) if stats.need[t] > 0)
    ascii_a = int(backend.encode_batch(["a"])[0][0])
    offsets = np.array([0, 2], np.int64)
    with pytest.raises(ValueError, match="end inside a UTF-8 character"):
        stats.documents(np.array([ascii_a, cut], np.uint32), offsets)
    with pytest.raises(ValueError, match="not continued by the next"):
        stats.documents(np.array([cut, ascii_a], np.uint32), offsets)
    outside = np.array([ascii_a, len(stats.code)], np.uint32)
    with pytest.raises(IndexError if stats.kernel is None else ValueError):
        stats.documents(outside, offsets)


def _token_reference(piece: bytes) -> tuple[int, ...]:
    """One token's row of :class:`TokenTextStats`' table, byte by byte in Python: each byte
    that is not a continuation byte starts a character of 1-4 bytes (by its high bits), which
    is complete when the token holds all of them."""
    heads = next((i for i, x in enumerate(piece) if x & 0xC0 != 0x80), len(piece))
    head_value = 0
    for x in piece[:heads]:
        head_value = (head_value << 6) | (x & 0x3F)
    chars = []  # (is complete, code point or the bits so far, bytes still needed)
    for i, x in enumerate(piece):
        if x & 0xC0 == 0x80:
            continue
        width = 1 if x < 0x80 else 2 if x < 0xE0 else 3 if x < 0xF0 else 4
        tail = piece[i : i + width]
        value = x & (0x7F >> width) if width > 1 else x
        for y in tail[1:]:
            value = (value << 6) | (y & 0x3F)
        chars.append((len(tail) == width, value, width - len(tail)))
    complete = [cp for done, cp, _ in chars if done]

    def is_latin(cp: int) -> bool:
        return bool(latin_mask(np.array([cp]))[0])

    latin = [done and is_latin(cp) for done, cp, _ in chars]
    han = sum(bool(han_mask(np.array([cp]))[0]) for cp in complete)
    visible = sum(cp > 0x10FFFF or chr(cp) not in INVISIBLE for cp in complete)
    words = sum(now and not before for before, now in zip([False] + latin, latin, strict=False))
    cut = bool(chars) and not chars[-1][0]
    flags = (bool(chars) and latin[0]) * 1 | (bool(complete) and is_latin(complete[-1])) * 2
    flags |= cut * 4 | any(x in CONTROL_CHARACTERS for x in piece) * 8
    code = visible | han << 21 | words << 42
    partial, need = (chars[-1][1], chars[-1][2]) if cut else (0, 0)
    only_partial = bool(chars) and not complete
    return code, flags, len(chars), partial, need, only_partial, heads, head_value


@pytest.mark.parametrize("vocab", ["demo", "random"])
def test_tables_equal_a_per_token_reference(backend, vocab):
    """Every token's table row equals :func:`_token_reference`: the demo vocabulary, and random
    tokens of whole, cut and stray UTF-8 pieces (empty tokens, bare continuation bytes,
    controls, 2-4-byte characters cut anywhere, a lead byte followed by ASCII)."""
    if vocab == "demo":
        pieces = backend.tok.vocab
    else:
        rng = random.Random(7)
        parts = [bytes([x]) for x in range(256)] + [c.encode() for c in EDGES]
        parts += [b"\x80\x80", b"\xe4\xb8", b"\xf0\x9f\x98", b"\xc3A"]
        pieces = {}
        for i in range(3000):
            piece = b"".join(rng.choice(parts) for _ in range(rng.randint(1, 6)))
            pieces[i] = piece[: rng.randint(0, 9)]
    stats = TokenTextStats(pieces, compiled=False)
    expected = np.array([_token_reference(pieces[i]) for i in range(len(pieces))]).T
    assert np.array_equal(stats.table, expected)
    assert (stats.flags & 4).any() and stats.head_count.any()  # cut characters and heads occur


def test_tables_only_for_gigatoken_on_a_byte_level_bpe(tmp_path, backend):
    assert TokenTextStats.for_backend(HFBackend(TOKENIZER)) is None
    with open(TOKENIZER, encoding="utf-8") as f:
        doc = json.load(f)
    doc["normalizer"] = {"type": "NFC"}  # one that gigatoken loads
    path = tmp_path / "nfc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert backend.byte_level_bpe and not GigatokenBackend(str(path)).byte_level_bpe
    assert TokenTextStats.for_backend(GigatokenBackend(str(path))) is None


def _line(record: dict) -> bytes:
    return (json.dumps(record) + "\n").encode("utf-8")


def assert_same(by_tokens, by_text) -> None:
    """Two EncodedChunks hold the same counts, messages and arrays."""
    assert by_tokens.counts == by_text.counts
    assert by_tokens.messages == by_text.messages
    assert sorted(by_tokens.outputs) == sorted(by_text.outputs)
    for name, out in by_text.outputs.items():
        other = by_tokens.outputs[name]
        for field in ("tokens", "sequence_lengths", "document_sequences"):
            a, b = getattr(out, field), getattr(other, field)
            assert a.dtype == b.dtype and np.array_equal(a, b), (name, field)


@pytest.mark.parametrize(
    "options",
    [
        EncodeOptions(on_error="skip"),
        EncodeOptions(per_language=True, lang_key="lang", on_error="skip"),
        EncodeOptions(
            json_keys=("text", "title"), append_eod=False, on_error="skip",
            filters=Filters(min_chars=5, min_tokens=3, max_document_chars=40),
        ),
    ],
    ids=["default", "per-language-labels", "two-keys-filters-cap"],
)  # fmt: skip
def test_encoder_by_tokens_equals_by_text(stats, backend, options):
    rng = random.Random(3)
    texts = adversarial_edges(300, seed=3)
    items = [
        _line({"text": t, "title": t[::-1], "lang": rng.choice([None, "zh", "en-US", "mixed"])})
        for t in texts
    ]
    items += [b"\n", b"{not json\n", _line({"title": "no text"}), _line({"text": 5})]
    items += [b'{"text": "a\\u0000b\\u001bc", "title": "x"}\n']  # escaped control characters
    items += [b'{"text": "\\ud800", "title": "x"}\n']  # a lone surrogate: skipped
    chunk = Chunk("adversarial.jsonl", 1, items, sum(map(len, items)), 0)
    by_text = ChunkEncoder(backend, options, np.uint16, 0)(chunk)
    encoder = ChunkEncoder(backend, options, np.uint16, 0, stats)
    assert encoder.token_stats is stats
    assert_same(encoder(chunk), by_text)
    assert encoder.scan_escapes  # the texts hold control characters: decoded again, scanned
    languages = by_text.counts["languages"]  # the cases the two ways must agree on occurred
    assert languages["en"]["dropped"]["empty"] > 0
    assert sum(lang["control_characters"] for lang in languages.values()) > 0
    assert sum(by_text.counts["errors"].values()) >= 4


def test_encoder_by_tokens_scans_escapes_once_a_chunk_holds_control_characters(stats, backend):
    """By tokens, a chunk is decoded without scanning its lines for control-character escapes
    while none of its texts holds one; the first chunk whose texts do is decoded again with the
    scan, and so is every chunk after it. Each chunk gives what the text path gives."""
    options = EncodeOptions(on_error="skip")
    texts = adversarial_edges(200, seed=5)
    clean = [t for t in texts if not any(ord(c) in CONTROL_CHARACTERS for c in t)]
    assert len(clean) < len(texts)
    chunks = []
    for i, batch in enumerate((clean, texts, clean)):
        items = [_line({"text": t}) for t in batch] + [b"{not json\n"]
        chunks.append(Chunk(f"part{i}.jsonl", 1, items, sum(map(len, items)), 0))
    encoder = ChunkEncoder(backend, options, np.uint16, 0, stats)
    scanned = []
    for chunk in chunks:
        assert_same(encoder(chunk), ChunkEncoder(backend, options, np.uint16, 0)(chunk))
        scanned.append(encoder.scan_escapes)
    assert scanned == [False, True, True]


@pytest.mark.parametrize("first", ["zh", "en"])
def test_outputs_and_languages_come_in_order_of_first_use(stats, backend, first):
    """Both ways number a chunk's outputs and languages by the first kept document that uses
    them (the order the stats file and the writers follow): here, the order of the input."""
    second = {"zh": "en", "en": "zh"}[first]
    text = {"zh": "\u4e2d\u6587\u6587\u6863", "en": "an English document"}
    order = [second, first, second, first]  # the first document is dropped (empty)
    items = [_line({"text": " ", "lang": second})]
    items += [_line({"text": text[lang], "lang": lang}) for lang in order[1:]]
    chunk = Chunk("order.jsonl", 1, items, sum(map(len, items)), 0)
    options = EncodeOptions(per_language=True, lang_key="lang")
    for encoder in (
        ChunkEncoder(backend, options, np.uint16, 0),
        ChunkEncoder(backend, options, np.uint16, 0, stats),
    ):
        result = encoder(chunk)
        assert list(result.outputs) == [f"{first}_text_document", f"{second}_text_document"]
        assert list(result.counts["outputs"]) == list(result.outputs)
        assert list(result.counts["languages"]) == [second, first]  # the dropped one counts
        assert result.counts["languages"][second]["dropped"] == {"empty": 1}
        assert result.counts["languages"][first]["documents"] == 2


@pytest.mark.parametrize("per_language", [True, False])
def test_two_keys_get_their_outputs_in_order_of_first_use(stats, backend, per_language):
    """With two --json-keys, each (key, language) pair, or each key, is one output, numbered as
    the record order, then the key order, first uses it."""
    items = [
        _line({"title": "an English title", "text": "an English text", "lang": "en"}),
        _line({"title": "\u4e2d\u6587\u6807\u9898", "text": "\u4e2d\u6587", "lang": "zh"}),
        _line({"title": "another title", "text": "another text", "lang": "en"}),
    ]
    chunk = Chunk("keys.jsonl", 1, items, sum(map(len, items)), 0)
    options = EncodeOptions(json_keys=("title", "text"), per_language=per_language, lang_key="lang")
    want = (
        ["en_title_document", "en_text_document", "zh_title_document", "zh_text_document"]
        if per_language
        else ["title_document", "text_document"]
    )
    for encoder in (
        ChunkEncoder(backend, options, np.uint16, 0),
        ChunkEncoder(backend, options, np.uint16, 0, stats),
    ):
        result = encoder(chunk)
        assert list(result.outputs) == want
        documents = [len(result.outputs[name].document_sequences) for name in want]
        assert documents == ([2, 2, 1, 1] if per_language else [3, 3])
