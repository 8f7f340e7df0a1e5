"""Preprocessing statistics: counters, their sum over chunks and shards, and the JSON written next
to the data (``{output_prefix}.stats.json``).

The JSON holds only integers and names (no timings, no host names), so a sharded run merged with
``megatron-gamma merge`` writes the same bytes as a single run::

    {
      "format": "megatron-gamma-preprocess-stats/1",
      "outputs": {"zh_text_document": {"prefix": "data/corpus_zh_text_document",
                                       "documents": 52, "sequences": 52, "tokens": 39411}, ...},
      "languages": {"zh": {"documents": 52, "sequences": 52, "tokens": 39411,
                           "characters": 40123, "control_characters": 0, "truncated": 0,
                           "dropped": {"empty": 0, "min_chars": 0,
                                                            "max_symbol_ratio": 0,
                                                            "min_tokens": 0}}, ...},
      "errors": {"unreadable_file": 0, "malformed_json": 0, ...},
      "unreadable_files": {"data/b.jsonl.gz": {"records": 1200, "byte": 2457600}},
      "data_path": ["0.31", "data/corpus_zh_text_document", "0.69", "data/corpus_en_..."]
    }

``data_path`` is a Megatron blend of the outputs weighted by their token counts (the natural
mixture); edit the weights to up- or down-sample a language and pass it to ``megatron-gamma
pretrain --data-path``. ``tokens`` count what is in the ``.bin`` (EOD included); ``characters``
count the kept documents' normalized text; ``control_characters`` and ``truncated`` count the
C0 control characters removed (:mod:`megatron_gamma.data.normalize`) and the documents cut to
``--max-document-chars`` (:mod:`megatron_gamma.data.filters`); ``byte_order_marks`` the files
whose leading UTF-8 BOM was stripped. ``unreadable_files`` names each file whose stream
broke (``--on-error skip``) with where reading stopped: the complete records read before the
break (all of them are in the output) and the uncompressed byte offset (0 for parquet).
"""

from __future__ import annotations

import json

from megatron_gamma.atomic import atomic_open
from megatron_gamma.data.filters import DROP_REASONS
from megatron_gamma.data.readers import ERROR_KINDS

FORMAT = "megatron-gamma-preprocess-stats/1"
_LANG_FIELDS = ("documents", "sequences", "tokens", "characters", "control_characters", "truncated")
_OUTPUT_FIELDS = ("documents", "sequences", "tokens")


def add_counts(total: dict, part: dict) -> dict:
    """Add nested integer counters ``part`` into ``total`` (in place); return ``total``."""
    for key, value in part.items():
        if isinstance(value, dict):
            add_counts(total.setdefault(key, {}), value)
        else:
            total[key] = total.get(key, 0) + value
    return total


def stats_document(output_prefix: str, counts: dict) -> dict:
    """The stats JSON (module docstring) for outputs ``{output_prefix}_{name}``."""
    outputs = {
        name: {"prefix": f"{output_prefix}_{name}"} | {k: c.get(k, 0) for k in _OUTPUT_FIELDS}
        for name, c in sorted(counts.get("outputs", {}).items())
    }
    languages = {}
    for lang, c in sorted(counts.get("languages", {}).items()):
        entry = {k: c.get(k, 0) for k in _LANG_FIELDS}
        entry["dropped"] = {r: c.get("dropped", {}).get(r, 0) for r in DROP_REASONS}
        languages[lang] = entry
    errors = {k: counts.get("errors", {}).get(k, 0) for k in ERROR_KINDS}
    unreadable = dict(sorted(counts.get("unreadable_files", {}).items()))
    boms = counts.get("byte_order_marks", 0)
    total = sum(o["tokens"] for o in outputs.values())
    data_path = []
    for o in outputs.values():
        data_path += [f"{o['tokens'] / total:.6f}", o["prefix"]]
    return {
        "format": FORMAT,
        "outputs": outputs,
        "languages": languages,
        "errors": errors,
        "unreadable_files": unreadable,
        "byte_order_marks": boms,
        "data_path": data_path if len(outputs) > 1 else [o["prefix"] for o in outputs.values()],
    }


def counts_from_document(doc: dict) -> dict:
    """The counters a stats JSON was made from (inverse of :func:`stats_document`)."""
    return {
        "outputs": {n: {k: o[k] for k in _OUTPUT_FIELDS} for n, o in doc["outputs"].items()},
        "languages": doc["languages"],
        "errors": doc["errors"],
        "unreadable_files": doc.get("unreadable_files", {}),
        "byte_order_marks": doc.get("byte_order_marks", 0),
    }


def write_json(path: str, doc: dict) -> None:
    """Write ``doc`` as indented, key-sorted JSON under a temporary name, then rename."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def read_json(path: str) -> dict:
    """Read a JSON file."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)
