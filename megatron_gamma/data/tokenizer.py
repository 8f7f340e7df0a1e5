"""Byte-level BPE tokenizer (HF ``tokenizers``) for bilingual zh + en text.

Byte-level BPE starts from the 256 byte symbols, so every string (any script, any byte) encodes,
and decoding returns the exact input: Chinese round-trips byte for byte. This is the byte
fallback: a character never seen in training (a rare Han character, an emoji) is spelled with its
UTF-8 bytes instead of an unknown token, and there is no unknown token at all. Special tokens of
the tokenizers :func:`train_bpe` makes: EOD ``<|endoftext|>`` (appended to every document), PAD
``<|pad|>``, BOS ``<|bos|>``.

Any other HF tokenizer.json loads too (:class:`BilingualTokenizer`): as in Megatron-LM's
``HuggingFaceTokenizer``, whose ``eod`` is the ``eos_token`` ``transformers.AutoTokenizer`` reads,
EOD is the ``eos_token`` of the ``tokenizer_config.json`` beside the tokenizer.json when it names
one (``</s>`` for Llama-2 or Mistral, ``<|end_of_text|>`` for Llama-3), else ``<|endoftext|>``;
PAD and BOS are that file's ``pad_token`` and ``bos_token``. An older ``special_tokens_map.json``
beside it names them over that file where transformers reads it (:func:`special_tokens`).

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

import contextlib
import functools
import hashlib
import json
import os
import shlex
import shutil
from collections.abc import Iterable

import numpy as np
import orjson
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from megatron_gamma.atomic import atomic_open, atomic_path
from megatron_gamma.config import ConfigError

EOD, PAD, BOS = "<|endoftext|>", "<|pad|>", "<|bos|>"
SPECIAL_TOKENS = [EOD, PAD, BOS]
TOKENIZER_CONFIG = "tokenizer_config.json"
"""The file beside a tokenizer.json whose ``eos_token`` / ``pad_token`` / ``bos_token`` name its
EOD, PAD and BOS (as ``transformers.AutoTokenizer`` reads them)."""
CONFIG_KEYS = {"eod": "eos_token", "pad": "pad_token", "bos": "bos_token"}
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
"""The older loader file beside a tokenizer.json whose special tokens ``transformers`` reads over
the :data:`TOKENIZER_CONFIG`'s when that one has no ``added_tokens_decoder``
(:func:`special_tokens`)."""
LOADER_FILES = (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, "tokenizer_metadata.json")
"""The files :func:`write_metadata` writes beside a tokenizer.json, in its folder."""
CODE_KEYS = ("auto_map",)
"""Keys of a loader file that make ``transformers`` import Python code: ``auto_map`` names a
tokenizer class in a module beside the file or on the Hub, which ``AutoTokenizer`` imports under
``trust_remote_code=True`` (what lm-eval passes for the exported GammaGPT model). megatron-gamma's
tokenizer is the tokenizer.json alone, so :func:`copy_loader_file` leaves them out."""


def write_metadata(
    tokenizer_json: str, eos: str = EOD, pad: str | None = PAD, bos: str | None = BOS
) -> list[str]:
    """Write the loader files (module docstring) next to ``tokenizer_json``, atomically.

    Args:
        tokenizer_json: the tokenizer.json.
        eos, pad, bos: its special tokens (default: those :func:`train_bpe` trains); pad and bos
            None are left out.

    Returns:
        The paths written.
    """
    folder = os.path.dirname(os.path.abspath(tokenizer_json))
    special = {"eos_token": eos, "pad_token": pad, "bos_token": bos}
    special = {key: token for key, token in special.items() if token is not None}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000,
        **special,
    }
    written = []
    for name, doc in ((LOADER_FILES[0], config), (LOADER_FILES[1], special)):
        path = os.path.join(folder, name)
        with atomic_open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        written.append(path)
    path = os.path.join(folder, LOADER_FILES[2])
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


def read_tokenizer_json(path: str) -> Tokenizer:
    """HF ``tokenizers``' ``Tokenizer`` of the tokenizer.json at ``path``.

    Raises:
        ConfigError: ``path`` is not a tokenizer.json (another JSON file, e.g. the
            tokenizer_config.json beside it), named with HF tokenizers' reason and the fix.
    """
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001  (tokenizers raises a bare Exception)
        beside = os.path.join(os.path.dirname(path), "tokenizer.json")
        fix = (
            f"--tokenizer-model {shlex.quote(beside)}, the tokenizer.json beside it"
            if os.path.isfile(beside) and not os.path.samefile(beside, path)
            else "pass a tokenizer.json (`megatron-gamma train-tokenizer` makes one)"
        )
        raise ConfigError(
            f"tokenizer_model={path!r}: not a tokenizer.json that HF tokenizers can read ({e}). "
            f"Fix: {fix}"
        ) from None


def files_sha256(paths: list[str], extra: bytes = b"") -> str:
    """Hex SHA-256 of the bytes of ``paths``, concatenated in order, then ``extra`` (a
    tokenizer's identity)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(extra)
    return digest.hexdigest()


NO_OP_POST_PROCESSOR = {
    "type": "TemplateProcessing",
    "single": [{"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {},
}
"""The ``post_processor`` that ``transformers`` (5.x) writes into a tokenizer.json it saves
(``PreTrainedTokenizerFast(tokenizer_file=...).save_pretrained``) when the tokenizer had none:
the sequence alone, the second of a pair with type id 1, no special token. It changes no id and
no type id of any encoding, with or without ``add_special_tokens``: a tokenizer without a
post-processor gives the first sequence type id 0 and the second 1 (``tokenizers``' default
processing) and adds nothing."""


def canonical_tokenizer_json(data: bytes) -> bytes:
    """The canonical form of a tokenizer.json's bytes ``data``, whose SHA-256 is a tokenizer's
    :attr:`~BilingualTokenizer.canonical_sha256`: equal forms give equal ids on every text.

    The JSON is parsed (``tokenizers`` reads it as parsed values: the order of an object's keys,
    whitespace and string escapes mean nothing to it) and written again with sorted keys, no
    whitespace and UTF-8 text; a ``post_processor`` equal to :data:`NO_OP_POST_PROCESSOR` (and
    nothing else) becomes null. Every other value, the order of every list (merges, added
    tokens, normalizer and pre-tokenizer sequences) and every number keep their meaning, so two
    tokenizers with another merge, vocabulary entry, normalizer, pre-tokenizer, truncation or a
    post-processor that adds a token (a BOS) have other forms.

    The bytes are those of ``json.dumps(doc, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)``; ``orjson`` writes them (about 6x faster) when the document holds no
    number that ``json`` reads as a float or constant (whose text the two write differently:
    ``1e-05`` against ``0.00001``), and ``json`` where it holds one or where ``orjson`` refuses a
    value (an integer beyond 64 bits, nesting deeper than 255, a lone surrogate, which ``json``
    cannot write as UTF-8 either). ``tests/test_tokenizer_canonical.py`` checks the two agree
    on every code point and on such documents.

    Returns:
        The UTF-8 bytes of the canonical JSON.

    Raises:
        ValueError: ``data`` is not UTF-8 JSON.
    """
    floats: list[str] = []

    def noting(text: str) -> float:
        floats.append(text)
        return float(text)

    doc = json.loads(data.decode("utf-8"), parse_float=noting, parse_constant=noting)
    post = doc.get("post_processor") if isinstance(doc, dict) else None
    no_op = json.dumps(NO_OP_POST_PROCESSOR, sort_keys=True)
    if post is not None and json.dumps(post, sort_keys=True) == no_op:  # strict: 0 is not 0.0
        doc["post_processor"] = None
    if not floats:
        with contextlib.suppress(TypeError):  # orjson.JSONEncodeError is a TypeError
            return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _config_token(doc: dict, key: str, config: str) -> str | None:
    """The token ``doc[key]`` names: a string, or an ``AddedToken`` dict's ``content``; None when
    the key is absent or null."""
    value = doc.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    if value is None or (isinstance(value, str) and value):
        return value
    raise ValueError(
        f"{config}: {key}={doc.get(key)!r} names no token. Fix: set {key} to the token's text "
        '(e.g. "</s>") or to an AddedToken with that "content", or remove it'
    )


def _loader_doc(path: str, tokenizer_json: str) -> dict:
    """The JSON object of the loader file ``path`` beside ``tokenizer_json``.

    Raises:
        ValueError: ``path`` cannot be read, or holds no JSON object.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path}: cannot read it ({type(e).__name__}: {e}); its eos_token names the "
            f"EOD of {tokenizer_json}. Fix: restore the {os.path.basename(path)} that came with "
            "the tokenizer, or remove it"
        ) from e
    if not isinstance(doc, dict):
        raise ValueError(
            f"{path}: not a JSON object. Fix: restore the {os.path.basename(path)} that came with "
            "the tokenizer"
        )
    return doc


def copy_loader_file(src: str, dst: str) -> str | None:
    """Copy the loader file ``src`` (a :data:`TOKENIZER_CONFIG` or :data:`SPECIAL_TOKENS_MAP`
    from outside: a model directory, a tokenizer directory) to ``dst`` without the keys that
    make ``transformers`` run code (:data:`CODE_KEYS`); a file without them is copied byte for
    byte. The special tokens, and so the tokenizer's identity, are unchanged.

    Returns:
        A line saying which keys were left out and why, for the caller to print; None when
        none was.

    Raises:
        ValueError: ``src`` cannot be read, or holds no JSON object.
    """
    doc = _loader_doc(src, os.path.join(os.path.dirname(src), "tokenizer.json"))
    dropped = [key for key in CODE_KEYS if key in doc]
    if not dropped:
        shutil.copyfile(src, dst)
        return None
    with atomic_open(dst, "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in doc.items() if k not in CODE_KEYS}, f, indent=2)
        f.write("\n")
    return (
        f"left {', '.join(dropped)} of {src} out of its copy: it names Python code that "
        "transformers would import (with trust_remote_code=True, as lm-eval loads the exported "
        "model); megatron-gamma's tokenizer is the tokenizer.json, and its special tokens are "
        "kept"
    )


def special_tokens(tokenizer_json: str) -> tuple[dict[str, str | None], dict[str, str]]:
    """The EOD, PAD and BOS tokens of a HF tokenizer.json, as ``transformers.AutoTokenizer``
    (5.24) reads them from the loader files beside it: those of the :data:`TOKENIZER_CONFIG`,
    and, where that file has no ``added_tokens_decoder`` (a file saved before transformers
    4.34, or none at all), those of the :data:`SPECIAL_TOKENS_MAP` over them
    (``PreTrainedTokenizerBase._from_pretrained``'s legacy path).

    Returns:
        ({'eod', 'pad', 'bos'}: token text, or None for a PAD or BOS no file names; EOD
        ``<|endoftext|>`` where none names one), and {the keys a file named: that file's path}.
        Without either file: ``<|endoftext|>``, ``<|pad|>``, ``<|bos|>`` and {}.

    Raises:
        ValueError: an unreadable loader file, or one whose special token is not text.
    """
    folder = os.path.dirname(os.path.abspath(tokenizer_json))
    tokens: dict[str, str | None] = {"eod": None, "pad": None, "bos": None}
    named: dict[str, str] = {}
    config = os.path.join(folder, TOKENIZER_CONFIG)
    legacy = os.path.join(folder, SPECIAL_TOKENS_MAP)
    doc = _loader_doc(config, tokenizer_json) if os.path.isfile(config) else {}
    files = [(config, doc)] if os.path.isfile(config) else []
    if "added_tokens_decoder" not in doc and os.path.isfile(legacy):
        files.append((legacy, _loader_doc(legacy, tokenizer_json)))
    if not files:
        return {"eod": EOD, "pad": PAD, "bos": BOS}, {}
    for path, loaded in files:
        for name, key in CONFIG_KEYS.items():
            if key in loaded:
                tokens[name] = _config_token(loaded, key, path)
                named[name] = path
    return {**tokens, "eod": tokens["eod"] or EOD}, named


class BilingualTokenizer:
    """A tokenizer.json with the surface megatron-core's GPTDataset uses.

    Args:
        path: the tokenizer.json.
        tokenizer_type: the Megatron-LM ``--tokenizer-type`` it was made from.
        source: the files that define it (default ``[path]``; GPT-2 BPE: vocab.json and
            merges.txt, :mod:`megatron_gamma.data.tokenizer_types`).

    For ``HuggingFaceTokenizer``, EOD, PAD and BOS are those of :func:`special_tokens`: the
    ``eos_token``, ``pad_token`` and ``bos_token`` of the ``tokenizer_config.json`` (or of a
    ``special_tokens_map.json``, as transformers reads it) beside ``path`` (PAD and BOS None where
    none names them; EOD ``<|endoftext|>`` where none names one), else ``<|endoftext|>``,
    ``<|pad|>`` and ``<|bos|>`` (PAD and BOS None when the vocabulary lacks them). When the
    file that names EOD makes it another token than ``<|endoftext|>``, it is a source
    file too (after ``path``), and ``sha256`` covers the tokenizer.json's bytes and the EOD,
    PAD and BOS tokens it names (not the rest of the file: a chat template added, or a re-save by
    ``transformers``, changes no token id): editing its ``eos_token`` changes ``sha256``, so
    data, caches and checkpoints made with another EOD are refused, not reused. Otherwise the
    identity is the tokenizer.json's alone, as before configs were read.

    Attributes:
        hf_tokenizer: the ``tokenizers.Tokenizer`` read from ``path`` (preprocessing's HF
            backend encodes with it: :class:`~megatron_gamma.data.token_backend.HFBackend`).
        vocab_size: number of token ids (unpadded).
        eod, pad, bos: special token ids (pad and bos may be None, see above).
        eos_token, pad_token, bos_token: their text (None where the id is None).
        special_texts: those of them that are not None, which preprocessing encodes as plain
            text when a document holds them (:mod:`megatron_gamma.data.token_backend`).
        named_in: {'eod', 'pad', 'bos' that a loader file names: that file's path}.
        sha256: hex SHA-256 of the bytes of the ``source`` files, in order (for the default
            source: of the tokenizer.json); with a loader file among them, of the tokenizer.json
            and the sorted JSON of the EOD, PAD and BOS tokens instead of the config's bytes.
        canonical_sha256: the same digest with the tokenizer.json's bytes replaced by its
            :func:`canonical_tokenizer_json` (for ``HuggingFaceTokenizer``; for the other types,
            whose source files are not a tokenizer.json, ``sha256`` itself): equal for a
            tokenizer.json that ``transformers`` saved again, which may add a no-op
            post-processor and write its keys in another layout. Read on first use (from the
            bytes ``sha256`` describes: a file changed since is an error).
        unique_identifiers: what megatron-core hashes into its dataset cache keys.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigError: ``path`` is not a tokenizer.json (:func:`read_tokenizer_json`).
        ValueError: the EOD token is not in the vocabulary, or a special token a loader file
            names is not (the message names it and the fix).
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
        self.hf_tokenizer = read_tokenizer_json(path)
        names, self.named_in = {"eod": EOD, "pad": PAD, "bos": BOS}, {}
        if tokenizer_type == "HuggingFaceTokenizer":
            names, self.named_in = special_tokens(self.path)
        lookup = self.hf_tokenizer.token_to_id
        ids = {key: None if t is None else lookup(t) for key, t in names.items()}
        for key, token in names.items():
            if ids[key] is None and token is not None and (key in self.named_in or key == "eod"):
                raise ValueError(self._missing(key, token))
        self.eod, self.pad, self.bos = ids["eod"], ids["pad"], ids["bos"]
        self.eos_token = names["eod"]
        self.pad_token = names["pad"] if self.pad is not None else None
        self.bos_token = names["bos"] if self.bos is not None else None
        self.special_texts = tuple(
            t for t in (self.eos_token, self.pad_token, self.bos_token) if t is not None
        )
        specials = b""  # the EOD, PAD and BOS a loader file names, where they join the identity
        if "eod" in self.named_in and self.eos_token != EOD:
            self.source.append(self.named_in["eod"])
            names = {"eos_token": self.eos_token, "pad_token": self.pad_token}
            specials = json.dumps({**names, "bos_token": self.bos_token}, sort_keys=True).encode()
        self.vocab_size = self.hf_tokenizer.get_vocab_size()
        self._specials = specials
        self.sha256 = files_sha256(self.source[: len(self.source) - bool(specials)], specials)
        self.unique_identifiers = {"class": type(self).__name__, "sha256": self.sha256[:16]}

    @functools.cached_property
    def canonical_sha256(self) -> str:
        """Hex SHA-256 of :func:`canonical_tokenizer_json` and the EOD, PAD and BOS that join
        the identity (class docstring); ``sha256`` for a type other than
        ``HuggingFaceTokenizer``. Read on first use, from bytes that must still have ``sha256``,
        so that the two digests always describe the same file.

        Raises:
            ConfigError: the tokenizer.json changed since this tokenizer read it (both digests
                named).
        """
        if self.tokenizer_type != "HuggingFaceTokenizer":
            return self.sha256
        with open(self.path, "rb") as f:
            data = f.read()
        now = hashlib.sha256(data + self._specials).hexdigest()
        if now != self.sha256:
            raise ConfigError(
                f"tokenizer_model={self.path!r}: changed while in use (sha256 {self.sha256[:12]} "
                f"when read, {now[:12]} now). Fix: leave the tokenizer files unchanged while a "
                "command runs, and run it again"
            )
        return hashlib.sha256(canonical_tokenizer_json(data) + self._specials).hexdigest()

    def _missing(self, key: str, token: str) -> str:
        """The error for special token ``token`` (``key``: eod, pad or bos) not in the
        vocabulary."""
        decoder = self.hf_tokenizer.get_added_tokens_decoder()
        added = [t.content for t in decoder.values() if t.special]
        have = f" (its special tokens: {', '.join(added[:12])})" if added else ""
        folder = os.path.dirname(self.path)
        beside = [
            p
            for p in (os.path.join(folder, n) for n in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP))
            if os.path.isfile(p)
        ]
        if key not in self.named_in and not beside:
            return (
                f"{self.path}: no {token} token, its EOD by default, and no {TOKENIZER_CONFIG} "
                "beside it whose eos_token names another. Fix: put the tokenizer_config.json that "
                "came with the tokenizer beside it (transformers' AutoTokenizer.from_pretrained("
                '...).save_pretrained(DIR) writes both), or write one there with "eos_token": '
                f"the tokenizer's end-of-document token{have}; or train one with `megatron-gamma "
                "train-tokenizer`"
            )
        field = CONFIG_KEYS[key]
        if key not in self.named_in:
            return (
                f"{self.path}: no {EOD} token, its EOD when {' and '.join(beside)} name(s) no "
                f"eos_token. Fix: set eos_token in {beside[0]} to the tokenizer's "
                f"end-of-document token{have}"
            )
        where = self.named_in[key]
        return (
            f"{where}: {field} {token!r} is not a token of {self.path}. Fix: set "
            f"{field} in {where} to one of its tokens{have}"
            + (", or remove it" if key != "eod" else "")
        )

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one text (no EOD)."""
        return self.hf_tokenizer.encode(text, add_special_tokens=False).ids

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of many texts at once (parallel on the Rust side)."""
        return [e.ids for e in self.hf_tokenizer.encode_batch(texts, add_special_tokens=False)]

    def detokenize(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of token ids (special tokens kept)."""
        return self.hf_tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
