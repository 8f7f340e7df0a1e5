"""The numbers behind ``megatron-gamma report``: a study directory's finished runs grouped by
arm, size and seed; the loss table with paired seed differences; scaling fits and effective
model-size multipliers; the γ grid; the mechanism trajectories from the live diagnostics.

Arms are recognized by their settings, not their names (:meth:`StudyData.role`): the
**baseline** is the study's ``baseline`` arm; **γ=1** has init_gamma 1 and the baseline's ε and
gate; **γ=1+ε** has init_gamma 1, a smaller ε and no gate; **γ=1+ε+gate** has init_gamma 1, a
smaller ε and a gate.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

from megatron_gamma.config import ConfigError
from megatron_gamma.study import rundir
from megatron_gamma.study.fits import (
    effective_size_multiplier,
    fit_power_law,
    mean_std,
    paired_difference,
    parabola_minimum,
)


def uniform_sink_share(seq_length: int) -> float:
    """Sink share of uniform causal attention: mean over query positions i = 1..s-1 of
    1 / (i + 1) (the reference the measured share is read against)."""
    return float(np.mean(1.0 / (np.arange(1, seq_length) + 1.0))) if seq_length > 1 else 1.0


def fmt(x: Optional[float], digits: int = 4) -> str:
    """``x`` with ``digits`` decimals; ``n/a`` for None, NaN and inf."""
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:.{digits}f}"


class StudyData:
    """The finished runs of a study directory, grouped by arm, size and seed."""

    def __init__(self, study_dir: str):
        path = os.path.join(study_dir, "study.json")
        if not os.path.isfile(path):
            raise ConfigError(
                f"study_dir={study_dir!r}: no study.json. Fix: run `megatron-gamma sweep "
                "STUDY.yaml --output-dir DIR` first"
            )
        with open(path, encoding="utf-8") as f:
            self.manifest = json.load(f)
        self.dir = study_dir
        self.baseline = self.manifest["baseline"]
        self.runs = []
        for entry in self.manifest["runs"]:
            rec = rundir.read_run(os.path.join(study_dir, entry["key"]))
            done = rec.checkpoint == entry["train_iters"] and entry["train_iters"] in rec.valid
            self.runs.append(
                {
                    **entry,
                    "record": rec,
                    "finished": done,
                    "loss": rec.valid.get(entry["train_iters"]) if done else None,
                }
            )
        self.finished = [r for r in self.runs if r["finished"]]
        self.arms = list(dict.fromkeys(r["arm"] for r in self.runs))
        sizes = {r["size"]: r["non_embedding"] for r in self.runs}
        self.sizes = sorted(sizes, key=sizes.get)
        self.size_n = sizes

    def losses(self, arm: str, size: str) -> dict[int, float]:
        """{seed: final validation loss} of the finished runs of ``arm`` at ``size``."""
        return {
            r["seed"]: r["loss"] for r in self.finished if r["arm"] == arm and r["size"] == size
        }

    def arm_sizes(self, arm: str) -> list[str]:
        return [s for s in self.sizes if self.losses(arm, s)]

    def settings(self, arm: str) -> dict:
        r = next(r for r in self.runs if r["arm"] == arm)
        return {k: r[k] for k in ("init_gamma", "norm_epsilon", "gated_attention")}

    def role(self, name: str) -> Optional[str]:
        """The arm playing a named role (see the module docstring), the one with most sizes."""
        base = self.settings(self.baseline)
        found = []
        for arm in self.arms:
            s = self.settings(arm)
            if arm == self.baseline or s["init_gamma"] != 1.0:
                continue
            small_eps = s["norm_epsilon"] < base["norm_epsilon"]
            gate = s["gated_attention"] != "none"
            wanted = {
                "gamma1": not small_eps and s["gated_attention"] == base["gated_attention"],
                "gamma1+eps": small_eps and not gate,
                "gamma1+eps+gate": small_eps and gate,
            }[name]
            if wanted:
                found.append(arm)
        return max(found, key=lambda a: len(self.arm_sizes(a)), default=None)

    def series(self, arm: str, size: str, prefix: str) -> dict[int, float]:
        """A diagnostic's per-iteration value (:meth:`RunRecord.series`) averaged over seeds."""
        per_seed = [
            r["record"].series(prefix)
            for r in self.finished
            if r["arm"] == arm and r["size"] == size
        ]
        per_seed = [s for s in per_seed if s]
        if not per_seed:
            return {}
        common = set.intersection(*(set(s) for s in per_seed))
        return {it: float(np.mean([s[it] for s in per_seed])) for it in sorted(common)}

    def seq_length(self) -> int:
        return int(self.runs[0]["seq_length"])


def loss_table(data: StudyData) -> tuple[list[dict], dict]:
    """Final loss per arm × size (mean, sd over seeds) and, for every non-baseline arm, the
    paired difference to the baseline (:func:`~.fits.paired_difference`).

    Returns:
        (rows, {(arm, size): Difference}).
    """
    rows, diffs = [], {}
    for arm in data.arms:
        for size in data.sizes:
            losses = data.losses(arm, size)
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
            base = data.losses(data.baseline, size)
            common = sorted(set(losses) & set(base))
            if arm != data.baseline and common:
                d = paired_difference([losses[s] for s in common], [base[s] for s in common])
                row.update(diff=d.mean, diff_low=d.low, diff_high=d.high)
                diffs[(arm, size)] = d
            rows.append(row)
    return rows, diffs


def scaling_fits(data: StudyData) -> dict[str, dict]:
    """Per arm: the power-law fit over every (size, seed) loss (>= 3 sizes), the sizes where
    the seed-mean loss rises with N, and the effective-size multiplier against the baseline's
    fit per size (flagged when extrapolated beyond the baseline's measured sizes)."""
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
        points = [(data.size_n[s], x) for s in sizes for x in data.losses(arm, s).values()]
        if len(sizes) >= 3:
            try:
                entry["fit"] = fit_power_law([p[0] for p in points], [p[1] for p in points])
            except ValueError as e:
                entry["error"] = str(e)
        else:
            entry["error"] = f"{len(sizes)} size(s); a fit of E, A, α needs >= 3"
        entry["loss_rises"] = [
            f"{sizes[i - 1]} → {sizes[i]}" for i in range(1, len(sizes)) if means[i] >= means[i - 1]
        ]
        out[arm] = entry
    base_fit = out.get(data.baseline, {}).get("fit")
    base_n = out.get(data.baseline, {}).get("n") or [0.0]
    for arm, entry in out.items():
        entry["multiplier"], entry["multiplier_extrapolated"] = {}, []
        if base_fit is None or arm == data.baseline:
            continue
        for size, n, loss in zip(entry["sizes"], entry["n"], entry["mean"], strict=True):
            m = effective_size_multiplier(base_fit, loss, n)
            entry["multiplier"][size] = m
            if not min(base_n) <= m * n <= max(base_n):
                entry["multiplier_extrapolated"].append(size)
    return out


def multiplier_text(entry: dict) -> str:
    """``SIZE 1.44x`` per size; flagged when the baseline's N_eff lies outside its measured
    sizes (the fit is extrapolated) or is never reached (loss below the baseline fit's E)."""
    parts = []
    for size, m in entry["multiplier"].items():
        if not np.isfinite(m):
            parts.append(f"{size} ∞ (loss below the baseline fit's E)")
        elif size in entry["multiplier_extrapolated"]:
            parts.append(f"{size} {m:.2f}x (extrapolated)")
        else:
            parts.append(f"{size} {m:.2f}x")
    return ", ".join(parts)


def gamma_grid(data: StudyData) -> dict[str, dict]:
    """Per grid size: seed-mean loss against γ (the grid arms and their base arm) and the
    parabola minimum (:func:`~.fits.parabola_minimum`) when there are >= 3 γ values."""
    grid = data.manifest.get("gamma_grid")
    if not grid:
        return {}
    base = grid["arm"]
    arms = [a for a in data.arms if a == base or a.startswith(base + "@gamma=")]
    out = {}
    for size in grid["sizes"]:
        points = []
        for arm in arms:
            losses = data.losses(arm, size)
            if losses:
                mean, std = mean_std(list(losses.values()))
                points.append((data.settings(arm)["init_gamma"], mean, std))
        points.sort()
        entry = {
            "gamma": [p[0] for p in points],
            "mean": [p[1] for p in points],
            "std": [p[2] for p in points],
            "minimum": None,
        }
        if len(points) >= 3:
            entry["minimum"] = parabola_minimum(entry["gamma"], entry["mean"])
        out[size] = entry
    return out


def mechanisms(data: StudyData) -> dict[str, dict]:
    """Per arm and size: saturation, sink share, stable rank and condensation trajectories."""
    out = {}
    for arm in data.arms:
        for size in data.arm_sizes(arm):
            sat = data.series(arm, size, "norm_saturated")
            sink = data.series(arm, size, "sink_share")
            rank = data.series(arm, size, "stable_rank")
            cond = data.series(arm, size, "condensation")
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
                its = sorted(rank)
                low_it = min(its[:-1], key=rank.get)
                first, low, last = rank[its[0]], rank[low_it], rank[its[-1]]
                entry.update(
                    rank_first=first,
                    rank_min=low,
                    rank_min_iteration=low_it,
                    rank_final=last,
                    rank_dip=1 - low / first,
                    rank_rise=last / low - 1,
                    rank_first_iteration=its[0],
                )
            out[f"{arm}|{size}"] = entry
    return out
