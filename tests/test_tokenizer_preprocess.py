"""Tokenizer round trip and .bin/.idx contents, read back through megatron-core."""

import json

import numpy as np
import pytest
from helpers import DEMO_INPUTS, DEMO_TOKENIZER
from megatron.core.datasets.indexed_dataset import IndexedDataset

from megatron_gamma.data.preprocess import preprocess
from megatron_gamma.data.tokenizer import BilingualTokenizer, train_bpe


def _texts():
    texts = []
    for path in DEMO_INPUTS:
        with open(path, encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def test_trained_tokenizer_round_trips_chinese_and_english(tmp_path):
    texts = _texts()
    path = tmp_path / "tok.json"
    train_bpe(texts[::4], vocab_size=1024, output=str(path))
    tok = BilingualTokenizer(str(path))
    assert tok.vocab_size == 1024
    samples = texts + ["中文《书名》与“引号”，数字3.14和English混排。", "emoji 😀 and \x00 bytes"]
    for text in samples:
        assert tok.detokenize(tok.tokenize(text)) == text


def test_demo_tokenizer_is_a_few_thousand_tokens_and_compresses_chinese():
    tok = BilingualTokenizer(DEMO_TOKENIZER)
    assert 2000 <= tok.vocab_size <= 8192
    zh = [t for t in _texts() if any("\u4e00" <= c <= "\u9fff" for c in t[:50])]
    chars = sum(len(t) for t in zh)
    tokens = sum(len(tok.tokenize(t)) for t in zh)
    assert chars / tokens > 1.0  # merges beyond the 3 UTF-8 bytes of a CJK character


@pytest.mark.parametrize("workers", [1, 2])
def test_bin_idx_match_direct_tokenization(tmp_path, workers):
    stats = preprocess(
        DEMO_INPUTS, DEMO_TOKENIZER, str(tmp_path / "demo"), workers=workers, progress=False
    )
    tok = BilingualTokenizer(DEMO_TOKENIZER)
    texts = _texts()
    ds = IndexedDataset(stats.prefix)
    assert len(ds.document_indices) - 1 == len(texts) == stats.documents
    assert len(ds) == len(texts)
    for i, text in enumerate(texts):
        ids = ds[i]
        expected = tok.tokenize(text) + [tok.eod]
        np.testing.assert_array_equal(ids, np.array(expected))
        assert tok.detokenize(ids[:-1]) == text
    assert stats.tokens == int(ds.sequence_lengths.sum())


def test_worker_count_does_not_change_bytes(tmp_path):
    a = preprocess(DEMO_INPUTS, DEMO_TOKENIZER, str(tmp_path / "a"), workers=1, progress=False)
    b = preprocess(DEMO_INPUTS, DEMO_TOKENIZER, str(tmp_path / "b"), workers=2, progress=False)
    for ext in (".bin", ".idx"):
        assert open(a.prefix + ext, "rb").read() == open(b.prefix + ext, "rb").read()


def test_malformed_line_is_named_and_nothing_is_written(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        preprocess([str(bad)], DEMO_TOKENIZER, str(tmp_path / "out"), progress=False)
    assert not list(tmp_path.glob("out*"))


def test_empty_input_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no documents"):
        preprocess([str(empty)], DEMO_TOKENIZER, str(tmp_path / "out"), progress=False)
    assert not list(tmp_path.glob("out*"))
