"""Text handling: sentence splitting, language tags, normalization and filters, on hand-written
cases with known answers and on the packaged bilingual corpus."""

import json
import os
import unicodedata

import numpy as np
import pytest

from megatron_gamma.data import demo_dir
from megatron_gamma.data.filters import DROP_REASONS, Filters, symbol_ratio
from megatron_gamma.data.langid import (
    script_units,
    script_units_batch,
    tag_language,
    tag_languages,
)
from megatron_gamma.data.normalize import normalize
from megatron_gamma.data.sentences import (
    EXTRA_ABBREVIATIONS,
    load_punkt_params,
    punkt_params_path,
    save_punkt_params,
    split_sentences,
    train_punkt,
)


def _demo_records():
    for lang in ("zh", "en"):
        with open(os.path.join(demo_dir(), f"{lang}.jsonl"), encoding="utf-8") as f:
            yield from (json.loads(line) for line in f)


SENTENCE_CASES = [
    ("Dr. Smith went home. He slept.", ["Dr. Smith went home.", "He slept."]),
    ("Use a tool, e.g. grep. It is fast.", ["Use a tool, e.g. grep.", "It is fast."]),
    ("That is, i.e. the root. Done.", ["That is, i.e. the root.", "Done."]),
    ("Pi is about 3.14. It is irrational.", ["Pi is about 3.14.", "It is irrational."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("See Fig. 3 for details. The results are clear.",
     ["See Fig. 3 for details.", "The results are clear."]),
    ("It costs $5.50 at Acme Inc. today. Buy it.",
     ["It costs $5.50 at Acme Inc. today.", "Buy it."]),
    ("Is it true? Yes, it is! Fine.", ["Is it true?", "Yes, it is!", "Fine."]),
    ("Visit www.debian.org for more. Thanks.", ["Visit www.debian.org for more.", "Thanks."]),
    ("他说：“你好。”然后走了。", ["他说：“你好。”", "然后走了。"]),
    ("《红楼梦》是名著。它很长！", ["《红楼梦》是名著。", "它很长！"]),
    ("版本3.5发布了。", ["版本3.5发布了。"]),
    ("运行 ls; pwd 即可。", ["运行 ls; pwd 即可。"]),
    ("真的吗？！是的……好吧。", ["真的吗？！", "是的……", "好吧。"]),
    ("请访问 www.debian.org 获取更多信息。谢谢！",
     ["请访问 www.debian.org 获取更多信息。", "谢谢！"]),
    ("他问（真的吗？）我答：是的；走吧。", ["他问（真的吗？）", "我答：是的；", "走吧。"]),
    ("价格是 1,234.56 元。好！", ["价格是 1,234.56 元。", "好！"]),
    ("中文句子!下一句?", ["中文句子!", "下一句?"]),
    ("wait… what? ok.", ["wait… what?", "ok."]),
    ("Debian 是一个自由的操作系统。It is free. 你可以下载它。",
     ["Debian 是一个自由的操作系统。", "It is free.", "你可以下载它。"]),
]  # fmt: skip


@pytest.mark.parametrize("text,expected", SENTENCE_CASES)
def test_sentence_boundaries(text, expected):
    pieces = split_sentences(text)
    assert [p.strip() for p in pieces] == expected
    assert "".join(pieces) == text


def test_sentence_pieces_cover_every_demo_document():
    for rec in _demo_records():
        pieces = split_sentences(rec["text"])
        assert "".join(pieces) == rec["text"]
        assert all(p.strip() for p in pieces)
    assert len(split_sentences("一。二。三。")) == 3


def test_shipped_punkt_parameters_are_reproducible_from_the_demo_corpus():
    texts = [r["text"] for r in _demo_records() if r["lang"] == "en"]
    trained = train_punkt(texts)
    shipped = load_punkt_params(punkt_params_path())
    assert shipped.abbrev_types == trained.abbrev_types
    assert shipped.collocations == trained.collocations
    assert shipped.sent_starters == trained.sent_starters
    assert dict(shipped.ortho_context) == dict(trained.ortho_context)
    assert {"e.g", "i.e", "dr", "etc"} <= set(EXTRA_ABBREVIATIONS) <= shipped.abbrev_types


@pytest.mark.parametrize(
    "text,han,words,tag",
    [
        ("Hello world, this is Debian.", 0, 5, "en"),
        ("你好世界", 4, 0, "zh"),
        ("用 apt-get install 安装软件", 5, 3, "zh"),
        ("This chapter 介绍 Debian and its tools", 2, 6, "mixed"),
        ("Crème brûlée", 0, 2, "en"),
        ("12345 !!!", 0, 0, "en"),
    ],
)
def test_language_tag_rule(text, han, words, tag):
    assert script_units(text) == (han, words)
    assert tag_language(text) == tag


def _units_by_loop(text: str) -> tuple[int, int]:
    """Independent reference: a character loop with the docstring's ranges."""
    han = words = 0
    in_word = False
    for ch in text:
        c = ord(ch)
        han += any(a <= c <= b for a, b in HAN_RANGES)
        latin = ch.isascii() and ch.isalpha() or (0xC0 <= c <= 0x24F and c not in (0xD7, 0xF7))
        words += latin and not in_word
        in_word = latin
    return han, words


HAN_RANGES = [(0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x3134F)]


def test_batched_tags_equal_a_per_character_loop_at_document_boundaries():
    """tag_languages over a chunk (texts joined in one pass) counts each text on its own: words
    that touch the end of one text and the start of the next, empty texts, astral Han
    (U+20000+), a lone Latin letter, and the demo corpus."""
    texts = ["abc", "def", "", "𠀀𠀁 x", "é", "", "中文ab", "cd中文", "7", "Q"]
    texts += [rec["text"] for rec in _demo_records()]
    han, words = script_units_batch(texts)
    assert list(zip(han.tolist(), words.tolist(), strict=True)) == [
        _units_by_loop(t) for t in texts
    ]
    assert tag_languages(texts) == [tag_language(t) for t in texts]
    assert tag_languages([]) == []


def test_language_tag_agrees_with_every_demo_label():
    for rec in _demo_records():
        assert tag_language(rec["text"]) == rec["lang"], rec["source"]


@pytest.mark.parametrize(
    "text,nfkc,width,expected",
    [
        ("Ｈｅｌｌｏ，世界！", False, "keep", "Ｈｅｌｌｏ，世界！"),
        ("Ｈｅｌｌｏ，世界！", True, "keep", "Hello,世界!"),
        ("Ｈｅｌｌｏ，世界！\u3000好。", False, "half", "Hello,世界! 好。"),
        ("你好,世界!共3,000个;ls;ok", False, "cjk", "你好，世界！共3,000个；ls;ok"),
        ("Ｈｅｌｌｏ，世界！", True, "cjk", "Hello,世界！"),
        ("《书名》“引号”", True, "half", "《书名》“引号”"),
    ],
)
def test_normalization(text, nfkc, width, expected):
    assert normalize(text, nfkc, width) == expected


def test_symbol_ratio_matches_unicode_categories():
    samples = ["Hello, world!", "你好，世界！", "$$$ ### ...", "  \n", "a😀b", "𠀀。"]
    samples += [r["text"] for r in _demo_records()][:20]
    for text in samples:
        visible = [c for c in text if not c.isspace()]
        symbols = sum(unicodedata.category(c)[0] in "PS" for c in visible)
        expected = symbols / len(visible) if visible else 0.0
        assert symbol_ratio(text) == pytest.approx(expected, abs=1e-12)


def test_filters_first_reason_wins():
    f = Filters(min_chars=5, min_tokens=3, max_symbol_ratio=0.5)
    assert f.text_reason(" \n ") == "empty"
    assert f.text_reason("!!!") == "min_chars"
    assert f.text_reason("!!!!!!ab") == "max_symbol_ratio"
    assert f.text_reason("hello, world") is None
    assert f.token_reasons(np.array([2, 3])).tolist() == [DROP_REASONS.index("min_tokens"), -1]
    reasons = f.reasons_from_counts(np.array([0, 0, 4, 8]), np.array([3, 9, 4, 9]))
    assert [DROP_REASONS[r] if r >= 0 else None for r in reasons] == [
        f.text_reason(t) for t in (" \n ", " \u200b" * 4 + " ", "!!ab", "hello, ab")
    ]
    with pytest.raises(ValueError, match="max_symbol_ratio=1.5"):
        Filters(max_symbol_ratio=1.5)


def test_train_punkt_refuses_an_existing_output_and_writes_what_the_library_trains(
    tmp_path, capsys
):
    """train-punkt replaced an existing --output without a word (train-tokenizer refuses); the
    refusal comes before any input is read (the input here does not exist). A new output holds
    the parameters ``train_punkt`` learns from the same texts."""
    from megatron_gamma.cli import main

    out = tmp_path / "punkt.json"
    out.write_text("parameters other data was split with")
    args = ["train-punkt", "--input", str(tmp_path / "missing.jsonl"), "--output", str(out)]
    assert main(args) == 2
    assert f"--output={str(out)!r}: already exists; train-punkt overwrites no file (were " in (
        capsys.readouterr().err
    )
    assert out.read_text() == "parameters other data was split with"
    en = os.path.join(demo_dir(), "en.jsonl")
    new = tmp_path / "new" / "punkt.json"
    assert main(["train-punkt", "--input", en, "--output", str(new), "--no-progress"]) == 0
    with open(en, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    save_punkt_params(train_punkt(texts), str(tmp_path / "ref.json"))
    assert new.read_bytes() == (tmp_path / "ref.json").read_bytes()
