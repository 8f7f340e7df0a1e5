"""Tokenizer, preprocessing into Megatron .bin/.idx, and megatron-core GPT datasets."""

from importlib import resources

CHUNK_DOCS = 4096
"""Records per chunk at most (``--chunk-size``), the unit of work of a preprocessing worker. Each
chunk costs a fixed ~0.4 ms (the tokenizer's batch call and result, the statistics kernel's
call, the output's arrays), so short documents want many per chunk: on one-line records of ~90
bytes, the warm per-chunk pipeline took 1.6 CPU-s at 256 records, 0.66 at 4096, 0.65 at 8192 and
0.9 at 16384 (docs/preprocess-benchmark.md, "Session 45"). Documents of a few KB reach
:data:`CHUNK_BYTES` first."""

CHUNK_BYTES = 1 << 20
"""Uncompressed bytes per chunk, about (a single longer record is its own chunk)."""


def demo_dir() -> str:
    """Directory of the packaged bilingual demo corpus (en.jsonl, zh.jsonl, NOTICE) and the demo
    tokenizer (tokenizer.json)."""
    return str(resources.files("megatron_gamma.data") / "demo")
