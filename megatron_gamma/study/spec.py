"""The study file (``megatron-gamma sweep STUDY.yaml``): schema, validation and the run plan.

A study is a YAML mapping (paths relative to the study file)::

    name: smoke
    config: [../configs/demo.yaml]        # base config file(s), layered in order
    set: {seq_length: 64, lr: 3.0e-3}     # config fields set for every run
    data:                                 # corpus, split into train / held-out, preprocessed
      inputs: [corpus/en.jsonl.gz, corpus/zh.jsonl.gz]
      tokenizer_model: tokenizer.json
      heldout_every: 20                   # every 20th document is held out
      on_error: stop                      # or skip: bad lines and records, counted
    baseline: baseline                    # the arm every other arm is compared with
    arms:                                 # name -> γ, ε, gate only (+ sizes/seeds, lr_grid)
      baseline: {init_gamma: 0.5, norm_epsilon: 1.0e-5, gated_attention: none}
      gamma1+eps+gate: {init_gamma: 1.0}
    sizes:                                # name -> width/depth (+ heads, ffn) and token budget
      d64: {hidden_size: 64, num_layers: 2, num_attention_heads: 4, tokens: 400000}
    seeds: [1, 2]
    gamma_grid: {arm: gamma1+eps+gate, values: [0.5, 0.75, 1.0, 1.25, 1.5], sizes: [d64]}
    lr_grid: {factors: [0.5, 1, 2], select_seed: 1}   # per-arm LR tuning (below)
    margin: 0.01                          # δ (nats): the smallest effect a verdict counts
    diagnostics_points: 10                # --log-diagnostics-interval = train_iters / this
    checkpoints: 4                        # --save-interval = train_iters / this

**Arms** set only the study's factors (:data:`ARM_FACTORS`: ``init_gamma``, ``norm_epsilon``,
``gated_attention``), plus an optional ``sizes`` / ``seeds`` subset and ``lr_grid``: the report
pairs arms by these three settings alone, so that each compared pair differs in the setting a
verdict credits. Any other config field (``weight_decay``, ``init_gamma_overrides``,
``embedding_fan_in``, ...) belongs in ``set`` (every arm gets it) or in a separate study. A
shared ``init_method`` under which ``init_gamma`` has no effect (``normal``) is refused: the γ
arms would differ in nothing.

Each (arm, size, seed) becomes one run whose resolved config (base files + ``set`` + size +
arm + seed + data paths + run directory) is validated by :func:`megatron_gamma.config.load_config`
before anything trains. ``gamma_grid`` adds arms ``ARM@gamma=V`` (``ARM``'s fields with
``init_gamma: V``) at the listed sizes; the value equal to ``ARM``'s own γ reuses ``ARM``'s runs.

**Sizes** take, besides width/depth and ``tokens``: ``config`` (the size's own recipe file(s),
layered after the study's ``config``), ``lr``, ``micro_batch_size``, ``lr_warmup_fraction``
(Megatron-LM's flag; it replaces the recipes' ``lr_warmup_iters``) and ``lr_grid``. Layers, in
order: study ``config``, size ``config``, ``set``, the size's fields, the arm's fields, the seed.
Arm and size names match ``[A-Za-z0-9][A-Za-z0-9._+=@-]*`` without ``..``; every run directory
must resolve inside the output directory.

**LR grid** (``lr_grid: {values: [...]}`` or ``{factors: [...]}``, at the top level, in an arm or
in a size; the arm's wins over the size's, which wins over the study's; ``factors`` multiply the
run's shared LR). ``select_seed`` (top level only, default the first seed) is the seed the grid
runs on. Every run keeps ``min_lr / lr`` of its shared LR. The plan has three phases:

* ``shared``: every arm × size × seed at the shared LR (``set``'s or the size's ``lr``), at
  ``ARM/SIZE/seed-S``;
* ``grid``: the grid's other LRs on the selection seed, at ``ARM/SIZE/lr-LR/seed-S``;
* ``confirm``: once an arm's grid at a size has finished, its best LR (lowest final validation
  loss on the selection seed; ties go to the smaller LR, a diverged run's NaN or inf loss ranks
  last) on the arm's other seeds, at ``ARM/SIZE/lr-LR/seed-S`` (none when the shared LR wins:
  its runs are the confirmation).

The best LR must be bracketed: while it is the grid's smallest or largest LR, the grid grows by
one more point in that direction (the edge LR times the ratio of the two outermost LRs on that
side, e.g. 6e-3 → 1.2e-2 for ``factors: [0.5, 1, 2]`` around 3e-3), at most ``extend`` points in
all (``lr_grid.extend``, default 2; 0 turns it off), before the confirm runs are planned. A best
LR still on the edge after that is reported as not bracketed, and the verdicts that compare arms
at their own best LR say so instead of deciding.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from megatron_gamma.config import Config, ConfigError, load_config
from megatron_gamma.config.effects import RULES
from megatron_gamma.config.file_kinds import STUDY_KEYS, keys_of_the_other_kind

TOP_KEYS = STUDY_KEYS
SIZE_KEYS = (
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "ffn_hidden_size",
    "tokens",
    "config",
    "lr",
    "micro_batch_size",
    "lr_warmup_fraction",
    "lr_grid",
)
DATA_KEYS = ("inputs", "tokenizer_model", "heldout_every", "on_error")
RESTRICT_KEYS = ("sizes", "seeds")
ARM_FACTORS = ("init_gamma", "norm_epsilon", "gated_attention")
"""The config fields an arm may set: the settings the report's roles and verdicts compare
(:meth:`~.analysis.StudyData.settings`). Any other field set in one arm would differ between
two arms the report pairs as differing in one factor, and its effect would be credited to it."""
LR_GRID_KEYS = ("values", "factors", "extend", "select_seed")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@-]*")
"""Arm, size and study names: usable as one directory name, never ``..`` or a path."""
SHARED, GRID, CONFIRM = "shared", "grid", "confirm"
"""``Run.lr_phase`` values (module docstring)."""


class StudyError(ConfigError):
    """A study file that cannot run as written (raised before anything trains)."""


class StudyChangedError(StudyError):
    """The study file changed an arm, size, seed, budget or the data of a run that exists."""


MANIFEST = "study.json"
"""The file ``sweep`` writes into its ``--output-dir`` and ``report`` reads."""


RUNS_CSV, LOSSES_CSV = "runs.csv", "losses.csv"
"""Two of the tables ``report`` writes beside its report.md (:mod:`~.report`)."""
REPORT_TABLES = (RUNS_CSV, LOSSES_CSV)
"""A folder holding both, with no study.json, is a report's output, not a study."""


def manifest_path(study_dir: str) -> str:
    """``study_dir``'s :data:`MANIFEST`, checked to exist (the first check of ``report``, before
    its imports).

    Raises:
        ConfigError: ``study_dir`` does not exist, is not a directory, or holds no study.json,
            naming it and the fix (and saying so where it holds a report's tables instead).
    """
    path = os.path.join(study_dir, MANIFEST)
    if not os.path.isdir(study_dir):
        why = "is not a directory" if os.path.lexists(study_dir) else "does not exist"
        raise ConfigError(
            f"study_dir={study_dir!r}: {why}. Fix: pass the --output-dir DIR of a `megatron-gamma "
            "sweep STUDY.yaml --output-dir DIR` run"
        )
    if not os.path.isfile(path):
        tables = [f for f in REPORT_TABLES if os.path.isfile(os.path.join(study_dir, f))]
        if len(tables) == len(REPORT_TABLES):
            raise ConfigError(
                f"study_dir={study_dir!r}: no {MANIFEST}; it holds a report's tables "
                f"({', '.join(tables)}), not a study: report judges the runs of a sweep's "
                "--output-dir, and a report's output keeps no runs (docs/reproduction.md says "
                "how the committed study's rows were re-judged). Fix: pass the --output-dir DIR "
                "of a `megatron-gamma sweep STUDY.yaml --output-dir DIR` run"
            )
        raise ConfigError(
            f"study_dir={study_dir!r}: no {MANIFEST}. Fix: run `megatron-gamma sweep "
            "STUDY.yaml --output-dir DIR` first, and pass that DIR"
        )
    return path


def _fail(key: str, value: Any, why: str, fix: str) -> None:
    raise StudyError(f"{key}={value!r}: {why}. Fix: {fix}")


@dataclass
class DataSpec:
    """The study's corpus: ``inputs`` (jsonl / jsonl.gz with a ``text`` key) split by document
    index into train and held-out (every ``heldout_every``-th document), tokenized with
    ``tokenizer_model``. Existence is checked when the data are prepared (a dry run of a cluster
    study works without the cluster's files). ``on_error``: ``stop`` at a line that is not
    JSON or a record ``preprocess`` refuses, or ``skip`` and count them (``preprocess
    --on-error``)."""

    inputs: list[str]
    tokenizer_model: str
    heldout_every: int
    on_error: str = "stop"


@dataclass
class LRGrid:
    """Peak learning rates to try: absolute ``values`` or ``factors`` of the shared LR (one of
    the two)."""

    values: Optional[list[float]] = None
    factors: Optional[list[float]] = None
    extend: int = 2

    def lrs(self, shared_lr: float) -> list[float]:
        """The grid's LRs for a run whose shared LR is ``shared_lr``, ascending."""
        if self.values is not None:
            return sorted(self.values)
        return sorted(_round_lr(f * shared_lr) for f in self.factors)


def extend_lr(lrs: list[float], best: float) -> Optional[float]:
    """The LR one step beyond the edge ``best`` lies on, or None when ``best`` is inside.

    Args:
        lrs: the grid's LRs so far, ascending (>= 2).
        best: the one with the lowest loss.

    Returns:
        ``lrs[-1]² / lrs[-2]`` when ``best`` is the largest, ``lrs[0]² / lrs[1]`` when it is the
        smallest (the outermost ratio continued, to 6 significant digits), else None.
    """
    if best == lrs[-1]:
        return _round_lr(lrs[-1] * lrs[-1] / lrs[-2])
    if best == lrs[0]:
        return _round_lr(lrs[0] * lrs[0] / lrs[1])
    return None


def _round_lr(lr: float) -> float:
    """``lr`` to 6 significant digits (``0.5 · 3e-3`` is 0.0015, not 0.0015000000000000002)."""
    return float(f"{lr:.6g}")


@dataclass
class Size:
    """A model size: config fields (width, depth, heads, ffn, LR, micro-batch, warmup
    fraction), its own recipe files, the token budget and an optional LR grid."""

    name: str
    fields: dict
    tokens: int
    config_files: list[str] = field(default_factory=list)
    lr_grid: Optional[LRGrid] = None


@dataclass
class Arm:
    """A named set of config fields, run at ``sizes`` × ``seeds``."""

    name: str
    fields: dict
    sizes: list[str]
    seeds: list[int]
    grid_of: Optional[str] = None
    """For γ-grid arms: the arm whose fields they copy."""
    lr_grid: Optional[LRGrid] = None


@dataclass
class Run:
    """One (arm, size, seed, LR) of the plan.

    Attributes:
        key: ``ARM/SIZE/seed-S`` (shared LR) or ``ARM/SIZE/lr-LR/seed-S``, the run directory
            relative to the study output directory.
        config: the resolved, validated config of the run.
        train_iters: iterations (``ceil(tokens / (global_batch_size · seq_length))``).
        tokens: tokens trained (``train_iters · global_batch_size · seq_length``).
        lr: peak learning rate.
        lr_phase: ``shared``, ``grid`` or ``confirm`` (module docstring).
        grid: a shared run that is also a point of its arm's LR grid (on the selection seed).
    """

    arm: str
    size: str
    seed: int
    key: str
    config: Config
    train_iters: int
    tokens: int
    lr: float = 0.0
    lr_phase: str = SHARED
    grid: bool = False


@dataclass
class Pending:
    """Confirm runs not planned yet: ``arm`` at ``size`` on ``seeds``, at the LR its grid
    (``lrs`` on the selection seed) picks once every grid run has finished."""

    arm: str
    size: str
    seeds: list[int]
    lrs: list[float]
    shared_lr: float


@dataclass
class Study:
    """A parsed study file (see the module docstring)."""

    path: str
    name: str
    config_files: list[str]
    fields: dict
    data: DataSpec
    baseline: str
    arms: dict[str, Arm]
    sizes: dict[str, Size]
    seeds: list[int]
    gamma_grid: Optional[dict] = None
    diagnostics_points: int = 10
    checkpoints: int = 4
    margin: float = 0.01
    """δ in nats: the smallest loss difference the report's verdicts count as an effect."""
    lr_grid: Optional[LRGrid] = None
    lr_select_seed: Optional[int] = None
    """The seed LR grids run on (None when no arm has a grid)."""
    runs: list[Run] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)

    def grid_for(self, arm: str, size: str) -> Optional[LRGrid]:
        """The LR grid of ``arm`` at ``size``: the arm's (or its γ-grid base arm's), else the
        size's, else the study's, else None."""
        a = self.arms[arm]
        base = self.arms[a.grid_of] if a.grid_of else a
        return a.lr_grid or base.lr_grid or self.sizes[size].lr_grid or self.lr_grid


def _mapping(key: str, value: Any) -> dict:
    if not isinstance(value, dict):
        _fail(key, value, "must be a mapping", f"write {key}: {{name: ...}}")
    return value


def _resolve(base: str, path: str) -> str:
    return os.path.normpath(os.path.join(base, os.path.expanduser(path)))


def _check_name(key: str, name: Any) -> str:
    """``name`` as a string if it is a safe single directory name, else StudyError."""
    text = "" if name is None else str(name)
    if not NAME_PATTERN.fullmatch(text) or ".." in text:
        _fail(
            key,
            text,
            "not a safe directory name (the run directories are OUTPUT_DIR/ARM/SIZE/...)",
            "use letters, digits and . _ + = @ -, starting with a letter or digit, without '..'",
        )
    return text


def _seed_list(key: str, value: Any) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(s, int) for s in value):
        _fail(key, value, "must be a non-empty list of integers", f"write {key}: [1, 2]")
    if len(set(value)) != len(value):
        _fail(key, value, "repeats a seed", "list each seed once")
    return list(value)


def _positive_list(key: str, value: Any) -> list[float]:
    ok = isinstance(value, list) and value
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if not ok or not all(math.isfinite(v) and v > 0 for v in value):
        _fail(
            key, value, "must be a non-empty list of positive numbers", f"e.g. {key}: [0.5, 1, 2]"
        )
    if len(set(value)) != len(value):
        _fail(key, value, "repeats a value", "list each value once")
    return [float(v) for v in value]


def _parse_lr_grid(key: str, raw: Any, top: bool) -> tuple[LRGrid, Optional[int]]:
    """``lr_grid`` at ``key`` → (grid, select_seed or None)."""
    raw = _mapping(key, raw)
    for k in raw:
        if k not in LR_GRID_KEYS or (k == "select_seed" and not top):
            allowed = LR_GRID_KEYS if top else LR_GRID_KEYS[:3]
            why = "unknown key" if k not in LR_GRID_KEYS else "set only in the top-level lr_grid"
            _fail(f"{key}.{k}", raw[k], why, f"use {', '.join(allowed)}")
    if ("values" in raw) == ("factors" in raw):
        _fail(
            key,
            raw,
            "needs exactly one of values (absolute LRs) and factors (multiples of the shared LR)",
            f"write {key}: {{factors: [0.5, 1, 2]}} or {{values: [1.0e-3, 3.0e-3]}}",
        )
    which = "values" if "values" in raw else "factors"
    numbers = _positive_list(f"{key}.{which}", raw[which])
    if len(numbers) < 2:
        _fail(f"{key}.{which}", numbers, "a grid needs >= 2 values", "give e.g. 3 values")
    seed = raw.get("select_seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        _fail(f"{key}.select_seed", seed, "must be an integer seed", "e.g. select_seed: 1")
    extend = raw.get("extend", LRGrid.extend)
    if not isinstance(extend, int) or isinstance(extend, bool) or extend < 0:
        _fail(f"{key}.extend", extend, "must be an integer >= 0", "e.g. extend: 2 (0: off)")
    grid = LRGrid(**{which: numbers}, extend=extend)
    return grid, seed


def _parse_data(raw: Any, base: str) -> DataSpec:
    raw = _mapping("data", raw)
    for key in raw:
        if key not in DATA_KEYS:
            _fail(f"data.{key}", raw[key], "unknown key", f"use one of {', '.join(DATA_KEYS)}")
    inputs = raw.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        _fail("data.inputs", inputs, "must be a non-empty list of files", "list jsonl files")
    inputs = [_resolve(base, p) for p in inputs]
    tok = raw.get("tokenizer_model")
    if not isinstance(tok, str):
        _fail("data.tokenizer_model", tok, "must be a path", "give tokenizer.json's path")
    every = raw.get("heldout_every", 20)
    if not isinstance(every, int) or every < 2:
        _fail("data.heldout_every", every, "must be an integer >= 2", "use e.g. 20")
    on_error = raw.get("on_error", "stop")
    if on_error not in ("stop", "skip"):
        _fail("data.on_error", on_error, "unknown", "use stop (the default) or skip")
    return DataSpec(inputs, _resolve(base, tok), every, on_error)


def _config_list(key: str, value: Any, base: str) -> list[str]:
    value = [value] if isinstance(value, str) else (value or [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(key, value, "must be a config file path or a list of them", f"{key}: [a.yaml]")
    return [_resolve(base, v) for v in value]


def _parse_sizes(raw: Any, base: str) -> dict[str, Size]:
    sizes = {}
    for name, spec in _mapping("sizes", raw).items():
        name = _check_name("sizes", name)
        spec = _mapping(f"sizes.{name}", spec)
        for key in spec:
            if key not in SIZE_KEYS:
                _fail(f"sizes.{name}.{key}", spec[key], "unknown key", f"use {SIZE_KEYS}")
        for key in ("hidden_size", "num_layers", "tokens"):
            if not isinstance(spec.get(key), int) or spec[key] < 1:
                _fail(f"sizes.{name}.{key}", spec.get(key), "required, integer >= 1", "set it")
        lr = spec.get("lr", 1.0)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
            _fail(f"sizes.{name}.lr", lr, "must be a positive number", "e.g. lr: 3.0e-4")
        if "micro_batch_size" in spec and (
            not isinstance(spec["micro_batch_size"], int) or spec["micro_batch_size"] < 1
        ):
            _fail(
                f"sizes.{name}.micro_batch_size",
                spec["micro_batch_size"],
                "must be an integer >= 1",
                "e.g. micro_batch_size: 8",
            )
        fraction = spec.get("lr_warmup_fraction")
        if fraction is not None and (
            not isinstance(fraction, (int, float)) or not 0 <= fraction < 1
        ):
            _fail(
                f"sizes.{name}.lr_warmup_fraction",
                fraction,
                "must be a fraction of the run's iterations in [0, 1)",
                "e.g. lr_warmup_fraction: 0.01",
            )
        grid = None
        if spec.get("lr_grid") is not None:
            grid, _ = _parse_lr_grid(f"sizes.{name}.lr_grid", spec["lr_grid"], top=False)
        configs = _config_list(f"sizes.{name}.config", spec.get("config"), base)
        fields = {k: v for k, v in spec.items() if k not in ("tokens", "config", "lr_grid")}
        sizes[name] = Size(name, fields, int(spec["tokens"]), configs, grid)
    if not sizes:
        _fail("sizes", raw, "no sizes", "give at least one width/depth pair")
    return sizes


def _parse_arms(raw: Any, sizes: dict, seeds: list[int]) -> dict[str, Arm]:
    arms = {}
    for name, spec in _mapping("arms", raw).items():
        name = _check_name("arms", name)
        spec = dict(_mapping(f"arms.{name}", spec or {}))
        arm_sizes = spec.pop("sizes", list(sizes))
        arm_seeds = _seed_list(f"arms.{name}.seeds", spec.pop("seeds", seeds))
        grid = None
        if spec.get("lr_grid") is not None:
            grid, _ = _parse_lr_grid(f"arms.{name}.lr_grid", spec["lr_grid"], top=False)
        spec.pop("lr_grid", None)
        for s in arm_sizes:
            if s not in sizes:
                _fail(f"arms.{name}.sizes", arm_sizes, f"unknown size {s!r}", f"use {list(sizes)}")
        for key in ("lr", "min_lr"):
            if key in spec:
                _fail(
                    f"arms.{name}.{key}",
                    spec[key],
                    "an arm's own LR would make the shared-LR comparison unfair",
                    f"give the arm an lr_grid (arms.{name}.lr_grid: {{values: [...]}}); the shared "
                    "LR is set's or the size's lr",
                )
        others = [k for k in spec if k not in ARM_FACTORS]
        if others:
            _fail(
                f"arms.{name}",
                {k: spec[k] for k in others},
                f"arm {name!r} sets config field(s) other than the study factors "
                f"({', '.join(others)}); an arm may set only {', '.join(ARM_FACTORS)} (and "
                "sizes, seeds, lr_grid), since the report "
                "pairs arms by those settings alone and would credit any other difference to γ, "
                "ε or the gate",
                f"set {', '.join(others)} in the study's shared config (set: or config:) so every "
                "arm gets it, or run a separate study",
            )
        arms[name] = Arm(name, spec, list(arm_sizes), arm_seeds, lr_grid=grid)
    if not arms:
        _fail("arms", raw, "no arms", "give at least a baseline and one other arm")
    return arms


def grid_arm_name(arm: str, gamma: float) -> str:
    """Name of the γ-grid arm built from ``arm`` with ``init_gamma = gamma``."""
    return f"{arm}@gamma={gamma:g}"


def _add_gamma_grid(study: Study, raw: Any) -> None:
    raw = _mapping("gamma_grid", raw)
    for key in raw:
        if key not in ("arm", "values", "sizes", "seeds"):
            _fail(f"gamma_grid.{key}", raw[key], "unknown key", "use arm, values, sizes, seeds")
    base = raw.get("arm")
    if base not in study.arms:
        _fail("gamma_grid.arm", base, "not an arm of the study", f"use one of {list(study.arms)}")
    values = raw.get("values")
    if not isinstance(values, list) or len(set(values)) < 3:
        _fail("gamma_grid.values", values, "need >= 3 distinct γ values", "e.g. [0.5, 1, 1.5]")
    grid_sizes = raw.get("sizes", study.arms[base].sizes)
    grid_seeds = _seed_list("gamma_grid.seeds", raw.get("seeds", study.arms[base].seeds))
    for s in grid_sizes:
        if s not in study.arms[base].sizes:
            _fail(
                "gamma_grid.sizes",
                grid_sizes,
                f"{s!r} is not a size of arm {base!r}",
                f"use sizes of {base}: {study.arms[base].sizes}",
            )
    own = float(study.arms[base].fields.get("init_gamma", _base_gamma(study)))
    for v in values:
        if float(v) == own:
            continue
        name = grid_arm_name(base, float(v))
        fields = {**study.arms[base].fields, "init_gamma": float(v)}
        study.arms[name] = Arm(name, fields, list(grid_sizes), grid_seeds, grid_of=base)
    study.gamma_grid = {
        "arm": base,
        "values": [float(v) for v in values],
        "sizes": list(grid_sizes),
        "seeds": grid_seeds,
    }


def _base_gamma(study: Study) -> float:
    try:
        return load_config(study.config_files, _warmup(dict(study.fields))).init.init_gamma
    except ConfigError as e:
        raise StudyError(f"study config + set: {e}") from e


def _check_gamma_acts(study: Study) -> None:
    """Refuse a study whose shared config (its ``config`` files, a size's own, ``set:``) makes
    ``init_gamma``, the factor every study compares, a no-op (the rule of
    :data:`megatron_gamma.config.effects.RULES`: ``init_method: normal`` draws every weight
    from init_method_std whatever γ). Its γ arms would differ in nothing, and the report would
    read their difference as γ's. A size whose config fails to load is left to the planner,
    which names the run."""
    in_effect = RULES["init_gamma"][0]
    for size in study.sizes.values():
        files = study.config_files + size.config_files
        try:
            cfg = load_config(files, _warmup({**study.fields, **size.fields}))
        except ConfigError:
            continue
        if in_effect(cfg):
            continue
        where = (
            "the study's set"
            if "init_method" in study.fields
            else f"the config file(s) of size {size.name!r} ({', '.join(files)})"
        )
        _fail(
            "init_method",
            cfg.init.init_method,
            f"given in {where}; init_gamma, the factor this study compares, has no effect under "
            "it (every weight is drawn from init_method_std whatever γ), so its γ arms would "
            "differ in nothing and the report would credit their noise to γ",
            "set init_method: gamma in the study's set: (or remove init_method from its set: "
            "and config files)",
        )


def _check_lr_grids(study: Study, select_seed: Optional[int]) -> None:
    """Set ``study.lr_select_seed`` when any arm has a grid; the seed must be one of every
    gridded arm's seeds."""
    gridded = [a for a in study.arms.values() if any(study.grid_for(a.name, s) for s in a.sizes)]
    if not gridded:
        if select_seed is not None:
            _fail("lr_grid.select_seed", select_seed, "no LR grid to select on", "drop it")
        return
    seed = study.seeds[0] if select_seed is None else select_seed
    for arm in gridded:
        if seed not in arm.seeds:
            _fail(
                "lr_grid.select_seed",
                seed,
                f"not a seed of arm {arm.name!r} (seeds {arm.seeds})",
                "pick a seed every arm with an LR grid runs",
            )
    study.lr_select_seed = seed


def margin_ok(margin: Any) -> bool:
    """A margin δ the verdicts can use: a finite number >= 0 (a negative δ turns an effect of
    the wrong sign into "reproduced", an infinite one makes every claim "not reproduced")."""
    return (
        not isinstance(margin, bool)
        and isinstance(margin, (int, float))
        and math.isfinite(margin)
        and margin >= 0
    )


def load_study(path: str) -> Study:
    """Read and validate a study file; resolve every run's config (nothing is written).

    Raises:
        StudyError: unknown keys, missing files, unsafe names, bad sizes/arms/seeds/LR grids,
            a shared ``init_method`` under which ``init_gamma`` has no effect
            (:func:`_check_gamma_acts`), or a run whose config fails validation (the
            ConfigError text names the run).
    """
    if not os.path.isfile(path):
        _fail("study", path, "file not found", "give the path of a study YAML file")
    with open(path, encoding="utf-8") as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as e:
            _fail("study", path, f"not valid YAML ({e})", "fix the syntax")
    raw = _mapping("study", raw)
    sections = keys_of_the_other_kind(raw, [f.name for f in dataclasses.fields(Config)], "study")
    if sections:
        raise StudyError(
            f"{path}: sections {', '.join(sections)} make it a pretrain config, not a study. Fix: "
            "pass a study file (examples/studies/*.yaml), which names a pretrain config under "
            "'config:'"
        )
    for key in raw:
        if key not in TOP_KEYS:
            value = raw[key]
            shown = f"={value!r}" if not isinstance(value, (dict, list)) else ""
            raise StudyError(
                f"{key}{shown}: unknown study key. Fix: use one of {', '.join(TOP_KEYS)}"
            )
    base = os.path.dirname(os.path.abspath(path))
    configs = _config_list("config", raw.get("config"), base)
    seeds = _seed_list("seeds", raw.get("seeds", [1234]))
    sizes = _parse_sizes(raw.get("sizes"), base)
    margin = raw.get("margin", 0.01)
    if not margin_ok(margin):
        _fail("margin", margin, "must be a finite number of nats >= 0", "e.g. margin: 0.01")
    fields = dict(_mapping("set", raw.get("set") or {}))
    study = Study(
        path=os.path.abspath(path),
        name=_check_name("name", raw.get("name") or os.path.splitext(os.path.basename(path))[0]),
        config_files=configs,
        fields=fields,
        data=_parse_data(raw.get("data"), base),
        baseline=str(raw.get("baseline", "baseline")),
        arms=_parse_arms(raw.get("arms"), sizes, seeds),
        sizes=sizes,
        seeds=seeds,
        diagnostics_points=int(raw.get("diagnostics_points", 10)),
        checkpoints=int(raw.get("checkpoints", 4)),
        margin=float(margin),
    )
    if study.baseline not in study.arms:
        _fail("baseline", study.baseline, "not an arm", f"use one of {list(study.arms)}")
    _check_gamma_acts(study)
    if study.diagnostics_points < 1 or study.checkpoints < 1:
        _fail(
            "diagnostics_points/checkpoints",
            (study.diagnostics_points, study.checkpoints),
            "must be >= 1",
            "use e.g. 10 and 4",
        )
    select_seed = None
    if raw.get("lr_grid") is not None:
        study.lr_grid, select_seed = _parse_lr_grid("lr_grid", raw["lr_grid"], top=True)
    if raw.get("gamma_grid") is not None:
        _add_gamma_grid(study, raw["gamma_grid"])
    _check_lr_grids(study, select_seed)
    return study


def data_prefixes(output_dir: str) -> dict[str, str]:
    """Indexed-dataset prefixes of the study's train and held-out splits under ``output_dir``."""
    data = os.path.join(os.path.abspath(output_dir), "data")
    return {
        "train": os.path.join(data, "train_text_document"),
        "heldout": os.path.join(data, "heldout_text_document"),
    }


def lr_key(lr: float) -> str:
    """The directory name of a run at a non-shared LR: ``lr-0.003``, ``lr-1e-05``."""
    return f"lr-{lr:g}"


def _inside(output_dir: str, run_dir: str, key: str) -> None:
    root = os.path.realpath(output_dir)
    if os.path.commonpath([root, os.path.realpath(run_dir)]) != root:
        _fail(
            "run",
            key,
            f"its directory {os.path.realpath(run_dir)!r} lies outside --output-dir {root!r}",
            "rename the arm or size, and remove symbolic links out of the output directory",
        )


def _warmup(fields: dict) -> dict:
    """``fields`` where ``lr_warmup_fraction`` replaces the recipes' warmup iterations/samples
    (Megatron-LM accepts one of the three)."""
    if fields.get("lr_warmup_fraction") is not None:
        fields.setdefault("lr_warmup_iters", 0)
        fields.setdefault("lr_warmup_samples", 0)
    return fields


class _Planner:
    """Builds runs: the (arm, size) base config once, then one validated config per seed/LR."""

    def __init__(self, study: Study, output_dir: str):
        self.study = study
        self.output_dir = os.path.abspath(output_dir)
        self.prefixes = data_prefixes(output_dir)
        self._base: dict[tuple[str, str], tuple[dict, float, Optional[float], int, int]] = {}

    def _files(self, size: str) -> list[str]:
        return self.study.config_files + self.study.sizes[size].config_files

    def base(self, arm: str, size: str) -> tuple[dict, float, Optional[float], int, int]:
        """(fields, shared lr, min_lr/lr, train_iters, tokens per iteration) of (arm, size)."""
        if (arm, size) not in self._base:
            s = self.study.sizes[size]
            fields = _warmup({**self.study.fields, **s.fields, **self.study.arms[arm].fields})
            key = f"{arm}/{size}/seed-{self.study.arms[arm].seeds[0]}"
            try:
                cfg = load_config(self._files(size), fields)
                shared = load_config(self._files(size), _warmup({**self.study.fields, **s.fields}))
            except ConfigError as e:
                raise StudyError(f"run {key}: {e}") from e
            o = shared.optimizer
            ratio = o.min_lr / o.lr if o.lr else None
            per_iter = cfg.training.global_batch_size * cfg.model.seq_length
            iters = max(1, math.ceil(s.tokens / per_iter))
            self._base[(arm, size)] = (fields, _round_lr(o.lr), ratio, iters, per_iter)
        return self._base[(arm, size)]

    def run(self, arm: str, size: str, seed: int, lr: Optional[float], phase: str) -> Run:
        """The run of ``arm`` at ``size`` and ``seed``; ``lr`` None is the shared LR."""
        fields, shared, ratio, iters, per_iter = self.base(arm, size)
        lr = shared if lr is None else lr
        key = (
            f"{arm}/{size}/seed-{seed}"
            if lr == shared
            else f"{arm}/{size}/{lr_key(lr)}/seed-{seed}"
        )
        run_dir = os.path.join(self.output_dir, key)
        _inside(self.output_dir, run_dir, key)
        fields = {**fields, "seed": seed}
        if lr != shared:
            fields["lr"] = lr
            if ratio is not None:
                fields["min_lr"] = _round_lr(ratio * lr)
        fields.update(
            train_iters=iters,
            eval_interval=iters,
            log_diagnostics_interval=max(1, iters // self.study.diagnostics_points),
            save_interval=max(1, iters // self.study.checkpoints),
            run_dir=run_dir,
            save=os.path.join(run_dir, "checkpoints"),
            load=os.path.join(run_dir, "checkpoints"),
            tokenizer_model=self.study.data.tokenizer_model,
            data_path=[],
            train_data_path=[self.prefixes["train"]],
            valid_data_path=[self.prefixes["heldout"]],
            test_data_path=[],
            check_for_nan_in_loss_and_grad=False,  # a diverged run is a result (the report's)
        )
        try:
            cfg = load_config(self._files(size), fields)
        except ConfigError as e:
            raise StudyError(f"run {key}: {e}") from e
        return Run(arm, size, seed, key, cfg, iters, iters * per_iter, lr, phase)


def best_lr(losses: dict[float, float]) -> float:
    """The LR with the lowest final validation loss; ties go to the smaller LR; a NaN or inf
    loss (the run diverged) ranks after every finite one (a NaN compares neither less nor
    greater, so it once won whenever it came first)."""
    return min(losses, key=lambda lr: (losses[lr] if math.isfinite(losses[lr]) else math.inf, lr))


def order_key(study: Study, run: Run) -> tuple:
    """Sort key of the execution order: size, then seed (the LR selection seed first), then
    round-robin over the arms (shared LR first, then the grid's LRs ascending), so that every
    arm of one (size, seed) finishes together and grids finish before their confirm runs."""
    sizes = list(study.sizes)
    seeds = sorted({s for a in study.arms.values() for s in a.seeds})
    if study.lr_select_seed is not None:
        seeds = [study.lr_select_seed] + [s for s in seeds if s != study.lr_select_seed]
    rank = 0 if run.lr_phase == SHARED else 1
    return (
        sizes.index(run.size),
        seeds.index(run.seed),
        rank,
        run.lr,
        list(study.arms).index(run.arm),
    )


FinalLoss = Callable[[Run], Optional[float]]
"""A run → its final validation loss once it has finished, else None."""


def _grid_lrs(
    planner: _Planner, arm: str, size: str, final_loss: FinalLoss
) -> tuple[list[float], Optional[float]]:
    study = planner.study
    grid = study.grid_for(arm, size)
    shared = planner.base(arm, size)[1]
    lrs = grid.lrs(shared)
    while True:
        losses = {}
        for lr in lrs:
            phase = GRID if lr != shared else SHARED
            loss = final_loss(planner.run(arm, size, study.lr_select_seed, lr, phase))
            if loss is None:
                return lrs, None
            losses[lr] = loss
        best = best_lr(losses)
        beyond = extend_lr(lrs, best)
        if beyond is None or len(lrs) - len(grid.lrs(shared)) >= grid.extend:
            return lrs, best
        lrs = sorted([*lrs, beyond])


def grid_runs(
    study: Study, output_dir: str, arm: str, size: str, final_loss: FinalLoss
) -> tuple[list[Run], Optional[list[Run]]]:
    """(the grid runs of ``arm`` at ``size`` known now, its confirm runs once the grid settled).

    The grid runs are the grid's own LRs other than the shared one, on the selection seed, plus
    one run beyond the edge for each time the best LR so far lay on it (at most
    ``lr_grid.extend``; module docstring). The confirm runs are None while any of them is
    unfinished, [] when the shared LR is the best (its runs on the other seeds are the
    confirmation) or the arm has no other seed, else the best LR's runs on the arm's other
    seeds (phase ``confirm``).
    """
    planner = _Planner(study, output_dir)
    lrs, best = _grid_lrs(planner, arm, size, final_loss)
    shared = planner.base(arm, size)[1]
    seed = study.lr_select_seed
    grid = [planner.run(arm, size, seed, lr, GRID) for lr in lrs if lr != shared]
    return grid, _confirm_at(planner, arm, size, best)


def _confirm_at(
    planner: _Planner, arm: str, size: str, best: Optional[float]
) -> Optional[list[Run]]:
    """The confirm runs at the settled ``best`` LR (None while unsettled; [] at the shared LR)."""
    if best is None:
        return None
    if best == planner.base(arm, size)[1]:
        return []
    seed = planner.study.lr_select_seed
    arm_seeds = planner.study.arms[arm].seeds
    return [planner.run(arm, size, s, best, CONFIRM) for s in arm_seeds if s != seed]


def plan(study: Study, output_dir: str, final_loss: Optional[FinalLoss] = None) -> list[Run]:
    """Every run of the study known now, in execution order (:func:`order_key`).

    Shared-LR runs for every arm × size × seed, grid runs on the selection seed (with the
    extensions the finished ones call for), and the confirm runs of every (arm, size) whose
    grid has settled per ``final_loss`` (default: read from the run directories); the others
    are listed in ``study.pending``.

    Raises:
        StudyError: a run whose config does not validate (the message names the run), or a run
            directory outside ``output_dir``.
    """
    if final_loss is None:
        from megatron_gamma.study.rundir import finished_loss

        final_loss = finished_loss
    planner = _Planner(study, output_dir)
    runs, pending = [], []
    for arm in study.arms.values():
        for size in arm.sizes:
            grid = study.grid_for(arm.name, size)
            shared = planner.base(arm.name, size)[1]
            for seed in arm.seeds:
                run = planner.run(arm.name, size, seed, None, SHARED)
                run.grid = (
                    bool(grid) and seed == study.lr_select_seed and shared in grid.lrs(shared)
                )
                runs.append(run)
            if not grid:
                continue
            lrs, best = _grid_lrs(planner, arm.name, size, final_loss)
            for lr in lrs:
                if lr != shared:
                    runs.append(planner.run(arm.name, size, study.lr_select_seed, lr, GRID))
            confirm = _confirm_at(planner, arm.name, size, best)
            others = [s for s in arm.seeds if s != study.lr_select_seed]
            if confirm is None and others:
                pending.append(Pending(arm.name, size, others, lrs, shared))
            runs.extend(confirm or [])
    runs.sort(key=lambda r: order_key(study, r))
    study.runs, study.pending = runs, pending
    return runs
