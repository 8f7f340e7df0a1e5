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
        b = np.frombuffer(b"".join(pieces) + b"\0\0\0", np.uint8).astype(np.int64)
        n = int(lengths.sum())
        first = np.cumsum(lengths) - lengths
        token = np.repeat(np.arange(len(pieces)), lengths)
        end = (first + lengths)[token]  # (n,) end of each byte's token
        pos = np.arange(n)
        head = b[:n]
        lead = (head & 0xC0) != 0x80
        size = np.select([head < 0x80, head >= 0xF0, head >= 0xE0, head >= 0xC0], [1, 4, 3, 2], 1)
        complete = lead & (pos + size <= end)
        cp = np.select(
            [size == 1, size == 2, size == 3],
            [
                head,
                ((head & 0x1F) << 6) | (b[1 : n + 1] & 0x3F),
                ((head & 0x0F) << 12) | ((b[1 : n + 1] & 0x3F) << 6) | (b[2 : n + 2] & 0x3F),
            ],
            ((head & 0x07) << 18)
            | ((b[1 : n + 1] & 0x3F) << 12)
            | ((b[2 : n + 2] & 0x3F) << 6)
            | (b[3 : n + 3] & 0x3F),
        )
        cp = np.where(complete, cp, 0)
        latin = complete & latin_mask(cp)
        # The Latin-ness of the complete character before each one in its token (False first).
        lead_pos = np.flatnonzero(lead)
        prev_latin = np.zeros(n, bool)
        same = token[lead_pos[1:]] == token[lead_pos[:-1]]
        prev_latin[lead_pos[1:]] = same & latin[lead_pos[:-1]]

        def per_token(values: np.ndarray) -> np.ndarray:
            out = np.zeros(len(pieces), np.int64)
            np.add.at(out, token, values.astype(np.int64))
            return out

        self.leads = per_token(lead)  # characters whose first byte is in the token
        han = per_token(complete & han_mask(cp))
        words = per_token(latin & ~prev_latin)  # Latin runs starting in the token
        visible = per_token(complete & _visible(cp))
        self.code = visible | (han << _FIELD) | (words << (2 * _FIELD))
        # The first character's Latin-ness (when complete), the last complete one's.
        first_lead = np.full(len(pieces), -1)
        last_complete = np.full(len(pieces), -1)
        first_lead[token[lead_pos[::-1]]] = lead_pos[::-1]
        done = np.flatnonzero(complete)
        last_complete[token[done]] = done
        first_latin = (first_lead >= 0) & latin[np.maximum(first_lead, 0)]
        last_latin = (last_complete >= 0) & latin[np.maximum(last_complete, 0)]
        self.only_partial = (first_lead >= 0) & (last_complete < first_lead)
        # A character cut at the token's end: its bits so far and the bytes it still needs.
        last_lead = np.full(len(pieces), -1)
        last_lead[token[lead_pos]] = lead_pos
        cut = (last_lead >= 0) & ~complete[np.maximum(last_lead, 0)]
        control = per_token(np.isin(head, list(CONTROL_CHARACTERS))) > 0
        self.flags = (
            first_latin * _FIRST_LATIN | last_latin * _LAST_LATIN | cut * _CUT | control * _CONTROL
        ).astype(np.uint8)
        self.partial = np.zeros(len(pieces), np.int64)
        self.need = np.zeros(len(pieces), np.int64)
        for t in np.flatnonzero(cut):
            tail = pieces[t][last_lead[t] - first[t] :]
            width = int(size[last_lead[t]])
            value = tail[0] & (0x7F >> width)
            for byte in tail[1:]:
                value = (value << 6) | (byte & 0x3F)
            self.partial[t], self.need[t] = value, width - len(tail)
        # Continuation bytes a token starts with (they finish a character cut before it).
        self.head_count = np.where(first_lead >= 0, first_lead - first, lengths)
        self.head_value = np.zeros(len(pieces), np.int64)
        for t in np.flatnonzero(self.head_count):
            value = 0
            for byte in pieces[t][: self.head_count[t]]:
                value = (value << 6) | (byte & 0x3F)
            self.head_value[t] = value
        # The compiled kernel's (8, V) table, rows as csrc/token_stats_cpu.cpp names them, and
        # its classes of the low code points.
        rows = (self.code, self.flags, self.leads, self.partial, self.need)
        rows += (self.only_partial, self.head_count, self.head_value)
        self.table = np.stack(rows).astype(np.int64)
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
