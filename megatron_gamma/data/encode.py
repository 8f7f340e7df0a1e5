"""Worker side of preprocessing: a chunk of raw records in, token arrays and counts out.

Per record and ``--json-keys`` key: decode and check the record, normalize the text, tag its
language, apply the text filters, split it into sentences (optional), then tokenize the whole
chunk in one ``Tokenizer.encode_batch_fast`` call (the Rust side, no offsets) and pack the ids of
each output into one numpy array. Every document is processed on its own, so the result does not
depend on where chunk boundaries fall, nor on which worker runs it.

Special-token strings inside a document (a literal ``<|endoftext|>`` in a text about tokenizers)
are encoded as plain text (``Tokenizer.encode_special_tokens = True``): only the appended EOD ends
a document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer

from megatron_gamma.data.filters import Filters
from megatron_gamma.data.langid import tag_language
from megatron_gamma.data.normalize import check_punct_width, normalize, remove_control_characters
from megatron_gamma.data.readers import (
    MAX_MESSAGES,
    Chunk,
    InputError,
    parse_chunk,
    record_language,
    record_text,
)
from megatron_gamma.data.sentences import split_sentences

ON_ERROR = ("stop", "skip")


@dataclass(frozen=True)
class EncodeOptions:
    """Everything that decides the bytes of the output (and so enters the done-marker).

    Attributes:
        json_keys: record fields to tokenize; each key is its own output (Megatron-LM).
        lang_key: record field holding the language ('zh*', 'en*', 'mixed'); when absent from a
            record, or when None, the script rule of :mod:`megatron_gamma.data.langid` tags it.
        per_language: one output per language tag instead of one for all.
        split_sentences: one sequence per sentence (:mod:`megatron_gamma.data.sentences`), for
            sentence-level consumers; megatron-core's GPTDataset treats every sequence as a
            document, so GPT pretraining data is made without it.
        append_eod: end every document with the tokenizer's EOD token.
        nfkc, punct_width: normalization (:mod:`megatron_gamma.data.normalize`).
        filters: document filters (:mod:`megatron_gamma.data.filters`).
        on_error: 'stop' at the first bad record, or 'skip' and count it.
    """

    json_keys: tuple[str, ...] = ("text",)
    lang_key: str | None = None
    per_language: bool = False
    split_sentences: bool = False
    append_eod: bool = True
    nfkc: bool = False
    punct_width: str = "keep"
    filters: Filters = field(default_factory=Filters)
    on_error: str = "stop"

    def __post_init__(self) -> None:
        if not self.json_keys:
            raise ValueError("json_keys is empty. Fix: --json-keys text")
        if len(set(self.json_keys)) != len(self.json_keys):
            raise ValueError(f"json_keys={list(self.json_keys)}: repeated key. Fix: name each once")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error={self.on_error!r}: unknown. Fix: use 'stop' or 'skip'")
        check_punct_width(self.punct_width)

    @property
    def level(self) -> str:
        """'sentence' or 'document', the last part of Megatron-LM's output names."""
        return "sentence" if self.split_sentences else "document"

    def output_name(self, key: str, lang: str) -> str:
        """``{lang}_{key}_{level}`` with per_language, else ``{key}_{level}``."""
        base = f"{key}_{self.level}"
        return f"{lang}_{base}" if self.per_language else base


@dataclass
class Output:
    """Token arrays of one output for one chunk.

    Attributes:
        tokens: (T,) token ids, dtype of the dataset.
        sequence_lengths: (S,) int32, tokens per sequence (sentence or document).
        document_sequences: (D,) int64, sequences per document.
    """

    tokens: np.ndarray
    sequence_lengths: np.ndarray
    document_sequences: np.ndarray


@dataclass
class EncodedChunk:
    """What a worker returns for a chunk.

    Attributes:
        outputs: ``{output name: Output}`` (only outputs that received documents).
        counts: nested integer counters (see :mod:`megatron_gamma.data.stats`).
        raw_bytes: uncompressed input bytes of the chunk.
        disk_pos: how far into its file (on-disk bytes) the chunk ends.
        path: the chunk's file.
        messages: the first bad-record messages skipped in this chunk.
    """

    outputs: dict[str, Output]
    counts: dict
    raw_bytes: int
    disk_pos: int
    path: str
    messages: list[str]


def _bump(d: dict, *keys: str, by: int = 1) -> None:
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = d.get(keys[-1], 0) + by


class ChunkEncoder:
    """Callable turning a :class:`~megatron_gamma.data.readers.Chunk` into an
    :class:`EncodedChunk`.

    Args:
        tokenizer_path: HF tokenizer.json with an EOD token.
        options: how to encode.
        dtype: numpy dtype of the token ids (megatron-core ``DType.optimal_dtype``).
        eod: the EOD token id.
    """

    def __init__(self, tokenizer_path: str, options: EncodeOptions, dtype: type, eod: int):
        self.tok = Tokenizer.from_file(tokenizer_path)
        self.tok.encode_special_tokens = True
        self.options = options
        self.dtype = dtype
        self.eod = eod

    def _texts(self, chunk: Chunk, counts: dict, messages: list[str]):
        """Yield (key, lang, text) of the records that pass the text filters."""
        opt = self.options
        errors = counts.setdefault("errors", {})
        records = parse_chunk(chunk, opt.on_error, errors, messages)
        for rec in records:
            try:
                label = record_language(chunk.path, rec, opt.lang_key)
                texts = []
                for key in opt.json_keys:
                    text = record_text(chunk.path, rec, key)
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError as e:
                        raise InputError(
                            "invalid_utf8",
                            f"{chunk.path}:{rec.line}: {key!r} holds a lone surrogate "
                            f"{text[e.start]!r} (not encodable as UTF-8). Fix: repair the "
                            "\\ud800-style escapes, or --on-error skip",
                        ) from None
                    text, controls = remove_control_characters(text)
                    text, cut = opt.filters.cap(text)
                    texts.append((key, text, controls, cut))
            except InputError as e:
                if opt.on_error != "skip":
                    raise
                _bump(errors, e.kind)
                if len(messages) < MAX_MESSAGES:
                    messages.append(str(e))
                continue
            for key, text, controls, cut in texts:
                text = normalize(text, opt.nfkc, opt.punct_width)
                lang = label or tag_language(text)
                _bump(counts, "languages", lang, "control_characters", by=controls)
                _bump(counts, "languages", lang, "truncated", by=int(cut))
                reason = opt.filters.text_reason(text)
                if reason is not None:
                    _bump(counts, "languages", lang, "dropped", reason)
                    continue
                yield key, lang, text

    def __call__(self, chunk: Chunk) -> EncodedChunk:
        opt = self.options
        counts: dict = {"byte_order_marks": chunk.byte_order_marks}
        messages: list[str] = []
        docs = list(self._texts(chunk, counts, messages))
        pieces = [split_sentences(t) if opt.split_sentences else [t] for _, _, t in docs]
        flat = [p for ps in pieces for p in ps]
        encodings = self.tok.encode_batch_fast(flat, add_special_tokens=False) if flat else []
        buffers: dict[str, tuple[list[int], list[int], list[int]]] = {}
        i = 0
        for (key, lang, text), ps in zip(docs, pieces, strict=True):
            seqs = [e.ids for e in encodings[i : i + len(ps)]]
            i += len(ps)
            seqs = [s for s in seqs if s]
            n = sum(len(s) for s in seqs)
            reason = opt.filters.token_reason(n) if seqs else "empty"
            if reason is not None:
                _bump(counts, "languages", lang, "dropped", reason)
                continue
            name = opt.output_name(key, lang)
            tokens, lengths, doc_seqs = buffers.setdefault(name, ([], [], []))
            for s in seqs:
                tokens.extend(s)
                lengths.append(len(s))
            if opt.append_eod:
                tokens.append(self.eod)
                lengths[-1] += 1
                n += 1
            doc_seqs.append(len(seqs))
            for group in (("languages", lang), ("outputs", name)):
                _bump(counts, *group, "documents")
                _bump(counts, *group, "sequences", by=len(seqs))
                _bump(counts, *group, "tokens", by=n)
            _bump(counts, "languages", lang, "characters", by=len(text))
        outputs = {
            name: Output(
                np.array(tokens, dtype=self.dtype),
                np.array(lengths, dtype=np.int32),
                np.array(doc_seqs, dtype=np.int64),
            )
            for name, (tokens, lengths, doc_seqs) in buffers.items()
        }
        return EncodedChunk(outputs, counts, chunk.raw_bytes, chunk.disk_pos, chunk.path, messages)
