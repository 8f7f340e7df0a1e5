"""Optional text normalization before tokenization (both off by default).

``nfkc``
    Unicode NFKC (``unicodedata.normalize('NFKC', text)``): compatibility characters become
    their canonical forms (ligatures, circled digits, full-width Latin letters and digits, and
    also full-width punctuation such as ``，！？（）`` -> ``,!?()``).

``punct_width``
    'keep'  leave the text as it is (default).
    'half'  full-width ASCII variants U+FF01..U+FF5E (``！＂＃..～``, letters, digits) and the
            ideographic space U+3000 become their ASCII forms. CJK punctuation without an ASCII
            twin (``。、「」《》…``) is kept.
    'cjk'   full-width letters and digits become ASCII, and the ASCII punctuation ``, ! ? ; :``
            directly after a Han character becomes its full-width form (``，！？；：``), the
            convention of Chinese typesetting. Punctuation after digits or Latin letters (``3,000``,
            ``ls;``) is left alone.

NFKC runs first, so ``nfkc=True, punct_width='cjk'`` yields NFKC text with Chinese punctuation
restored after Han characters.

Always on, before both: C0 control characters other than tab, line feed and carriage return
(U+0000..U+0008, U+000B, U+000C, U+000E..U+001F; NUL for instance) are removed
(:func:`remove_control_characters`) and counted per language as ``control_characters`` in
``stats.json``: they carry no text, and a tokenizer would otherwise give them ids of their own.
"""

from __future__ import annotations

import re
import unicodedata

PUNCT_WIDTHS = ("keep", "half", "cjk")

_TO_HALF = {0xFF01 + i: 0x21 + i for i in range(0x5E)} | {0x3000: 0x20}
_ALNUM_TO_HALF = {
    k: v for k, v in _TO_HALF.items() if chr(v).isalnum()
}  # full-width A-Z a-z 0-9 only
_TO_FULL = {",": "，", "!": "！", "?": "？", ";": "；", ":": "："}
_AFTER_HAN = re.compile(r"(?<=[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff])[,!?;:]")


CONTROL_CHARACTERS = frozenset((*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20)))
"""Code points of the C0 control characters removed before tokenization (all but tab, LF, CR)."""
_CONTROLS = re.compile("[" + "".join(re.escape(chr(c)) for c in sorted(CONTROL_CHARACTERS)) + "]")


def remove_control_characters(text: str) -> tuple[str, int]:
    """``text`` without C0 control characters other than tab, LF and CR, and how many were
    removed (module docstring)."""
    return _CONTROLS.subn("", text)


def check_punct_width(value: str) -> None:
    """Raise ValueError unless ``value`` is one of :data:`PUNCT_WIDTHS`."""
    if value not in PUNCT_WIDTHS:
        raise ValueError(
            f"punct_width={value!r}: unknown. Fix: use one of {', '.join(PUNCT_WIDTHS)}"
        )


def normalize(text: str, nfkc: bool = False, punct_width: str = "keep") -> str:
    """Apply the normalization described in the module docstring.

    Args:
        text: a document.
        nfkc: apply Unicode NFKC first.
        punct_width: 'keep', 'half' or 'cjk'.

    Returns:
        The normalized text (``text`` itself when both options are off).
    """
    if nfkc:
        text = unicodedata.normalize("NFKC", text)
    if punct_width == "half":
        text = text.translate(_TO_HALF)
    elif punct_width == "cjk":
        text = _AFTER_HAN.sub(lambda m: _TO_FULL[m.group()], text.translate(_ALNUM_TO_HALF))
    return text
