"""``megatron-gamma report DIR``: the paper's analyses and a verdict table from a study's runs.

Reads ``DIR/study.json`` (written by ``sweep``) and every run directory (no retraining), then
writes ``report.md``, and beside it a folder of the same stem holding ``report.json``,
``losses.csv``, ``runs.csv``, the PNG plots and the ``megatron-gamma compare`` output of the
best arm against the baseline (Δsym by difficulty on the held-out split).

Arms are recognized by their settings, not their names: the **baseline** is the study's
``baseline`` arm; **γ=1** has init_gamma 1 and the baseline's ε and gate; **γ=1+ε** has
init_gamma 1, a smaller ε and no gate; **γ=1+ε+gate** has init_gamma 1, a smaller ε and a gate.
Every verdict states its rule, the numbers it read, and *reproduced*, *not reproduced* or
*not measurable at this scale* with the reason.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np

from megatron_gamma.config import ConfigError
from megatron_gamma.study import plots, rundir
from megatron_gamma.study.fits import (
    PowerLawFit,
    effective_size_multiplier,
    fit_power_law,
    mean_std,
    paired_difference,
    parabola_minimum,
)

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_MEASURABLE = "not measurable at this scale"
SATURATION_MIN = 0.01
"""Saturated-token share above which ε = 1e-5 counts as saturating (1% of tokens)."""
DIP_MIN = 0.05
"""Relative stable-rank dip (and recovery) that counts as condensation (and expansion)."""
EASY_SHARE = 0.3
"""Share of the difficulty bins (easiest first) counted as easy tokens in the Δsym verdict."""


@dataclass
class Verdict:
    """One row of the verdict table."""

    claim: str
    verdict: str
    numbers: str
    rule: str

    def as_dict(self) -> dict:
        return {
            "claim": self.claim,
            "verdict": self.verdict,
            "numbers": self.numbers,
            "rule": self.rule,
        }


def uniform_sink_share(seq_length: int) -> float:
    """Sink share of uniform causal attention: mean over query positions i = 1..s-1 of
    1 / (i + 1) (the reference the measured share is read against)."""
    return float(np.mean(1.0 / (np.arange(1, seq_length) + 1.0))) if seq_length > 1 else 1.0


def _f(x: Optional[float], digits: int = 4) -> str:
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


def _loss_table(data: StudyData) -> tuple[list[dict], dict]:
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


def _fits(data: StudyData) -> dict[str, dict]:
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


def _multiplier_text(entry: dict) -> str:
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


def _gamma_grid(data: StudyData) -> dict[str, dict]:
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


def _mechanisms(data: StudyData) -> dict[str, dict]:
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


def _compare(data: StudyData, out_dir: str, table: list[dict]) -> Optional[dict]:
    """Run ``megatron-gamma compare`` between the best arm and the baseline at the largest size
    both finished (first common seed); return its compare.json plus the arms, or None."""
    for size in reversed(data.sizes):
        base = data.losses(data.baseline, size)
        rows = [r for r in table if r["size"] == size and r["arm"] != data.baseline]
        rows = [r for r in rows if set(data.losses(r["arm"], size)) & set(base)]
        if not base or not rows:
            continue
        best = min(rows, key=lambda r: r["mean"])
        seed = sorted(set(data.losses(best["arm"], size)) & set(base))[0]
        ckpt_a = rundir.final_checkpoint(os.path.join(data.dir, best["arm"], size, f"seed-{seed}"))
        ckpt_b = rundir.final_checkpoint(
            os.path.join(data.dir, data.baseline, size, f"seed-{seed}")
        )
        target = os.path.join(out_dir, "compare")
        cmd = [
            sys.executable,
            "-m",
            "megatron_gamma.cli",
            "compare",
            ckpt_a,
            ckpt_b,
            "--data-path",
            data.manifest["heldout"],
            "--output-dir",
            target,
            "--no-progress",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip()[-600:], "arm": best["arm"], "size": size}
        with open(os.path.join(target, "compare.json"), encoding="utf-8") as f:
            result = json.load(f)
        result.update(arm=best["arm"], size=size, seed=seed)
        return result
    return None


def _diff_text(d) -> str:
    if np.isfinite(d.low):
        return f"{d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}]"
    return f"{d.mean:+.4f} ({d.seeds} seed, no interval)"


def _verdicts(data, diffs, fits, grid, mech, cmp) -> list[Verdict]:  # noqa: C901
    v = []
    roles = {k: data.role(k) for k in ("gamma1", "gamma1+eps", "gamma1+eps+gate")}
    base = data.baseline

    def adv(arm):
        return {s: -diffs[(arm, s)].mean for s in data.sizes if (arm, s) in diffs}

    # 1. γ = 1 beats γ = 0.5
    claim = "γ = 1 beats γ = 0.5 (same ε = baseline's, no gate)"
    rule = (
        "loss difference γ=1 − baseline < 0 at every size, and the 95% interval of the "
        "difference pooled over all (size, seed) pairs lies below 0"
    )
    g1 = roles["gamma1"]
    if g1 is None or not adv(g1):
        v.append(
            Verdict(claim, NOT_MEASURABLE, "no γ = 1 arm with the baseline's ε and gate", rule)
        )
    else:
        pairs = [
            (data.losses(g1, s)[seed], data.losses(base, s)[seed])
            for s in data.sizes
            if (g1, s) in diffs
            for seed in sorted(set(data.losses(g1, s)) & set(data.losses(base, s)))
        ]
        pooled = paired_difference([p[0] for p in pairs], [p[1] for p in pairs])
        ds = [diffs[(g1, s)] for s in data.sizes if (g1, s) in diffs]
        ok = all(d.mean < 0 for d in ds) and np.isfinite(pooled.high) and pooled.high < 0
        nums = "; ".join(
            f"{s}: {_diff_text(diffs[(g1, s)])}" for s in data.sizes if (g1, s) in diffs
        )
        nums = f"Δloss {nums}; pooled over {pooled.seeds} pairs: {_diff_text(pooled)}"
        v.append(Verdict(claim, REPRODUCED if ok else NOT_REPRODUCED, nums, rule))
    # 2. gap shrinks with size under the blockers
    claim = "the gain of γ = 1 shrinks with size under ε = 1e-5 and no gate"
    rule = "advantage (baseline − γ=1 loss) has a negative slope against log N over the sizes"
    if g1 is None or len(adv(g1)) < 2:
        v.append(Verdict(claim, NOT_MEASURABLE, "needs the γ = 1 arm at >= 2 sizes", rule))
    else:
        a = adv(g1)
        slope = float(np.polyfit(np.log([data.size_n[s] for s in a]), list(a.values()), 1)[0])
        nums = "; ".join(f"{s}: {x:+.4f}" for s, x in a.items()) + f"; slope {slope:+.4f}/ln N"
        if fits.get(g1, {}).get("loss_rises"):
            nums += f"; caution: {g1}'s own loss rises with N ({', '.join(fits[g1]['loss_rises'])})"
        v.append(Verdict(claim, REPRODUCED if slope < 0 else NOT_REPRODUCED, nums, rule))
    # 3. removing both blockers widens it
    claim = "removing both blockers (ε = 1e-12 + gate) widens the gain"
    rule = "advantage of γ=1+ε+gate > advantage of γ=1 at the largest common size"
    g3 = roles["gamma1+eps+gate"]
    common = [s for s in data.sizes if g1 and g3 and s in adv(g1) and s in adv(g3)]
    if not common:
        v.append(Verdict(claim, NOT_MEASURABLE, "needs γ = 1 and γ = 1+ε+gate arms", rule))
    else:
        s = common[-1]
        nums = "; ".join(
            f"{z}: γ=1 {adv(g1)[z]:+.4f}, γ=1+ε+gate {adv(g3)[z]:+.4f}" for z in common
        )
        if fits.get(g3, {}).get("multiplier"):
            nums += "; effective-size multiplier of γ=1+ε+gate: " + _multiplier_text(fits[g3])
        ok = adv(g3)[s] > adv(g1)[s]
        v.append(Verdict(claim, REPRODUCED if ok else NOT_REPRODUCED, nums, rule))
    # 4. saturation
    claim = "ε = 1e-5 saturates RMSNorm under small initialization"
    rule = (
        f"max saturated-token share of γ=1 (ε=1e-5) > {SATURATION_MIN:g} and above both "
        "γ=1+ε (ε=1e-12) and the γ=0.5 baseline, at the largest size"
    )
    g2 = roles["gamma1+eps"]
    size = next(
        (
            s
            for s in reversed(data.sizes)
            if g1
            and g2
            and all(
                f"{a}|{s}" in mech and "saturation_max" in mech[f"{a}|{s}"] for a in (g1, g2, base)
            )
        ),
        None,
    )
    if size is None:
        v.append(
            Verdict(
                claim,
                NOT_MEASURABLE,
                "needs saturation diagnostics of baseline, γ=1 and γ=1+ε at one size",
                rule,
            )
        )
    else:
        m = {a: mech[f"{a}|{size}"]["saturation_max"] for a in (g1, g2, base)}
        nums = (
            f"{size}: max saturated share γ=1 {m[g1]:.4f}, γ=1+ε {m[g2]:.4f}, "
            f"baseline {m[base]:.4f}"
        )
        ok = m[g1] > SATURATION_MIN and m[g1] > m[g2] and m[g1] > m[base]
        v.append(Verdict(claim, REPRODUCED if ok else NOT_REPRODUCED, nums, rule))
    # 5. sink
    claim = "small initialization strengthens the attention sink; gating removes it"
    rule = (
        "final sink share at the largest size: γ=1 > baseline (only γ differs; γ=1+ε when there "
        "is no γ=1 arm), and γ=1+ε+gate < γ=1+ε (only the gate differs); not measurable when "
        "no arm's share exceeds uniform attention's (no sink has formed)"
    )
    small = g1 or g2
    arms5 = (small, g2, g3, base)
    size = next(
        (
            s
            for s in reversed(data.sizes)
            if small and g2 and g3 and all("sink_final" in mech.get(f"{a}|{s}", {}) for a in arms5)
        ),
        None,
    )
    if size is None:
        v.append(
            Verdict(
                claim,
                NOT_MEASURABLE,
                "needs sink diagnostics of baseline, γ=1, γ=1+ε and γ=1+ε+gate at one size",
                rule,
            )
        )
    else:
        m = {a: mech[f"{a}|{size}"]["sink_final"] for a in arms5}
        uni = uniform_sink_share(data.seq_length())
        nums = (
            f"{size}: sink share baseline {m[base]:.4f}, {small} {m[small]:.4f}, {g2} "
            f"{m[g2]:.4f}, {g3} {m[g3]:.4f} (uniform attention {uni:.4f})"
        )
        if max(m.values()) <= uni:
            nums += "; no sink has formed: every share is at or below uniform attention's"
            v.append(Verdict(claim, NOT_MEASURABLE, nums, rule))
        else:
            ok = m[small] > m[base] and m[g3] < m[g2]
            v.append(Verdict(claim, REPRODUCED if ok else NOT_REPRODUCED, nums, rule))
    # 6. γ optimum
    claim = "loss is best at γ = 1 (worse above)"
    rule = "the lowest measured loss of the γ grid is at γ = 1 at every grid size"
    usable = {s: g for s, g in grid.items() if g["minimum"] is not None}
    if not usable:
        v.append(Verdict(claim, NOT_MEASURABLE, "no γ grid with >= 3 finished values", rule))
    else:
        parts, ok = [], True
        for s, g in usable.items():
            m = g["minimum"]
            ok &= m.best_measured == 1.0
            parts.append(
                f"{s}: best measured γ = {m.best_measured:g}, parabola minimum "
                f"{_f(m.gamma, 3)} ± {_f(m.gamma_err, 3)}; losses "
                + ", ".join(
                    f"γ={g_:g} {l_:.4f}" for g_, l_ in zip(g["gamma"], g["mean"], strict=True)
                )
            )
        v.append(Verdict(claim, REPRODUCED if ok else NOT_REPRODUCED, "; ".join(parts), rule))
    # 7. condensation then expansion
    claim = "condensation then expansion: stable rank dips early at γ = 1, not at γ = 0.5"
    rule = (
        f"γ=1+ε+gate: mean stable rank falls by > {DIP_MIN:.0%} from its first logged "
        f"value and recovers by > {DIP_MIN:.0%} by the end; baseline's dip is smaller"
    )
    g_any = g3 or g2 or g1
    size = next(
        (
            s
            for s in reversed(data.sizes)
            if g_any and all("rank_dip" in mech.get(f"{a}|{s}", {}) for a in (g_any, base))
        ),
        None,
    )
    if size is None:
        v.append(Verdict(claim, NOT_MEASURABLE, "needs >= 3 stable-rank points per arm", rule))
    else:
        a, b = mech[f"{g_any}|{size}"], mech[f"{base}|{size}"]
        nums = (
            f"{size} ({g_any}): {a['rank_first']:.2f} at it {a['rank_first_iteration']} → "
            f"min {a['rank_min']:.2f} at it {a['rank_min_iteration']} → {a['rank_final']:.2f} "
            f"(dip {a['rank_dip']:.1%}, rise {a['rank_rise']:.1%}); baseline dip "
            f"{b['rank_dip']:.1%}, rise {b['rank_rise']:.1%}"
        )
        ok = a["rank_dip"] > DIP_MIN and a["rank_rise"] > DIP_MIN and b["rank_dip"] < a["rank_dip"]
        v.append(Verdict(claim, REPRODUCED if ok else NOT_REPRODUCED, nums, rule))
    # 8. Δsym by difficulty
    claim = "the gains concentrate on mid/high-difficulty tokens"
    rule = (
        f"Δsym (best arm vs baseline, held-out) averaged over the hardest "
        f"{1 - EASY_SHARE:.0%} of difficulty bins is > 0 and above the easiest {EASY_SHARE:.0%}"
    )
    if not cmp or "bins" not in cmp:
        why = cmp["error"] if cmp else "no pair of finished best-arm and baseline runs"
        v.append(Verdict(claim, NOT_MEASURABLE, f"compare: {why}", rule))
    else:
        bins = cmp["bins"]
        k = max(1, int(round(EASY_SHARE * len(bins))))
        easy, hard = bins[:k], bins[k:]
        if not hard:
            v.append(Verdict(claim, NOT_MEASURABLE, f"only {len(bins)} difficulty bin(s)", rule))
        else:

            def wmean(bs):
                return sum(b["mean_delta"] * b["count"] for b in bs) / sum(b["count"] for b in bs)

            e, h = wmean(easy), wmean(hard)
            nums = (
                f"{cmp['arm']} vs {base} at {cmp['size']}, {cmp['tokens']} tokens: Δsym "
                f"easy {e:+.4f}, mid/high {h:+.4f}; overall {cmp['mean_delta_sym']:+.4f}"
            )
            v.append(Verdict(claim, REPRODUCED if h > 0 and h > e else NOT_REPRODUCED, nums, rule))
    return v


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    try:
        from importlib.metadata import version

        mcore = version("megatron-core")
    except Exception:  # noqa: BLE001 - version lookup only
        mcore = "unknown"
    return (
        f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} logical CPUs, "
        f"{gpu}; Python {platform.python_version()}, torch {torch.__version__}, "
        f"megatron-core {mcore}"
    )


def _wall_seconds(data: StudyData) -> tuple[float, int]:
    total, n = 0.0, 0
    for r in data.runs:
        path = os.path.join(data.dir, r["key"], "study-run.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                w = json.load(f).get("wall_seconds")
            if w:
                total += w
                n += 1
    return total, n


def _write_csv(path: str, rows: list[dict]) -> str:
    tmp = path + ".tmp"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)
    return path


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "as_dict"):
        return _jsonable(x.as_dict())
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def report(
    study_dir: str,
    output: Optional[str] = None,
    command: Optional[str] = None,
    note: Optional[str] = None,
) -> dict[str, str]:
    """Analyze a study directory and write the report.

    Args:
        study_dir: the sweep's ``--output-dir``.
        output: path of the Markdown report (default ``DIR/report.md``); plots and tables go
            into the folder of the same stem (``DIR/report/``).
        command: the command line to print in the report (default: reconstructed).
        note: free text placed under the header (e.g. how the machine was shared).

    Returns:
        {name: path} of every file written.

    Raises:
        ConfigError: no ``study.json`` in ``study_dir`` or no finished run.
    """
    data = StudyData(study_dir)
    if not data.finished:
        raise ConfigError(
            f"study_dir={study_dir!r}: no finished run. Fix: run (or finish) the sweep first"
        )
    output = output or os.path.join(study_dir, "report.md")
    out_dir = os.path.splitext(output)[0]
    os.makedirs(out_dir, exist_ok=True)
    rel = os.path.basename(out_dir)
    table, diffs = _loss_table(data)
    fits = _fits(data)
    grid = _gamma_grid(data)
    mech = _mechanisms(data)
    cmp = _compare(data, out_dir, table)
    verdicts = _verdicts(data, diffs, fits, grid, mech, cmp)
    files = {}
    files["scaling_plot"] = plots.plot_scaling(
        {
            a: {
                "sizes": f["n"],
                "mean": f["mean"],
                "std": [mean_std(list(data.losses(a, s).values()))[1] for s in f["sizes"]],
                "fit": f["fit"],
            }
            for a, f in fits.items()
            if f["sizes"]
        },
        os.path.join(out_dir, "loss_vs_size.png"),
    )
    files["gamma_plot"] = plots.plot_gamma(grid, os.path.join(out_dir, "loss_vs_gamma.png"))
    largest = {
        a: next((s for s in reversed(data.sizes) if f"{a}|{s}" in mech), None)
        for a in data.arms
        if "@gamma=" not in a
    }
    trajectories = {
        "saturation_plot": (
            "saturation",
            "saturated-token share (σ²(h) ≤ 10ε)",
            "RMSNorm saturation, mean over norms",
            None,
            True,
        ),
        "sink_plot": (
            "sink_share",
            "attention-sink share",
            "attention sink, mean over layers",
            uniform_sink_share(data.seq_length()),
            False,
        ),
        "stable_rank_plot": (
            "stable_rank",
            "stable rank",
            "stable rank, mean over matrices",
            None,
            False,
        ),
    }
    for name, (key, ylabel, title, ref, log_y) in trajectories.items():
        series = {f"{a} ({s})": mech[f"{a}|{s}"][key] for a, s in largest.items() if s}
        files[name] = plots.plot_trajectories(
            series,
            os.path.join(out_dir, f"{key}.png"),
            ylabel,
            title + " (largest size)",
            reference=ref,
            reference_label="uniform attention 1/(i+1)" if ref else "",
            log_y=log_y,
        )
    files = {k: p for k, p in files.items() if p}
    if cmp and "files" in cmp:
        files["delta_sym_plot"] = cmp["files"]["plot"]
    files["losses_csv"] = _write_csv(os.path.join(out_dir, "losses.csv"), table)
    files["runs_csv"] = _write_csv(
        os.path.join(out_dir, "runs.csv"),
        [
            {
                k: r[k]
                for k in (
                    "key",
                    "arm",
                    "size",
                    "seed",
                    "params",
                    "non_embedding",
                    "tokens",
                    "train_iters",
                    "finished",
                    "loss",
                )
            }
            for r in data.runs
        ],
    )
    summary = {
        "study": data.manifest["name"],
        "runs": len(data.runs),
        "finished": len(data.finished),
        "losses": table,
        "fits": {a: {k: v for k, v in f.items()} for a, f in fits.items()},
        "gamma_grid": grid,
        "mechanisms": {
            k: {
                kk: vv
                for kk, vv in m.items()
                if kk not in ("saturation", "sink_share", "stable_rank", "condensation")
            }
            | {
                "series": {
                    kk: m[kk] for kk in ("saturation", "sink_share", "stable_rank", "condensation")
                }
            }
            for k, m in mech.items()
        },
        "compare": {k: v for k, v in (cmp or {}).items() if k != "files"},
        "verdicts": [x.as_dict() for x in verdicts],
    }
    json_path = os.path.join(out_dir, "report.json")
    with open(json_path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(_jsonable(summary), f, indent=1, ensure_ascii=False)
    os.replace(json_path + ".tmp", json_path)
    files["json"] = json_path
    md = _markdown(data, table, fits, grid, mech, cmp, verdicts, files, rel, command, note)
    with open(output + ".tmp", "w", encoding="utf-8") as f:
        f.write(md)
    os.replace(output + ".tmp", output)
    files["report"] = output
    return files


def _markdown(data, table, fits, grid, mech, cmp, verdicts, files, rel, command, note) -> str:
    m = data.manifest
    wall, n_wall = _wall_seconds(data)
    out = [f"# Study `{m['name']}`: measured reproduction report", ""]
    out += [
        "Made by `megatron-gamma report` from the run directories; every number below is "
        "measured, none is copied from the paper.",
        "",
        f"- sweep: `{m['sweep_command']}`",
        f"- report: `{command or 'megatron-gamma report ' + data.dir}`",
        f"- machine: {_machine()}",
        f"- runs: {len(data.finished)} of {len(data.runs)} finished; training wall time "
        f"{wall / 60:.1f} min summed over {n_wall} runs timed by this sweep (start-up included)",
    ]
    if note:
        out += [f"- note: {note}"]
    out += ["", "## Verdicts", "", "| claim | verdict | measured | rule |", "|---|---|---|---|"]
    for v in verdicts:
        out.append(f"| {v.claim} | **{v.verdict}** | {v.numbers} | {v.rule} |")
    out += [
        "",
        "## Runs",
        "",
        "| size | non-embedding params | total params | tokens | iterations |",
        "|---|---|---|---|---|",
    ]
    for size in data.sizes:
        r = next(r for r in data.runs if r["size"] == size)
        out.append(
            f"| {size} ({r['hidden_size']}×{r['num_layers']}) | {r['non_embedding']:,} | "
            f"{r['params']:,} | {r['tokens']:,} | {r['train_iters']} |"
        )
    out += [
        "",
        "Arms: "
        + "; ".join(
            f"`{a}` (γ={s['init_gamma']:g}, ε={s['norm_epsilon']:.0e}, gate {s['gated_attention']})"
            for a in data.arms
            for s in [data.settings(a)]
        ),
        "",
    ]
    out += [
        "## Final validation loss (held-out split)",
        "",
        "Mean ± sample sd over seeds; Δ = arm − baseline, paired by seed, with a 95% "
        "Student-t interval.",
        "",
        "| arm | size | seeds | loss | Δ vs baseline [95% CI] |",
        "|---|---|---|---|---|",
    ]
    for r in table:
        sd = f" ± {r['std']:.4f}" if r["std"] is not None else ""
        d = ""
        if "diff" in r:
            d = (
                f"{r['diff']:+.4f} [{r['diff_low']:+.4f}, {r['diff_high']:+.4f}]"
                if np.isfinite(r["diff_low"])
                else f"{r['diff']:+.4f} (1 seed)"
            )
        out.append(f"| {r['arm']} | {r['size']} | {r['seeds']} | {r['mean']:.4f}{sd} | {d} |")
    out += ["", f"![loss vs size]({rel}/loss_vs_size.png)" if "scaling_plot" in files else "", ""]
    out += [
        "## Scaling fits L(N) = E + A·N^(−α)",
        "",
        "N = non-embedding parameters (embedding and output layer excluded); fitted by least "
        "squares to every finished run's final loss (one point per size and seed); ± is one "
        "standard error (n/a with 3 points: no residual degrees of freedom). Multiplier: the N "
        "at which the baseline's fit reaches the arm's seed-mean loss, divided by the arm's N "
        "(paper: about 1.44 for γ = 1 with both fixes).",
        "",
        "A power law assumes the loss falls with N; where an arm's seed-mean loss rises from one "
        "size to the next, the last column says so and its fit and multipliers describe no "
        "scaling trend.",
        "",
        "| arm | E | A | α | rms residual | multiplier by size | loss rises with N |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, f in fits.items():
        fit: Optional[PowerLawFit] = f["fit"]
        mult = _multiplier_text(f) or "—"
        if fit is None:
            out.append(f"| {arm} | not fitted: {f['error']} | | | | {mult} | |")
        else:
            rises = ", ".join(f["loss_rises"]) or "no"
            out.append(
                f"| {arm} | {fit.e:.3f} ± {_f(fit.e_err, 3)} | {fit.a:.3g} ± "
                f"{fit.a_err:.3g} | {fit.alpha:.3f} ± {_f(fit.alpha_err, 3)} | "
                f"{fit.rms_residual:.4f} | {mult} | {rises} |"
            )
    out += ["", "## Loss against γ", ""]
    if grid:
        for size, g in grid.items():
            mn = g["minimum"]
            pts = ", ".join(f"γ={x:g}: {y:.4f}" for x, y in zip(g["gamma"], g["mean"], strict=True))
            if mn is not None:
                pts += (
                    f"; parabola minimum γ = {_f(mn.gamma, 3)} ± {_f(mn.gamma_err, 3)}, best "
                    f"measured γ = {mn.best_measured:g}"
                )
            out.append(f"- {size}: {pts}")
        if "gamma_plot" in files:
            out += ["", f"![loss vs gamma]({rel}/loss_vs_gamma.png)"]
    else:
        out.append("No γ grid in this study.")
    out += [
        "",
        "## Mechanisms",
        "",
        f"From `--log-diagnostics-interval` (first point at the first interval, not at "
        f"initialization). Uniform-attention sink share for sequence length "
        f"{data.seq_length()}: {uniform_sink_share(data.seq_length()):.4f}.",
        "",
        "| arm | size | max saturated share | final saturated share | final sink share | "
        "stable rank first → min → final |",
        "|---|---|---|---|---|---|",
    ]
    for key, e in mech.items():
        arm, size = key.split("|")
        rank = (
            f"{e['rank_first']:.2f} → {e['rank_min']:.2f} (it {e['rank_min_iteration']}) "
            f"→ {e['rank_final']:.2f}"
            if "rank_first" in e
            else "n/a"
        )
        out.append(
            f"| {arm} | {size} | {_f(e.get('saturation_max'))} | "
            f"{_f(e.get('saturation_final'))} | {_f(e.get('sink_final'))} | {rank} |"
        )
    for name, title in (
        ("saturation_plot", "saturation"),
        ("sink_plot", "sink"),
        ("stable_rank_plot", "stable rank"),
    ):
        if name in files:
            out += ["", f"![{title}]({rel}/{os.path.basename(files[name])})"]
    out += ["", "## Δsym by token difficulty (held-out)", ""]
    if cmp and "bins" in cmp:
        out += [
            f"A = `{cmp['arm']}`, B = `{data.baseline}`, size {cmp['size']}, seed "
            f"{cmp['seed']}, {cmp['tokens']} tokens; mean loss A {cmp['a']['mean_loss']:.4f},"
            f" B {cmp['b']['mean_loss']:.4f}; Δsym = (p_A − p_B)/(p_A + p_B).",
            "",
            "| difficulty (nats) | tokens | mean Δsym ± sem | A better |",
            "|---|---|---|---|",
        ]
        for b in cmp["bins"]:
            out.append(
                f"| {b['lo']:.2f}–{b['hi']:.2f} | {b['count']} | "
                f"{b['mean_delta']:+.4f} ± {b['sem_delta']:.4f} | {b['a_better']:.1%} |"
            )
        out += ["", f"![delta sym]({rel}/compare/delta_sym_by_difficulty.png)"]
    else:
        out.append(f"Not measured: {cmp['error'] if cmp else 'no finished pair of runs'}.")
    out.append("")
    return "\n".join(out)
