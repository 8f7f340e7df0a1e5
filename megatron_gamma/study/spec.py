"""The study file (``megatron-gamma sweep STUDY.yaml``): schema, validation and the run plan.

A study is a YAML mapping (paths relative to the study file)::

    name: smoke
    config: [../configs/demo.yaml]        # base config file(s), layered in order
    set: {seq_length: 64, lr: 3.0e-3}     # config fields set for every run
    data:                                 # corpus, split into train / held-out, preprocessed
      inputs: [corpus/en.jsonl.gz, corpus/zh.jsonl.gz]
      tokenizer_model: tokenizer.json
      heldout_every: 20                   # every 20th document is held out
    baseline: baseline                    # the arm every other arm is compared with
    arms:                                 # name -> config fields (+ optional sizes/seeds subset)
      baseline: {init_gamma: 0.5, norm_epsilon: 1.0e-5, gated_attention: none}
      gamma1+eps+gate: {init_gamma: 1.0}
    sizes:                                # name -> width/depth (+ heads, ffn) and token budget
      d64: {hidden_size: 64, num_layers: 2, num_attention_heads: 4, tokens: 400000}
    seeds: [1, 2]
    gamma_grid: {arm: gamma1+eps+gate, values: [0.5, 0.75, 1.0, 1.25, 1.5], sizes: [d64]}
    diagnostics_points: 10                # --log-diagnostics-interval = train_iters / this
    checkpoints: 4                        # --save-interval = train_iters / this

Each (arm, size, seed) becomes one run whose resolved config (base files + ``set`` + size +
arm + seed + data paths + run directory) is validated by :func:`megatron_gamma.config.load_config`
before anything trains. ``gamma_grid`` adds arms ``ARM@gamma=V`` (``ARM``'s fields with
``init_gamma: V``) at the listed sizes; the value equal to ``ARM``'s own γ reuses ``ARM``'s runs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from megatron_gamma.config import Config, ConfigError, load_config

TOP_KEYS = (
    "name",
    "config",
    "set",
    "data",
    "baseline",
    "arms",
    "sizes",
    "seeds",
    "gamma_grid",
    "diagnostics_points",
    "checkpoints",
)
SIZE_KEYS = ("hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size", "tokens")
DATA_KEYS = ("inputs", "tokenizer_model", "heldout_every")
RESTRICT_KEYS = ("sizes", "seeds")


class StudyError(ConfigError):
    """A study file that cannot run as written (raised before anything trains)."""


class StudyChangedError(StudyError):
    """The study file changed an arm, size, seed or budget of a run that already exists."""


def _fail(key: str, value: Any, why: str, fix: str) -> None:
    raise StudyError(f"{key}={value!r}: {why}. Fix: {fix}")


@dataclass
class DataSpec:
    """The study's corpus: ``inputs`` (jsonl / jsonl.gz with a ``text`` key) split by document
    index into train and held-out (every ``heldout_every``-th document), tokenized with
    ``tokenizer_model``. Existence is checked when the data are prepared (a dry run of a cluster
    study works without the cluster's files)."""

    inputs: list[str]
    tokenizer_model: str
    heldout_every: int


@dataclass
class Size:
    """A model size: config fields (width, depth, heads, ffn) and the token budget."""

    name: str
    fields: dict
    tokens: int


@dataclass
class Arm:
    """A named set of config fields, run at ``sizes`` × ``seeds``."""

    name: str
    fields: dict
    sizes: list[str]
    seeds: list[int]
    grid_of: Optional[str] = None
    """For γ-grid arms: the arm whose fields they copy."""


@dataclass
class Run:
    """One (arm, size, seed) of the plan.

    Attributes:
        key: ``ARM/SIZE/seed-S``, the run directory relative to the study output directory.
        config: the resolved, validated config of the run.
        train_iters: iterations (``ceil(tokens / (global_batch_size · seq_length))``).
        tokens: tokens trained (``train_iters · global_batch_size · seq_length``).
    """

    arm: str
    size: str
    seed: int
    key: str
    config: Config
    train_iters: int
    tokens: int


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
    runs: list[Run] = field(default_factory=list)


def _mapping(key: str, value: Any) -> dict:
    if not isinstance(value, dict):
        _fail(key, value, "must be a mapping", f"write {key}: {{name: ...}}")
    return value


def _resolve(base: str, path: str) -> str:
    return os.path.normpath(os.path.join(base, os.path.expanduser(path)))


def _seed_list(key: str, value: Any) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(s, int) for s in value):
        _fail(key, value, "must be a non-empty list of integers", f"write {key}: [1, 2]")
    if len(set(value)) != len(value):
        _fail(key, value, "repeats a seed", "list each seed once")
    return list(value)


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
    return DataSpec(inputs, _resolve(base, tok), every)


def _parse_sizes(raw: Any) -> dict[str, Size]:
    sizes = {}
    for name, spec in _mapping("sizes", raw).items():
        spec = _mapping(f"sizes.{name}", spec)
        for key in spec:
            if key not in SIZE_KEYS:
                _fail(f"sizes.{name}.{key}", spec[key], "unknown key", f"use {SIZE_KEYS}")
        for key in ("hidden_size", "num_layers", "tokens"):
            if not isinstance(spec.get(key), int) or spec[key] < 1:
                _fail(f"sizes.{name}.{key}", spec.get(key), "required, integer >= 1", "set it")
        fields = {k: v for k, v in spec.items() if k != "tokens"}
        sizes[str(name)] = Size(str(name), fields, int(spec["tokens"]))
    if not sizes:
        _fail("sizes", raw, "no sizes", "give at least one width/depth pair")
    return sizes


def _parse_arms(raw: Any, sizes: dict, seeds: list[int]) -> dict[str, Arm]:
    arms = {}
    for name, spec in _mapping("arms", raw).items():
        spec = dict(_mapping(f"arms.{name}", spec or {}))
        arm_sizes = spec.pop("sizes", list(sizes))
        arm_seeds = _seed_list(f"arms.{name}.seeds", spec.pop("seeds", seeds))
        for s in arm_sizes:
            if s not in sizes:
                _fail(f"arms.{name}.sizes", arm_sizes, f"unknown size {s!r}", f"use {list(sizes)}")
        if "/" in str(name) or str(name).startswith("."):
            _fail("arms", name, "not usable as a directory name", "drop '/' and leading '.'")
        arms[str(name)] = Arm(str(name), spec, list(arm_sizes), arm_seeds)
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
    return load_config(study.config_files, dict(study.fields)).init.init_gamma


def load_study(path: str) -> Study:
    """Read and validate a study file; resolve every run's config (nothing is written).

    Raises:
        StudyError: unknown keys, missing files, bad sizes/arms/seeds, or a run whose config
            fails validation (the ConfigError text names the run).
    """
    if not os.path.isfile(path):
        _fail("study", path, "file not found", "give the path of a study YAML file")
    with open(path, encoding="utf-8") as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as e:
            _fail("study", path, f"not valid YAML ({e})", "fix the syntax")
    raw = _mapping("study", raw)
    for key in raw:
        if key not in TOP_KEYS:
            _fail(key, raw[key], "unknown study key", f"use one of {', '.join(TOP_KEYS)}")
    base = os.path.dirname(os.path.abspath(path))
    configs = raw.get("config") or []
    configs = [configs] if isinstance(configs, str) else configs
    configs = [_resolve(base, c) for c in configs]
    seeds = _seed_list("seeds", raw.get("seeds", [1234]))
    sizes = _parse_sizes(raw.get("sizes"))
    study = Study(
        path=os.path.abspath(path),
        name=str(raw.get("name") or os.path.splitext(os.path.basename(path))[0]),
        config_files=configs,
        fields=dict(_mapping("set", raw.get("set") or {})),
        data=_parse_data(raw.get("data"), base),
        baseline=str(raw.get("baseline", "baseline")),
        arms=_parse_arms(raw.get("arms"), sizes, seeds),
        sizes=sizes,
        seeds=seeds,
        diagnostics_points=int(raw.get("diagnostics_points", 10)),
        checkpoints=int(raw.get("checkpoints", 4)),
    )
    if study.baseline not in study.arms:
        _fail("baseline", study.baseline, "not an arm", f"use one of {list(study.arms)}")
    if study.diagnostics_points < 1 or study.checkpoints < 1:
        _fail(
            "diagnostics_points/checkpoints",
            (study.diagnostics_points, study.checkpoints),
            "must be >= 1",
            "use e.g. 10 and 4",
        )
    if raw.get("gamma_grid") is not None:
        _add_gamma_grid(study, raw["gamma_grid"])
    return study


def data_prefixes(output_dir: str) -> dict[str, str]:
    """Indexed-dataset prefixes of the study's train and held-out splits under ``output_dir``."""
    data = os.path.join(os.path.abspath(output_dir), "data")
    return {
        "train": os.path.join(data, "train_text_document"),
        "heldout": os.path.join(data, "heldout_text_document"),
    }


def plan(study: Study, output_dir: str) -> list[Run]:
    """Every run of the study with its resolved config, in order arm, size, seed.

    Raises:
        StudyError: a run whose config does not validate (the message names the run).
    """
    prefixes = data_prefixes(output_dir)
    runs = []
    for arm in study.arms.values():
        for size_name in arm.sizes:
            size = study.sizes[size_name]
            for seed in arm.seeds:
                key = f"{arm.name}/{size_name}/seed-{seed}"
                run_dir = os.path.join(os.path.abspath(output_dir), key)
                fields = {**study.fields, **size.fields, **arm.fields, "seed": seed}
                try:
                    cfg = load_config(study.config_files, fields)
                except ConfigError as e:
                    raise StudyError(f"run {key}: {e}") from e
                t = cfg.training
                per_iter = t.global_batch_size * cfg.model.seq_length
                iters = max(1, math.ceil(size.tokens / per_iter))
                fields.update(
                    train_iters=iters,
                    eval_interval=iters,
                    log_diagnostics_interval=max(1, iters // study.diagnostics_points),
                    save_interval=max(1, iters // study.checkpoints),
                    run_dir=run_dir,
                    save=os.path.join(run_dir, "checkpoints"),
                    load=os.path.join(run_dir, "checkpoints"),
                    tokenizer_model=study.data.tokenizer_model,
                    data_path=[],
                    train_data_path=[prefixes["train"]],
                    valid_data_path=[prefixes["heldout"]],
                    test_data_path=[],
                )
                try:
                    cfg = load_config(study.config_files, fields)
                except ConfigError as e:
                    raise StudyError(f"run {key}: {e}") from e
                runs.append(Run(arm.name, size_name, seed, key, cfg, iters, iters * per_iter))
    study.runs = runs
    return runs
