"""The numbers behind ``megatron-gamma report``: a study's finished runs grouped by arm, size,
seed and learning-rate phase; the loss table with paired seed differences; scaling fits and
effective model-size multipliers where they are identified; the γ grid at matched seeds; the
mechanism trajectories from the live diagnostics.

Arms are recognized by their settings, not their names (:meth:`StudyData.role`): the
**baseline** is the study's ``baseline`` arm; **γ=1** has init_gamma 1 and exactly the
baseline's ε and gate; **γ=1+ε** has init_gamma 1, a smaller ε and the baseline's gate;
**γ=1+ε+gate** has init_gamma 1, a smaller ε and a gate other than the baseline's (not none);
**γ=0.5+ε+gate** has exactly γ=1+ε+gate's ε and gate at the baseline's γ (the control that
separates the fixes' main effect from their interaction with γ). Two arms are paired only
when the config fields their study file set besides these three (``arm_fields`` in
``study.json``; the study file refuses any, :data:`~.spec.ARM_FACTORS`) are the same
(:meth:`StudyData.check_matched`): a pair that differs in more than the compared setting is
refused, naming the fields, rather than credited to γ, ε or the gate. A manifest written before
``arm_fields`` was recorded is read as no arm setting anything else.

Learning-rate phases (``study.json``, one per run): ``shared`` (the study's shared LR, every arm
× size × seed), ``grid`` (the arm's LR grid on the selection seed; a shared run that is also a
grid point has ``grid: true``), ``confirm`` (the arm at its own best LR on fresh seeds). A
manifest without these fields is read as every run ``shared``, margin 0.01 nats, no grid.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import yaml

from megatron_gamma.config import ConfigError
from megatron_gamma.config.loading import config_from_dict
from megatron_gamma.config.sections import is_dataset
from megatron_gamma.data.tokenizer_fingerprint import read_fingerprint
from megatron_gamma.model.init import ParamInit, drawn_init
from megatron_gamma.model.vocab import model_vocab_size
from megatron_gamma.study import rundir
from megatron_gamma.study.fits import (
    effective_size_multiplier,
    fit_power_law,
    mean_std,
    paired_difference,
)
from megatron_gamma.study.spec import (
    ARM_FACTORS,
    NAME_PATTERN,
    best_lr,
    data_prefixes,
    manifest_path,
    margin_ok,
)

DEFAULT_MARGIN = 0.01
"""The pre-registered margin δ (nats) of a manifest that does not set ``margin``."""
MATRIX_DIAGNOSTICS = ("stable_rank", "condensation")
"""The per-matrix diagnostics (``PREFIX/ROLE/layer_LL``): :func:`mechanisms` averages them over
the matrices every arm at a size logged; at iteration 0 they fingerprint a run's initial weights
(:meth:`StudyData.same_start`)."""
UNIGRAM_SMOOTHING = 0.5
"""Add-k smoothing of :func:`unigram_loss` (a token the train split lacks keeps a probability)."""


def unigram_loss(train_prefix: str, heldout_prefix: str, vocab_size: int) -> Optional[float]:
    """Held-out loss of the train split's token frequencies: the mean over every token of the
    held-out split (the appended EODs included) of −ln p(t), with
    p(t) = (count_train(t) + k) / (N_train + k·V), k = :data:`UNIGRAM_SMOOTHING`, in fp64.

    A model whose validation loss is not below it has learned nothing beyond how often each
    token occurs (ln V is a uniform predictor's, above it). It is over the whole split; a run's
    validation loss scores a sample of the split's windows.

    Args:
        train_prefix, heldout_prefix: indexed datasets (``.bin``/``.idx``) of the two splits.
        vocab_size: V, the tokenizer's vocabulary size (unpadded).

    Returns:
        Nats per token; None when a split's files are missing or the held-out split is empty.

    Raises:
        ConfigError: a token id >= ``vocab_size`` (the splits were made with another tokenizer).
    """
    from megatron_gamma.data.indexed import indexed_dataset

    if not (is_dataset(train_prefix) and is_dataset(heldout_prefix)):
        return None
    IndexedDataset = indexed_dataset().IndexedDataset
    tokens = {}
    for name, prefix in (("train", train_prefix), ("heldout", heldout_prefix)):
        dtype = IndexedDataset(prefix).index.dtype
        tokens[name] = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
        if len(tokens[name]) and int(tokens[name].max()) >= vocab_size:
            raise ConfigError(
                f"{prefix}.bin: token id {int(tokens[name].max())} >= vocab_size={vocab_size}: "
                "the split was made with another tokenizer. Fix: rerun `megatron-gamma sweep` "
                "into a new --output-dir"
            )
    if not len(tokens["heldout"]):
        return None
    counts = np.bincount(tokens["train"], minlength=vocab_size).astype(np.float64)
    log_p = np.log(counts + UNIGRAM_SMOOTHING) - np.log(
        counts.sum() + UNIGRAM_SMOOTHING * vocab_size
    )
    held = np.bincount(tokens["heldout"], minlength=vocab_size).astype(np.float64)
    return float(-(held @ log_p) / held.sum())


def fmt(x: Optional[float], digits: int = 4) -> str:
    """``x`` with ``digits`` decimals; ``n/a`` for None, NaN and inf."""
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:.{digits}f}"


EMBEDDING = "embedding.word_embeddings.weight"
"""The input embedding's parameter name (:mod:`megatron_gamma.model.roles`): its output is what
the first RMSNorm sees, so its init sigma sets σ²_emb / ε
(:meth:`StudyData.embedding_variance_over_eps`)."""


def embedding_init(
    run_dir: Optional[str], entry: dict, tokenizer_vocab: Optional[int] = None
) -> Optional[ParamInit]:
    """How the run drew its input embedding (:func:`~megatron_gamma.model.init.drawn_init`, the
    one rule the model and the init audit use): from the ``model``, ``init`` and ``parallel``
    sections of the run's config.yaml, the resolved config, so that a study-wide ``set:`` of
    ``init_gamma_overrides`` (e.g. ``embedding=2``), ``init_method`` or ``embedding_fan_in``
    counts; without a config.yaml, from the manifest entry's ``hidden_size`` and
    ``init_gamma`` under the default init (what such a manifest's runs were given).

    Args:
        run_dir: the run's directory (None: read the entry alone).
        entry: the run's study.json entry.
        tokenizer_vocab: the tokenizer's vocabulary size, which the ``vocab`` fan-in policy
            pads as ``pretrain`` does (None where unknown).

    Returns:
        The embedding's :class:`~megatron_gamma.model.init.ParamInit`; None where its sigma
        depends on a vocabulary size that is unknown, or the config.yaml no longer reads as a
        config of this version.
    """
    path = os.path.join(run_dir, "config.yaml") if run_dir else None
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
        names = ("model", "init", "parallel")
        sections = {k: raw[k] for k in names if isinstance(raw.get(k), dict)}
    else:
        init = {"init_gamma": entry["init_gamma"]} if "init_gamma" in entry else {}
        sections = {"model": {"hidden_size": entry.get("hidden_size")}, "init": init}
    try:
        cfg = config_from_dict(sections)
    except ConfigError:
        return None
    vocab = max(tokenizer_vocab or 0, cfg.model.vocab_size or 0)
    uses_vocab = cfg.init.init_method == "gamma" and cfg.init.embedding_fan_in == "vocab"
    if uses_vocab and not vocab:
        return None
    return drawn_init(EMBEDDING, cfg, model_vocab_size(cfg, vocab) if vocab else 0)


def _safe_name(name) -> bool:
    """A name that is one directory name, never ``..`` or a path (:data:`~.spec.NAME_PATTERN`)."""
    return isinstance(name, str) and bool(NAME_PATTERN.fullmatch(name)) and ".." not in name


def check_entry(path: str, index: int, entry) -> None:
    """Refuse a run of ``study.json`` (at ``path``) whose names could lead out of the study:
    ``arm`` and ``size`` must be safe directory names as the study file's are, ``seed`` an
    integer, and ``key`` the run directory ``sweep`` makes of them (``ARM/SIZE/seed-S`` or
    ``ARM/SIZE/lr-LR/seed-S``). ``report`` reads ``DIR/KEY`` and writes ``compare`` output to
    ``REPORT/compare/seed-S``, so a manifest from elsewhere must not steer either.

    Raises:
        ConfigError: naming the file, the run, the value and the fix.
    """
    fix = (
        "Fix: restore study.json as sweep wrote it (rerun `megatron-gamma sweep STUDY.yaml "
        "--output-dir DIR`, which rewrites it and skips finished runs)"
    )
    where = f"{path}: runs[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}={entry!r}: not a mapping of the run's fields. {fix}")
    for key in ("arm", "size"):
        if not _safe_name(entry.get(key)):
            raise ConfigError(
                f"{where}.{key}={entry.get(key)!r}: not a safe directory name (letters, digits "
                f"and . _ + = @ -, no '..'), as a study's {key} names are. {fix}"
            )
    seed = entry.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"{where}.seed={seed!r}: not an integer seed. {fix}")
    parts = entry.get("key").split("/") if isinstance(entry.get("key"), str) else []
    lr_dir = len(parts) == 4 and parts[2].startswith("lr-") and _safe_name(parts[2])
    if (
        len(parts) not in (3, 4)
        or parts[:2] != [entry["arm"], entry["size"]]
        or parts[-1] != f"seed-{seed}"
        or (len(parts) == 4 and not lr_dir)
    ):
        raise ConfigError(
            f"{where}.key={entry.get('key')!r}: not the run directory of arm {entry['arm']!r}, "
            f"size {entry['size']!r}, seed {seed} (ARM/SIZE/seed-S or ARM/SIZE/lr-LR/seed-S). "
            f"{fix}"
        )


class StudyData:
    """The runs of a study, grouped by arm, size, seed and LR phase.

    Args:
        manifest: ``study.json``'s content (``baseline``, ``runs``; optional ``margin``,
            ``shared_lr``, ``lr_select_seed``, ``gamma_grid``, ``heldout``).
        runs: one dict per manifest entry: the entry's fields plus ``loss`` (final validation
            loss in nats, None when unfinished), ``finished`` (bool) and ``record``
            (:class:`~.rundir.RunRecord` with the diagnostics, or None).
        study_dir: the directory the runs were read from (None for records built in memory).
        vocab_size: the tokenizer's vocabulary size V (unpadded), whose ln V (nats) is the
            validation loss of a uniform predictor; None when unknown (then no run is checked
            against it).
        unigram_loss: the held-out loss of the train split's token frequencies
            (:func:`unigram_loss`), the bar a learned model's loss is below; None when unknown
            (then ln V is the bar).

    Raises:
        ConfigError: a ``margin`` that is not a finite number >= 0 (:func:`~.spec.margin_ok`).
    """

    def __init__(
        self,
        manifest: dict,
        runs: list[dict],
        study_dir: Optional[str] = None,
        vocab_size: Optional[int] = None,
        unigram_loss: Optional[float] = None,
    ):
        self.manifest = manifest
        self.dir = study_dir
        self.vocab_size = vocab_size
        self.unigram_loss = unigram_loss
        self.baseline = manifest["baseline"]
        margin = manifest.get("margin", DEFAULT_MARGIN)
        if not margin_ok(margin):
            raise ConfigError(
                f"study.json margin={margin!r}: must be a finite number of nats >= 0, as the "
                "study file's is (a negative δ turns an effect of the wrong sign into "
                "'reproduced'). Fix: restore study.json as sweep wrote it (rerun `megatron-gamma "
                "sweep STUDY.yaml --output-dir DIR`)"
            )
        self.margin = float(margin)
        self.shared_lr = manifest.get("shared_lr")
        self.select_seed = manifest.get("lr_select_seed")
        self.runs = [
            {
                **r,
                "lr_phase": r.get("lr_phase", "shared"),
                "grid": r.get("grid", r.get("lr_phase") == "grid"),
                "embedding_init": (
                    r["embedding_init"]
                    if "embedding_init" in r
                    else embedding_init(None, r, vocab_size)  # entries alone, no run directory
                ),
            }
            for r in runs
        ]
        self.finished = [r for r in self.runs if r["finished"]]
        self.arms = list(dict.fromkeys(r["arm"] for r in self.runs))
        sizes: dict[str, int] = {}
        for r in sorted(self.runs, key=lambda r: r["arm"] != self.baseline):
            sizes.setdefault(r["size"], r["non_embedding"])
        self.sizes = sorted(sizes, key=sizes.get)
        self.size_n = sizes
        """{size: non-embedding parameters of the baseline arm (another arm's where the
        baseline lacks the size; a gated arm has more)}."""

    @classmethod
    def from_dir(cls, study_dir: str) -> StudyData:
        """Read ``DIR/study.json`` and every run directory it lists; the vocabulary size from
        the tokenizer fingerprint of the held-out data (``heldout`` in study.json), None
        without one; with it, the held-out loss of the train split's token frequencies
        (:func:`unigram_loss`, ``DIR/data``'s two splits).

        Raises:
            ConfigError: no study.json in ``study_dir``, or a run whose names could lead out
                of the study (:func:`check_entry`), before any run directory is read.
        """
        path = manifest_path(study_dir)
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        for index, entry in enumerate(manifest["runs"]):
            check_entry(path, index, entry)
        heldout = manifest.get("heldout")
        doc = read_fingerprint(heldout) if heldout else None
        vocab = doc.get("vocab_size") if doc else None
        runs = []
        for entry in manifest["runs"]:
            run_dir = os.path.join(study_dir, entry["key"])
            rec = rundir.read_run(run_dir)
            done = rec.checkpoint == entry["train_iters"] and entry["train_iters"] in rec.valid
            runs.append(
                {
                    **entry,
                    "embedding_init": embedding_init(run_dir, entry, vocab),
                    "record": rec,
                    "finished": done,
                    "loss": rec.valid.get(entry["train_iters"]) if done else None,
                }
            )
        splits = data_prefixes(study_dir)
        unigram = unigram_loss(splits["train"], splits["heldout"], vocab) if vocab else None
        return cls(manifest, runs, study_dir, vocab, unigram)

    def _runs(self, arm: str, size: str, phase: str) -> list[dict]:
        return [
            r
            for r in self.finished
            if r["arm"] == arm and r["size"] == size and r["lr_phase"] == phase
        ]

    def losses(self, arm: str, size: str, phase: str = "shared") -> dict[int, float]:
        """{seed: final validation loss} of the finished runs of ``arm`` at ``size`` in LR phase
        ``phase`` (``shared`` or ``confirm``)."""
        return {r["seed"]: r["loss"] for r in self._runs(arm, size, phase)}

    def arm_sizes(self, arm: str) -> list[str]:
        return [s for s in self.sizes if self.losses(arm, s)]

    @property
    def has_lr_grid(self) -> bool:
        return any(r["grid"] for r in self.runs)

    def lr_grid(self, arm: str, size: str) -> dict[float, float]:
        """{lr: final loss} of ``arm``'s finished LR-grid runs at ``size`` (selection seed)."""
        return {
            float(r["lr"]): r["loss"]
            for r in self.finished
            if r["arm"] == arm and r["size"] == size and r["grid"]
        }

    def best_lr(self, arm: str, size: str) -> Optional[float]:
        """The grid LR with the lowest loss on the selection seed (ties: the smaller LR; a NaN
        or inf loss last; as the sweep picks it, :func:`~.spec.best_lr`); None without grid
        runs."""
        grid = self.lr_grid(arm, size)
        return best_lr(grid) if grid else None

    def edge_lr(self, arm: str, size: str) -> Optional[str]:
        """Why ``arm``'s best LR at ``size`` is not bracketed (it is the smallest or largest LR
        of its finished grid, extensions included), or None when it is (or there is no grid)."""
        grid = sorted(self.lr_grid(arm, size))
        best = self.best_lr(arm, size)
        if best is None or grid[0] < best < grid[-1]:
            return None
        side = "largest" if best == grid[-1] else "smallest"
        lrs = ", ".join(f"{x:g}" for x in grid)
        return f"{arm} at {size}: best LR {best:g} is the {side} of [{lrs}]"

    def shared_lr_of(self, arm: str, size: str) -> Optional[float]:
        """The LR of ``arm``'s finished shared-LR runs at ``size``: the study's shared LR, or the
        size's own where its sizes have their own (the manifest's ``shared_lr`` is then None);
        None without such a run, or where its runs disagree."""
        lrs = {float(r["lr"]) for r in self._runs(arm, size, "shared") if r.get("lr") is not None}
        return lrs.pop() if len(lrs) == 1 else None

    def _confirm_runs(self, arm: str, size: str) -> list[dict]:
        """The finished runs of ``arm`` at ``size`` at its best LR on the seeds other than the
        selection seed: its confirm runs, or its shared-LR runs where the shared LR won the
        grid (runs confirmed at another LR, e.g. planned before the grid settled, are left
        out)."""
        best = self.best_lr(arm, size)
        if best is None:
            return []
        shared = self.shared_lr_of(arm, size)
        if shared is not None and np.isclose(shared, best):
            return [r for r in self._runs(arm, size, "shared") if r["seed"] != self.select_seed]
        return [r for r in self._runs(arm, size, "confirm") if np.isclose(float(r["lr"]), best)]

    def confirm_losses(self, arm: str, size: str) -> dict[int, float]:
        """{seed: loss} of ``arm`` at ``size`` at its best LR, on its confirm runs
        (:meth:`_confirm_runs`)."""
        return {r["seed"]: r["loss"] for r in self._confirm_runs(arm, size)}

    def same_start(self, arm: str, size: str, best: bool = False) -> list[list[int]]:
        """Groups of two or more seeds of ``arm`` at ``size`` whose runs start from the same
        weights: their weight-matrix diagnostics (:data:`MATRIX_DIAGNOSTICS`, e.g. every
        matrix's stable rank; finite values) at iteration 0 are equal, value for value, where
        different seeds draw different matrices. Such seeds did not change the
        initialization: together they are one replicate, not several (a rerun, or a seed that
        never reached the model). Runs read: the shared-LR runs, or with ``best`` the confirm
        runs (:meth:`confirm_losses`'); a run with no such diagnostics at iteration 0 is not
        checked.

        Returns:
            the groups, each sorted, in order of their first seed ([] when none).
        """
        runs = self._confirm_runs(arm, size) if best else self._runs(arm, size, "shared")
        starts: dict[tuple, list[int]] = {}
        for r in sorted(runs, key=lambda r: r["seed"]):
            first = r["record"].diagnostics.get(0, {}) if r.get("record") else {}
            weights = tuple(
                sorted(
                    (k, v)
                    for k, v in first.items()
                    if k.split("/")[0] in MATRIX_DIAGNOSTICS and np.isfinite(v)
                )
            )
            if weights:
                starts.setdefault(weights, []).append(r["seed"])
        return [seeds for seeds in starts.values() if len(seeds) > 1]

    def incomplete(self, arms: list[str], best: bool) -> tuple[list[str], list[str]]:
        """Keys of the planned runs of ``arms`` that have not finished (failed, running or not
        started: their shared-LR runs, and with ``best`` their grid and confirm runs too), and
        of those that diverged (a NaN or inf loss: their shared-LR runs, or with ``best`` their
        confirm runs; a grid LR that diverged is only a bad LR, and a shared one is not what
        the best-LR comparison reads)."""
        ours = [r for r in self.runs if r["arm"] in arms]
        waiting = ("shared", "grid", "confirm") if best else ("shared",)
        read = "confirm" if best else "shared"
        unfinished = [r["key"] for r in ours if r["lr_phase"] in waiting and not r["finished"]]
        diverged = [
            r["key"]
            for r in ours
            if r["lr_phase"] == read and r["finished"] and not np.isfinite(r["loss"])
        ]
        return unfinished, diverged

    def settings(self, arm: str) -> dict:
        r = next(r for r in self.runs if r["arm"] == arm)
        return {k: r[k] for k in ARM_FACTORS}

    def other_fields(self, arm: str) -> dict:
        """The config fields ``arm``'s study entry set besides the factors (``arm_fields`` of
        its runs in ``study.json``, merged); {} for a manifest without ``arm_fields``."""
        out: dict = {}
        for r in self.runs:
            if r["arm"] == arm:
                fields = r.get("arm_fields") or {}
                out.update({k: v for k, v in fields.items() if k not in ARM_FACTORS})
        return out

    def unmatched_fields(self, arm: str, other: str) -> dict[str, tuple]:
        """{field: (``arm``'s value, ``other``'s value)} of the non-factor fields the two arms
        set differently (None: not set)."""
        a, b = self.other_fields(arm), self.other_fields(other)
        return {k: (a.get(k), b.get(k)) for k in sorted({*a, *b}) if a.get(k) != b.get(k)}

    def check_matched(self, arm: str, other: str, compared: str) -> None:
        """Refuse to pair ``arm`` with ``other`` as differing in ``compared`` alone when their
        recorded settings differ in any other field.

        Raises:
            ConfigError: naming both arms and each differing field with the two values.
        """
        differ = self.unmatched_fields(arm, other)
        if differ:

            def value(v) -> str:
                return "unset" if v is None else repr(v)

            shown = "; ".join(f"{k}: {value(a)} vs {value(b)}" for k, (a, b) in differ.items())
            raise ConfigError(
                f"study.json: arms {arm!r} and {other!r} would be compared as differing in "
                f"{compared} alone, but their arm settings also differ in {', '.join(differ)} "
                f"({shown}), and a verdict would credit that difference to {compared}. Fix: "
                "sweep the arms again with those fields in the study's set: (every arm gets "
                "them), or compare them in a separate study"
            )

    def role(self, name: str) -> Optional[str]:
        """The arm playing a named role (see the module docstring), the one with most sizes.

        ``gamma1`` differs from the baseline in γ alone and ``gamma0.5+eps+gate`` from
        ``gamma1+eps+gate`` in γ alone (:meth:`matching`), so that each pair a claim compares
        differs in one setting.
        """
        base = self.settings(self.baseline)
        if name == "gamma1":
            return self.matching(self.baseline, init_gamma=1.0)
        if name == "gamma0.5+eps+gate":
            fixed = self.role("gamma1+eps+gate")
            return self.matching(fixed, init_gamma=base["init_gamma"]) if fixed else None
        gate_wanted = name == "gamma1+eps+gate"
        found = [
            arm
            for arm in self.arms
            for s in [self.settings(arm)]
            if s["init_gamma"] == 1.0
            and s["norm_epsilon"] < base["norm_epsilon"]
            and (s["gated_attention"] == base["gated_attention"]) != gate_wanted
            and (s["gated_attention"] != "none" or not gate_wanted)
        ]
        return self._best_matched(
            self.baseline, found, "γ, ε and the gate" if gate_wanted else "γ and ε"
        )

    def _best_matched(self, arm: str, found: list[str], compared: str) -> Optional[str]:
        """Of ``found`` (arms whose factors fit a role), those whose other fields are
        ``arm``'s: the baseline first, else the one with most sizes; None if ``found`` is
        empty. Raises ConfigError (:meth:`check_matched`) when ``found`` has arms but none
        matches ``arm`` in its other fields."""

        def best(arms: list[str]) -> Optional[str]:
            if self.baseline in arms:
                return self.baseline
            return max(arms, key=lambda a: len(self.arm_sizes(a)), default=None)

        matched = [other for other in found if not self.unmatched_fields(arm, other)]
        if found and not matched:
            self.check_matched(arm, best(found), compared)
        return best(matched)

    def matching(self, arm: str, **changes) -> Optional[str]:
        """The arm whose γ, ε and gate are exactly ``arm``'s with ``changes`` applied (keys of
        :meth:`settings`) and whose other recorded fields are ``arm``'s, the baseline first,
        else the one with most sizes; None if none.

        Raises:
            ConfigError: arms have those γ, ε and gate but each also differs from ``arm`` in
                another field (:meth:`check_matched`).
        """
        want = {**self.settings(arm), **changes}
        found = [
            other
            for other in dict.fromkeys([self.baseline, *self.arms])
            if other != arm and self.settings(other) == want
        ]
        names = {"init_gamma": "γ", "norm_epsilon": "ε", "gated_attention": "the gate"}
        compared = " and ".join(names[k] for k in changes) or "nothing"
        return self._best_matched(arm, found, compared)

    def matched_control(self, arm: str) -> Optional[str]:
        """The arm with ``arm``'s ε and gate at the baseline's γ (the baseline itself when ε
        and gate are the baseline's), or None."""
        return self.matching(arm, init_gamma=self.settings(self.baseline)["init_gamma"])

    def embedding_init(self, arm: str, size: str) -> Optional[ParamInit]:
        """How ``arm``'s runs at ``size`` drew the input embedding (:func:`embedding_init`:
        the run's resolved init, overrides and ``init_method`` included); None where unknown
        or the arm has no run there."""
        r = next((r for r in self.runs if r["arm"] == arm and r["size"] == size), None)
        return r and r["embedding_init"]

    def embedding_variance_over_eps(self, arm: str, size: str) -> Optional[float]:
        """σ²_emb / ε at initialization: the square of the embedding's init sigma as the run
        drew it (:meth:`embedding_init`) over ``norm_epsilon``; the embedding output's mean
        square that the first RMSNorm sees, against its ε. None when that sigma is unknown."""
        init = self.embedding_init(arm, size)
        if init is None:
            return None
        r = next(r for r in self.runs if r["arm"] == arm and r["size"] == size)
        return init.sigma**2 / r["norm_epsilon"]

    def common_keys(self, arms: list[str], size: str, prefix: str) -> set[str]:
        """The diagnostic keys ``prefix/...`` (e.g. ``stable_rank/ROLE/layer_LL``) that every
        one of ``arms`` logged at ``size`` in its shared-LR runs (an arm that logged none there
        is left out), so that a mean over them compares the same matrices: a gated arm's gate
        matrices, absent in an ungated arm, are not in it."""
        logged = []
        for arm in arms:
            keys = set().union(
                *(
                    r["record"].keys(prefix)
                    for r in self._runs(arm, size, "shared")
                    if r.get("record")
                )
            )
            if keys:
                logged.append(keys)
        return set.intersection(*logged) if logged else set()

    def _phase_runs(self, arm: str, size: str, phase: str) -> list[dict]:
        """``arm``'s runs at ``size`` of LR phase ``phase`` (``shared``, ``confirm``, or
        ``best``: :meth:`confirm_losses`' runs)."""
        return self._confirm_runs(arm, size) if phase == "best" else self._runs(arm, size, phase)

    def seed_series(
        self,
        arm: str,
        size: str,
        prefix: str,
        phase: str = "shared",
        keys: Optional[set[str]] = None,
    ) -> dict[int, dict[int, float]]:
        """{seed: {iteration: value}} of a diagnostic (:meth:`RunRecord.series`; the mean over
        ``keys`` only when given) in the runs of LR phase ``phase`` (``shared`` or ``confirm``),
        or with ``best`` in the runs at the arm's own best LR (:meth:`confirm_losses`' runs:
        its confirm runs, or its shared-LR runs where the shared LR won its grid)."""
        out = {}
        for r in self._phase_runs(arm, size, phase):
            series = r["record"].series(prefix, keys) if r.get("record") else {}
            if series:
                out[r["seed"]] = series
        return out

    def non_finite(
        self,
        arms: list[str],
        size: str,
        prefix: str,
        phase: str = "shared",
        keys: Optional[set[str]] = None,
    ) -> list[str]:
        """``ARM seed S at iteration(s) ...`` for each run of ``arms`` at ``size`` (as
        :meth:`seed_series` selects them) whose diagnostic ``prefix`` (over ``keys`` when
        given) is NaN or inf at some logged iteration (:meth:`RunRecord.non_finite`)."""
        out = []
        for arm in arms:
            for r in self._phase_runs(arm, size, phase):
                its = r["record"].non_finite(prefix, keys) if r.get("record") else []
                if its:
                    listed = ", ".join(map(str, its[:5])) + (" ..." if len(its) > 5 else "")
                    out.append(
                        f"{arm} seed {r['seed']} at iteration{'s' * (len(its) > 1)} {listed}"
                    )
        return out

    def series(
        self, arm: str, size: str, prefix: str, keys: Optional[set[str]] = None
    ) -> dict[int, float]:
        """A diagnostic's per-iteration value averaged over seeds (the iterations all share;
        each seed's value the mean over ``keys`` only when given)."""
        per_seed = list(self.seed_series(arm, size, prefix, keys=keys).values())
        if not per_seed:
            return {}
        common = set.intersection(*(set(s) for s in per_seed))
        return {it: float(np.mean([s[it] for s in per_seed])) for it in sorted(common)}

    def seq_length(self) -> int:
        return int(self.runs[0]["seq_length"])


def loss_table(data: StudyData, phase: str = "shared") -> tuple[list[dict], dict]:
    """Final loss per arm × size (mean, sd over seeds) and, for every non-baseline arm, the
    paired difference to the baseline over their common seeds (:func:`~.fits.paired_difference`).

    Args:
        phase: ``shared`` (every arm at the shared LR) or ``best`` (every arm at its own best
            LR: its confirm runs, :meth:`StudyData.confirm_losses`; rows add ``lr`` and
            ``edge``, :meth:`StudyData.edge_lr`).

    Returns:
        (rows, {(arm, size): Interval}).
    """

    def get(arm, size):
        return data.losses(arm, size) if phase == "shared" else data.confirm_losses(arm, size)

    rows, diffs = [], {}
    for arm in data.arms:
        for size in data.sizes:
            losses = get(arm, size)
            if not losses:
                continue
            mean, std = mean_std(list(losses.values()))
            row = {
                "arm": arm,
                "size": size,
                "non_embedding": data.size_n[size],
                "seeds": len(losses),
                "mean": mean,
                "std": std,
            }
            if phase != "shared":
                row["lr"] = data.best_lr(arm, size)
                row["edge"] = data.edge_lr(arm, size)
            base = get(data.baseline, size)
            common = sorted(set(losses) & set(base))
            if arm != data.baseline and common:
                d = paired_difference([losses[s] for s in common], [base[s] for s in common])
                row.update(
                    diff=d.mean, diff_low=d.low, diff_high=d.high, diff_df=d.df, diff_text=d.text()
                )
                diffs[(arm, size)] = d
            rows.append(row)
    return rows, diffs


ALPHA_EDGE = 1e-3
"""A fitted α within this of its bounds [0, 3] counts as at the bound (not identified)."""


def scaling_fits(data: StudyData) -> dict[str, dict]:
    """Per arm: the power-law fit to the seed-mean loss at each size where it is identified, the
    sizes where the seed-mean loss rises with N, and the effective-size multiplier against the
    baseline's fit per size where it needs no extrapolation.

    Sizes are the unit: one point per size (the mean over its seeds), so the fit's standard
    errors have df = sizes − 3; pooling every (size, seed) loss would count seeds as if they
    were sizes. A fit is identified with more sizes than its 3 parameters and α strictly inside
    its bounds; otherwise ``fit`` is None and ``error`` says why. A multiplier is a point
    estimate (no interval) given only where the arm's seed-mean loss lies within the baseline's
    measured seed-mean losses (so N_eff lies within its measured sizes); otherwise
    ``multiplier_reason`` says why.
    """
    out = {}
    for arm in data.arms:
        sizes = data.arm_sizes(arm)
        means = [mean_std(list(data.losses(arm, s).values()))[0] for s in sizes]
        entry = {
            "sizes": sizes,
            "n": [data.size_n[s] for s in sizes],
            "mean": means,
            "fit": None,
            "error": None,
        }
        if len(sizes) <= 3:
            entry["error"] = f"{len(sizes)} size(s): E, A, α need more sizes than parameters (>= 4)"
        else:
            try:
                fit = fit_power_law(entry["n"], means)
            except ValueError as e:
                entry["error"] = str(e)
            else:
                if not ALPHA_EDGE < fit.alpha < 3.0 - ALPHA_EDGE:
                    entry["error"] = f"α = {fit.alpha:.3g} at its bound [0, 3]: not identified"
                else:
                    entry["fit"] = fit
        entry["loss_rises"] = [
            f"{sizes[i - 1]} → {sizes[i]}" for i in range(1, len(sizes)) if means[i] >= means[i - 1]
        ]
        out[arm] = entry
    base = out.get(data.baseline, {})
    base_fit = base.get("fit")
    lo, hi = (min(base["mean"]), max(base["mean"])) if base.get("mean") else (np.nan, np.nan)
    for arm, entry in out.items():
        entry["multiplier"], entry["multiplier_reason"] = {}, {}
        if arm == data.baseline:
            continue
        for size, n, loss in zip(entry["sizes"], entry["n"], entry["mean"], strict=True):
            if base_fit is None:
                entry["multiplier_reason"][size] = "no identified baseline fit"
            elif not lo <= loss <= hi:
                entry["multiplier_reason"][size] = (
                    f"loss {loss:.4f} outside the baseline's measured {lo:.4f}–{hi:.4f} "
                    "(extrapolation)"
                )
            else:
                entry["multiplier"][size] = effective_size_multiplier(base_fit, loss, n)
    return out


def multiplier_text(entry: dict) -> str:
    """``SIZE 1.44x (point estimate, no interval)`` per size where the multiplier is identified,
    else ``SIZE: reason``."""
    parts = [
        f"{size} {m:.2f}x (point estimate, no interval)" for size, m in entry["multiplier"].items()
    ]
    parts += [f"{size}: not given, {why}" for size, why in entry["multiplier_reason"].items()]
    return "; ".join(parts)


def gamma_grid_arms(data: StudyData) -> list[str]:
    """The arms of the γ grid: its base arm and the ``BASE@gamma=V`` arms ([] without one).

    Raises:
        ConfigError: a grid arm whose recorded fields other than the factors differ from the
            base arm's (:meth:`StudyData.check_matched`).
    """
    grid = data.manifest.get("gamma_grid")
    base = grid["arm"] if grid else None
    arms = [a for a in data.arms if base and (a == base or a.startswith(base + "@gamma="))]
    for arm in arms:
        if arm != base:
            data.check_matched(base, arm, "γ")
    return arms


def gamma_grid(data: StudyData, phase: str = "shared") -> dict[str, dict]:
    """Per grid size: loss against γ at matched seeds (the seeds every γ value finished).

    Args:
        phase: ``shared`` (every γ at the shared LR) or ``best`` (every γ at its own best LR:
            its confirm runs, :meth:`StudyData.confirm_losses`; a γ not confirmed yet is
            missing, and ``edges`` holds {γ: why} for each γ whose best LR is on its grid's
            edge, :meth:`StudyData.edge_lr`).

    Each entry: ``lr`` (``shared LR`` or ``best LR``), ``gamma`` (sorted), ``seeds`` (matched),
    ``all_seeds`` ({γ: seeds finished}), ``mean`` (per γ, over matched seeds), ``per_seed``
    ({γ: losses at the matched seeds, in ``seeds`` order}), ``losses`` ({γ: {seed: loss}} of
    every seed that γ finished, for pairing two γs on their own common seeds), ``best`` (the γ
    of the lowest mean, a NaN or inf mean last; None without matched seeds or with one γ),
    ``edges`` ({} at the shared LR).
    """
    grid = data.manifest.get("gamma_grid")
    if not grid:
        return {}
    arms = gamma_grid_arms(data)
    get = data.losses if phase == "shared" else data.confirm_losses
    out = {}
    for size in grid["sizes"]:
        per_gamma = {}
        for arm in arms:
            losses = get(arm, size)
            if losses:
                per_gamma[data.settings(arm)["init_gamma"]] = losses
        gammas = sorted(per_gamma)
        seeds = sorted(set.intersection(*(set(v) for v in per_gamma.values()))) if gammas else []
        per_seed = {g: [per_gamma[g][s] for s in seeds] for g in gammas} if seeds else {}
        means = [float(np.mean(per_seed[g])) for g in gammas] if seeds else []
        edges = {}
        for arm in arms if phase != "shared" else []:
            if edge := data.edge_lr(arm, size):
                edges[data.settings(arm)["init_gamma"]] = edge
        out[size] = {
            "lr": "shared LR" if phase == "shared" else "best LR",
            "gamma": gammas,
            "seeds": seeds,
            "all_seeds": {g: sorted(per_gamma[g]) for g in gammas},
            "mean": means,
            "per_seed": per_seed,
            "losses": per_gamma,
            "best": gammas[int(np.argmin(np.where(np.isfinite(means), means, np.inf)))]
            if len(means) >= 2
            else None,
            "edges": edges,
        }
    return out


RANK_WINDOW = 3
"""Logged points (after initialization) a stable-rank trajectory's minimum and end are read
over (:func:`rank_dip`), where at least twice as many are logged."""


def rank_window(points: int) -> int:
    """How many logged points :func:`rank_dip` reads a stable-rank trajectory's minimum and end
    over: :data:`RANK_WINDOW` where ``points`` (those logged after initialization) hold two such
    windows apart, else 1 (the single points)."""
    return RANK_WINDOW if points >= 2 * RANK_WINDOW else 1


@dataclass(frozen=True)
class RankDip:
    """A stable-rank trajectory's dip and recovery (:func:`rank_dip`).

    Attributes:
        first: the stable rank at the first logged point (initialization).
        low: the minimum's level (cross-fitted where ``window`` > 1), or ``first`` where that
            lies at or above it.
        low_iteration: the iteration of the lowest logged point after the first.
        end: the mean of the last ``window`` logged points.
        dip: 1 − low/first (0 where there is no dip).
        rise: end/low − 1; None where the minimum reaches the last point (still falling there:
            no recovery measured, and ``dip`` is only the fall so far, a lower bound).
        window: :func:`rank_window` of the points logged after initialization.
    """

    first: float
    low: float
    low_iteration: int
    end: float
    dip: float
    rise: Optional[float]
    window: int


def rank_dip(series: dict[int, float]) -> RankDip:
    """The dip and recovery of a stable-rank trajectory {iteration: stable rank}, its first
    point the initialization: dip = 1 − low/first, rise = end/low − 1. The one rule claim 7
    (:func:`~.verdicts.claim7`) and the report's Mechanisms table (:func:`mechanisms`) read.

    With k = :func:`rank_window` = 3 (at least 6 points logged after initialization) the
    minimum is cross-fitted (trial 10, finding 4): the lowest of the even-indexed points after
    initialization is located, and its level read as the mean of the odd-indexed points next
    to it (its window of 3, less itself); the same with odd and even swapped; ``low`` is the
    mean of the two readings. The lowest of n noisy points lies below their level (about 1.5
    sd for n = 10, 2.3 for 50), and a window centred on it still holds it (trial 9 cut the bias
    to about a third only); the points read here are not the ones the minimum was chosen on,
    so their noise is independent of the choice and a flat trajectory's expected recovery is
    about 0. On a noise-free trajectory the reading is the mean of the minimum's neighbours, so
    its level can lie above the lowest point by up to half a logging interval's change. ``end``
    is the mean of the last k points (chosen by position, not by value: no selection). With
    fewer than 6 points after initialization (k = 1) the minimum is the single lowest point:
    too few points to split (its selection bias is at most about 1.2 sd with 5 points).

    A low at or above the first value is the first value (no dip: dip 0, rise from it). rise
    is None where the minimum reaches the last point: with k = 1 the lowest point is the last;
    with k = 3 both located minima's windows reach the last point (still falling there, or
    flattened too late to tell: no recovery measured, and the dip is only the fall so far).
    """
    its = sorted(series)
    first, after = series[its[0]], [float(series[i]) for i in its[1:]]
    n = len(after)
    k = rank_window(n)
    end = float(np.mean(after[-k:]))
    j = int(np.argmin(after))
    if k == 1:
        low, reaches = after[j], j == n - 1
    else:
        half, readings, reaches = k // 2, [], True
        for parity in (0, 1):
            at = min(range(parity, n, 2), key=lambda i: after[i])
            near = [after[i] for i in range(max(0, at - half), min(n, at + half + 1)) if i != at]
            readings.append(float(np.mean(near)))
            reaches &= at + half >= n - 1
        low = float(np.mean(readings))
    if low >= first:
        return RankDip(first, first, its[j + 1], end, 0.0, end / first - 1, k)
    rise = None if reaches else end / low - 1
    return RankDip(first, low, its[j + 1], end, 1 - low / first, rise, k)


def mechanisms(data: StudyData) -> dict[str, dict]:
    """Per arm and size: saturation, sink share, stable rank and condensation trajectories.
    The stable rank and the condensation score (:data:`MATRIX_DIAGNOSTICS`) are each the mean
    over the matrices every arm at that size logged (:meth:`StudyData.common_keys`): a gated
    arm's gate matrices are left out, so arms that differ in the gate average the same
    matrices. These series are the report's table, plot and ``report.json`` ``series``.

    Returns:
        {``ARM|SIZE``: entry}: the seed-mean series ({iteration: value}) under ``saturation``,
        ``sink_share``, ``stable_rank``, ``condensation``; with >= 3 stable-rank points also
        the seed mean's dip and recovery by claim 7's rule (:func:`rank_dip`, one helper, so
        the table and the verdict agree; trial 10, finding 6): ``rank_first``, ``rank_min``
        (the cross-fitted minimum where ``rank_window`` is 3, the single lowest point where
        it is 1), ``rank_min_iteration`` (where the lowest logged point lies), ``rank_final``
        (the mean of the last ``rank_window`` points), ``rank_dip`` (1 − min/first) and
        ``rank_rise`` (final/min − 1; None when the minimum reaches the last point: the
        trajectory is still falling there, so no recovery was measured).
    """
    out = {}
    shared = {
        (size, prefix): data.common_keys(data.arms, size, prefix)
        for size in data.sizes
        for prefix in MATRIX_DIAGNOSTICS
    }
    for arm in data.arms:
        for size in data.arm_sizes(arm):
            sat = data.series(arm, size, "norm_saturated")
            sink = data.series(arm, size, "sink_share")
            rank, cond = (
                data.series(arm, size, prefix, shared[(size, prefix)])
                for prefix in MATRIX_DIAGNOSTICS
            )
            entry = {
                "saturation": sat,
                "sink_share": sink,
                "stable_rank": rank,
                "condensation": cond,
            }
            if sat:
                entry["saturation_max"] = max(sat.values())
                entry["saturation_final"] = sat[max(sat)]
            if sink:
                entry["sink_final"] = sink[max(sink)]
            if len(rank) >= 3:
                r = rank_dip(rank)
                entry.update(
                    rank_first=r.first,
                    rank_min=r.low,
                    rank_min_iteration=r.low_iteration,
                    rank_final=r.end,
                    rank_dip=r.dip,
                    rank_rise=r.rise,
                    rank_window=r.window,
                    rank_first_iteration=min(rank),
                )
            out[f"{arm}|{size}"] = entry
    return out
