"""The verdict table of ``megatron-gamma report``: one row per claim of the paper, each with its
rule, the measured numbers it read, and *reproduced*, *not reproduced* or *not measurable at this
scale* with the reason. Never a verdict without its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megatron_gamma.study.analysis import fmt, multiplier_text, uniform_sink_share
from megatron_gamma.study.fits import paired_difference

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


def _diff_text(d) -> str:
    if np.isfinite(d.low):
        return f"{d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}]"
    return f"{d.mean:+.4f} ({d.seeds} seed, no interval)"


def verdicts(data, diffs, fits, grid, mech, cmp) -> list[Verdict]:  # noqa: C901
    """The eight rows, in the paper's order, from the outputs of
    :mod:`~megatron_gamma.study.analysis` and ``compare`` (``cmp``: its compare.json plus
    ``arm``/``size``/``seed``, or ``{"error": ...}``, or None)."""
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
            nums += "; effective-size multiplier of γ=1+ε+gate: " + multiplier_text(fits[g3])
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
                f"{fmt(m.gamma, 3)} ± {fmt(m.gamma_err, 3)}; losses "
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
