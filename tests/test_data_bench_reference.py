"""The benchmark's re-creation of Megatron-LM's ``tools/preprocess_data_fast.py`` makes the
script's own builder calls (its ``process_key`` at d98e8a64dd, with ``--append-eod``):

    builder = indexed_dataset.IndexedDatasetBuilder(bin_file, dtype=DType.optimal_dtype(vocab))
    builder.add_documents(encoded_docs, eod_token=tokenizer.eod)
    builder.finalize(idx_file)

The real script need not be present: a recording builder stands in for megatron-core's, and the
documents it is given are checked against HF ``tokenizers`` (one ``encode`` per document)."""

import json
import os

import awkward as ak
import pytest
from helpers import load_tool
from megatron.core.datasets import indexed_dataset
from tokenizers import Tokenizer

from megatron_gamma.data import demo_dir
from megatron_gamma.data.tokenizer import BilingualTokenizer

TOKENIZER = os.path.join(demo_dir(), "tokenizer.json")


class RecordingBuilder:
    """Records every call; ``add_documents`` keeps megatron-core's signature (d98e8a64dd)."""

    calls: list = []

    def __init__(self, path, dtype=None):
        RecordingBuilder.calls.append(("IndexedDatasetBuilder", (path,), {"dtype": dtype}))
        self.sequence_lengths = []

    def add_documents(self, documents, modes=None, eod_token=None, chunk_size=1_000_000):
        kwargs = {"eod_token": eod_token} if eod_token is not None else {}
        RecordingBuilder.calls.append(("add_documents", (documents,), kwargs))
        self.sequence_lengths += [len(d) + (eod_token is not None) for d in documents]

    def finalize(self, idx_path):
        RecordingBuilder.calls.append(("finalize", (idx_path,), {}))

    def __getattr__(self, name):
        raise AssertionError(f"the real script does not use IndexedDatasetBuilder.{name}")


def test_mlm_fast_recreation_calls_the_builder_as_the_real_script(tmp_path, monkeypatch):
    monkeypatch.setattr(indexed_dataset, "IndexedDatasetBuilder", RecordingBuilder)
    RecordingBuilder.calls = []
    src = os.path.join(demo_dir(), "en.jsonl")
    prefix = str(tmp_path / "out")
    result = load_tool("bench_preprocess")._child_mlm_fast([src], TOKENIZER, prefix, 1)

    tok = BilingualTokenizer(TOKENIZER)
    dtype = indexed_dataset.DType.optimal_dtype(tok.vocab_size)
    names = [(name, args[1:], kwargs) for name, args, kwargs in RecordingBuilder.calls]
    assert names == [
        ("IndexedDatasetBuilder", (), {"dtype": dtype}),
        ("add_documents", (), {"eod_token": tok.eod}),
        ("finalize", (), {}),
    ]
    assert RecordingBuilder.calls[0][1] == (prefix + ".bin",)
    assert RecordingBuilder.calls[2][1] == (prefix + ".idx",)

    with open(src, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    hf = Tokenizer.from_file(TOKENIZER)
    hf.encode_special_tokens = True
    want = [hf.encode(t, add_special_tokens=False).ids for t in texts]
    docs = RecordingBuilder.calls[1][1][0]
    assert ak.to_list(docs) == want  # the EOD is the builder's to append, not in the documents
    assert result["tokens"] == sum(map(len, want)) + len(want)


def test_mlm_fast_refuses_a_megatron_core_without_add_documents(tmp_path, monkeypatch):
    class OldBuilder:  # megatron-core 0.16's builder: add_document only
        def __init__(self, *args, **kwargs):
            pass

    monkeypatch.setattr(indexed_dataset, "IndexedDatasetBuilder", OldBuilder)
    src = os.path.join(demo_dir(), "en.jsonl")
    with pytest.raises(SystemExit, match="add_documents.*Fix: --megatron-lm DIR"):
        load_tool("bench_preprocess")._child_mlm_fast([src], TOKENIZER, str(tmp_path / "out"), 1)
