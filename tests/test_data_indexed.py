"""The chunk writer of ``preprocess`` (``megatron_gamma/data/indexed.py``) against megatron-core's
own per-document ``IndexedDatasetBuilder.add_document``: same ``.bin`` and ``.idx`` bytes."""

import importlib.util
import os
from array import array

import numpy as np
import pytest
from helpers import run_with_stand_in_wandb
from megatron.core.datasets.indexed_dataset import (
    DType,
    IndexedDataset,
    IndexedDatasetBuilder,
    _IndexWriter,
)

from megatron_gamma.data.indexed import (
    ChunkWriter,
    _index_writer,
    index_token_count,
    token_dtype,
)


def _documents(seed: int, vocab_size: int) -> list[list[np.ndarray]]:
    """Documents of 1-3 sequences of 1-50 random ids each."""
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(0, vocab_size, rng.integers(1, 51)) for _ in range(rng.integers(1, 4))]
        for _ in range(40)
    ]


@pytest.mark.parametrize("vocab_size", [1000, 70000])
def test_chunks_write_the_bytes_of_add_document(tmp_path, vocab_size):
    docs = _documents(vocab_size, vocab_size)
    reference = str(tmp_path / "reference")
    builder = IndexedDatasetBuilder(reference + ".bin", dtype=DType.optimal_dtype(vocab_size))
    for doc in docs:
        builder.add_document(np.concatenate(doc), [len(s) for s in doc])
    builder.finalize(reference + ".idx")

    ours = str(tmp_path / "ours")
    writer = ChunkWriter(ours, vocab_size)
    for chunk in (docs[:7], docs[7:8], docs[8:]):  # uneven chunks
        seqs = [s for doc in chunk for s in doc]
        writer.add(
            np.concatenate(seqs),
            np.array([len(s) for s in seqs], np.int32),
            np.array([len(doc) for doc in chunk], np.int64),
        )
    writer.finalize()

    for ext in (".bin", ".idx"):
        with open(reference + ext, "rb") as a, open(ours + ext, "rb") as b:
            assert a.read() == b.read(), ext
    assert (writer.documents, writer.sequences) == (40, sum(map(len, docs)))
    assert writer.tokens == sum(len(s) for doc in docs for s in doc)
    assert IndexedDataset(ours).index.dtype is DType.optimal_dtype(vocab_size)


@pytest.mark.parametrize("vocab_size", [1000, 70000])
def test_the_sequence_offsets_in_numpy_are_megatron_cores(tmp_path, vocab_size):
    """The index writer of ``finalize_index`` gives each sequence the byte offset that
    megatron-core's own loop gives, for both token dtypes, and none for no sequence."""
    rng = np.random.default_rng(vocab_size)
    lengths = array("i", rng.integers(0, 70000, 3000).tolist() + [2**30, 2**30 - 1, 5, 2**30])
    dtype = DType.optimal_dtype(vocab_size)
    with (
        _IndexWriter(str(tmp_path / "a.idx"), dtype) as theirs,
        _index_writer()(str(tmp_path / "b.idx"), dtype) as ours,
    ):
        assert ours._sequence_pointers(lengths).tolist() == theirs._sequence_pointers(lengths)
        assert ours._sequence_pointers(array("i")).tolist() == []


def test_finalize_writes_the_index_with_the_numpy_offsets(tmp_path, monkeypatch):
    """megatron-core's writer still asks for the offsets through ``_sequence_pointers``, so the
    numpy override is what a finalize uses: one call, with the chunks' sequence lengths."""
    writer_type = _index_writer()
    calls = []
    numpy_offsets = writer_type._sequence_pointers

    def spy(self, sequence_lengths):
        calls.append(list(sequence_lengths))
        return numpy_offsets(self, sequence_lengths)

    monkeypatch.setattr(writer_type, "_sequence_pointers", spy)
    writer = ChunkWriter(str(tmp_path / "out"), 1000)
    writer.add(np.arange(6), np.array([2, 4], np.int32), np.array([1, 1], np.int64))
    writer.finalize()
    assert calls == [[2, 4]]
    assert IndexedDataset(str(tmp_path / "out")).index.sequence_pointers.tolist() == [0, 4]


@pytest.mark.parametrize("vocab_size", [1000, 70000])
def test_the_token_count_read_with_numpy_is_megatron_cores(tmp_path, vocab_size):
    """``index_token_count`` (no torch, for ``evaluate``'s checks before the imports) sums the
    sequence lengths megatron-core's reader takes from the same ``.idx``; a file that is not a
    whole version-1 index gives None."""
    docs = _documents(vocab_size + 1, vocab_size)
    prefix = str(tmp_path / "d")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(vocab_size))
    for doc in docs:
        builder.add_document(np.concatenate(doc), [len(s) for s in doc])
    builder.finalize(prefix + ".idx")
    expected = sum(len(s) for doc in docs for s in doc)
    assert index_token_count(prefix + ".idx") == expected
    assert int(IndexedDataset(prefix).sequence_lengths.sum()) == expected
    index = (tmp_path / "d.idx").read_bytes()
    for name, data in (
        ("empty", b""),
        ("header only", index[:34]),
        ("truncated", index[: 34 + 4 * 10]),
        ("version 2", index[:9] + (2).to_bytes(8, "little") + index[17:]),
        ("not an index", b"x" * len(index)),
    ):
        (tmp_path / "bad.idx").write_bytes(data)
        assert index_token_count(str(tmp_path / "bad.idx")) is None, name


@pytest.mark.parametrize("vocab_size", [1, 255, 65499, 65500, 65536, 10**6])
def test_token_dtype_is_megatron_cores_rule(vocab_size):
    assert token_dtype(vocab_size) is DType.optimal_dtype(vocab_size)


def test_finalize_refuses_a_megatron_core_with_another_rule(tmp_path, monkeypatch):
    monkeypatch.setattr(DType, "optimal_dtype", staticmethod(lambda cardinality: np.int64))
    prefix = str(tmp_path / "x")
    writer = ChunkWriter(prefix, 1000)
    writer.add(np.arange(5), np.array([5], np.int32), np.array([1], np.int64))
    with pytest.raises(RuntimeError, match=r"uint16 ids.*optimal_dtype\(1000\) is int64.*Fix"):
        writer.finalize()
    assert not os.path.exists(prefix + ".idx")


IMPORT_PROBE = """
import json, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    {before}
    from megatron_gamma.data.indexed import indexed_dataset
    module = indexed_dataset()
import torch
import megatron.core.jit as jit
import megatron.core.timers as timers
from megatron.core.fusions.fused_bias_geglu import geglu
seen = {{"during": timers.wandb is not None, "after": "wandb" in sys.modules}}
seen["compiled"] = hasattr(geglu, "_torchdynamo_orig_callable")
seen["dynamo"] = "torch._dynamo" in sys.modules
seen["fuser"] = jit.jit_fuser is torch.compile
seen["accelerator_warnings"] = sum("not installed" in str(w.message) for w in caught)
import wandb
seen["later"] = wandb.__file__
print(json.dumps(seen))
"""


def _import_probe(tmp_path, before: str = "") -> dict:
    """Run :func:`indexed_dataset` with a stand-in ``wandb`` first on the path
    (:func:`helpers.run_with_stand_in_wandb`); report whether megatron-core's timers got it,
    whether it is in ``sys.modules`` after the call, whether megatron-core's GeGLU fusion went
    through ``torch.compile`` and TorchDynamo was imported, whether megatron-core's
    ``jit_fuser`` is ``torch.compile`` afterwards, how many warnings about missing accelerators
    were raised, and which file a later ``import wandb`` loads. Without ``TORCHDYNAMO_DISABLE``,
    under which ``torch.compile`` returns the function as it is."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHDYNAMO_DISABLE"}  # CI sets it
    return run_with_stand_in_wandb(tmp_path, IMPORT_PROBE.format(before=before), env)


def test_megatron_core_is_imported_without_wandb_and_wandb_stays_importable(tmp_path):
    seen = _import_probe(tmp_path)
    assert seen["during"] is False and seen["after"] is False
    assert seen["later"] == seen["fake"]


def test_megatron_core_is_imported_without_torch_compile_and_its_fuser_is_restored(tmp_path):
    seen = _import_probe(tmp_path)
    assert seen["compiled"] is False and seen["dynamo"] is False
    assert seen["fuser"] is True


def test_an_imported_wandb_is_left_to_megatron_core(tmp_path):
    """The control: where the process holds wandb already, megatron-core's own import takes it,
    so the stand-in module is on the path the probe's megatron-core sees."""
    seen = _import_probe(tmp_path, before="import wandb")
    assert seen["during"] is True and seen["later"] == seen["fake"]


def test_an_imported_megatron_core_keeps_its_compiled_fusions_and_warnings(tmp_path):
    """The control: megatron-core imported before the call compiles its GeGLU fusion through
    ``torch.compile`` (so the probe sees a compiled function where one was made) and, where
    Transformer Engine and Apex are missing, warns about them (so the probe sees such warnings)."""
    seen = _import_probe(tmp_path, before="import megatron.core")
    assert seen["compiled"] is True and seen["dynamo"] is True
    if importlib.util.find_spec("transformer_engine") is None:
        assert seen["accelerator_warnings"] > 0


def test_megatron_core_imported_for_data_shows_no_accelerator_warning(tmp_path):
    assert _import_probe(tmp_path)["accelerator_warnings"] == 0
