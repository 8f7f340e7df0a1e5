"""Per-document language tag for a Chinese-English corpus: 'zh', 'en' or 'mixed'.

The rule counts script units: every Han character (CJK Unified Ideographs, Extension A and
Compatibility Ideographs, U+3400..U+4DBF, U+4E00..U+9FFF, U+F900..U+FAFF, U+20000..U+3134F) is one
unit, and every maximal run of Latin letters (A-Z, a-z, U+00C0..U+024F without x and /) is one
unit, since a Chinese character and an English word carry comparable content. With
``share = han / (han + latin_words)``:

    share >= 0.5         -> 'zh'
    share <  0.1         -> 'en'   (also a text with no Han character and no Latin letter)
    otherwise            -> 'mixed'

Measured on the 8,409 documents of debian-docs-bilingual (labels from their ``lang`` field), the
rule tags every English document 'en' (largest share 0.017) and every Chinese document 'zh'
(smallest share 0.52, 1st percentile 0.65): Chinese technical prose full of commands and paths
stays 'zh'. Scripts other than Han and Latin (kana, Hangul, Cyrillic) are not counted.
"""

from __future__ import annotations

import numpy as np

LANGUAGES = ("zh", "en", "mixed")
ZH_MIN_SHARE = 0.5
EN_MAX_SHARE = 0.1


def codepoints(text: str) -> np.ndarray:
    """The code points of ``text``: (len(text),) uint32."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def han_mask(cp: np.ndarray) -> np.ndarray:
    """Boolean mask of Han characters in code points ``cp``."""
    return (
        ((cp >= 0x4E00) & (cp <= 0x9FFF))
        | ((cp >= 0x3400) & (cp <= 0x4DBF))
        | ((cp >= 0xF900) & (cp <= 0xFAFF))
        | ((cp >= 0x20000) & (cp <= 0x3134F))
    )


def script_units(text: str) -> tuple[int, int]:
    """(Han characters, Latin words) of ``text``."""
    cp = codepoints(text)
    low = cp | 0x20
    latin = ((low >= 0x61) & (low <= 0x7A)) | (
        (cp >= 0xC0) & (cp <= 0x24F) & (cp != 0xD7) & (cp != 0xF7)
    )
    starts = latin.copy()
    starts[1:] &= ~latin[:-1]
    return int(han_mask(cp).sum()), int(starts.sum())


def tag_language(text: str) -> str:
    """'zh', 'en' or 'mixed' by the script-unit rule of the module docstring."""
    han, words = script_units(text)
    share = han / (han + words) if han + words else 0.0
    if share >= ZH_MIN_SHARE:
        return "zh"
    if share < EN_MAX_SHARE:
        return "en"
    return "mixed"


def language_label(value: object) -> str | None:
    """Map a record's language field to a tag: 'zh*'/'cmn*' -> 'zh', 'en*' -> 'en', 'mixed' ->
    'mixed' (case-insensitive); None for anything else."""
    if not isinstance(value, str):
        return None
    v = value.strip().lower()
    if v.startswith(("zh", "cmn")):
        return "zh"
    if v.startswith("en"):
        return "en"
    if v == "mixed":
        return "mixed"
    return None
