"""Tell a pretrain config from a study file by its top-level keys, so that each command names
the other one's file as such: ``sweep`` given a pretrain config, ``pretrain --config`` given a
study file (:mod:`megatron_gamma.study.spec`)."""

from __future__ import annotations

STUDY_KEYS = (
    "name",
    "config",
    "set",
    "data",
    "baseline",
    "arms",
    "sizes",
    "seeds",
    "gamma_grid",
    "lr_grid",
    "margin",
    "diagnostics_points",
    "checkpoints",
)
"""The top-level keys of a study file (:func:`megatron_gamma.study.spec.load_study`)."""


def keys_of_the_other_kind(raw: dict, sections: set[str] | list[str], kind: str) -> list[str]:
    """The top-level keys of ``raw``, read as a ``kind`` file (``"study"`` or ``"pretrain"``),
    that only the other kind has: pretrain config sections for a study file, study keys for a
    pretrain config (``data``, a key of both, counts for neither).

    Args:
        raw: the file's top-level mapping.
        sections: the pretrain config's section names.
        kind: what the file was given as.

    Returns:
        Those keys, sorted.
    """
    if kind == "study":
        return sorted(set(raw) & set(sections) - set(STUDY_KEYS))
    return sorted(set(raw) & set(STUDY_KEYS) - set(sections))
