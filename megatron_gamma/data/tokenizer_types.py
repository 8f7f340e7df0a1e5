"""Megatron-LM's ``--tokenizer-type`` choices, each turned into the tokenizer.json that every
megatron-gamma path reads (preprocessing workers, the gigatoken backend, training, evaluation).

* ``HuggingFaceTokenizer``: ``--tokenizer-model`` is a HF ``tokenizers`` tokenizer.json, or a
  directory holding one (Megatron-LM passes a hub name or a local path; we read local files only,
  no network); default: the packaged demo tokenizer. EOD is, as in Megatron-LM, the
  ``eos_token`` of the ``tokenizer_config.json`` beside it (``</s>``, ``<|end_of_text|>``, ...),
  else ``<|endoftext|>`` (:class:`~megatron_gamma.data.tokenizer.BilingualTokenizer`).
* ``GPT2BPETokenizer``: ``--vocab-file`` (vocab.json) and ``--merge-file`` (merges.txt), GPT-2's
  files, make a byte-level BPE: HF ``tokenizers.models.BPE.from_file`` with the ``ByteLevel``
  pre-tokenizer (no prefix space) and decoder, the tokenization of transformers'
  ``GPT2TokenizerFast`` from the same files. EOD is ``<|endoftext|>``. It is written once, as
  ``gpt2-bpe-<SHA-256 of the two files, 16 hex digits>.tokenizer.json`` in a work directory (the
  run directory; for ``preprocess`` the output prefix's directory), atomically.
"""

from __future__ import annotations

import json
import os
import shlex

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from megatron_gamma.atomic import atomic_path
from megatron_gamma.config import ConfigError, DataConfig
from megatron_gamma.data import demo_dir
from megatron_gamma.data.tokenizer import (
    EOD,
    BilingualTokenizer,
    files_sha256,
    read_tokenizer_json,
)


def _gpt2_fix(vocab_file: str) -> str:
    """The fix for files BPE.from_file refused: a tokenizer.json given as --vocab-file is the
    HuggingFaceTokenizer's file."""
    try:
        with open(vocab_file, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("model"), dict):
        return (
            f"{vocab_file} is a tokenizer.json: pass --tokenizer-type HuggingFaceTokenizer "
            f"--tokenizer-model {shlex.quote(vocab_file)} instead of --vocab-file/--merge-file"
        )
    return (
        "--vocab-file a JSON object {token: id} holding every symbol of --merge-file's merges "
        "(GPT-2's vocab.json), --merge-file its merges.txt"
    )


def gpt2_bpe_tokenizer(vocab_file: str, merge_file: str) -> Tokenizer:
    """GPT-2's byte-level BPE from its vocab.json and merges.txt (module docstring).

    Raises:
        ConfigError: a missing file, files that HF tokenizers cannot read as GPT-2's (a
            tokenizer.json given as the vocabulary is named as such), or a vocabulary without
            ``<|endoftext|>``.
    """
    for key, path in (("vocab_file", vocab_file), ("merge_file", merge_file)):
        if not os.path.isfile(path):
            raise ConfigError(
                f"{key}={path!r}: file not found. Fix: pass GPT-2's vocab.json to --vocab-file "
                "and merges.txt to --merge-file"
            )
    try:
        tok = Tokenizer(models.BPE.from_file(vocab_file, merge_file))
    except Exception as e:  # noqa: BLE001  (tokenizers raises a bare Exception)
        raise ConfigError(
            f"vocab_file={vocab_file!r}, merge_file={merge_file!r}: not GPT-2's vocab.json and "
            f"merges.txt ({e}). Fix: {_gpt2_fix(vocab_file)}"
        ) from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if tok.token_to_id(EOD) is None:
        raise ConfigError(
            f"vocab_file={vocab_file!r}: no {EOD} token (GPT-2's EOD). Fix: use a GPT-2 "
            "vocab.json, or --tokenizer-type HuggingFaceTokenizer with a tokenizer.json"
        )
    tok.add_special_tokens([AddedToken(EOD, special=True)])
    return tok


def hf_tokenizer_json(tokenizer_model: str | None) -> str:
    """The tokenizer.json of ``--tokenizer-model`` (a file, or a directory holding
    tokenizer.json), or the packaged demo tokenizer's for None.

    Raises:
        ConfigError: no such file (a hub name is not fetched: no network).
    """
    if tokenizer_model is None:
        return os.path.join(demo_dir(), "tokenizer.json")
    path = tokenizer_model
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        raise ConfigError(
            f"tokenizer_model={tokenizer_model!r}: {path} not found (megatron-gamma reads "
            "local files only, no hub download). Fix: pass an existing tokenizer.json or a "
            "directory holding one (`megatron-gamma train-tokenizer` makes one)"
        )
    return path


def tokenizer_vocab_size(data: DataConfig) -> int:
    """Token ids (unpadded) of the tokenizer :func:`load_tokenizer` would give, read from its
    files without writing anything (for ``megatron-gamma estimate``).

    Raises:
        ConfigError: as :func:`load_tokenizer`.
    """
    if data.tokenizer_type == "GPT2BPETokenizer":
        return gpt2_bpe_tokenizer(data.vocab_file, data.merge_file).get_vocab_size()
    return read_tokenizer_json(hf_tokenizer_json(data.tokenizer_model)).get_vocab_size()


def load_tokenizer(data: DataConfig, workdir: str) -> BilingualTokenizer:
    """The run's tokenizer from ``data.tokenizer_type`` and its files.

    Args:
        data: the data section (tokenizer_type, tokenizer_model, vocab_file, merge_file).
        workdir: where a GPT-2 BPE's tokenizer.json is written (created if missing).

    Raises:
        ConfigError: a missing file, or a GPT-2 vocabulary without ``<|endoftext|>``.
    """
    if data.tokenizer_type == "GPT2BPETokenizer":
        source = [data.vocab_file, data.merge_file]
        tok = gpt2_bpe_tokenizer(*source)
        os.makedirs(workdir, exist_ok=True)
        path = os.path.join(workdir, f"gpt2-bpe-{files_sha256(source)[:16]}.tokenizer.json")
        with atomic_path(path) as tmp:
            tok.save(tmp)
        return BilingualTokenizer(path, data.tokenizer_type, source)
    return BilingualTokenizer(hf_tokenizer_json(data.tokenizer_model), data.tokenizer_type)
