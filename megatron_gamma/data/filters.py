"""Optional document filters, each counted by name in the preprocessing statistics.

Applied in this order; a document is counted under the first filter that drops it:

=================  ==========================================================================
reason             drops a document when
=================  ==========================================================================
empty              its (normalized) text has no visible character: only whitespace and the
                   zero-width characters of :data:`INVISIBLE` (always on)
min_chars          it has fewer than ``min_chars`` characters (``len(text)``)
max_symbol_ratio   more than ``max_symbol_ratio`` of its non-whitespace characters are
                   punctuation or symbols (Unicode categories P* and S*; CJK punctuation counts)
min_tokens         it has fewer than ``min_tokens`` tokens (before the EOD token)
=================  ==========================================================================

Before them, a document longer than ``max_document_chars`` characters is cut to its first
``max_document_chars`` characters and counted per language as ``truncated``: tokenizing one
document costs memory in proportion to its length (3.6M characters took 1.1 GB), so the cap
bounds a worker's peak memory whatever the input (``tools/bench_long_document.py``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from megatron_gamma.data.langid import codepoints

DROP_REASONS = ("empty", "min_chars", "max_symbol_ratio", "min_tokens")
_EMPTY, _MIN_CHARS, _MIN_TOKENS = (
    DROP_REASONS.index(r) for r in ("empty", "min_chars", "min_tokens")
)
_KEEP = -1
INVISIBLE = (
    "".join(c for c in map(chr, range(0x3001)) if c.isspace()) + "\u200b\u200c\u200d\u2060\ufeff"
)
"""Characters that show nothing: Unicode whitespace, zero-width space, non-joiner and joiner,
word joiner, and the byte-order mark (zero-width no-break space)."""
_TABLE_SIZE = 0x30000  # BMP and the two supplementary planes in use (emoji, Han extensions)
_OTHER, _SYMBOL, _SPACE = 0, 1, 2


@lru_cache(maxsize=1)
def _classes() -> np.ndarray:
    """(0x30001,) uint8: character class by code point; the last entry stands for all higher."""
    table = np.zeros(_TABLE_SIZE + 1, dtype=np.uint8)
    for cp in range(_TABLE_SIZE):
        c = chr(cp)
        if c.isspace():
            table[cp] = _SPACE
        elif unicodedata.category(c)[0] in "PS":
            table[cp] = _SYMBOL
    return table


def symbol_ratio(text: str) -> float:
    """Fraction of the non-whitespace characters of ``text`` in Unicode categories P* or S*
    (0.0 for a text of only whitespace)."""
    cls = _classes()[np.minimum(codepoints(text), _TABLE_SIZE)]
    counts = np.bincount(cls, minlength=3)
    visible = counts[_OTHER] + counts[_SYMBOL]
    return float(counts[_SYMBOL] / visible) if visible else 0.0


@dataclass(frozen=True)
class Filters:
    """Thresholds; the defaults keep every non-empty document."""

    min_chars: int = 0
    min_tokens: int = 0
    max_symbol_ratio: float = 1.0
    max_document_chars: int = 1_000_000

    def __post_init__(self) -> None:
        if self.min_chars < 0:
            raise ValueError(f"min_chars={self.min_chars}: must be >= 0. Fix: e.g. 20")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens={self.min_tokens}: must be >= 0. Fix: e.g. 8")
        if not 0.0 <= self.max_symbol_ratio <= 1.0:
            raise ValueError(
                f"max_symbol_ratio={self.max_symbol_ratio}: must lie in [0, 1]. Fix: e.g. 0.3"
            )
        if self.max_document_chars < 1:
            raise ValueError(
                f"max_document_chars={self.max_document_chars}: must be >= 1. Fix: e.g. 1000000"
            )

    def text_reason(self, text: str) -> str | None:
        """The first text filter that drops ``text`` ('empty', 'min_chars',
        'max_symbol_ratio'), or None to keep it."""
        if not text.strip(INVISIBLE):
            return "empty"
        if len(text) < self.min_chars:
            return "min_chars"
        if self.max_symbol_ratio < 1.0 and symbol_ratio(text) > self.max_symbol_ratio:
            return "max_symbol_ratio"
        return None

    def reasons_from_counts(self, visible: np.ndarray, chars: np.ndarray) -> np.ndarray:
        """:meth:`text_reason` of texts with ``visible`` characters outside INVISIBLE and
        ``chars`` characters ((N,) integer arrays), without the symbol-ratio filter (the caller
        keeps ``max_symbol_ratio`` at 1.0): (N,) int64, the reason's index in
        :data:`DROP_REASONS`, or -1 to keep the text."""
        min_chars = np.where(chars < self.min_chars, _MIN_CHARS, _KEEP)
        return np.where(visible == 0, _EMPTY, min_chars).astype(np.int64)

    def token_reasons(self, num_tokens: np.ndarray) -> np.ndarray:
        """(N,) int64: the index of 'min_tokens' in :data:`DROP_REASONS` where ``num_tokens``
        (EOD not counted; an (N,) integer array) is below ``min_tokens``, else -1."""
        return np.where(num_tokens < self.min_tokens, _MIN_TOKENS, _KEEP).astype(np.int64)
