"""A bounded, seeded, language-balanced sample of a huge corpus, for tokenizer training.

Files are visited in an order shuffled by ``seed``; within them every document gets a pseudo-random
number ``u`` in [0, 1) from a keyed hash of its text (BLAKE2b, key = seed), so the choice does not
depend on the file order or on any other document:

* ``u < heldout_fraction``: held out (never trained on); kept while the language's held-out
  budget (``heldout_chars``) is not full, to measure characters per token;
* ``u < heldout_fraction + sample_rate x (1 - heldout_fraction)``: a training candidate, kept while
  the language's training budget (``sample_chars x proportion``) is not full;
* otherwise skipped.

Reading stops as soon as every budget is full, so a sample of a trillion-token corpus reads only
about ``sample_chars / sample_rate`` characters, spread over many files by the shuffle; lower
``sample_rate`` spreads it wider. A language whose input runs out first is under-filled (the
result says by how much) rather than topped up, so the proportions stay explicit. Budgets are in
characters; a document that starts inside the budget is kept whole (at most one document over).
Languages come from the record's ``lang_key`` field when present, else from the script rule of
:mod:`megatron_gamma.data.langid`.
"""

from __future__ import annotations

import hashlib
import logging
import random
from dataclasses import dataclass, field

from tqdm import tqdm

from megatron_gamma.data.langid import LANGUAGES, tag_language
from megatron_gamma.data.normalize import normalize
from megatron_gamma.data.readers import (
    InputError,
    check_readable,
    iter_chunks,
    iter_records,
    record_language,
    record_text,
    unused_lang_key,
)

log = logging.getLogger(__name__)


def parse_proportions(spec: str) -> dict[str, float]:
    """'zh=0.5,en=0.5' -> {'zh': 0.5, 'en': 0.5} (languages of share 0 left out).

    Raises:
        ValueError: unknown language, negative weights, bad syntax, or shares that do not sum to
            1 (within 1e-6; never rescaled).
    """
    out: dict[str, float] = {}
    for part in spec.split(","):
        lang, sep, value = part.partition("=")
        lang = lang.strip()
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or lang not in LANGUAGES or weight < 0 or lang in out:
            raise ValueError(
                f"lang_proportions={spec!r}: expected LANG=WEIGHT pairs with LANG in "
                f"{'/'.join(LANGUAGES)}, e.g. 'zh=0.5,en=0.5'"
            )
        out[lang] = weight
    total = sum(out.values())
    if abs(total - 1) > 1e-3:  # shares written to 3 decimals (1/3 as 0.333) pass
        raise ValueError(
            f"lang_proportions={spec!r}: the shares sum to {total:.6g}, not 1. Fix: give shares "
            "that sum to 1, e.g. 'zh=0.5,en=0.5'"
        )
    return {k: v for k, v in out.items() if v > 0}


@dataclass
class Sample:
    """Sampled documents by language.

    Attributes:
        train, heldout: ``{lang: [text, ...]}``.
        budgets: ``{lang: training budget in characters}``.
        documents_read: documents looked at.
        errors: skipped bad records by kind.
    """

    train: dict[str, list[str]] = field(default_factory=dict)
    heldout: dict[str, list[str]] = field(default_factory=dict)
    budgets: dict[str, int] = field(default_factory=dict)
    documents_read: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def chars(self, part: str) -> dict[str, int]:
        """``{lang: characters}`` of 'train' or 'heldout'."""
        return {k: sum(map(len, v)) for k, v in getattr(self, part).items()}


def _unit_hash(text: str, key: bytes) -> float:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8, key=key)
    return int.from_bytes(digest.digest(), "little") / 2.0**64


def sample_corpus(
    files: list[str],
    proportions: dict[str, float],
    sample_chars: int,
    seed: int = 1234,
    sample_rate: float = 1.0,
    heldout_fraction: float = 0.01,
    heldout_chars: int = 1_000_000,
    json_keys: tuple[str, ...] = ("text",),
    lang_key: str | None = None,
    nfkc: bool = False,
    punct_width: str = "keep",
    on_error: str = "stop",
    progress: bool = True,
) -> Sample:
    """Draw the sample described in the module docstring.

    Args:
        files: input files (from ``expand_inputs``).
        proportions: ``{lang: share}`` of the training characters (from
            :func:`parse_proportions`).
        sample_chars: training characters in all.
        seed: seeds the file order and the per-document hash.
        sample_rate: share of the non-held-out documents that are candidates, in (0, 1].
        heldout_fraction: share of documents held out, in [0, 1).
        heldout_chars: held-out characters per language at most.
        json_keys: text fields of a record (each is a document).
        lang_key: optional language field.
        nfkc, punct_width: normalization (:mod:`megatron_gamma.data.normalize`), to match the
            preprocessing the tokenizer will serve.
        on_error: 'stop' or 'skip' bad records.
        progress: show a bar of sampled characters.

    Raises:
        ValueError: a parameter out of range.
        InputError: a bad record with ``on_error='stop'``.
    """
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate={sample_rate}: must lie in (0, 1]. Fix: e.g. 0.01")
    if not 0 <= heldout_fraction < 1:
        raise ValueError(f"heldout_fraction={heldout_fraction}: must lie in [0, 1). Fix: 0.01")
    if sample_chars < 1:
        raise ValueError(f"sample_chars={sample_chars}: must be >= 1. Fix: e.g. 500000000")
    key = hashlib.sha256(f"megatron-gamma-sample-{seed}".encode()).digest()[:32]
    order = list(files)
    random.Random(seed).shuffle(order)
    sample = Sample(budgets={k: int(sample_chars * v) for k, v in proportions.items()})
    train_left = dict(sample.budgets)
    held_left = {k: heldout_chars if heldout_fraction > 0 else 0 for k in proportions}
    keep_below = heldout_fraction + sample_rate * (1 - heldout_fraction)
    columns = list(json_keys) + ([lang_key] if lang_key else [])
    messages: list[str] = []
    labelled = 0  # texts whose lang_key field gave their language
    bar = tqdm(
        total=sum(train_left.values()), unit="char", unit_scale=True,
        disable=None if progress else True,
    )  # fmt: skip
    try:
        for path in order:
            if not any(v > 0 for v in (*train_left.values(), *held_left.values())):
                break
            try:
                check_readable(path)
                for chunk in iter_chunks(path, columns=columns):
                    for rec in iter_records(chunk, on_error, sample.errors, messages):
                        for k in json_keys:
                            try:
                                text = record_text(path, rec, k)
                                label = record_language(path, rec, lang_key)
                                labelled += label is not None
                            except InputError as e:
                                if on_error != "skip":
                                    raise
                                sample.errors[e.kind] = sample.errors.get(e.kind, 0) + 1
                                continue
                            sample.documents_read += 1
                            text = normalize(text, nfkc, punct_width)
                            lang = label or tag_language(text)
                            if lang not in proportions or not text.strip():
                                continue
                            u = _unit_hash(text, key)
                            if u < heldout_fraction:
                                if held_left[lang] > 0:
                                    sample.heldout.setdefault(lang, []).append(text)
                                    held_left[lang] -= len(text)
                            elif u < keep_below and train_left[lang] > 0:
                                sample.train.setdefault(lang, []).append(text)
                                bar.update(min(len(text), train_left[lang]))
                                train_left[lang] -= len(text)
                    if not any(v > 0 for v in (*train_left.values(), *held_left.values())):
                        break
            except InputError as e:
                if on_error != "skip" or e.kind != "unreadable_file":
                    raise
                sample.errors[e.kind] = sample.errors.get(e.kind, 0) + 1
    finally:
        bar.close()
    if lang_key and sample.documents_read and not labelled:
        log.warning("%s", unused_lang_key(lang_key))
    return sample
