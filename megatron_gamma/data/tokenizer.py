"""Byte-level BPE tokenizer (HF ``tokenizers``) for bilingual zh + en text.

Byte-level BPE starts from the 256 byte symbols, so every string (any script, any byte) encodes,
and decoding returns the exact input: Chinese round-trips byte for byte. This is the byte
fallback: a character never seen in training (a rare Han character, an emoji) is spelled with its
UTF-8 bytes instead of an unknown token, and there is no unknown token at all. Special tokens:
EOD ``<|endoftext|>`` (appended to every document), PAD ``<|pad|>``, BOS ``<|bos|>``.

Next to a ``tokenizer.json``, :func:`write_metadata` puts the files other loaders need:
``tokenizer_config.json`` and ``special_tokens_map.json`` (HF ``AutoTokenizer``), and
``tokenizer_metadata.json``, the bytes megatron-core's ``MegatronTokenizer.write_metadata``
writes for library ``huggingface`` and model type ``gpt`` (written here without importing
megatron-core, which would import torch: ``train-tokenizer`` needs neither;
``tests/test_cli_imports.py`` compares the bytes), so
``megatron.core.tokenizers.MegatronTokenizer.from_pretrained(<that directory>)`` loads it with
EOD as its ``eod``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from megatron_gamma.atomic import atomic_open, atomic_path

EOD, PAD, BOS = "<|endoftext|>", "<|pad|>", "<|bos|>"
SPECIAL_TOKENS = [EOD, PAD, BOS]


def write_metadata(tokenizer_json: str) -> list[str]:
    """Write the loader files (module docstring) next to ``tokenizer_json``, atomically.

    Returns:
        The paths written.
    """
    folder = os.path.dirname(os.path.abspath(tokenizer_json))
    special = {"eos_token": EOD, "pad_token": PAD, "bos_token": BOS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000,
        **special,
    }
    written = []
    for name, doc in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        path = os.path.join(folder, name)
        with atomic_open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        written.append(path)
    path = os.path.join(folder, "tokenizer_metadata.json")
    metadata = {
        "library": "huggingface",
        "class_name": None,
        "class_path": None,
        "model_type": "gpt",
        "chat_template": None,
    }
    with atomic_open(path, "w") as f:
        json.dump(metadata, f)
    return written + [path]


def train_bpe(texts: Iterable[str], vocab_size: int, output: str) -> Tokenizer:
    """Train a byte-level BPE and write it to ``output`` (a tokenizer.json), atomically.

    Args:
        texts: training documents.
        vocab_size: final vocabulary size including the 256 byte symbols and special tokens.
        output: path of the tokenizer.json to write.

    Raises:
        ValueError: vocab_size too small to hold the byte alphabet and special tokens.
    """
    minimum = 256 + len(SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size={vocab_size} < {minimum}. Fix: use e.g. 4096")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with atomic_path(output) as tmp:
        tok.save(tmp)
    return tok


def files_sha256(paths: list[str]) -> str:
    """Hex SHA-256 of the bytes of ``paths``, concatenated in order (a tokenizer's identity)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


class BilingualTokenizer:
    """A tokenizer.json with the surface megatron-core's GPTDataset uses.

    Args:
        path: the tokenizer.json.
        tokenizer_type: the Megatron-LM ``--tokenizer-type`` it was made from.
        source: the files that define it (default ``[path]``; GPT-2 BPE: vocab.json and
            merges.txt, :mod:`megatron_gamma.data.tokenizer_types`).

    Attributes:
        vocab_size: number of token ids (unpadded).
        eod, pad, bos: special token ids (pad and bos None when the vocabulary lacks them).
        sha256: hex SHA-256 of the bytes of the ``source`` files, in order (for the default
            source: of the tokenizer.json).
        unique_identifiers: what megatron-core hashes into its dataset cache keys.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: no EOD token in the vocabulary.
    """

    def __init__(
        self, path: str, tokenizer_type: str = "HuggingFaceTokenizer", source: list | None = None
    ):
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"tokenizer_model={path!r} does not exist. Fix: pass a tokenizer.json made by "
                "`megatron-gamma train-tokenizer`"
            )
        self.path = os.path.abspath(path)
        self.tokenizer_type = tokenizer_type
        self.source = [os.path.abspath(p) for p in source or [path]]
        self._tok = Tokenizer.from_file(self.path)
        ids = {t: self._tok.token_to_id(t) for t in SPECIAL_TOKENS}
        if ids[EOD] is None:
            raise ValueError(
                f"{path}: no {EOD} token; train it with `megatron-gamma train-tokenizer`"
            )
        self.eod, self.pad, self.bos = ids[EOD], ids[PAD], ids[BOS]
        self.vocab_size = self._tok.get_vocab_size()
        self.sha256 = files_sha256(self.source)
        self.unique_identifiers = {"class": type(self).__name__, "sha256": self.sha256[:16]}

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one text (no EOD)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of many texts at once (parallel on the Rust side)."""
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def detokenize(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of token ids (special tokens kept)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)
