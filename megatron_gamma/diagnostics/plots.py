"""PNG figures of the diagnostics (matplotlib, Agg backend: no display needed).

Conventions for every figure: x axes in optimizer iterations; each run keeps one colour in all
figures (``RUN_COLORS[i]`` for the i-th run, label with gamma, eps and the gate's granularity);
with a single run, lines are per layer, coloured by depth (viridis, shallow = dark) and norm
roles told apart by line style, and the run's label is the figure's subtitle; with several, each
run's line is the mean over its layers and a shaded band their range, which the legend says
(:data:`BAND_LABEL`). Files are written to a temp name, then renamed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from megatron_gamma.atomic import atomic_path
from megatron_gamma.diagnostics.attention import uniform_sink_share
from megatron_gamma.diagnostics.condensation import gaussian_cosine_baseline
from megatron_gamma.diagnostics.norm import SATURATION_FACTOR
from megatron_gamma.diagnostics.probes import parse_metric_key
from megatron_gamma.model.roles import sort_key
from megatron_gamma.model.roles import title as role_title
from megatron_gamma.rundir.layout import read_metrics

RUN_COLORS = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#8c564b",
    "#e377c2",
]
"""One colour per run, in the order the runs are given (A = blue, B = red in ``compare``)."""

NORM_STYLES = {
    "input_layernorm": "-",
    "pre_mlp_layernorm": "--",
    "final_layernorm": ":",
}
X_LABEL = "iteration (optimizer steps)"
BAND_LABEL = "line: mean over layers; band: min–max over layers"
"""The legend entry of the shaded band that figures of several runs draw around each run's line
(:func:`_band`)."""


def run_color(index: int) -> str:
    """Colour of the index-th run."""
    return RUN_COLORS[index % len(RUN_COLORS)]


def run_label(run) -> str:
    """Legend label: name, gamma, eps and gating of a run (``gated-headwise``,
    ``gated-elementwise`` or ``no gate``)."""
    s = run.summary
    mode = s.get("gated_attention", "none")
    gate = f"gated-{mode}" if mode != "none" else "no gate"
    return f"{run.name} (γ={s['gamma']:g}, ε={s['norm_epsilon']:.0e}, {gate})"


def _save(fig, path: str) -> str:
    """Write ``fig`` as PNG with its suptitle and panel titles in the PNG text chunks
    (``Title``; ``Panels``: JSON list), so tools and tests can tell what a file shows."""
    panels = [ax.get_title() for ax in fig.axes if ax.get_title()]
    title = fig.get_suptitle()
    with atomic_path(path) as tmp:
        fig.savefig(
            tmp,
            dpi=110,
            bbox_inches="tight",
            metadata={"Title": title, "Panels": json.dumps(panels, ensure_ascii=False)},
        )
    plt.close(fig)
    return path


def _series(run, key: str) -> tuple[np.ndarray, np.ndarray]:
    values = run.metrics.get(key, [])
    pairs = [(it, v) for it, v in zip(run.iterations, values, strict=True) if v is not None]
    if not pairs:
        return np.array([]), np.array([])
    x, y = zip(*pairs, strict=True)
    return np.asarray(x), np.asarray(y, dtype=float)


def _keys(run, metric: str) -> list[dict]:
    """Parsed keys of ``metric`` without a head or expert index (experts: the layer's mean over
    experts), with the key itself."""
    out = []
    for key in run.metrics:
        p = parse_metric_key(key)
        if p["metric"] == metric and p["head"] is None and p["expert"] is None:
            p["key"] = key
            out.append(p)
    return out


def _layer_colors(num_layers: int):
    cmap = plt.get_cmap("viridis")
    return [cmap(i / max(1, num_layers - 1) * 0.9) for i in range(num_layers)]


def _num_layers(runs) -> int:
    return max(int(r.summary.get("num_layers", 1)) for r in runs)


def _layer_legend(fig, num_layers: int, axes) -> None:
    colors = _layer_colors(num_layers)
    if num_layers <= 8:
        handles = [
            plt.Line2D([], [], color=colors[i], marker="o", label=f"layer {i}")
            for i in range(num_layers)
        ]
        fig.legend(handles=handles, loc="outside right upper", title="layer (from input)")
    else:
        sm = plt.cm.ScalarMappable(cmap="viridis", norm=plt.Normalize(0, (num_layers - 1) / 0.9))
        fig.colorbar(sm, ax=axes, label="layer index (0 = first)")


def _band_handle(label: str = BAND_LABEL) -> Patch:
    """A legend entry for the shaded bands of :func:`_band`."""
    return Patch(facecolor="grey", alpha=0.3, lw=0, label=label)


def _legend(ax, extra: Sequence = (), **kwargs) -> None:
    """``ax``'s legend of its labelled artists, followed by the handles in ``extra``."""
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=[*handles, *extra], **kwargs)


def _run_legend(fig, runs) -> None:
    """The figure's legend of several runs: one colour per run, and what the band shows."""
    handles = [
        plt.Line2D([], [], color=run_color(i), label=run_label(r)) for i, r in enumerate(runs)
    ]
    handles.append(_band_handle())
    fig.legend(handles=handles, loc="outside lower center", ncols=min(3, len(handles)))


def _band(ax, runs, keys_of_run, color_index=None, label=None, scale: float = 1.0) -> None:
    """Per run: mean over ``keys_of_run(run)`` series (solid) and min-max band, the values
    multiplied by ``scale`` (100 for a percentage)."""
    for i, run in enumerate(runs):
        series = [_series(run, k) for k in keys_of_run(run)]
        series = [s for s in series if len(s[0])]
        if not series:
            continue
        x = series[0][0]
        ys = scale * np.stack([s[1] for s in series if len(s[1]) == len(x)])
        c = run_color(i if color_index is None else color_index)
        ax.plot(x, ys.mean(0), color=c, marker="o", ms=3, label=label)
        if len(ys) > 1:
            ax.fill_between(x, ys.min(0), ys.max(0), color=c, alpha=0.18, lw=0)


def plot_role_grid(
    runs,
    metric: str,
    path: str,
    title: str,
    ylabel: str,
    baseline: bool = False,
) -> Optional[str]:
    """One panel per matrix role of ``metric`` over training (see module docstring).

    With ``baseline``, each panel gets the condensation score of a Gaussian matrix with that
    role's column count (dashed grey).
    """
    roles = sorted({p["role"] for r in runs for p in _keys(r, metric)}, key=sort_key)
    if not roles:
        return None
    ncols = min(4, len(roles))
    nrows = -(-len(roles) // ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(4.0 * ncols, 3.0 * nrows + 0.8),
        squeeze=False,
        layout="constrained",
    )
    single = len(runs) == 1
    colors = _layer_colors(_num_layers(runs))
    for ax, role in zip(axes.flat, roles, strict=False):
        if single:
            for p in sorted(_keys(runs[0], metric), key=lambda p: p["layer"] or 0):
                if p["role"] != role:
                    continue
                x, y = _series(runs[0], p["key"])
                c = "black" if p["layer"] is None else colors[p["layer"]]
                ax.plot(x, y, color=c, marker="o", ms=3)
        else:
            _band(
                ax,
                runs,
                lambda r, role=role: [p["key"] for p in _keys(r, metric) if p["role"] == role],
            )
        if baseline:
            shape = next((r.shapes[role] for r in runs if role in r.shapes), None)
            if shape:
                ax.axhline(
                    gaussian_cosine_baseline(shape[1]),
                    color="grey",
                    ls="--",
                    lw=1,
                    label=f"Gaussian baseline (d_in={shape[1]})",
                )
                ax.legend(fontsize=7, loc="best")
        ax.set_title(role_title(role), fontsize=10)
        ax.set_xlabel(X_LABEL, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        top = max([ax.dataLim.y1] + [float(np.nanmax(ln.get_ydata())) for ln in ax.get_lines()])
        ax.set_ylim(0, 1.12 * top if top > 0 else 1)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(roles) :]:
        ax.axis("off")
    fig.suptitle(title + (f"\n{run_label(runs[0])}" if single else ""))
    if single:
        _layer_legend(fig, _num_layers(runs), axes)
    else:
        _run_legend(fig, runs)
    return _save(fig, path)


def plot_heatmaps(run, path: str) -> Optional[str]:
    """Grid of ordered row-cosine heatmaps: one row per chosen matrix, one column per iteration."""
    if not run.heatmap_cosines:
        return None
    keys = list(run.heatmap_cosines)
    iters = sorted({it for cells in run.heatmap_cosines.values() for it in cells})
    fig, axes = plt.subplots(
        len(keys),
        len(iters),
        figsize=(2.9 * len(iters) + 1.2, 2.9 * len(keys) + 0.6),
        squeeze=False,
        layout="constrained",
    )
    image = None
    for i, key in enumerate(keys):
        role, layer = key.split("/")
        for j, it in enumerate(iters):
            ax = axes[i, j]
            cos = run.heatmap_cosines[key].get(it)
            if cos is None:
                ax.axis("off")
                continue
            image = ax.imshow(cos.numpy(), cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
            score = run.heatmaps[key][it]["score"]
            ax.set_title(f"iteration {it}\nmean |cos| = {score:.3f}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(
                    f"{role_title(role)}\n{layer.replace('_', ' ')}\n"
                    f"rows (n={cos.shape[0]}, ordered)",
                    fontsize=9,
                )
            if i == len(keys) - 1:
                ax.set_xlabel("rows (same order)", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label="cosine similarity of rows")
    fig.suptitle(
        f"Row-wise cosine similarity over training — {run_label(run)}\n"
        "(rows ordered by angle in the top-2 singular plane; blocks = condensed directions)",
        fontsize=10,
    )
    return _save(fig, path)


def _uniform_sink_line(ax, seq: int) -> None:
    """The share a uniform causal attention over ``seq`` tokens puts on token 0, dashed, with the
    y axis from 0 to above every line drawn so far, so that the runs are read against it rather
    than zoomed in on their own spread."""
    ax.axhline(
        uniform_sink_share(seq), color="grey", ls="--", lw=1, label=f"uniform causal (s={seq})"
    )
    top = max(float(np.max(line.get_ydata())) for line in ax.get_lines())
    ax.set_ylim(0, 1.15 * top)


def plot_sink(runs, path: str) -> Optional[str]:
    """Attention-sink share over training (left) and per layer and head at the end (right)."""
    if not any(_keys(r, "sink_share") for r in runs):
        return None
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
    single = len(runs) == 1
    colors = _layer_colors(_num_layers(runs))
    if single:
        for p in sorted(_keys(runs[0], "sink_share"), key=lambda p: p["layer"]):
            x, y = _series(runs[0], p["key"])
            ax.plot(
                x,
                y,
                color=colors[p["layer"]],
                marker="o",
                ms=3,
                label=f"layer {p['layer']}",
            )
    else:
        for i, run in enumerate(runs):
            _band(
                ax,
                [run],
                lambda r: [p["key"] for p in _keys(r, "sink_share")],
                i,
                run_label(run),
            )
    seq = max(r.seq_length for r in runs)
    _uniform_sink_line(ax, seq)
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel("attention probability on token 0")
    ax.set_title(
        "Attention-sink share (mean over heads)"
        if not single
        else "Attention-sink share per layer (mean over heads)"
    )
    ax.grid(alpha=0.3)
    _legend(
        ax,
        () if single else [_band_handle()],
        fontsize=8,
        ncols=2 if single and _num_layers(runs) > 6 else 1,
    )
    if single:
        run = runs[0]
        last = len(run.iterations) - 1
        heads = [parse_metric_key(k) for k in run.metrics if k.startswith("sink_share/")]
        heads = [
            (
                p["layer"],
                p["head"],
                run.metrics[f"sink_share/layer_{p['layer']:02d}/head_{p['head']:02d}"][last],
            )
            for p in heads
            if p["head"] is not None
        ]
        n_layers = max(h[0] for h in heads) + 1
        n_heads = max(h[1] for h in heads) + 1
        grid = np.full((n_layers, n_heads), np.nan)
        for layer, head, value in heads:
            if value is not None:
                grid[layer, head] = value
        im = ax2.imshow(grid, cmap="magma", vmin=0, vmax=max(1e-3, np.nanmax(grid)), aspect="auto")
        ax2.set_xlabel("head")
        ax2.set_ylabel("layer")
        ax2.set_xticks(range(n_heads))
        ax2.set_yticks(range(n_layers))
        if n_layers * n_heads <= 96:
            for (layer, head), value in np.ndenumerate(grid):
                bright = value > 0.6 * np.nanmax(grid)
                ax2.text(
                    head,
                    layer,
                    f"{value:.3f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if bright else "white",
                )
        ax2.set_title(f"per head at iteration {run.iterations[last]}")
        fig.colorbar(im, ax=ax2, label="attention probability on token 0")
    else:
        for i, run in enumerate(runs):
            ps = sorted((p for p in _keys(run, "sink_share")), key=lambda p: p["layer"])
            if not ps:  # a run analysed without an activation batch: nothing of it to draw
                continue
            ax2.plot(
                [p["layer"] for p in ps],
                [run.metrics[p["key"]][-1] for p in ps],
                color=run_color(i),
                marker="o",
                label=run_label(run),
            )
        _uniform_sink_line(ax2, seq)
        ax2.set_xlabel("layer")
        ax2.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers, not fractions of one
        ax2.set_ylabel("attention probability on token 0")
        ax2.set_title("per layer at each run's last checkpoint")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8)
    fig.suptitle(
        "Attention sink: mean softmax probability on the first token (queries i ≥ 1)"
        + (f"\n{run_label(runs[0])}" if single else "")
    )
    return _save(fig, path)


def _norm_style(role: str) -> str:
    return NORM_STYLES.get(role, "-.")


def _norm_quantile(run, saturated_keys: list[str], q: str) -> np.ndarray:
    """(norms, points): the ``norm_log10_ms_{q}`` series of the norms whose
    ``norm_saturated`` keys are ``saturated_keys``."""
    keys = [k.replace("norm_saturated", f"norm_log10_ms_{q}") for k in saturated_keys]
    return np.stack([_series(run, k)[1] for k in keys])


def plot_norms(runs, path: str, hist_edges: Sequence[float]) -> Optional[str]:
    """RMSNorm saturation: saturated share (a), median sigma^2(h) vs eps (b), distribution (c)."""
    if not any(_keys(r, "norm_saturated") for r in runs):
        return None
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), layout="constrained")
    single = len(runs) == 1
    colors = _layer_colors(_num_layers(runs))
    ax_a, ax_b, ax_c = axes
    centers = 0.5 * (np.asarray(hist_edges[:-1]) + np.asarray(hist_edges[1:]))
    for i, run in enumerate(runs):
        sat = _keys(run, "norm_saturated")
        if not sat:  # a run analysed without an activation batch: nothing of it to draw here
            continue
        if single:
            for p in sat:
                x, y = _series(run, p["key"])
                c = colors[p["layer"]] if p["layer"] is not None else "black"
                ax_a.plot(x, 100 * y, color=c, ls=_norm_style(p["role"]), marker="o", ms=2)
                x, y = _series(run, p["key"].replace("norm_saturated", "norm_log10_ms_p50"))
                ax_b.plot(x, y, color=c, ls=_norm_style(p["role"]), marker="o", ms=2)
        else:
            keys = [p["key"] for p in sat]
            _band(ax_a, [run], lambda r, keys=keys: keys, i, run_label(run), 100.0)
            x = _series(run, keys[0])[0]
            med, lo, hi = (_norm_quantile(run, keys, q) for q in ("p50", "p05", "p95"))
            ax_b.plot(x, np.median(med, 0), color=run_color(i), marker="o", ms=3)
            ax_b.fill_between(x, lo.min(0), hi.max(0), color=run_color(i), alpha=0.15, lw=0)
        eps = float(run.summary["norm_epsilon"])
        tag = "" if single else f" ({run.name})"
        c = "black" if single else run_color(i)
        ax_b.axhline(
            np.log10(eps),
            color=c,
            ls="--",
            lw=1,
            label=f"log10 ε = {np.log10(eps):.0f}{tag}",
        )
        ax_b.axhline(
            np.log10(SATURATION_FACTOR * eps),
            color=c,
            ls=":",
            lw=1,
            label=f"log10 {SATURATION_FACTOR:g}ε (saturation threshold){tag}",
        )
        # (c) distribution over all norm layers, first and last analysed iteration
        for it, style in ((run.iterations[0], "--"), (run.iterations[-1], "-")):
            counts = np.zeros(len(centers))
            for hist in run.norm_histograms.values():
                if it in hist:
                    counts += np.asarray(hist[it])
            if counts.sum():
                ax_c.step(
                    centers,
                    100 * counts / counts.sum(),
                    where="mid",
                    ls=style,
                    color="grey" if single and style == "--" else run_color(i),
                    label=f"{run.name if not single else ''} iteration {it}".strip(),
                )
        ax_c.axvline(
            np.log10(SATURATION_FACTOR * eps),
            color=c,
            ls=":",
            lw=1,
            label=f"log10 {SATURATION_FACTOR:g}ε{tag}",
        )
        ax_c.axvline(
            np.log10(eps),
            color=c,
            ls="--",
            lw=1,
            label=f"log10 ε{tag}",
        )
    ax_a.set_ylabel("saturated tokens, σ²(h) ≤ 10ε (%)")
    ax_a.set_title("(a) share of saturated tokens per norm layer")
    ax_b.set_ylabel("median log10 σ²(h)  (σ² in squared hidden units)")
    ax_b.set_title("(b) mean square of the norm input vs ε")
    lo_hi = [
        centers[np.nonzero(np.asarray(h[it]))[0][[0, -1]]]
        for r in runs
        for h in r.norm_histograms.values()
        for it in h
        if np.any(h[it])
    ]
    eps_all = [np.log10(float(r.summary["norm_epsilon"])) for r in runs]
    if lo_hi:
        ax_c.set_xlim(
            min(min(v[0] for v in lo_hi), min(eps_all)) - 1.5,
            max(max(v[1] for v in lo_hi), max(eps_all) + 1) + 1.5,
        )
    ax_c.set_xlabel("log10 σ²(h) per token")
    ax_c.set_ylabel("tokens (% of all norm inputs)")
    ax_c.set_title("(c) distribution over all norm layers")
    for ax in (ax_a, ax_b):
        ax.set_xlabel(X_LABEL)
        ax.grid(alpha=0.3)
    ax_a.set_ylim(-3, 103)
    ax_c.grid(alpha=0.3)
    spread = _band_handle("line: median of the layers' medians; band: lowest p05 to highest p95")
    _legend(ax_b, () if single else [spread], fontsize=7, loc="best")
    ax_c.legend(fontsize=7, loc="best")
    if single:
        styles = [plt.Line2D([], [], color="black", ls=s, label=r) for r, s in NORM_STYLES.items()]
        ax_a.legend(handles=styles, fontsize=7, title="norm (colour = layer)", title_fontsize=7)
        _layer_legend(fig, _num_layers(runs), axes)
    else:
        _legend(ax_a, [_band_handle()], fontsize=7)
    fig.suptitle(
        "RMSNorm saturation: y = h / sqrt(σ²(h) + ε), σ²(h) = mean_k h_k²"
        + (f"\n{run_label(runs[0])}" if single else "")
    )
    return _save(fig, path)


def plot_gates(runs, path: str) -> Optional[str]:
    """Mean gate value and share of closed gates (g < 0.1) per layer over training; each y axis
    from 0 to 12% above its highest value, at most its full range (1; 100%)."""
    if not any(_keys(r, "gate_mean") for r in runs):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    colors = _layer_colors(_num_layers(runs))
    single = len(runs) == 1
    for (metric, ylabel, scale), ax in zip(
        [
            ("gate_mean", "mean gate value sigmoid(z)", 1.0),
            ("gate_closed", "gates below 0.1 (%)", 100.0),
        ],
        axes,
        strict=True,
    ):
        if single:
            for p in sorted(_keys(runs[0], metric), key=lambda p: p["layer"]):
                x, y = _series(runs[0], p["key"])
                ax.plot(
                    x,
                    scale * y,
                    color=colors[p["layer"]],
                    marker="o",
                    ms=3,
                    label=f"layer {p['layer']}",
                )
        else:
            for i, run in enumerate(runs):
                keys = [p["key"] for p in _keys(run, metric)]
                _band(ax, [run], lambda r, keys=keys: keys, i, run_label(run), scale)
        ax.set_xlabel(X_LABEL)
        ax.set_ylabel(ylabel)
        top = ax.dataLim.y1
        ax.set_ylim(0, min(scale, 1.12 * top) if top > 0 else scale)
        ax.grid(alpha=0.3)
        _legend(ax, () if single else [_band_handle()], fontsize=7)
    fig.suptitle(
        "Gated attention: output gates per layer" + (f"\n{run_label(runs[0])}" if single else "")
    )
    return _save(fig, path)


def read_losses(run_dir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{'train' | 'valid': (iterations, losses)} from a run's ``metrics.jsonl`` (the last value
    of an iteration when a resumed run logged it twice); empty without the file
    (:func:`megatron_gamma.rundir.layout.read_metrics`: a torn last line is skipped)."""
    series: dict[str, dict[int, float]] = {"train": {}, "valid": {}}
    for row in read_metrics(run_dir):
        if row.get("split") in series and "loss" in row:
            series[row["split"]][int(row["iteration"])] = float(row["loss"])
    return {
        split: (np.array(sorted(v)), np.array([v[i] for i in sorted(v)]))
        for split, v in series.items()
        if v
    }


def plot_losses(runs, path: str) -> Optional[str]:
    """Training loss (thin line) and validation loss (markers) of every run against iteration,
    read from ``metrics.jsonl`` (so a run saved without checkpoints gets its curve too); None
    when no run has a ``metrics.jsonl``."""
    curves = [(i, run, read_losses(run.run_dir)) for i, run in enumerate(runs)]
    curves = [c for c in curves if c[2]]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, run, losses in curves:
        color = run_color(i)
        if "train" in losses:
            ax.plot(
                *losses["train"], color=color, lw=0.8, alpha=0.7, label=f"{run_label(run)} train"
            )
        if "valid" in losses:
            ax.plot(*losses["valid"], "o-", color=color, ms=4, label=f"{run_label(run)} validation")
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel("LM loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("Training and validation loss (metrics.jsonl)")
    return _save(fig, path)


def plot_analysis(runs, out_dir: str) -> dict[str, str]:
    """Every analysis figure for ``runs`` into ``out_dir``; returns {name: path} of those drawn
    (figures without data, e.g. gates of ungated runs, are skipped). The loss curves come from
    ``metrics.jsonl``; the diagnostics' trajectories need two analysed iterations at least, so
    with only initialization (a run without checkpoints) they are skipped with a note on stderr
    instead of single points."""
    from megatron_gamma.diagnostics.norm import HIST_EDGES

    os.makedirs(out_dir, exist_ok=True)
    losses = plot_losses(runs, os.path.join(out_dir, "loss.png"))
    if max(len(run.iterations) for run in runs) < 2:
        print(
            "analyze: only iteration 0 could be analysed (no checkpoints saved): the diagnostics "
            "have no trajectory to plot; loss.png and the numbers in analysis.json/csv are "
            "written. Fix: train with --save to get checkpoints",
            file=sys.stderr,
        )
        return {"loss": losses} if losses else {}
    out = {
        "loss": losses,
        "stable_rank": plot_role_grid(
            runs,
            "stable_rank",
            os.path.join(out_dir, "stable_rank.png"),
            "Stable rank ‖W‖_F² / ‖W‖₂² per weight matrix over training",
            "stable rank (dimensionless)",
        ),
        "condensation": plot_role_grid(
            runs,
            "condensation",
            os.path.join(out_dir, "condensation.png"),
            "Condensation score: mean |cos| between rows of W (1 = all rows on one line)",
            "mean |cos| over row pairs",
            baseline=True,
        ),
        "attention_sink": plot_sink(runs, os.path.join(out_dir, "attention_sink.png")),
        "norm_saturation": plot_norms(
            runs, os.path.join(out_dir, "norm_saturation.png"), HIST_EDGES
        ),
        "gates": plot_gates(runs, os.path.join(out_dir, "gates.png")),
    }
    for run in runs:
        suffix = "" if len(runs) == 1 else "_" + run.name.replace("/", "_")
        out[f"cosine_heatmaps{suffix}"] = plot_heatmaps(
            run, os.path.join(out_dir, f"cosine_heatmaps{suffix}.png")
        )
    return {k: v for k, v in out.items() if v is not None}


def plot_compare(bins, labels: tuple[str, str], path: str, title_note: str = "") -> str:
    """Delta_sym by difficulty bin (top) and each model's mean loss per bin (bottom). A bar is
    coloured for A or B only where its interval excludes 0 (grey otherwise, and where a bin has
    no interval).

    Args:
        bins: list of :class:`~megatron_gamma.diagnostics.tokens.DifficultyBin`.
        labels: (label of A, label of B).
        path: PNG to write.
        title_note: extra text for the title (e.g. token count).
    """
    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(9, 7), sharex=True, layout="constrained", height_ratios=[3, 2]
    )
    x = np.arange(len(bins))
    mean = np.array([b.mean_delta for b in bins])
    known = [b.low is not None for b in bins]
    low = np.array([b.low if k else m for b, k, m in zip(bins, known, mean, strict=True)])
    high = np.array([b.high if k else m for b, k, m in zip(bins, known, mean, strict=True)])
    colors = [
        run_color(0) if k and lo > 0 else run_color(1) if k and hi < 0 else "lightgrey"
        for k, lo, hi in zip(known, low, high, strict=True)
    ]
    yerr = np.vstack([mean - low, high - mean])
    ax.bar(x, mean, yerr=yerr, color=colors, alpha=0.85, capsize=3, ecolor="black")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("mean Δsym = (p_A − p_B)/(p_A + p_B)")
    ax.set_title(f"Symmetric probability gap by token difficulty{title_note}")
    ax.grid(axis="y", alpha=0.3)
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=run_color(0), label=f"A better: {labels[0]}"),
        plt.Rectangle((0, 0), 1, 1, color=run_color(1), label=f"B better: {labels[1]}"),
        plt.Rectangle((0, 0), 1, 1, color="lightgrey", label="interval includes 0"),
        plt.Line2D(
            [], [], color="black", marker="|", ls="", ms=10,
            label="95% interval, clustered by document",
        ),
    ]  # fmt: skip
    ax.legend(handles=handles, fontsize=8, loc="best")
    # each model's mean loss per bin, and the share of tokens A wins
    if bins[0].mean_loss_a is not None:
        for k, (attr, name) in enumerate((("mean_loss_a", "A"), ("mean_loss_b", "B"))):
            ax2.plot(
                x,
                [getattr(b, attr) for b in bins],
                color=run_color(k),
                marker="o",
                label=f"mean loss of {name}",
            )
    else:
        ax2.plot(
            x,
            [b.mean_difficulty for b in bins],
            color="grey",
            marker="o",
            label="difficulty (mean of both losses)",
        )
    ax2.set_ylabel("mean loss per bin (nats)")
    ax2.set_xlabel("token difficulty bin = mean loss of A and B (nats), equal token counts")
    ax2.set_xticks(x, [f"{b.lo:.2f}–{b.hi:.2f}\n(n={b.count})" for b in bins], fontsize=7)
    ax2.grid(alpha=0.3)
    ax3 = ax2.twinx()
    ax3.plot(
        x,
        [100 * b.a_better for b in bins],
        color="black",
        marker="s",
        ls="--",
        lw=1,
        label="tokens where p_A > p_B (%)",
    )
    ax3.axhline(50, color="black", lw=0.6, ls=":", label="50% (right axis): A and B even")
    ax3.set_ylabel("tokens where p_A > p_B (%)")
    ax3.set_ylim(0, 100)
    lines = ax2.get_legend_handles_labels()
    lines3 = ax3.get_legend_handles_labels()
    fig.legend(  # below the panel: inside it, it covered points
        lines[0] + lines3[0], lines[1] + lines3[1], fontsize=8, loc="outside lower center", ncols=2
    )
    return _save(fig, path)
