"""Write Megatron ``.bin/.idx`` pairs chunk by chunk; the ``.idx`` through megatron-core's index
writer.

``IndexedDatasetBuilder.add_document`` takes one document at a time; here a whole chunk of
documents (one numpy array of ids, its sequence lengths and sequences per document) goes to the
``.bin`` file in one write, and the index columns are kept in compact ``array`` buffers (4 bytes
per sequence, 8 per document) instead of Python lists (about 36 bytes per entry). The index is
written by megatron-core's index writer, as its ``finalize`` writes it, so the ``.idx`` bytes are
exactly those of ``add_document`` for the same documents (the tests compare them). That writer
computes each sequence's byte offset in a Python loop over numpy scalars and keeps them in a
Python list (about 0.7 us and 40 bytes per sequence: 0.28 CPU-s of a 1.6 CPU-s run on 405,703
one-line records); :func:`finalize_index` gives it the offsets from one numpy pass instead (two
int64 arrays of the sequence count while they are made, then the writer's own copy), the same
values.

megatron-core is imported only when an index is written, after the last chunk, so it is not
resident while the chunks are encoded, nor in the worker processes forked for that. It is
imported without Weights & Biases and without ``torch.compile`` (:func:`indexed_dataset`), which
its package import would otherwise load for logging and fusions that writing an index never
uses: 1.3-1.6 s and 78 MiB on top of torch (which the token statistics load) instead of 2.8-3.3 s
and 146 MiB without wandb installed (this project's CI machine, 2 runs each).
"""

from __future__ import annotations

import functools
import hashlib
import os
from array import array
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from megatron_gamma.mcore_import import import_megatron_core
from megatron_gamma.warnings_summary import accelerator_warnings_ignored

if TYPE_CHECKING:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder


def indexed_dataset() -> ModuleType:
    """megatron-core's ``megatron.core.datasets.indexed_dataset`` module, imported without
    ``wandb`` and without ``torch.compile`` when this process has not imported megatron-core yet
    (:func:`~megatron_gamma.mcore_import.import_megatron_core`: logging and fusions that writing
    an index never uses), and without its warnings that Transformer Engine and Apex are missing
    (:func:`~megatron_gamma.warnings_summary.accelerator_warnings_ignored`): the fallbacks they
    announce are for models and optimizers."""
    with accelerator_warnings_ignored():
        return import_megatron_core("megatron.core.datasets.indexed_dataset")


def token_dtype(vocab_size: int) -> type:
    """numpy dtype of the token ids of a vocabulary of ``vocab_size`` ids: ``uint16`` below
    65,500, else ``int32``.

    megatron-core's rule (``DType.optimal_dtype``), taken here so that the chunks can be encoded
    before megatron-core is imported; :meth:`ChunkWriter.finalize` checks it against
    megatron-core's own before it writes an index.
    """
    return np.uint16 if vocab_size < 65500 else np.int32


def compact_builder(bin_path: str, dtype: type) -> IndexedDatasetBuilder:
    """An ``IndexedDatasetBuilder`` writing ``bin_path`` with its index columns in arrays.

    megatron-core (and with it torch) is imported here (:func:`indexed_dataset`), where a builder
    is needed, not when this module is: the data commands start without it
    (``tests/test_cli_imports.py``).
    """
    builder = indexed_dataset().IndexedDatasetBuilder(bin_path, dtype=dtype)
    builder.sequence_lengths = array("i")
    builder.document_indices = array("q", [0])
    return builder


@functools.cache
def _index_writer() -> type:
    """megatron-core's ``_IndexWriter`` with ``_sequence_pointers`` in numpy: the byte offset of
    each sequence in the ``.bin`` (``(S,)`` int64, the exclusive cumulative sum of the sequence
    lengths times the dtype's size), the values megatron-core's own loop gives."""
    module = indexed_dataset()

    class IndexWriter(module._IndexWriter):
        def _sequence_pointers(self, sequence_lengths) -> np.ndarray:
            lengths = np.asarray(sequence_lengths, dtype=np.int64)
            pointers = np.zeros(len(lengths), dtype=np.int64)
            np.cumsum(lengths[:-1], out=pointers[1:])
            pointers *= module.DType.size(self.dtype)
            return pointers

    return IndexWriter


def finalize_index(builder: IndexedDatasetBuilder, idx_path: str) -> None:
    """``builder.finalize(idx_path)`` of megatron-core (close the ``.bin``, write the index of its
    columns), its index writer given the sequence offsets in one numpy pass
    (:func:`_index_writer`): the same ``.idx`` bytes."""
    builder.data_file.close()
    with _index_writer()(idx_path, builder.dtype) as writer:
        writer.write(builder.sequence_lengths, builder.sequence_modes, builder.document_indices)


INDEX_HEADER = b"MMIDIDX\x00\x00"
"""The first 9 bytes of a Megatron ``.idx`` (megatron-core's ``_INDEX_HEADER``), then the version
(``<Q``, 1), the token dtype code (``<B``), the sequence and document counts (``<Q`` each) and
the int32 length of every sequence."""


def index_token_count(idx_path: str) -> int | None:
    """The tokens of an indexed dataset, the sum of the sequence lengths its ``.idx`` holds, read
    with numpy alone (megatron-core's ``_IndexReader`` reads the same columns), so that a command
    can compare it with what it needs before torch is imported.

    Args:
        idx_path: ``PREFIX.idx``.

    Returns:
        The count; None where the file is not a version-1 index, or is shorter than its sequence
        count says (megatron-core's reader names that when it opens the file).
    """
    with open(idx_path, "rb") as f:
        head = f.read(34)
        if len(head) < 34 or head[:9] != INDEX_HEADER or head[9:17] != (1).to_bytes(8, "little"):
            return None
        sequences = int.from_bytes(head[18:26], "little")
        lengths = np.fromfile(f, dtype="<i4", count=sequences)
    if len(lengths) < sequences:
        return None
    return int(lengths.sum(dtype=np.int64))


def short_dataset(prefix: str, tokens: int, seq_length: int) -> str:
    """The error of a dataset ``prefix`` of ``tokens`` tokens, fewer than one window of
    ``seq_length + 1`` (the windows of ``compare`` and ``evaluate``)."""
    return (
        f"data_path={prefix!r}: {tokens} tokens, fewer than one window of {seq_length + 1}. Fix: "
        "use more data or a smaller --seq-length"
    )


def sha256_file(path: str, block: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(block):
            h.update(data)
    return h.hexdigest()


class ChunkWriter:
    """Append chunks of documents to ``{prefix}.bin`` and write ``{prefix}.idx`` at the end.

    Args:
        prefix: path without extension.
        vocab_size: the tokenizer's vocabulary size; the ids are written as
            :func:`token_dtype` of it.

    Attributes:
        dtype: numpy dtype of the ids written.
        documents, sequences, tokens: running totals.
        bin_sha256: SHA-256 of the ``.bin`` bytes written (computed while writing).
    """

    def __init__(self, prefix: str, vocab_size: int):
        self.prefix = prefix
        self.vocab_size = vocab_size
        self.dtype = token_dtype(vocab_size)
        self._bin = open(prefix + ".bin", "wb")
        self._sequence_lengths = array("i")
        self._document_indices = array("q", [0])
        self._sha = hashlib.sha256()
        self.documents = self.sequences = self.tokens = 0

    def add(
        self, tokens: np.ndarray, sequence_lengths: np.ndarray, document_sequences: np.ndarray
    ) -> None:
        """Append documents.

        Args:
            tokens: (T,) ids of all the documents, in order.
            sequence_lengths: (S,) int32, tokens per sequence; sums to T.
            document_sequences: (D,) int64, sequences per document; sums to S.
        """
        data = memoryview(np.ascontiguousarray(tokens, dtype=self.dtype)).cast("B")  # no copy
        self._bin.write(data)
        self._sha.update(data)
        self._sequence_lengths.frombytes(sequence_lengths.astype(np.int32).tobytes())
        ends = self._document_indices[-1] + np.cumsum(document_sequences, dtype=np.int64)
        self._document_indices.frombytes(ends.tobytes())
        self.documents += len(document_sequences)
        self.sequences += len(sequence_lengths)
        self.tokens += len(tokens)

    @property
    def bin_sha256(self) -> str:
        return self._sha.hexdigest()

    def finalize(self) -> None:
        """Close the ``.bin`` and write the ``.idx`` with megatron-core's index writer
        (:func:`finalize_index`).

        The builder is opened on ``os.devnull`` (the ``.bin`` is written and closed already:
        ``finalize`` only closes that file, then writes the index of the columns given).

        Raises:
            RuntimeError: megatron-core's ``DType.optimal_dtype`` gives another dtype than
                :func:`token_dtype` for this vocabulary; no index is written.
        """
        self._bin.close()
        expected = indexed_dataset().DType.optimal_dtype(self.vocab_size)
        if expected is not self.dtype:
            raise RuntimeError(
                f"{self.prefix}.bin holds {self.dtype.__name__} ids, but this megatron-core's "
                f"DType.optimal_dtype({self.vocab_size}) is {expected.__name__}. Fix: install the "
                "megatron-core that setup.py pins, or report the new rule"
            )
        builder = compact_builder(os.devnull, self.dtype)
        builder.sequence_lengths = self._sequence_lengths
        builder.document_indices = self._document_indices
        finalize_index(builder, self.prefix + ".idx")

    def abort(self) -> None:
        """Close the ``.bin`` without writing an index (the caller removes the files)."""
        self._bin.close()
