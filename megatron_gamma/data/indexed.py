"""Write Megatron ``.bin/.idx`` pairs chunk by chunk through megatron-core's
``IndexedDatasetBuilder``.

``IndexedDatasetBuilder.add_document`` takes one document at a time; here a whole chunk of
documents (one numpy array of ids, its sequence lengths and sequences per document) goes to the
builder's ``.bin`` file in one write, and the index columns are kept in compact ``array``
buffers (4 bytes per sequence, 8 per document) instead of Python lists (about 36 bytes per
entry). ``finalize`` is megatron-core's own, so the ``.idx`` bytes are exactly those of
``add_document`` for the same documents (the tests compare them). Its index writer builds one
Python list of sequence offsets while it writes (about 40 bytes per sequence, briefly), which is
the only memory that grows with the size of one output.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder


def compact_builder(bin_path: str, dtype: type) -> IndexedDatasetBuilder:
    """An ``IndexedDatasetBuilder`` writing ``bin_path`` with its index columns in arrays.

    megatron-core (and with it torch) is imported here, where the first writer is built, not
    when this module is: the data commands start without it (``tests/test_cli_imports.py``).
    """
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(bin_path, dtype=dtype)
    builder.sequence_lengths = array("i")
    builder.document_indices = array("q", [0])
    return builder


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
        dtype: token dtype (megatron-core ``DType.optimal_dtype(vocab_size)``).

    Attributes:
        documents, sequences, tokens: running totals.
        bin_sha256: SHA-256 of the ``.bin`` bytes written (computed while writing).
    """

    def __init__(self, prefix: str, dtype: type):
        self.prefix = prefix
        self.dtype = np.dtype(dtype).type
        self.builder = compact_builder(prefix + ".bin", self.dtype)
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
        self.builder.data_file.write(data)
        self._sha.update(data)
        self.builder.sequence_lengths.frombytes(sequence_lengths.astype(np.int32).tobytes())
        ends = self.builder.document_indices[-1] + np.cumsum(document_sequences, dtype=np.int64)
        self.builder.document_indices.frombytes(ends.tobytes())
        self.documents += len(document_sequences)
        self.sequences += len(sequence_lengths)
        self.tokens += len(tokens)

    @property
    def bin_sha256(self) -> str:
        return self._sha.hexdigest()

    def finalize(self) -> None:
        """Close the ``.bin`` and write the ``.idx`` (megatron-core ``finalize``)."""
        self.builder.finalize(self.prefix + ".idx")

    def abort(self) -> None:
        """Close the ``.bin`` without writing an index (the caller removes the files)."""
        self.builder.data_file.close()
