"""Worker side of preprocessing: a chunk of raw records in, token arrays and counts out.

Per record and ``--json-keys`` key: decode and check the record, normalize the text, tag its
language, apply the text filters, split it into sentences (optional), then tokenize the whole
chunk in one batch call of the tokenizer backend (:mod:`megatron_gamma.data.token_backend`:
``gigatoken`` or HF ``tokenizers``, same ids) and pack the ids of each output into one numpy array
with vectorized gathers, so no Python object is made per token. Every document is processed on
its own, so the result does not depend on where chunk boundaries fall, nor on which worker runs
it.

Special-token strings inside a document (a literal ``<|endoftext|>`` in a text about tokenizers)
are encoded as plain text (both backends): only the appended EOD ends a document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from megatron_gamma.data.filters import DROP_REASONS, Filters
from megatron_gamma.data.langid import LANGUAGES, tag_indices, tag_languages
from megatron_gamma.data.normalize import check_punct_width, normalize, remove_control_characters
from megatron_gamma.data.readers import (
    MAX_MESSAGES,
    Chunk,
    InputError,
    iter_records,
    plain_records,
    record_language,
    record_text,
)
from megatron_gamma.data.sentences import split_sentences
from megatron_gamma.data.stats import add_counts
from megatron_gamma.data.token_backend import GigatokenBackend, HFBackend
from megatron_gamma.data.token_stats import MAX_CHARS, TokenTextStats

ON_ERROR = ("stop", "skip")
_EMPTY = DROP_REASONS.index("empty")


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
    def stats_from_tokens(self) -> bool:
        """Whether the language tags and text filters can be read off a document's token ids
        (:class:`~megatron_gamma.data.token_stats.TokenTextStats`): no sentence splitting, no
        symbol-ratio filter, and documents capped below its field size."""
        return (
            not self.split_sentences
            and self.filters.max_symbol_ratio >= 1.0
            and self.filters.max_document_chars < MAX_CHARS
        )

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


def _count_dropped(counts: dict, langs: np.ndarray, reasons: np.ndarray) -> None:
    """Count each document whose ``reasons`` entry (an index in DROP_REASONS, -1 kept) drops
    it, under its language (``langs``: indices in LANGUAGES)."""
    for d in np.flatnonzero(reasons >= 0).tolist():
        _bump(counts, "languages", LANGUAGES[langs[d]], "dropped", DROP_REASONS[reasons[d]])


def _pack(
    ids: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    last: np.ndarray,
    eod: int | None,
    dtype: type,
) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate sequences of ``ids``, with ``eod`` after each document's last one.

    Args:
        ids: (T,) the chunk's token ids.
        starts, lengths: (S,) int64, where each kept sequence lies in ``ids``.
        last: (S,) bool, the sequence ends its document.
        eod: the id appended to each document, or None.
        dtype: the output's token dtype.

    Returns:
        (tokens, sequence_lengths): (sum(lengths) + EODs,) ``dtype`` and (S,) int32.
    """
    eods = last.astype(np.int64) if eod is not None else np.zeros(len(lengths), np.int64)
    out_lengths = lengths + eods
    ends = np.cumsum(lengths)
    if len(starts) and (starts[1:] == starts[0] + ends[:-1]).all():  # one run of ids
        run = ids[starts[0] : starts[0] + ends[-1]].astype(dtype)
        tokens = run if eod is None else np.insert(run, ends[last], dtype(eod))
        return tokens, out_lengths.astype(np.int32)
    out_starts = np.cumsum(out_lengths) - out_lengths
    tokens = np.empty(int(out_lengths.sum()), dtype=dtype)
    n = int(lengths.sum())
    within = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    tokens[np.repeat(out_starts, lengths) + within] = ids[np.repeat(starts, lengths) + within]
    if eod is not None:
        tokens[(out_starts + lengths)[last]] = eod
    return tokens, out_lengths.astype(np.int32)


@dataclass
class DecodedTexts:
    """The ``--json-keys`` texts of a chunk's good records, in order (:func:`decoded_texts`):
    checked, cleaned of control characters, capped and normalized; neither tagged nor filtered.

    Attributes:
        keys: (N,) int64, each text's key, an index in ``EncodeOptions.json_keys``.
        texts: the N texts.
        chars: (N,) int64, characters of each text.
        controls: (N,) int64, control characters removed from each text.
        truncated: (N,) bool, the text was cut to ``max_document_chars`` characters.
        labels: (N,) int64, the language of the text's record from its ``lang_key`` field, an
            index in :data:`~megatron_gamma.data.langid.LANGUAGES`, or -1 (none: the script rule
            tags it).
    """

    keys: np.ndarray
    texts: list[str]
    chars: np.ndarray
    controls: np.ndarray
    truncated: np.ndarray
    labels: np.ndarray


def _decoded(
    texts: list[str],
    keys: np.ndarray,
    controls: np.ndarray,
    labels: np.ndarray,
    opt: EncodeOptions,
) -> DecodedTexts:
    """``texts`` capped to ``opt.filters.max_document_chars`` characters, then normalized."""
    chars = np.fromiter(map(len, texts), np.int64, len(texts))
    cap = opt.filters.max_document_chars
    truncated = chars > cap
    for i in np.flatnonzero(truncated).tolist():
        texts[i] = texts[i][:cap]
    if opt.nfkc or opt.punct_width != "keep":
        texts = [normalize(text, opt.nfkc, opt.punct_width) for text in texts]
        chars = np.fromiter(map(len, texts), np.int64, len(texts))
    else:
        chars = np.minimum(chars, cap)
    return DecodedTexts(keys, texts, chars, controls, truncated, labels)


def decoded_texts(
    chunk: Chunk, opt: EncodeOptions, counts: dict, messages: list[str], escapes: bool = True
) -> DecodedTexts:
    """The ``--json-keys`` texts of ``chunk``'s good records (:class:`DecodedTexts`). Without
    ``opt.lang_key``, a chunk whose records need no check
    (:func:`~megatron_gamma.data.readers.plain_records`) is parsed in one pass; any other goes
    record by record (``iter_records``), same texts.

    Args:
        chunk: raw records.
        opt: text handling and filters.
        counts: receives the error counts, and under ``lang_key_records`` the records whose
            ``opt.lang_key`` field gave their language.
        messages: receives up to ``MAX_MESSAGES`` skipped-record messages.
        escapes: as :func:`~megatron_gamma.data.readers.iter_records` takes it; with False, the
            control characters of a line parsed by orjson are neither counted nor removed (the
            caller finds them in the tokens and decodes the chunk again).

    Raises:
        InputError: a bad record, with ``opt.on_error`` 'stop'.
    """
    errors = counts.setdefault("errors", {})
    if opt.lang_key is None:
        plain = plain_records(chunk, opt.json_keys, escapes)
        if plain is not None:
            texts = [fields[key] for fields in plain for key in opt.json_keys]
            keys = np.tile(np.arange(len(opt.json_keys), dtype=np.int64), len(plain))
            none = np.zeros(len(texts), np.int64)
            return _decoded(texts, keys, none, none - 1, opt)
    records = iter_records(chunk, opt.on_error, errors, messages, escapes)
    texts, keys, controls, labels = [], [], [], []
    for rec in records:
        try:
            label = record_language(chunk.path, rec, opt.lang_key)
            if label is not None:
                _bump(counts, "lang_key_records")
            mine = []  # (key, text, control characters) of this record
            for k, key in enumerate(opt.json_keys):
                text = record_text(chunk.path, rec, key)
                removed = 0
                if not rec.plain:
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError as e:
                        raise InputError(
                            "invalid_utf8",
                            f"{chunk.path}:{rec.line}: {key!r} holds a lone surrogate "
                            f"{text[e.start]!r}, from a JSON escape: the line is valid UTF-8, "
                            "but the escape encodes no character, so the text cannot be "
                            "written as UTF-8 (counted as invalid_utf8). Fix: repair the escape "
                            "(\\ud800-\\udbff must be followed by \\udc00-\\udfff), or "
                            "--on-error skip",
                        ) from None
                    text, removed = remove_control_characters(text)
                mine.append((k, text, removed))
        except InputError as e:
            if opt.on_error != "skip":
                raise
            _bump(errors, e.kind)
            if len(messages) < MAX_MESSAGES:
                messages.append(str(e))
            continue
        for k, text, removed in mine:
            keys.append(k)
            texts.append(text)
            controls.append(removed)
            labels.append(-1 if label is None else LANGUAGES.index(label))
    return _decoded(
        texts,
        np.array(keys, np.int64),
        np.array(controls, np.int64),
        np.array(labels, np.int64),
        opt,
    )


def filtered_texts(chunk: Chunk, opt: EncodeOptions, counts: dict, messages: list[str]):
    """Yield (key, lang, text) of ``chunk``'s records that pass the text filters, normalized, in
    order (:func:`decoded_texts`); the untagged texts are tagged in one batch
    (:func:`~.langid.tag_languages`).

    Raises:
        InputError: a bad record, with ``opt.on_error`` 'stop'.
    """
    d = decoded_texts(chunk, opt, counts, messages)
    untagged = np.flatnonzero(d.labels < 0).tolist()
    tags = iter(tag_languages([d.texts[i] for i in untagged]))
    columns = (d.keys.tolist(), d.texts, d.controls.tolist(), d.truncated.tolist())
    for k, text, controls, cut, label in zip(*columns, d.labels.tolist(), strict=True):
        lang = LANGUAGES[label] if label >= 0 else next(tags)
        _bump(counts, "languages", lang, "control_characters", by=controls)
        _bump(counts, "languages", lang, "truncated", by=int(cut))
        reason = opt.filters.text_reason(text)
        if reason is not None:
            _bump(counts, "languages", lang, "dropped", reason)
            continue
        yield opt.json_keys[k], lang, text


def _first_use(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct ``values`` in order of first occurrence, each value's index in that
    order): (U,) and (N,) int64 for (N,) int64 ``values``."""
    distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return distinct[order], rank[inverse.reshape(-1)]


class ChunkEncoder:
    """Callable turning a :class:`~megatron_gamma.data.readers.Chunk` into an
    :class:`EncodedChunk`.

    Two ways give the same bytes and counts. By text (:func:`filtered_texts`): tag and filter
    each text, then tokenize what is kept. By tokens, when ``token_stats`` is given and the
    options need no text but what the tokens carry (:meth:`EncodeOptions.stats_from_tokens`):
    tokenize every decoded text, then read the language tags and the ``empty`` filter off the
    ids (:class:`~megatron_gamma.data.token_stats.TokenTextStats`), which costs a few passes
    over the ids instead of several over the code points. By tokens, the lines are not scanned
    for the escapes of control characters either (a regex over every byte, about 4 % of a run): the
    ids show whether a text holds one, and a chunk whose texts do is decoded again with the
    scan, which removes and counts them, and tokenized again. After such a chunk the encoder
    scans every chunk first (``scan_escapes``), so input full of control characters costs no
    second tokenization per chunk; the result is the same either way.

    Args:
        backend: the tokenizer backend
            (:func:`~megatron_gamma.data.token_backend.make_backend`), as the start-up check
            chose and loaded it.
        options: how to encode.
        dtype: numpy dtype of the token ids (megatron-core ``DType.optimal_dtype``).
        eod: the EOD token id.
        token_stats: the backend's vocabulary tables, or None to work by text.
    """

    def __init__(
        self,
        backend: HFBackend | GigatokenBackend,
        options: EncodeOptions,
        dtype: type,
        eod: int,
        token_stats: TokenTextStats | None = None,
    ):
        self.backend = backend
        self.options = options
        self.dtype = dtype
        self.eod = eod
        self.token_stats = token_stats if options.stats_from_tokens else None
        self.scan_escapes = False

    def _by_text(self, chunk: Chunk, counts: dict, messages: list[str]):
        opt = self.options
        docs = list(filtered_texts(chunk, opt, counts, messages))
        pieces = [split_sentences(t) if opt.split_sentences else [t] for _, _, t in docs]
        ids, offsets = self.backend.encode_batch([p for ps in pieces for p in ps])
        doc_pieces = np.fromiter(map(len, pieces), np.int64, len(pieces))
        key_of = {key: k for k, key in enumerate(opt.json_keys)}
        keys = np.fromiter((key_of[key] for key, _, _ in docs), np.int64, len(docs))
        langs = np.fromiter((LANGUAGES.index(lang) for _, lang, _ in docs), np.int64, len(docs))
        chars = np.fromiter((len(text) for _, _, text in docs), np.int64, len(docs))
        return keys, langs, chars, ids, offsets[:-1], np.diff(offsets), doc_pieces

    def _tokenized(self, chunk: Chunk, counts: dict, messages: list[str], escapes: bool):
        decoded = decoded_texts(chunk, self.options, counts, messages, escapes)
        ids, offsets = self.backend.encode_batch(decoded.texts)
        return decoded, ids, offsets, self.token_stats.documents(ids, offsets)

    def _by_tokens(self, chunk: Chunk, counts: dict, messages: list[str]):
        opt = self.options
        if not self.scan_escapes:
            first_counts: dict = {}
            first_messages: list[str] = []
            d, ids, offsets, units = self._tokenized(chunk, first_counts, first_messages, False)
            if units["controls"].any():
                self.scan_escapes = True
            else:
                add_counts(counts, first_counts)
                messages += first_messages
        if self.scan_escapes:
            d, ids, offsets, units = self._tokenized(chunk, counts, messages, True)
        langs = np.where(d.labels >= 0, d.labels, tag_indices(units["han"], units["words"]))
        seen, lang_of = _first_use(langs)
        n = len(seen)
        controls = np.bincount(lang_of, d.controls, minlength=n)
        cut = np.bincount(lang_of, d.truncated, minlength=n)
        for m, lang in enumerate(seen.tolist()):
            _bump(counts, "languages", LANGUAGES[lang], "control_characters", by=int(controls[m]))
            _bump(counts, "languages", LANGUAGES[lang], "truncated", by=int(cut[m]))
        reasons = opt.filters.reasons_from_counts(units["visible"], d.chars)
        _count_dropped(counts, langs, reasons)
        keep = np.flatnonzero(reasons < 0)
        lengths = np.diff(offsets)[keep]
        starts = offsets[:-1][keep]
        return d.keys[keep], langs[keep], d.chars[keep], ids, starts, lengths, np.ones_like(keep)

    def __call__(self, chunk: Chunk) -> EncodedChunk:
        opt = self.options
        counts: dict = {"byte_order_marks": chunk.byte_order_marks}
        messages: list[str] = []
        by = self._by_text if self.token_stats is None else self._by_tokens
        # Per document: its key (index in json_keys), language (index in LANGUAGES) and
        # characters; per piece (sentence or whole document): where its ids start, its length;
        # per document: its pieces.
        by_doc = by(chunk, counts, messages)
        doc_key, doc_lang, doc_chars, ids, piece_starts, piece_lengths, doc_pieces = by_doc
        doc_of_piece = np.repeat(np.arange(len(doc_key)), doc_pieces)
        bounds = np.concatenate([[0], np.cumsum(doc_pieces)])
        nonempty = piece_lengths > 0
        total = np.concatenate([[0], np.cumsum(piece_lengths)])
        kept = np.concatenate([[0], np.cumsum(nonempty)])
        doc_tokens = total[bounds[1:]] - total[bounds[:-1]]
        doc_seqs = kept[bounds[1:]] - kept[bounds[:-1]]
        reasons = np.where(doc_seqs > 0, opt.filters.token_reasons(doc_tokens), _EMPTY)
        _count_dropped(counts, doc_lang, reasons)
        # Each kept document's output and language, numbered in order of first use.
        keep = np.flatnonzero(reasons < 0)
        kept_lang = doc_lang[keep]
        langs_used, lang_member = _first_use(kept_lang)
        langs = {LANGUAGES[lang]: m for m, lang in enumerate(langs_used.tolist())}
        width = len(LANGUAGES) if opt.per_language else 1
        lang_part = kept_lang if opt.per_language else 0
        groups_used, output_member = _first_use(doc_key[keep] * width + lang_part)
        names: dict[str, int] = {}
        for used in groups_used.tolist():
            key, lang = divmod(used, width)
            names[opt.output_name(opt.json_keys[key], LANGUAGES[lang])] = len(names)
        doc_output = np.full(len(doc_key), -1, dtype=np.int64)
        doc_output[keep] = output_member
        chars = doc_chars[keep]
        extra = int(opt.append_eod)
        seqs, tokens = doc_seqs[keep], doc_tokens[keep] + extra
        for group, members, member in (
            ("outputs", names, output_member),
            ("languages", langs, lang_member),
        ):
            n = len(members)
            sums = {
                "documents": np.bincount(member, minlength=n),
                "sequences": np.bincount(member, seqs, minlength=n),
                "tokens": np.bincount(member, tokens, minlength=n),
            }
            if group == "languages":
                sums["characters"] = np.bincount(member, chars, minlength=n)
            for name, m in members.items():
                for counter, values in sums.items():
                    _bump(counts, group, name, counter, by=int(values[m]))
        outputs = {}
        eod = self.eod if opt.append_eod else None
        for name, o in names.items():
            sel = np.flatnonzero(nonempty & (doc_output[doc_of_piece] == o))
            owner = doc_of_piece[sel]
            last = np.append(owner[1:] != owner[:-1], True)
            tokens, lengths = _pack(
                ids, piece_starts[sel], piece_lengths[sel], last, eod, self.dtype
            )
            outputs[name] = Output(tokens, lengths, doc_seqs[doc_output == o].astype(np.int64))
        return EncodedChunk(outputs, counts, chunk.raw_bytes, chunk.disk_pos, chunk.path, messages)
