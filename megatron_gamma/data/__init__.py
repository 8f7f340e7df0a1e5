"""Tokenizer, preprocessing into Megatron .bin/.idx, and megatron-core GPT datasets."""

from importlib import resources


def demo_dir() -> str:
    """Directory of the packaged bilingual demo corpus (en.jsonl, zh.jsonl, NOTICE) and the demo
    tokenizer (tokenizer.json)."""
    return str(resources.files("megatron_gamma.data") / "demo")
