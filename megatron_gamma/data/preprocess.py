"""jsonl -> Megatron indexed binaries (.bin/.idx) with megatron-core's ``IndexedDatasetBuilder``.

Each document becomes its token ids followed by one EOD token, as one sequence of one document
(Megatron-LM's ``preprocess_data.py`` layout without sentence splitting), so datasets made here
feed Megatron-LM and NeMo unchanged. ``workers`` processes tokenize chunks of documents in
parallel; chunks are written in input order, so the bytes do not depend on the worker count.
Outputs are written under temporary names and renamed when complete.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
from tqdm import tqdm

from megatron_gamma.data.tokenizer import BilingualTokenizer, iter_jsonl_texts

_TOKENIZER: BilingualTokenizer | None = None


@dataclass
class PreprocessStats:
    """What one preprocessing run wrote."""

    prefix: str
    documents: int
    tokens: int
    characters: int
    seconds: float


def _init_worker(tokenizer_path: str) -> None:
    global _TOKENIZER
    _TOKENIZER = BilingualTokenizer(tokenizer_path)


def _encode_chunk(texts: list[str]) -> tuple[list[np.ndarray], int]:
    assert _TOKENIZER is not None
    eod = _TOKENIZER.eod
    docs = [np.array(ids + [eod], dtype=np.int64) for ids in _TOKENIZER.tokenize_batch(texts)]
    return docs, sum(len(t) for t in texts)


def _chunks(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(texts)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def output_prefix_for(output_prefix: str, json_key: str = "text") -> str:
    """Megatron-LM's naming: ``{output_prefix}_{json_key}_document``."""
    return f"{output_prefix}_{json_key}_document"


def preprocess(
    inputs: list[str],
    tokenizer_path: str,
    output_prefix: str,
    workers: int = 1,
    json_key: str = "text",
    chunk_size: int = 64,
    progress: bool = True,
) -> PreprocessStats:
    """Tokenize jsonl files into one Megatron indexed dataset.

    Args:
        inputs: jsonl files, read in this order.
        tokenizer_path: tokenizer.json.
        output_prefix: writes ``{output_prefix}_{json_key}_document.{bin,idx}``.
        workers: tokenizer processes.
        json_key: the field holding the text.
        chunk_size: documents per work item.
        progress: show a tqdm bar.

    Returns:
        The written prefix and counts.

    Raises:
        FileNotFoundError: an input or the tokenizer is missing (checked before any work).
        ValueError: malformed JSON or missing key (file and line named), empty input, workers < 1.
    """
    if workers < 1:
        raise ValueError(f"workers={workers}: must be >= 1. Fix: --workers 1")
    if not inputs:
        raise ValueError("no input files. Fix: pass --input FILE.jsonl [...]")
    for path in inputs:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"input={path!r} does not exist. Fix: check the path")
    tokenizer = BilingualTokenizer(tokenizer_path)
    prefix = output_prefix_for(output_prefix, json_key)
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    tmp = f"{prefix}.tmp{os.getpid()}"
    builder = IndexedDatasetBuilder(tmp + ".bin", dtype=DType.optimal_dtype(tokenizer.vocab_size))
    documents = tokens = characters = 0
    start = time.time()
    bar = tqdm(unit="doc", desc="preprocess", disable=not progress)
    texts = iter_jsonl_texts(inputs, json_key)
    pool = (
        mp.get_context("fork").Pool(workers, _init_worker, (tokenizer_path,))
        if workers > 1
        else None
    )
    try:
        if pool is None:
            _init_worker(tokenizer_path)
            results = map(_encode_chunk, _chunks(texts, chunk_size))
        else:
            results = pool.imap(_encode_chunk, _chunks(texts, chunk_size))
        for docs, chars in results:
            for doc in docs:
                builder.add_document(doc, [doc.size])
                tokens += doc.size
            documents += len(docs)
            characters += chars
            bar.update(len(docs))
            bar.set_postfix(tok_per_s=f"{tokens / max(time.time() - start, 1e-9):.0f}")
        if documents == 0:
            raise ValueError(f"inputs {inputs} hold no documents. Fix: give non-empty jsonl files")
        builder.finalize(tmp + ".idx")
    except BaseException:
        for ext in (".bin", ".idx"):
            if os.path.exists(tmp + ext):
                os.remove(tmp + ext)
        raise
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
    os.replace(tmp + ".bin", prefix + ".bin")
    os.replace(tmp + ".idx", prefix + ".idx")
    return PreprocessStats(prefix, documents, tokens, characters, time.time() - start)
