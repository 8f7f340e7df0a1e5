"""``megatron-gamma analyze RUN_DIR [RUN_DIR ...]``: the paper's diagnostics over saved checkpoints.

For every run directory (or ``--save`` directory kept apart from it: checkpoints carry their
config, :func:`megatron_gamma.rundir.loader.run_config`), every complete checkpoint (any saved
parallel layout) is loaded into a single-rank model, plus iteration 0 rebuilt from the run's
config (the gamma rule draws each weight from (seed, name), so this is the run's exact
initialization for ``init_method: gamma``).
At each point we compute the weight diagnostics of every matrix (stable rank, top-direction
share, condensation score) and, on the first validation micro-batch of the run's own data (the
batch the live callback uses), the attention-sink share per head, RMSNorm saturation per norm
and gate statistics.

Writes ``--output-dir`` (default ``RUN_DIR/analysis`` for one run) whole: the files are made in
a directory beside it, which replaces it once complete, so no file of an earlier analysis stays
mixed with this one's. An earlier analysis there (a directory holding only the files below) moves
aside to ``DIR.superseded-N``, nothing deleted; a directory holding anything else is refused
before any run is analysed. The files:

- ``analysis.json``: every number (metrics per run and iteration, norm histograms, cosine
  matrices of the heatmaps; in each run's ``summary``, ``headline``: the numbers ``analyze``
  prints, :func:`headline`, their meaning under ``headline_fields``), ``analysis.csv``: the
  metrics in long form (run, iteration, metric, role, layer, head, value, expert; role as in
  the weight-role registry :mod:`megatron_gamma.model.roles`, experts per expert and as the
  layer's mean);
- ``loss.png``: training and validation loss from each run's ``metrics.jsonl`` (drawn for a
  run without checkpoints too, whose diagnostics have only iteration 0 and are then not
  plotted: a note says so);
- ``stable_rank.png``, ``condensation.png``, ``attention_sink.png``, ``norm_saturation.png``,
  ``cosine_heatmaps[_RUN].png`` and, for gated runs, ``gates.png`` (see
  :mod:`megatron_gamma.diagnostics.plots`).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np
import torch
from tqdm import tqdm

from megatron_gamma.atomic import atomic_open, atomic_path
from megatron_gamma.config import Config, ConfigError, RecordedPaths
from megatron_gamma.diagnostics.callback import first_validation_batch
from megatron_gamma.diagnostics.condensation import (
    condensation_order,
    condensation_score_from_cosine,
    row_cosine_similarity,
    sample_rows,
)
from megatron_gamma.diagnostics.norm import HIST_EDGES
from megatron_gamma.diagnostics.probes import (
    CONDENSATION_ROWS,
    ActivationProbe,
    aggregate_experts,
    parse_metric_key,
    weight_diagnostics,
    weight_matrices,
)
from megatron_gamma.rundir import layout, loader, paths

DEFAULT_HEATMAPS = ("qkv.q/layer_00", "fc1.gate/layer_00")
"""Matrices shown as cosine heatmaps when none are chosen (plus the last layer's)."""

HEADLINE_FIELDS = {
    "iteration": "the analysed iteration (0 = initialization)",
    "stable_rank_mean": "stable rank ||W||_F^2 / ||W||_2^2 (dimensionless; 1 = a single "
    "direction), mean over the weight matrices (an MoE layer's experts as their mean)",
    "stable_rank_min": "the lowest stable rank of a weight matrix",
    "stable_rank_min_matrix": "that matrix, ROLE[/layer_LL]",
    "condensation_max": "the highest condensation score of a weight matrix: mean |cos| between "
    "its rows (0..1; 1 = all rows on one line)",
    "condensation_max_matrix": "that matrix, ROLE[/layer_LL]",
    "sink_share": "attention probability on token 0 (queries i >= 1; 0..1), mean over layers "
    "and heads, on the activation batch",
    "sink_share_uniform": "the sink share of uniform causal attention over the batch's "
    "seq_length tokens, the reference for sink_share",
    "saturated_share": "share of tokens whose sigma^2(h) <= 10 eps (0..1), mean over the "
    "RMSNorm layers",
    "gate_mean": "mean gate value sigmoid(z) (0..1), mean over layers (gated runs)",
    "gate_closed": "share of gate values below 0.1 (0..1), mean over layers (gated runs)",
}
"""The fields of a run's ``summary["headline"]`` rows in analysis.json, with their meaning:
summaries of the per-key metrics, never new measurements; None where the run has no value."""


@dataclass
class RunAnalysis:
    """Everything computed for one run.

    Attributes:
        name: label: the run directory's name, or as many trailing components of its path as
            tell it from the other runs analysed with it
            (:func:`~megatron_gamma.rundir.paths.run_labels`).
        run_dir: the run directory.
        summary: gamma, eps, gated attention, sizes (for legends); after :func:`analyze`
            also ``headline``: :func:`headline` of the run.
        iterations: analysed iterations, ascending (0 = initialization).
        metrics: {metric key: [value per iteration, None where absent]}.
        shapes: {role: [rows, cols]} of the weight matrices.
        norm_histograms: {norm key: {iteration: counts over HIST_EDGES}}.
        norm_eps: {norm key: eps}.
        heatmaps: {"ROLE/layer_LL": {iteration: {"rows": sampled row indices, "order": heatmap
            row order, "score": condensation score of the sample}}}.
        heatmap_cosines: {"ROLE/layer_LL": {iteration: ordered (k, k) cosine matrix}} (written
            to ``heatmaps.npz``, not to the JSON).
        seq_length: tokens per sequence of the activation batch (0 when none was used).
    """

    name: str
    run_dir: str
    summary: dict
    iterations: list[int] = field(default_factory=list)
    metrics: dict[str, list] = field(default_factory=dict)
    shapes: dict[str, list[int]] = field(default_factory=dict)
    norm_histograms: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    norm_eps: dict[str, float] = field(default_factory=dict)
    heatmaps: dict[str, dict[int, dict]] = field(default_factory=dict)
    heatmap_cosines: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)
    seq_length: int = 0


def run_summary(cfg: Config) -> dict:
    """The settings that tell runs apart in legends."""
    m = cfg.model
    return {
        "init_method": cfg.init.init_method,
        "gamma": cfg.init.init_gamma,
        "norm_epsilon": m.norm_epsilon,
        "gated_attention": m.gated_attention,
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
    }


def headline(run: RunAnalysis) -> list[dict]:
    """The numbers ``analyze`` prints, per analysed iteration: means, minimum and maximum of the
    values in ``run.metrics`` (keys without a head or expert index: a layer's mean over heads
    and over experts), fields as :data:`HEADLINE_FIELDS` says.

    Returns:
        One dict per iteration of ``run.iterations`` with every key of
        :data:`HEADLINE_FIELDS`: floats (shares as fractions in [0, 1]), matrix names as
        ``ROLE[/layer_LL]``, None where the run has no value there (no activation batch, an
        ungated model).
    """
    from megatron_gamma.diagnostics.attention import uniform_sink_share

    metrics = ("stable_rank", "condensation", "sink_share", "norm_saturated", "gate_mean")
    keys: dict[str, list[str]] = {m: [] for m in (*metrics, "gate_closed")}
    for key in run.metrics:
        p = parse_metric_key(key)
        if p["metric"] in keys and p["head"] is None and p["expert"] is None:
            keys[p["metric"]].append(key)

    def mean(values: dict[str, float]) -> Optional[float]:
        return float(np.mean(list(values.values()))) if values else None

    def extreme(values: dict[str, float], pick) -> tuple[Optional[float], Optional[str]]:
        if not values:
            return None, None
        key = pick(values, key=values.get)
        return values[key], key.split("/", 1)[1]

    rows = []
    for i, iteration in enumerate(run.iterations):
        at = {
            metric: {k: run.metrics[k][i] for k in ks if run.metrics[k][i] is not None}
            for metric, ks in keys.items()
        }
        low, low_matrix = extreme(at["stable_rank"], min)
        high, high_matrix = extreme(at["condensation"], max)
        sink = mean(at["sink_share"])
        rows.append(
            {
                "iteration": iteration,
                "stable_rank_mean": mean(at["stable_rank"]),
                "stable_rank_min": low,
                "stable_rank_min_matrix": low_matrix,
                "condensation_max": high,
                "condensation_max_matrix": high_matrix,
                "sink_share": sink,
                "sink_share_uniform": None if sink is None else uniform_sink_share(run.seq_length),
                "saturated_share": mean(at["norm_saturated"]),
                "gate_mean": mean(at["gate_mean"]),
                "gate_closed": mean(at["gate_closed"]),
            }
        )
    return rows


def headline_lines(runs: Sequence[dict]) -> list[str]:
    """The console table of :func:`headline` per run and a key to its columns.

    Args:
        runs: the ``runs`` of analysis.json (each with ``name`` and ``summary``, which holds
            ``headline``).

    Returns:
        Lines without newlines: per run a title (its legend label), two header lines and a row
        per analysed iteration (shares in %; ``-`` where there is no value; the gate columns
        only for a run with gates), then the key.
    """
    from types import SimpleNamespace

    from megatron_gamma.diagnostics.plots import run_label

    def num(value: Optional[float], spec: str, scale: float = 1.0) -> str:
        return "-" if value is None else format(scale * value, spec)

    def named(value: Optional[float], matrix: Optional[str], spec: str) -> str:
        return "-" if value is None else f"{value:{spec}} {matrix}"

    lines = []
    for run in runs:
        rows = run["summary"]["headline"]
        gated = any(r["gate_mean"] is not None for r in rows)
        uniform = next((r["sink_share_uniform"] for r in rows if r["sink_share"] is not None), None)
        header = [
            ("iteration", ""),
            ("stable rank", "mean"),
            ("lowest stable rank", "(matrix)"),
            ("highest condensation", "(matrix)"),
            ("sink share", "" if uniform is None else f"(uniform {uniform:.4f})"),
            ("saturated", "tokens %"),
        ]
        if gated:
            header += [("gate", "mean"), ("closed", "gates %")]
        table = [
            [
                str(r["iteration"]),
                num(r["stable_rank_mean"], ".2f"),
                named(r["stable_rank_min"], r["stable_rank_min_matrix"], ".2f"),
                named(r["condensation_max"], r["condensation_max_matrix"], ".3f"),
                num(r["sink_share"], ".4f"),
                num(r["saturated_share"], ".2f", 100.0),
                *(
                    (num(r["gate_mean"], ".3f"), num(r["gate_closed"], ".2f", 100.0))
                    if gated
                    else ()
                ),
            ]
            for r in rows
        ]
        label = run_label(SimpleNamespace(name=run["name"], summary=run["summary"]))
        lines += [f"{label}: headline diagnostics per analysed iteration"]
        lines += _columns([[h[0] for h in header], [h[1] for h in header], *table], left={2, 3})
    gated = any(r["gate_mean"] is not None for run in runs for r in run["summary"]["headline"])
    lines += [
        "  stable rank = ‖W‖_F²/‖W‖₂² (1: a single direction), mean and lowest over the weight "
        "matrices;",
        "    at most a matrix's smaller dimension (a headwise gate's: the head count), so the "
        "lowest can be a narrow matrix, not a collapse",
        "  condensation = mean |cos| between a matrix's rows (1: all rows on one line), the "
        "highest",
        "  sink share = attention probability on token 0 (queries i ≥ 1), mean over layers and "
        "heads",
        "    (uniform) = the same under uniform causal attention, for reference",
        "  saturated = tokens whose σ²(h) ≤ 10ε, mean over the RMSNorm layers",
    ]
    if gated:
        lines += ["  gate = sigmoid(z): its mean, and the % of gates below 0.1; means over layers"]
    lines += ["  the same numbers, unrounded: analysis.json, runs[].summary.headline"]
    return lines


def _columns(rows: Sequence[Sequence[str]], left: set[int]) -> list[str]:
    """``rows`` of cells as indented lines of aligned columns: the columns in ``left``
    left-aligned, the others right-aligned."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            cell.ljust(w) if c in left else cell.rjust(w)
            for c, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _validation_batch(
    cfg: Config,
    batch_size: int,
    ckpts: Sequence[str] = (),
    recorded: Optional[RecordedPaths] = None,
) -> Optional[dict]:
    """The first validation micro-batch of ``batch_size`` sequences (at most the split's size),
    built as training builds it (:func:`~megatron_gamma.diagnostics.callback.
    first_validation_batch`); None without validation data (the line that says so names, for
    the run's own data, where its relative paths were looked for: ``recorded``).

    Raises:
        ConfigError: one of ``ckpts`` was trained with another tokenizer than the run's config
            names (:func:`~megatron_gamma.rundir.loader.check_tokenizer`).
    """
    from megatron_gamma.data.datasets import build_datasets

    try:
        cfg.data.blend(recorded)
    except ConfigError as e:
        print(f"analyze: activation diagnostics skipped: {e}", file=sys.stderr)
        return None
    for ckpt in ckpts:
        warning = loader.check_tokenizer(
            ckpt, cfg, "put the checkpoint's tokenizer ({flags}) back where the run's config says"
        )
        if warning:
            print(f"analyze: {warning}", file=sys.stderr)
    tok = loader.run_tokenizer(cfg)
    valid = build_datasets(cfg, tok)[1]
    if valid is None or len(valid) == 0:
        print("analyze: the run has no validation split; activation diagnostics skipped")
        return None
    return first_validation_batch(valid, min(batch_size, len(valid)))


def _parse_heatmaps(specs: Sequence[str], num_layers: int) -> list[tuple[str, int]]:
    out = []
    for spec in specs:
        parsed = parse_metric_key("x/" + spec)
        if parsed["role"] is None or parsed["layer"] is None:
            raise ConfigError(
                f"heatmap={spec!r}: expected ROLE/layer_LL, e.g. qkv.q/layer_00. Fix: the syntax"
            )
        if not 0 <= parsed["layer"] < num_layers:
            raise ConfigError(
                f"heatmap={spec!r}: layer {parsed['layer']} outside 0..{num_layers - 1}"
            )
        out.append((parsed["role"], parsed["layer"]))
    return out


def _check_heatmap_roles(chosen: list[tuple[str, int]], model) -> None:
    """Refuse a requested heatmap whose role the run's model has no matrix of (it gave an empty
    ``heatmaps.npz`` and no plot, without a word).

    Raises:
        ConfigError: naming the heatmap and the roles the model has.
    """
    have = sorted({m.role for m in weight_matrices(model)})
    for role, layer in chosen:
        if role not in have:
            raise ConfigError(
                f"heatmap={role}/layer_{layer:02d}: the run's model has no {role!r} matrix. Fix: "
                f"use one of its roles: {', '.join(have)}"
            )


def _pick_iterations(
    available: list[int], wanted: Optional[Sequence[int]], k: int = 4
) -> list[int]:
    if wanted:
        missing = sorted(set(wanted) - set(available))
        if missing:
            raise ConfigError(
                f"heatmap_iterations={list(wanted)}: no checkpoint at {missing}. "
                f"Fix: choose among {available}"
            )
        return sorted(set(wanted))
    if len(available) <= k:
        return list(available)
    step = (len(available) - 1) / (k - 1)
    return sorted({available[round(i * step)] for i in range(k)})


def _heatmap(model, role: str, layer: int, rows: int) -> Optional[tuple[dict, torch.Tensor]]:
    """(row sample, order and score; ordered cosine matrix) of one matrix (expert 0 of an
    expert role), None if absent."""
    for m in weight_matrices(model):
        if m.role == role and m.layer == layer:
            idx = sample_rows(m.local.size(0), rows, seed=0)
            w = m.local.detach()[idx.to(m.local.device)]
            cos = row_cosine_similarity(w)
            order = condensation_order(w)
            info = {
                "rows": idx.tolist(),
                "order": order.tolist(),
                "score": condensation_score_from_cosine(cos),
            }
            return info, cos[order][:, order].float().cpu()
    return None


def analyze_run(
    run_dir: str,
    *,
    data_path: Optional[Sequence[str]] = None,
    data_cache_path: Optional[str] = None,
    include_init: bool = True,
    heatmaps: Optional[Sequence[str]] = None,
    heatmap_iterations: Optional[Sequence[int]] = None,
    heatmap_rows: int = 256,
    condensation_rows: Optional[int] = None,
    batch_size: Optional[int] = None,
    progress: bool = True,
) -> RunAnalysis:
    """Compute every diagnostic at every checkpoint of one run (see module docstring).

    Must run inside :func:`megatron_gamma.rundir.loader.single_process`.

    Args:
        run_dir: the run directory, or a checkpoint directory (``--save``) anywhere: the config
            is the newest checkpoint's own, else the run's config.yaml
            (:func:`~megatron_gamma.rundir.loader.run_config`).
        data_path: dataset blend for the activation batch (default: the run's own).
        data_cache_path: where megatron-core keeps the activation batch's dataset index caches
            (default ``RUN_DIR/data_cache``, in ``run_dir`` as given). Never the directory the
            checkpoint's config records: a checkpoint from elsewhere must not choose where
            ``analyze`` writes.
        include_init: also analyse iteration 0, rebuilt from the config.
        heatmaps: matrices for cosine heatmaps as ``ROLE/layer_LL``.
        heatmap_iterations: iterations for the heatmaps (default: up to 4 spread out).
        heatmap_rows: rows sampled per heatmap.
        condensation_rows: rows sampled for the condensation score (default
            :data:`~.probes.CONDENSATION_ROWS`, pretrain's own sample: a tag then has one value
            in ``metrics.jsonl`` and ``analysis.csv``).
        batch_size: sequences in the activation batch (default: the run's micro-batch size).
        progress: show a progress bar.

    Raises:
        ConfigError: no checkpoint in the run, or a bad heatmap choice (its syntax, its layer,
            or a role the model has no matrix of).
    """
    cfg = loader.run_config(run_dir, run_dir=run_dir)
    cfg = cfg.replace(data_cache_path=data_cache_path)
    if data_path:
        cfg = cfg.replace(data_path=list(data_path))
    ckpts = layout.list_checkpoints(run_dir)
    if not ckpts and not include_init:
        raise ConfigError(f"run_dir={run_dir!r}: no complete checkpoint. Fix: check the path")
    points = ([(0, None)] if include_init and all(it != 0 for it, _ in ckpts) else []) + ckpts
    if not points:
        raise ConfigError(f"run_dir={run_dir!r}: no complete checkpoint. Fix: check the path")
    name = os.path.basename(os.path.normpath(run_dir))
    result = RunAnalysis(name=name, run_dir=os.path.abspath(run_dir), summary=run_summary(cfg))
    specs = list(heatmaps) if heatmaps else list(DEFAULT_HEATMAPS)
    if not heatmaps and cfg.model.num_layers > 1:
        last = cfg.model.num_layers - 1
        specs += [s.replace("layer_00", f"layer_{last:02d}") for s in DEFAULT_HEATMAPS]
    chosen = _parse_heatmaps(specs, cfg.model.num_layers)
    heat_iters = set(_pick_iterations([it for it, _ in points], heatmap_iterations))
    batch = _validation_batch(
        cfg,
        batch_size or cfg.training.micro_batch_size,
        [ckpt for _, ckpt in ckpts],
        None if data_path else loader.recorded_paths(run_dir),
    )
    model = loader.model_for_run(cfg, ckpts[0][1] if ckpts else None)
    if heatmaps:
        _check_heatmap_roles(chosen, model)
    device = next(model.parameters()).device
    sampled = CONDENSATION_ROWS if condensation_rows is None else condensation_rows
    rows: list[dict[str, float]] = []
    bar = tqdm(
        points,
        desc=f"analyze {name}",
        unit="ckpt",
        disable=None if progress else True,
        file=sys.stderr,
    )
    for iteration, ckpt in bar:
        if ckpt is not None:
            loader.load_weights(model, ckpt)
        with torch.no_grad():
            values = weight_diagnostics([model], None, max_rows=sampled)
            values = aggregate_experts(values)
            if batch is not None:
                with ActivationProbe([model]) as probe:
                    mask = batch.get("attention_mask")
                    model(
                        batch["tokens"].to(device),
                        batch["position_ids"].to(device),
                        None if mask is None else mask.to(device),
                    )
                values.update(probe.results())
                for key, stats in probe.norm_stats.items():
                    result.norm_histograms.setdefault(key, {})[iteration] = stats.histogram
                    result.norm_eps[key] = stats.eps
                result.seq_length = int(batch["tokens"].size(1))
            if iteration in heat_iters:
                for role, layer in chosen:
                    cell = _heatmap(model, role, layer, heatmap_rows)
                    if cell is not None:
                        key = f"{role}/layer_{layer:02d}"
                        result.heatmaps.setdefault(key, {})[iteration] = cell[0]
                        result.heatmap_cosines.setdefault(key, {})[iteration] = cell[1]
        result.iterations.append(iteration)
        rows.append(values)
    for m in weight_matrices(model):
        result.shapes.setdefault(m.role, list(m.local.shape))
    keys = sorted({k for r in rows for k in r})
    result.metrics = {k: [r.get(k) for r in rows] for k in keys}
    return result


def write_numbers(runs: Sequence[RunAnalysis], out_dir: str) -> dict[str, str]:
    """Write ``analysis.json`` (with :data:`HEADLINE_FIELDS` as ``headline_fields``),
    ``analysis.csv`` and ``heatmaps.npz`` (temp file, then rename).

    ``heatmaps.npz`` holds one float32 (k, k) ordered cosine matrix per
    ``RUN/ROLE/layer_LL/iter_N`` (slashes replaced by ``__``).

    Returns:
        {"json": path, "csv": path, "heatmaps": path}.
    """
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "analysis.json")
    csv_path = os.path.join(out_dir, "analysis.csv")
    npz_path = os.path.join(out_dir, "heatmaps.npz")
    runs_doc = []
    for r in runs:
        d = asdict(r)
        d.pop("heatmap_cosines")
        runs_doc.append(d)
    doc = {
        "hist_edges_log10_ms": list(HIST_EDGES),
        "headline_fields": HEADLINE_FIELDS,
        "runs": runs_doc,
    }
    with atomic_open(json_path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    with atomic_open(csv_path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "iteration", "metric", "role", "layer", "head", "value", "expert"])
        for r in runs:
            for key, series in r.metrics.items():
                p = parse_metric_key(key)
                for it, value in zip(r.iterations, series, strict=True):
                    if value is None:
                        continue
                    writer.writerow(
                        [
                            r.name,
                            it,
                            p["metric"],
                            p["role"] or "",
                            p["layer"],
                            p["head"],
                            value,
                            p["expert"],
                        ]
                    )
    arrays = {
        f"{r.name}/{key}/iter_{it}".replace("/", "__"): cos.numpy()
        for r in runs
        for key, cells in r.heatmap_cosines.items()
        for it, cos in cells.items()
    }
    with atomic_path(npz_path) as tmp:
        np.savez_compressed(tmp, **arrays)
    return {"json": json_path, "csv": csv_path, "heatmaps": npz_path}


def analyze(
    run_dirs: Sequence[str],
    output_dir: Optional[str] = None,
    **kwargs,
) -> dict[str, str]:
    """Analyse runs, write the numbers and the plots into ``output_dir`` as a whole (module
    docstring): an earlier analysis there moves aside to ``OUTPUT_DIR.superseded-N``, with a
    line on stdout saying so.

    Args:
        run_dirs: one or more run directories (several: overlaid, one colour per run).
        output_dir: where to write (default ``RUN_DIR/analysis`` for a single run, required
            for several).
        **kwargs: passed to :func:`analyze_run`.

    Returns:
        {artifact name: path} of everything written (paths in ``output_dir``).

    Raises:
        ConfigError: a missing run directory, several runs without ``output_dir``, fewer than 2
            heatmap or condensation rows, or an ``output_dir`` that is a file or holds files
            analyze does not write (:func:`~megatron_gamma.rundir.paths.analysis_dir`, which
            the command line runs before this module is imported); a run without a config or a
            heatmap iteration some run has no checkpoint at (all checked before any run is
            analysed).
    """
    from megatron_gamma.diagnostics import plots

    output_dir = paths.analysis_dir(
        run_dirs, output_dir, kwargs.get("heatmap_rows"), kwargs.get("condensation_rows")
    )
    for d in run_dirs:
        loader.run_config(d)
        if kwargs.get("heatmap_iterations"):
            its = [it for it, _ in layout.list_checkpoints(d)]
            _pick_iterations(
                sorted({*its, *([0] if kwargs.get("include_init", True) else [])}),
                kwargs["heatmap_iterations"],
            )
    labels = paths.run_labels(run_dirs)
    first = loader.run_config(run_dirs[0], run_dir=run_dirs[0])
    with loader.single_process(first):
        runs = [analyze_run(d, **kwargs) for d in run_dirs]
    for run, label in zip(runs, labels, strict=True):
        run.name = label
        run.summary["headline"] = headline(run)
    with paths.replaced_dir(output_dir, "analyze") as tmp:
        written = write_numbers(runs, tmp)
        written.update(plots.plot_analysis(runs, tmp))
    return {name: os.path.join(output_dir, os.path.basename(p)) for name, p in written.items()}
