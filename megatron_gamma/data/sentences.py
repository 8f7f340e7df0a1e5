"""Sentence splitting for Chinese and English text (``--split-sentences``).

English: nltk's Punkt (``PunktSentenceTokenizer``) with parameters we trained ourselves and ship
in ``megatron_gamma/data/punkt/english.json``: ``nltk.tokenize.punkt.PunktTrainer`` run over the
English half of the packaged demo corpus, plus the abbreviations in :data:`EXTRA_ABBREVIATIONS`
(``e.g.``, ``Dr.``, ...) that a corpus this small cannot learn. Nothing is downloaded at run time
and nltk's ``punkt_tab`` data package is not needed. ``megatron-gamma train-punkt`` regenerates
the file (see :func:`train_punkt`).

Chinese: a boundary follows a run of sentence-final marks, ``。！？；`` always, and ``…`` and the
ASCII ``! ? ;`` only right after a CJK character or CJK punctuation (so ``wait…``, ``ls;`` and
``3.5`` in Latin runs and numbers never split; ``.`` never ends a Chinese sentence), together
with the closing quotes and brackets that follow it (``”’」』）》】〕〉"')]``).

Every text goes through both rules (Chinese marks and Punkt), which is what mixed documents need;
each rule finds nothing in the other language. nltk is imported on first use (it pulls in scipy,
about a second). Line breaks are not boundaries (as in Punkt): a
hard-wrapped paragraph stays one sentence.

The pieces cover the text exactly: each boundary sits right after a sentence's last mark and the
whitespace that follows belongs to the next piece, so ``''.join(split(text)) == text`` and, with a
byte-level tokenizer, every document decodes back to its text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import lru_cache
from importlib import resources

from megatron_gamma.atomic import atomic_open

EXTRA_ABBREVIATIONS = (
    "e.g i.e etc vs cf al approx ca resp fig figs eq eqs ref refs sec ch vol vols pp "
    "dr mr mrs ms prof jr sr st mt gen col lt sgt rev hon inc ltd corp co dept univ est "
    "jan feb mar apr jun jul aug sep sept oct nov dec"
).split()
"""Abbreviations added to the trained Punkt parameters (lower case, without the final period)."""

_CJK_CONTEXT = r"\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef”’」』）》】"
_ZH_BOUNDARY = re.compile(
    r"(?:[。！？；]|(?<=[" + _CJK_CONTEXT + r"])(?:…+|[!?;]))"  # first mark
    r"(?:[。！？；!?;]|…+)*"  # more marks: 真的吗？！ 是的……
    r"[”’」』）》】〕〉\"')\]]*"  # closing quotes and brackets
)


def punkt_params_path() -> str:
    """The shipped Punkt parameters (JSON)."""
    return str(resources.files("megatron_gamma.data") / "punkt" / "english.json")


def save_punkt_params(params, path: str) -> None:
    """Write Punkt parameters as sorted JSON (reproducible bytes), atomically."""
    doc = {
        "abbrev_types": sorted(params.abbrev_types),
        "collocations": sorted([a, b] for a, b in params.collocations),
        "sent_starters": sorted(params.sent_starters),
        "ortho_context": dict(sorted(params.ortho_context.items())),
    }
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0, sort_keys=True)
        f.write("\n")


def load_punkt_params(path: str):
    """Read nltk ``PunktParameters`` written by :func:`save_punkt_params`."""
    from nltk.tokenize.punkt import PunktParameters

    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    params = PunktParameters()
    params.abbrev_types = set(doc["abbrev_types"])
    params.collocations = {tuple(c) for c in doc["collocations"]}
    params.sent_starters = set(doc["sent_starters"])
    for word, flags in doc["ortho_context"].items():
        params.ortho_context[word] = flags
    return params


def train_punkt(texts: Iterable[str], extra_abbreviations: Iterable[str] = EXTRA_ABBREVIATIONS):
    """Train Punkt parameters on English documents.

    Args:
        texts: English documents.
        extra_abbreviations: added to the learned abbreviations (lower case, no final period).

    Returns:
        nltk ``PunktParameters``.
    """
    from nltk.tokenize.punkt import PunktTrainer

    trainer = PunktTrainer()
    for text in texts:
        trainer.train(text, finalize=False)
    trainer.finalize_training()
    params = trainer.get_params()
    params.abbrev_types |= set(extra_abbreviations)
    return params


@lru_cache(maxsize=1)
def _punkt():
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    return PunktSentenceTokenizer(load_punkt_params(punkt_params_path()))


def zh_boundaries(text: str) -> list[int]:
    """End offsets of the Chinese sentences in ``text`` (the Chinese rule above)."""
    return [m.end() for m in _ZH_BOUNDARY.finditer(text)]


def en_boundaries(text: str) -> list[int]:
    """End offsets of Punkt's sentences in ``text`` (with closing quotes realigned)."""
    return [end for _, end in _punkt().span_tokenize(text)]


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into consecutive pieces, one per sentence, that join back to ``text``.

    Returns:
        Non-empty pieces; a piece holds one sentence and the whitespace before it.
    """
    cuts = sorted(set(zh_boundaries(text)) | set(en_boundaries(text)))
    pieces, start = [], 0
    for end in cuts:
        if end > start and text[end:].strip():
            pieces.append(text[start:end])
            start = end
    pieces.append(text[start:])
    return pieces
