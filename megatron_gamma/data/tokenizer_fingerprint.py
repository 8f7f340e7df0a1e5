"""Which tokenizer made a dataset: a fingerprint next to the data, checked before training.

``megatron-gamma preprocess`` (and ``merge``) write
``{dataset prefix}.tokenizer_fingerprint.json`` beside each ``.bin/.idx``::

    {"format": "megatron-gamma-tokenizer-fingerprint/1", "tokenizer_type": "HuggingFaceTokenizer",
     "source": ["/abs/tok/tokenizer.json"], "sha256": "<hex>", "canonical_sha256": "<hex>",
     "vocab_size": 4096, "eod": 0}

``sha256`` is :attr:`~megatron_gamma.data.tokenizer.BilingualTokenizer.sha256` (of the
tokenizer.json's bytes, and of the EOD, PAD and BOS the tokenizer_config.json beside it names
when its ``eos_token`` makes the EOD another token than ``<|endoftext|>``; or of GPT-2's
vocab.json + merges.txt); ``canonical_sha256`` is
:attr:`~megatron_gamma.data.tokenizer.BilingualTokenizer.canonical_sha256`, the same with the
tokenizer.json's canonical form (its parsed JSON with sorted keys, a no-op post-processor as
null: :func:`~megatron_gamma.data.tokenizer.canonical_tokenizer_json`) in place of its bytes.
These are the identity compared (:func:`same_tokenizer`); the rest names the tokenizer in
messages. ``pretrain`` checks every dataset of the blend against its tokenizer in preflight
(:func:`check_datasets`), and every load of a checkpoint checks the fingerprint it carries
(:func:`megatron_gamma.rundir.loader.check_tokenizer`): token ids of another tokenizer would
train silently on garbage. Datasets written before fingerprints existed get a warning.

Two fingerprints name the same tokenizer when their ``sha256`` are equal (the same bytes), or
when both record a ``canonical_sha256`` and those are equal: the same tokenizer saved again by
``transformers``, which adds a post-processor that adds no token and may lay its keys out
otherwise, still reads data and checkpoints made with the original. A fingerprint written
before ``canonical_sha256`` existed (the format is the same; the key is new) is compared by its
``sha256`` alone, as then: data and checkpoints made before are accepted exactly where they
were. A version of megatron-gamma that predates the key compares ``sha256`` alone too, and so
refuses a tokenizer saved again, as it did before.
"""

from __future__ import annotations

import os
import shlex

from megatron_gamma.config import ConfigError
from megatron_gamma.data.stats import read_json
from megatron_gamma.data.tokenizer import BilingualTokenizer

FORMAT = "megatron-gamma-tokenizer-fingerprint/1"
SUFFIX = ".tokenizer_fingerprint.json"


def fingerprint(tok: BilingualTokenizer) -> dict:
    """The fingerprint document of ``tok`` (module docstring)."""
    return {
        "format": FORMAT,
        "tokenizer_type": tok.tokenizer_type,
        "source": tok.source,
        "sha256": tok.sha256,
        "canonical_sha256": tok.canonical_sha256,
        "vocab_size": tok.vocab_size,
        "eod": tok.eod,
    }


def same_tokenizer(then: dict, now: dict) -> bool:
    """Whether fingerprint ``then`` (recorded with data or a checkpoint) and ``now`` name the
    same tokenizer: equal ``sha256``, or equal ``canonical_sha256`` where both record one (a
    fingerprint written before that key existed has only its ``sha256``; module docstring)."""
    if then["sha256"] == now["sha256"]:
        return True
    canonical = then.get("canonical_sha256")
    return canonical is not None and canonical == now.get("canonical_sha256")


def read_fingerprint(prefix: str) -> dict | None:
    """The fingerprint of dataset ``prefix``, or None when it has none (an older dataset)."""
    path = prefix + SUFFIX
    if not os.path.isfile(path):
        return None
    doc = read_json(path)
    if doc.get("format") != FORMAT:
        raise ConfigError(
            f"{path}: not a megatron-gamma tokenizer fingerprint. Fix: remove it, or rerun "
            "`megatron-gamma preprocess`"
        )
    return doc


def describe(doc: dict) -> str:
    """``TYPE FILES (sha256 0123456789ab)`` for messages."""
    return f"{doc['tokenizer_type']} {', '.join(doc['source'])} (sha256 {doc['sha256'][:12]})"


def tokenizer_flags(doc: dict) -> str:
    """The Megatron-LM flags that select the tokenizer of fingerprint ``doc`` (:func:`fingerprint`),
    for the fix in an error message."""
    files = doc["source"]
    if doc["tokenizer_type"] == "GPT2BPETokenizer":
        return (
            f"--tokenizer-type GPT2BPETokenizer --vocab-file {shlex.quote(files[0])} "
            f"--merge-file {shlex.quote(files[-1])}"
        )
    return f"--tokenizer-type {doc['tokenizer_type']} --tokenizer-model {shlex.quote(files[0])}"


def same_files(then: dict, now: dict) -> bool:
    """Whether fingerprints ``then`` and ``now`` name the same tokenizer files: the same source,
    or the same tokenizer.json of a ``HuggingFaceTokenizer`` whose tokenizer_config.json joined
    or left its source (its ``eos_token`` was edited)."""
    if then.get("source") == now["source"]:
        return True
    hf = then.get("tokenizer_type") == now["tokenizer_type"] == "HuggingFaceTokenizer"
    return hf and (then.get("source") or [None])[:1] == now["source"][:1]


def changed_files(then: dict, now: dict) -> tuple[str, str]:
    """(the files, 'file' or 'files') of a tokenizer :func:`same_files` found changed, for
    messages."""
    files = then["source"] + [p for p in now["source"] if p not in then["source"]]
    return ", ".join(files), "file" if len(files) == 1 else "files"


def other_tokenizers(docs: list[tuple[str, dict]], want: dict) -> list[tuple[str, dict]]:
    """The (dataset, fingerprint) pairs of ``docs`` made with another tokenizer than fingerprint
    ``want`` (not :func:`same_tokenizer`): the datasets :func:`merged_fingerprint` refuses to merge
    with one made by ``want``, and a shard of a sharded ``preprocess`` refuses beside its
    siblings (:func:`~megatron_gamma.data.merge.check_sibling_shards`)."""
    return [(prefix, doc) for prefix, doc in docs if not same_tokenizer(want, doc)]


def merged_fingerprint(prefixes: list[str]) -> dict | None:
    """The common fingerprint of datasets to concatenate, or None if any has none.

    Raises:
        ConfigError: two of them were made with different tokenizers (both named).
    """
    docs = [(p, read_fingerprint(p)) for p in prefixes]
    if any(doc is None for _, doc in docs):
        return None
    first_prefix, first = docs[0]
    other = other_tokenizers(docs[1:], first)
    if other:
        prefix, doc = other[0]
        raise ConfigError(
            f"cannot merge {prefix} (tokenized with {describe(doc)}) into datasets tokenized "
            f"with {describe(first)} ({first_prefix}). Fix: preprocess them with the same "
            "tokenizer"
        )
    return first


def check_datasets(prefixes: list[str], tok: BilingualTokenizer) -> list[str]:
    """Check that every dataset ``prefixes`` was tokenized with ``tok`` (:func:`same_tokenizer`:
    also with the same tokenizer saved again by transformers, elsewhere or at the same path).

    Returns:
        One warning line per dataset without a fingerprint (made before fingerprints existed).

    Raises:
        ConfigError: a dataset made with another tokenizer, naming both tokenizers and the flag
            that selects the right one; or, when the tokenizer files are at the same path
            (:func:`same_files`), made with them before they changed (both digests named, and
            the fix: restore the original files or preprocess the data again).
    """
    mine = fingerprint(tok)
    warnings = []
    for prefix in prefixes:
        doc = read_fingerprint(prefix)
        if doc is None:
            warnings.append(
                f"WARNING: {prefix} has no tokenizer fingerprint ({prefix}{SUFFIX}, written by "
                f"`megatron-gamma preprocess` since fingerprints exist); cannot check that it was "
                f"tokenized with {describe(mine)}"
            )
        elif not same_tokenizer(doc, mine) and same_files(doc, mine):
            files, noun = changed_files(doc, mine)
            raise ConfigError(
                f"data_path={prefix!r}: the tokenizer at {files} changed "
                f"since the data was tokenized (sha256 {doc['sha256'][:12]} then, "
                f"{mine['sha256'][:12]} now). Fix: restore the original tokenizer {noun} there, "
                "or preprocess the data again with the current one"
            )
        elif not same_tokenizer(doc, mine):
            raise ConfigError(
                f"data_path={prefix!r}: tokenized with {describe(doc)}, but this run's tokenizer "
                f"is {describe(mine)}. Fix: pass the tokenizer the data was made with "
                f"({tokenizer_flags(doc)}), or preprocess the data again with this one"
            )
    return warnings
