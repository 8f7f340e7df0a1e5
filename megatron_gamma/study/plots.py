"""PNG figures of ``megatron-gamma report`` (matplotlib, Agg backend). Each function takes plain
dicts prepared by :mod:`megatron_gamma.study.report` and returns the written path, or None when
there is nothing to draw. Files are written to a temp name, then renamed.
"""

from __future__ import annotations

from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from megatron_gamma.atomic import atomic_path
from megatron_gamma.study.spec import best_lr

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f"]


def _save(fig, path: str) -> str:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_scaling(arms: dict[str, dict], path: str) -> Optional[str]:
    """Final validation loss at the shared LR against the baseline arm's non-embedding
    parameters at each size (a gated arm has a few more), one colour per arm, with the arm's
    power-law fit where there is one.

    Args:
        arms: {arm: {"sizes": [N], "mean": [loss], "std": [loss or None],
            "fit": PowerLawFit or None}}.
    """
    if not arms:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for i, (name, a) in enumerate(arms.items()):
        c = COLORS[i % len(COLORS)]
        err = [s or 0.0 for s in a["std"]]
        ax.errorbar(a["sizes"], a["mean"], yerr=err, fmt="o", color=c, label=name, capsize=3)
        if a.get("fit") is not None:
            n = np.geomspace(min(a["sizes"]), max(a["sizes"]), 50)
            ax.plot(n, a["fit"].loss(n), "-", color=c, alpha=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters N of the baseline arm")
    ax.set_ylabel("final validation loss (nats)")
    fitted = any(a.get("fit") is not None for a in arms.values())
    lines = "lines: fits E + A·N^−α" if fitted else "no fit: < 4 sizes, or α not identified"
    ax.set_title(f"loss against model size at the shared LR (mean ± sd over seeds; {lines})")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_lr_grid(per_size: dict[str, dict[str, dict[float, float]]], path: str) -> Optional[str]:
    """Final validation loss against peak LR on the selection seed, one panel per size, one
    line per arm, each arm's best LR (:func:`~.spec.best_lr`, the sweep's rule) circled, or
    squared where it is the grid's smallest or largest LR (not bracketed: the arm's own best LR
    is not known).

    Args:
        per_size: {size: {arm: {lr: loss}}} (:meth:`~.analysis.StudyData.lr_grid`).
    """
    per_size = {s: arms for s, arms in per_size.items() if any(arms.values())}
    if not per_size:
        return None
    fig, axes = plt.subplots(
        1, len(per_size), figsize=(4.2 * len(per_size), 4), layout="constrained", squeeze=False
    )
    for ax, (size, arms) in zip(axes[0], per_size.items(), strict=True):
        for i, (name, grid) in enumerate(arms.items()):
            if not grid:
                continue
            c = COLORS[i % len(COLORS)]
            lrs = sorted(grid)
            ax.plot(lrs, [grid[x] for x in lrs], "o-", color=c, label=name)
            best = best_lr(grid)
            edge = best in (lrs[0], lrs[-1])
            ax.plot([best], [grid[best]], "s" if edge else "o", ms=12, mfc="none", color=c)
        ax.set_xscale("log")
        grid_lrs = sorted({lr for grid in arms.values() for lr in grid})
        ax.set_xticks(grid_lrs, [f"{lr:.2g}" for lr in grid_lrs], rotation=45)
        ax.xaxis.set_minor_formatter(NullFormatter())  # the grid's LRs only, not overlapping
        ax.set_xlabel("peak learning rate (ticks: the grid's)")
        ax.set_title(size)
    axes[0][0].set_ylabel("final validation loss (nats)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(
        "LR grid on the selection seed (circled: each arm's best LR; squared: a best LR on the "
        "grid's edge, not bracketed)"
    )
    return _save(fig, path)


def plot_gamma(per_size: dict[str, dict], path: str) -> Optional[str]:
    """Loss against γ per size at matched seeds, mean ± sd over those seeds (no bar with one),
    the γ of the lowest mean marked as such: a point estimate, not claim 6's verdict.

    Args:
        per_size: {size: {"gamma": [γ], "mean": [loss over matched seeds], "seeds": [seed],
            "per_seed": {γ: [loss per matched seed]}, "best": γ of the lowest mean or None}}
            (:func:`~.analysis.gamma_grid`).
    """
    per_size = {k: d for k, d in per_size.items() if d["mean"]}
    if not per_size:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    for i, (size, d) in enumerate(per_size.items()):
        c = COLORS[i % len(COLORS)]
        sd = [
            float(np.std(d["per_seed"][g], ddof=1)) if len(d["seeds"]) > 1 else 0.0
            for g in d["gamma"]
        ]
        label = f"{size} (seeds {d['seeds']})"
        ax.errorbar(d["gamma"], d["mean"], yerr=sd, fmt="o-", color=c, label=label, capsize=3)
        if d.get("best") is not None:
            ax.axvline(d["best"], color=c, alpha=0.4, linestyle="--")
    ax.set_xlabel("γ (σ = fan_in^−γ)")
    ax.set_ylabel("final validation loss (nats)")
    ax.set_title(
        "loss against γ, mean ± sd over matched seeds\n(dashed: the lowest mean, a point "
        "estimate; claim 6's row says what the seeds support)"
    )
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_trajectories(
    series: dict[str, dict[int, float]],
    path: str,
    ylabel: str,
    title: str,
    reference: Optional[float] = None,
    reference_label: str = "",
    log_y: bool = False,
    threshold: Optional[float] = None,
    threshold_label: str = "",
) -> Optional[str]:
    """One line per arm of a diagnostic against iteration (e.g. stable rank, sink share).

    Args:
        series: {arm: {iteration: value}}.
        reference: a horizontal reference value (e.g. the uniform-attention sink share).
        threshold: a second horizontal line, where a verdict rule starts counting (e.g. a sink:
            uniform + the rule's margin); it also keeps the y range from magnifying differences
            far below it.
    """
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    for i, (name, s) in enumerate(series.items()):
        its = sorted(s)
        ax.plot(its, [s[t] for t in its], "o-", ms=3, color=COLORS[i % len(COLORS)], label=name)
    if reference is not None:
        ax.axhline(reference, color="k", ls="--", lw=1, label=reference_label)
    if threshold is not None:
        ax.axhline(threshold, color="k", ls=":", lw=1, label=threshold_label)
    if log_y:
        ax.set_yscale("symlog", linthresh=1e-4)
        ax.set_ylim(bottom=0)
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)
