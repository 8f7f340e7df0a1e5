"""Per-document text statistics read off the token ids of a byte-level BPE tokenizer.

With a byte-level BPE and no normalizer, the bytes of a document's tokens, concatenated, are the
UTF-8 bytes of its text. So what preprocessing's language tags and ``empty`` filter count on
the text (the script units of :mod:`megatron_gamma.data.langid`, the characters outside
:data:`~megatron_gamma.data.filters.INVISIBLE`), and whether it holds a control character that
preprocessing removes (:data:`~megatron_gamma.data.normalize.CONTROL_CHARACTERS`), follow from
per-token tables built once from the vocabulary, summed per document with ``np.add.reduceat``,
plus two corrections at token boundaries:

- a character whose UTF-8 bytes are split over two or more tokens (byte-level BPE splits rare
  Han characters) is decoded from the partial code point its first token ends with and the
  continuation bytes the next tokens start with;
- a run of Latin letters that continues across a token boundary is one word, not two.

The counts equal those of the text (``tests/test_data_token_stats.py`` compares them with
:func:`~megatron_gamma.data.langid.script_units_batch` on the Debian corpus and on adversarial
texts). Where the extension ``megatron_gamma._C`` is built, one pass of its C++ kernel
(``csrc/token_stats_cpu.cpp``) over the token ids does the work; elsewhere a dozen numpy passes do,
with the same results (the tests compare both).
"""

from __future__ import annotations

import numpy as np

from megatron_gamma.data.filters import INVISIBLE
from megatron_gamma.data.langid import han_mask, latin_mask
from megatron_gamma.data.normalize import CONTROL_CHARACTERS
from megatron_gamma.data.token_backend import PROBE_TEXTS

_FIELD = 21
MAX_CHARS = 1 << _FIELD
"""Documents must be shorter than this (characters): each count is a 21-bit field of one int64."""
_FIRST_LATIN, _LAST_LATIN, _CUT, _CONTROL = 1, 2, 4, 8


_VISIBLE, _HAN, _LATIN = 1, 2, 4
_NEED_CLASSES = 4
_UTF8_ERRORS = {
    1: "token ids end inside a UTF-8 character. Fix: valid UTF-8 text",
    2: "a UTF-8 character cut by a token is not continued by the next",
}
_LOW_CODE_POINTS = 0x10000
"""Code points the compiled kernel classifies from a table (the Basic Multilingual Plane); a cut
character above is classified when it occurs."""


def _compiled_kernel():
    """``token_document_stats`` of ``megatron_gamma._C``, or None when the extension is not
    built (it imports torch). Loaded here, not through :mod:`megatron_gamma.ops`, whose import
    (~0.03 CPU-s) registers the model's kernels; ``MEGATRON_GAMMA_OPS`` selects those only, and
    ``TokenTextStats(compiled=False)`` this one."""
    try:
        import torch

        from megatron_gamma import _C  # noqa: F401  (registers torch.ops.megatron_gamma.*)
    except ImportError:
        return None
    return torch.ops.megatron_gamma.token_document_stats


def _char_classes(cp: np.ndarray) -> np.ndarray:
    """(N,) int64 class bits of code points ``cp``: visible 1, Han 2, Latin 4 (the masks of the
    numpy path)."""
    return _visible(cp) * _VISIBLE + han_mask(cp) * _HAN + latin_mask(cp) * _LATIN


def _visible(cp: np.ndarray) -> np.ndarray:
    """Characters outside :data:`~megatron_gamma.data.filters.INVISIBLE`."""
    return ~np.isin(cp, np.array([ord(c) for c in INVISIBLE], dtype=np.int64))


_UTF8_LENGTH = np.ones(256, np.int64)
_UTF8_LENGTH[0xC0:], _UTF8_LENGTH[0xE0:], _UTF8_LENGTH[0xF0:] = 2, 3, 4
"""The bytes of the UTF-8 character a byte starts (1 for ASCII and continuation bytes)."""
_CONTROL_BYTE = np.zeros(256, bool)
_CONTROL_BYTE[list(CONTROL_CHARACTERS)] = True


def _vocabulary_tables(data: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, ...]:
    """:class:`TokenTextStats`' per-token tables of a vocabulary.

    Args:
        data: (N + 3,) uint8, the tokens' bytes one after another, then three zero bytes.
        lengths: (V,) int64, each token's bytes.

    Returns:
        ``code``, ``flags``, ``leads``, ``partial``, ``need``, ``only_partial``, ``head_count``
        and ``head_value``: (V,) arrays (``flags`` uint8, ``only_partial`` bool, the rest
        int64), as :class:`TokenTextStats` names them. Per-token sums are ``np.bincount`` over
        the characters' token ids (int32), and the arrays of every byte are freed by return, so
        a 100k vocabulary's build stays within a few tens of MiB. ``head_value`` keeps the low
        64 bits of a token that starts with over ten continuation bytes (no UTF-8 text holds
        one; only its first three can finish a cut character).
    """
    v = len(lengths)
    first = np.cumsum(lengths) - lengths
    end = first + lengths
    head = data[: len(data) - 3]
    token = np.repeat(np.arange(v, dtype=np.int32), lengths)  # (N,) each byte's token
    lead_pos = np.flatnonzero((head & 0xC0) != 0x80)  # the first byte of each character
    tok_lead = token[lead_pos]
    complete = lead_pos + _UTF8_LENGTH[head[lead_pos]] <= end[tok_lead]
    at = lead_pos[complete]
    cp = _code_points(data, at)
    tok_c = tok_lead[complete]
    latin_c = latin_mask(cp)
    latin = np.zeros(len(lead_pos), bool)
    latin[complete] = latin_c
    # The Latin-ness of the complete character before each one in its token (False first).
    prev_latin = np.zeros(len(lead_pos), bool)
    prev_latin[1:] = (tok_lead[1:] == tok_lead[:-1]) & latin[:-1]
    leads = np.bincount(tok_lead, minlength=v)
    han = np.bincount(tok_c[han_mask(cp)], minlength=v)
    words = np.bincount(tok_lead[latin & ~prev_latin], minlength=v)  # Latin runs starting here
    visible = np.bincount(tok_c[_visible(cp)], minlength=v)
    code = visible | (han << _FIELD) | (words << (2 * _FIELD))
    # Each token's first character (when complete its Latin-ness), last one, last complete one.
    new = np.ones(len(lead_pos), bool)
    new[1:] = tok_lead[1:] != tok_lead[:-1]
    last = np.roll(new, -1)
    last_c = np.ones(len(tok_c), bool)
    last_c[:-1] = tok_c[1:] != tok_c[:-1]
    first_lead, last_lead, last_complete = (np.full(v, -1, np.int64) for _ in range(3))
    first_lead[tok_lead[new]] = lead_pos[new]
    last_lead[tok_lead[last]] = lead_pos[last]
    last_complete[tok_c[last_c]] = at[last_c]
    first_latin, last_latin, cut, control = (np.zeros(v, bool) for _ in range(4))
    first_latin[tok_lead[new]] = latin[new]
    last_latin[tok_c[last_c]] = latin_c[last_c]
    cut[tok_lead[last]] = ~complete[last]
    control[token[_CONTROL_BYTE[head]]] = True
    only_partial = (first_lead >= 0) & (last_complete < first_lead)
    flags = first_latin * _FIRST_LATIN | last_latin * _LAST_LATIN | cut * _CUT
    flags = (flags | control * _CONTROL).astype(np.uint8)
    # A character cut at the token's end: its bits so far and the bytes it still needs.
    partial, need = np.zeros(v, np.int64), np.zeros(v, np.int64)
    cuts = np.flatnonzero(cut)
    start = last_lead[cuts]
    tail = end[cuts] - start  # 1-3 bytes
    width = _UTF8_LENGTH[data[start]]
    value = data[start] & (0x7F >> width)
    for k in (1, 2):
        more = tail > k
        value[more] = (value[more] << 6) | (data[start[more] + k] & 0x3F)
    partial[cuts], need[cuts] = value, width - tail
    # Continuation bytes a token starts with (they finish a character cut before it).
    head_count = np.where(first_lead >= 0, first_lead - first, lengths)
    head_value = np.zeros(v, np.int64)
    heads = np.flatnonzero(head_count)
    count = head_count[heads]
    value = np.zeros(len(heads), np.int64)
    for k in range(int(count.max(initial=0))):
        more = count > k
        value[more] = (value[more] << 6) | (data[first[heads[more]] + k] & 0x3F)
    head_value[heads] = value
    return code, flags, leads, partial, need, only_partial, head_count, head_value


def _code_points(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """(C,) int32 code points of the complete UTF-8 characters starting at byte offsets ``at``
    of ``data`` (uint8, at least 3 bytes after each character)."""
    lead = data[at].astype(np.int32)
    c1, c2, c3 = ((data[at + k] & 0x3F).astype(np.int32) for k in (1, 2, 3))
    return np.select(
        [lead < 0x80, lead < 0xE0, lead < 0xF0],
        [lead, ((lead & 0x1F) << 6) | c1, ((lead & 0x0F) << 12) | (c1 << 6) | c2],
        ((lead & 0x07) << 18) | (c1 << 12) | (c2 << 6) | c3,
    )


class TokenTextStats:
    """Per-token tables of a vocabulary and the per-document counts they give.

    Args:
        vocab: token id -> the token's bytes, for ids 0..V-1 (gigatoken's ``Tokenizer.vocab``).
        compiled: count with the C++ kernel of ``megatron_gamma._C``: None where it is built
            (else numpy), False never, True always.

    Raises:
        ValueError: the ids are not 0..V-1.
        RuntimeError: ``compiled=True`` and the extension is not built.
    """

    def __init__(self, vocab: dict[int, bytes], compiled: bool | None = None):
        if sorted(vocab) != list(range(len(vocab))):
            raise ValueError("vocab ids are not 0..V-1. Fix: pass Tokenizer.vocab of gigatoken")
        self.kernel = None if compiled is False else _compiled_kernel()
        if compiled and self.kernel is None:
            raise RuntimeError(
                "compiled=True but megatron_gamma._C is not built. Fix: pip install "
                "--no-build-isolation -e . (or compiled=None for numpy)"
            )
        pieces = [vocab[i] for i in range(len(vocab))]
        lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
        data = np.frombuffer(b"".join(pieces) + b"\0\0\0", np.uint8)
        (
            self.code, self.flags, self.leads, self.partial, self.need, self.only_partial,
            self.head_count, self.head_value,
        ) = _vocabulary_tables(data, lengths)  # fmt: skip
        # The compiled kernel's (8, V) table, rows as csrc/token_stats_cpu.cpp names them, and
        # its classes of the low code points.
        rows = (self.code, self.flags, self.leads, self.partial, self.need)
        rows += (self.only_partial, self.head_count, self.head_value)
        self.table = np.stack(rows, dtype=np.int64)
        if self.kernel is not None:
            self.classes = _char_classes(np.arange(_LOW_CODE_POINTS)).astype(np.uint8)

    @classmethod
    def for_backend(cls, backend) -> TokenTextStats | None:
        """The tables of ``backend``'s vocabulary when its tokens' bytes are the text's: the
        ``gigatoken`` backend on a byte-level BPE without normalizer
        (:func:`~megatron_gamma.data.token_backend.is_byte_level_bpe`) whose ids give back the
        bytes of every probe text of :data:`~megatron_gamma.data.token_backend.PROBE_TEXTS`;
        else None (work by text).

        Args:
            backend: a :class:`~megatron_gamma.data.token_backend.GigatokenBackend` or
                :class:`~megatron_gamma.data.token_backend.HFBackend`.
        """
        if getattr(backend, "name", None) != "gigatoken" or not backend.byte_level_bpe:
            return None
        vocab = backend.tok.vocab
        ids, offsets = backend.encode_batch(PROBE_TEXTS)
        for i, text in enumerate(PROBE_TEXTS):
            if b"".join(map(vocab.__getitem__, ids[offsets[i] : offsets[i + 1]].tolist())) != (
                text.encode("utf-8")
            ):
                return None
        return cls(vocab)

    def documents(self, ids: np.ndarray, offsets: np.ndarray) -> dict[str, np.ndarray]:
        """Script units, visibility and control characters of each document's text from its
        token ids.

        Args:
            ids: (T,) token ids (any integer dtype), documents one after another.
            offsets: (D + 1,) int64, document d's ids are ``ids[offsets[d]:offsets[d + 1]]``;
                each document shorter than :data:`MAX_CHARS` characters.

        Returns:
            ``han`` (Han characters), ``words`` (Latin words), ``visible`` (characters outside
            INVISIBLE), ``controls`` (tokens holding one of
            :data:`~megatron_gamma.data.normalize.CONTROL_CHARACTERS`; 0 when the text has
            none): (D,) int64.

        Raises:
            ValueError: the ids' bytes are not valid UTF-8 (a character cut and not continued),
                or (compiled kernel) an id outside the vocabulary, where numpy raises
                IndexError.
        """
        if self.kernel is None:
            return self._documents_numpy(ids, offsets)
        import torch

        ids = np.ascontiguousarray(ids)
        if ids.dtype in (np.uint32, np.int32):
            # uint32 ids (gigatoken's) are read as int32 in place: one >= 2**31 reads negative
            # and is refused as outside the vocabulary.
            ids32 = torch.from_numpy(ids.view(np.int32))
        elif ids.size and (ids.min() < 0 or ids.max() >= self.table.shape[1]):
            raise ValueError(self._outside_vocabulary())
        else:
            ids32 = torch.from_numpy(ids.astype(np.int32))
        args = (ids32, torch.from_numpy(np.ascontiguousarray(offsets, dtype=np.int64)))
        args += (torch.from_numpy(self.table), torch.from_numpy(self.classes))
        extra = np.zeros(0, np.int64)
        counts, status, unclassified = self.kernel(
            *args, torch.from_numpy(extra), torch.from_numpy(extra)
        )
        if status == _NEED_CLASSES:  # cut characters above the table: classify, count again
            values = unclassified.numpy()
            classes = torch.from_numpy(_char_classes(values).astype(np.int64))
            counts, status, _ = self.kernel(*args, unclassified, classes)
        if status:
            raise ValueError(_UTF8_ERRORS.get(status) or self._outside_vocabulary())
        counts = counts.numpy()
        return {
            "han": counts[:, 0], "words": counts[:, 1], "visible": counts[:, 2],
            "controls": counts[:, 3],
        }  # fmt: skip

    def _outside_vocabulary(self) -> str:
        return (
            f"a token id outside the vocabulary of {self.table.shape[1]}. Fix: this tokenizer's ids"
        )

    def _documents_numpy(self, ids: np.ndarray, offsets: np.ndarray) -> dict[str, np.ndarray]:
        idx = np.asarray(ids, dtype=np.intp)
        code = self.code[idx]
        flags = self.flags[idx]
        cut = np.flatnonzero(flags & _CUT)
        # Characters cut at a token's end: finish each from the continuation bytes that follow.
        value, need, j = self.partial[idx[cut]], self.need[idx[cut]], cut + 1
        visits = []  # (positions of the tokens that continue a cut character, which cut)
        while (open_ := np.flatnonzero(need > 0)).size:  # a character spans at most 4 tokens
            if (j[open_] >= len(idx)).any():
                raise ValueError("token ids end inside a UTF-8 character. Fix: valid UTF-8 text")
            nxt = idx[j[open_]]
            count = self.head_count[nxt]
            take = np.minimum(count, need[open_])
            if not take.all():
                raise ValueError("a UTF-8 character cut by a token is not continued by the next")
            value[open_] = (value[open_] << (6 * take)) | (
                self.head_value[nxt] >> (6 * (count - take))
            )
            need[open_] -= take
            visits.append((j[open_], open_))
            j[open_] += 1
        tail_latin = latin_mask(value)
        only = self.only_partial[idx[cut]]
        before = (flags[cut] & _LAST_LATIN) > 0  # the complete character before the cut one
        code[cut] += (
            _visible(value)
            + (han_mask(value).astype(np.int64) << _FIELD)
            + ((tail_latin & (only | ~before)).astype(np.int64) << (2 * _FIELD))
        )
        # Each token's first and last character's Latin-ness, cut characters included.
        first = cut[only]
        flags[first] = np.where(tail_latin[only], flags[first] | _FIRST_LATIN, flags[first])
        ends = [cut] + [at[self.leads[idx[at]] == 0] for at, _ in visits]
        latin = [tail_latin] + [tail_latin[w][self.leads[idx[at]] == 0] for at, w in visits]
        for at, is_latin in zip(ends, latin, strict=True):  # a bare continuation token ends with it
            flags[at] = np.where(
                is_latin, flags[at] | _LAST_LATIN, flags[at] & (0xFF ^ _LAST_LATIN)
            )
        # A Latin word continuing from the previous token (same document) is no new word.
        glued = np.zeros(len(idx), np.uint8)
        np.bitwise_and(flags[1:], flags[:-1] >> 1, out=glued[1:])
        glued &= _FIRST_LATIN
        glued[offsets[:-1][offsets[:-1] < len(idx)]] = 0
        d = len(offsets) - 1
        sums, words, controls = (np.zeros(d, np.int64) for _ in range(3))
        nonempty = np.flatnonzero(offsets[1:] > offsets[:-1])
        if nonempty.size:
            starts = offsets[:-1][nonempty]
            sums[nonempty] = np.add.reduceat(code, starts)
            words[nonempty] = np.add.reduceat(glued, starts, dtype=np.int64)
            controls[nonempty] = np.add.reduceat((flags & _CONTROL) > 0, starts, dtype=np.int64)
        mask = (1 << _FIELD) - 1
        return {
            "han": (sums >> _FIELD) & mask,
            "words": (sums >> (2 * _FIELD)) - words,
            "visible": sums & mask,
            "controls": controls,
        }
