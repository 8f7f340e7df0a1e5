"""The verdict table of ``megatron-gamma report``: one row per claim of the paper (two for the
loss claims 1 and 3 when the study has an LR grid: at the shared LR and at each arm's own best
LR), each with its rule, the measured numbers and intervals it read, and a verdict. Never a
verdict without its numbers.

Verdicts:

- *reproduced*: the interval lies beyond the pre-registered margin δ in the claim's direction;
- *not reproduced*: the interval lies on the other side of δ (it excludes an effect of size δ
  in the claim's direction);
- *inconclusive*: the interval includes both, or there are too few seeds/sizes for an interval
  (df < 1), or an arm the claim needs is missing, or the data cannot show the effect;
- *not measurable at this scale*: the mechanism cannot act in these models (the number why).

Units of replication: seeds within a size (paired by seed); sizes across sizes (the mean of
per-size mean differences, Student-t with df = sizes − 1); never pooled (size, seed) pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import numpy as np

from megatron_gamma.study.analysis import StudyData, uniform_sink_share
from megatron_gamma.study.fits import Interval, paired_difference, t_interval, trend_interval

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NOT_MEASURABLE = "not measurable at this scale"
EPS_ACTS_MAX = 1.0
"""σ²_emb/ε at initialization above which ε cannot act on the first RMSNorm (σ² ≫ ε)."""
SATURATION_MIN = 0.01
"""Margin on the saturated-token share (1% of tokens) for claim 4."""
DIP_MIN = 0.05
"""Margin on the relative stable-rank dip (and recovery) for claim 7."""
EASY_SHARE = 0.3
"""Share of tokens (easiest first, by difficulty) counted as easy in the Δsym verdict."""
BOOTSTRAP = 2000
"""Resamples of the document-level bootstrap of claim 8."""


@dataclass
class Verdict:
    """One row of the verdict table.

    Attributes:
        claim: the paper's claim.
        verdict: one of the four verdicts.
        numbers: the measured effects with their intervals and degrees of freedom.
        rule: the decision rule.
        lr: which comparison: ``shared LR``, ``best LR`` or ``—`` (not a loss comparison).
    """

    claim: str
    verdict: str
    numbers: str
    rule: str
    lr: str = "—"

    def as_dict(self) -> dict:
        return {
            "claim": self.claim,
            "verdict": self.verdict,
            "numbers": self.numbers,
            "rule": self.rule,
            "lr": self.lr,
        }


def decide(iv: Interval, margin: float, direction: int) -> tuple[str, str]:
    """Verdict of an interval against the margin: the claim is ``effect < −margin``
    (direction −1) or ``effect > +margin`` (direction +1).

    Returns:
        (verdict, why): reproduced when the interval lies beyond the margin in the claim's
        direction, not reproduced when it lies entirely on the other side, else inconclusive
        (also without an interval, df < 1).
    """
    if not iv.has_interval:
        unit = iv.unit.split()[0]
        return INCONCLUSIVE, f"{iv.n} {unit[:-1] if iv.n == 1 else unit}: df < 1, no interval"
    thr = direction * margin
    beyond = iv.high < thr if direction < 0 else iv.low > thr
    short = iv.low > thr if direction < 0 else iv.high < thr
    if beyond:
        return REPRODUCED, f"the interval lies beyond {thr:+g}"
    if short:
        return NOT_REPRODUCED, f"the interval excludes an effect beyond {thr:+g}"
    return INCONCLUSIVE, f"the interval includes {thr:+g}"


def combine(verdicts: list[str]) -> str:
    """Several parts of one claim: not reproduced if any part is, reproduced if all are, else
    inconclusive."""
    if NOT_REPRODUCED in verdicts:
        return NOT_REPRODUCED
    if verdicts and all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return INCONCLUSIVE


def _scope(per_size: dict) -> str:
    return "across sizes" if len(per_size) > 1 else "at the one size"


def across_sizes(per_size: dict[str, Interval]) -> Interval:
    """Sizes as the unit: Student-t over the per-size mean differences (df = sizes − 1); with
    one size, that size's seed interval."""
    if len(per_size) == 1:
        return next(iter(per_size.values()))
    return t_interval([d.mean for d in per_size.values()], unit="sizes")


Losses = Callable[[str, str], dict[int, float]]


def _paired(get: Losses, data: StudyData, arm: str, ref: str) -> dict[str, Interval]:
    out = {}
    for s in data.sizes:
        a, b = get(arm, s), get(ref, s)
        common = sorted(set(a) & set(b))
        if common:
            out[s] = paired_difference([a[k] for k in common], [b[k] for k in common])
    return out


def _per_size_text(per_size: dict[str, Interval]) -> str:
    return "; ".join(f"{s}: {d.text()}" for s, d in per_size.items())


def _ratio_text(data: StudyData, arm: str) -> tuple[dict[str, float], str]:
    ratios = {
        s: r
        for s in data.arm_sizes(arm)
        if (r := data.embedding_variance_over_eps(arm, s)) is not None
    }
    st = data.settings(arm)
    need = st["norm_epsilon"] ** (-1 / (2 * st["init_gamma"]))
    text = (
        "σ²_emb/ε at init (γ = {:g}, ε = {:.0e}): ".format(st["init_gamma"], st["norm_epsilon"])
        + ", ".join(f"{s} {r:.3g}" for s, r in ratios.items())
        + f"; ε acts where σ²_emb ≲ ε, i.e. embedding fan-in ≥ ε^(−1/(2γ)) = {need:.0f}"
    )
    return ratios, text


def _loss_rises(data: StudyData, get: Losses, arm: str) -> list[str]:
    sizes = [s for s in data.sizes if get(arm, s)]
    means = [float(np.mean(list(get(arm, s).values()))) for s in sizes]
    return [
        f"{arm} {sizes[i - 1]} → {sizes[i]} ({means[i - 1]:.4f} → {means[i]:.4f})"
        for i in range(1, len(sizes))
        if means[i] >= means[i - 1]
    ]


def claim1(data: StudyData, get: Losses, lr: str) -> Verdict:
    """γ = 1 beats γ = 0.5 at the baseline's ε and gate."""
    claim = "γ = 1 beats γ = 0.5 (same ε = baseline's, no gate)"
    rule = (
        f"Δloss = γ=1 − baseline, paired by seed within a size; across sizes the mean of "
        f"per-size means (sizes as units, t with df = sizes − 1): reproduced if the interval "
        f"lies below −δ, not reproduced if above −δ (δ = {data.margin:g} nats)"
    )
    g1 = data.role("gamma1")
    if not g1:
        return Verdict(claim, INCONCLUSIVE, "no γ = 1 arm with the baseline's ε and gate", rule, lr)
    per_size = _paired(get, data, g1, data.baseline)
    if not per_size:
        return Verdict(claim, INCONCLUSIVE, f"no finished seed of {g1} and the baseline", rule, lr)
    total = across_sizes(per_size)
    verdict, why = decide(total, data.margin, -1)
    nums = f"Δloss {_per_size_text(per_size)}; {_scope(per_size)} {total.text()}: {why}"
    return Verdict(claim, verdict, nums, rule, lr)


def claim2(data: StudyData, get: Losses, lr: str) -> Verdict:
    """The gain of γ = 1 shrinks with size under ε = 1e-5 and no gate."""
    claim = "the gain of γ = 1 shrinks with size under ε = 1e-5 and no gate"
    rule = (
        "advantage (baseline − γ=1, paired by seed) against ln N: the change over the measured "
        "range (slope × ln(N_max/N_min)), sizes as units (df = sizes − 2; Welch over seeds with "
        "2 sizes), below −δ; both arms' losses must fall with N; not measurable where "
        f"σ²_emb/ε > {EPS_ACTS_MAX:g} at every size (ε cannot act)"
    )
    g1 = data.role("gamma1")
    if not g1:
        return Verdict(claim, INCONCLUSIVE, "no γ = 1 arm with the baseline's ε and gate", rule, lr)
    per_size = _paired(get, data, g1, data.baseline)
    if len(per_size) < 2:
        return Verdict(
            claim, INCONCLUSIVE, f"the γ = 1 arm is paired at {len(per_size)} size(s); a trend "
            "needs >= 2", rule, lr,
        )  # fmt: skip
    sizes = list(per_size)
    groups = []
    for s in sizes:
        a, b = get(g1, s), get(data.baseline, s)
        groups.append([b[k] - a[k] for k in sorted(set(a) & set(b))])
    x = np.log([data.size_n[s] for s in sizes])
    slope = trend_interval(x, groups)
    span = float(x[-1] - x[0])
    change = Interval(
        slope.mean * span, slope.low * span, slope.high * span, slope.n, slope.df, slope.unit
    )
    adv = "; ".join(f"{s}: {np.mean(g):+.4f}" for s, g in zip(sizes, groups, strict=True))
    nums = f"advantage {adv}; change over the range {change.text()}"
    ratios, rtext = _ratio_text(data, g1)
    nums += f"; {rtext}"
    if ratios and all(r > EPS_ACTS_MAX for r in ratios.values()):
        return Verdict(
            claim, NOT_MEASURABLE, nums + "; ε cannot act at any size, so whatever shrinks is "
            "not the paper's mechanism", rule, lr,
        )  # fmt: skip
    verdict, why = decide(change, data.margin, -1)
    rises = _loss_rises(data, get, g1) + _loss_rises(data, get, data.baseline)
    if rises and verdict == REPRODUCED:
        verdict = INCONCLUSIVE
        why += "; but loss rises with size: " + ", ".join(rises) + " (not a scaling trend)"
    return Verdict(claim, verdict, f"{nums}: {why}", rule, lr)


def claim3(data: StudyData, get: Losses, lr: str) -> Verdict:
    """Removing both blockers widens the gain: the interaction γ × fixes."""
    claim = "removing both blockers (smaller ε + gate) widens the gain of γ = 1"
    rule = (
        "interaction (γ=1+ε+gate − γ=1) − (γ=0.5+ε+gate − baseline), paired by seed within a "
        "size, sizes as units across sizes: reproduced if the interval lies below −δ, not "
        f"reproduced if above −δ (δ = {data.margin:g} nats)"
    )
    g1, g3, c = data.role("gamma1"), data.role("gamma1+eps+gate"), data.role("gamma0.5+eps+gate")
    if not g1 or not g3:
        return Verdict(claim, INCONCLUSIVE, "needs the γ = 1 and γ = 1+ε+gate arms", rule, lr)
    fix1 = _paired(get, data, g3, g1)
    if not c:
        nums = "fixes at γ = 1: " + _per_size_text(fix1) if fix1 else ""
        return Verdict(
            claim, INCONCLUSIVE, "the study has no γ = 0.5 + fixes arm; the gate's main effect "
            f"cannot be separated. {nums}", rule, lr,
        )  # fmt: skip
    per_size, parts = {}, []
    for s in data.sizes:
        arms = [get(a, s) for a in (g3, g1, c, data.baseline)]
        seeds = sorted(set.intersection(*(set(a) for a in arms)))
        if not seeds:
            continue
        f1 = np.mean([arms[0][k] - arms[1][k] for k in seeds])
        f05 = np.mean([arms[2][k] - arms[3][k] for k in seeds])
        per_size[s] = t_interval(
            [(arms[0][k] - arms[1][k]) - (arms[2][k] - arms[3][k]) for k in seeds]
        )
        parts.append(
            f"{s} (seeds {seeds}): fixes at γ=1 {f1:+.4f}, at γ=0.5 {f05:+.4f}, "
            f"interaction {per_size[s].text()}"
        )
    if not per_size:
        return Verdict(
            claim, INCONCLUSIVE, "no seed has all four arms (γ ∈ {0.5, 1} × fixes) at one size",
            rule, lr,
        )  # fmt: skip
    total = across_sizes(per_size)
    verdict, why = decide(total, data.margin, -1)
    nums = "; ".join(parts) + f"; {_scope(per_size)} {total.text()}: {why}"
    return Verdict(claim, verdict, nums, rule, lr)


def _largest_with(data: StudyData, arms: list[str], prefix: str) -> Optional[str]:
    return next(
        (s for s in reversed(data.sizes) if all(data.seed_series(a, s, prefix) for a in arms)),
        None,
    )


def claim4(data: StudyData) -> Verdict:
    """ε = 1e-5 saturates RMSNorm under small initialization."""
    claim = "ε = 1e-5 saturates RMSNorm under small initialization"
    rule = (
        "max saturated-token share, γ=1 (ε=1e-5) − γ=1+ε (smaller ε), paired by seed at the "
        f"largest size: reproduced if the interval lies above {SATURATION_MIN:g}; not "
        f"measurable where σ²_emb/ε > {EPS_ACTS_MAX:g} at every size"
    )
    g1, g2 = data.role("gamma1"), data.role("gamma1+eps")
    if not g1:
        return Verdict(claim, INCONCLUSIVE, "needs the γ = 1 and γ = 1+ε arms", rule)
    ratios, rtext = _ratio_text(data, g1)
    if ratios and all(r > EPS_ACTS_MAX for r in ratios.values()):
        return Verdict(claim, NOT_MEASURABLE, rtext, rule)  # whatever other arms there are
    if not g2:
        return Verdict(claim, INCONCLUSIVE, f"needs the γ = 1+ε arm; {rtext}", rule)
    size = _largest_with(data, [g1, g2], "norm_saturated")
    if size is None:
        return Verdict(claim, INCONCLUSIVE, f"no saturation diagnostics; {rtext}", rule)
    a, b = (data.seed_series(x, size, "norm_saturated") for x in (g1, g2))
    seeds = sorted(set(a) & set(b))
    d = paired_difference([max(a[k].values()) for k in seeds], [max(b[k].values()) for k in seeds])
    verdict, why = decide(d, SATURATION_MIN, +1)
    return Verdict(
        claim, verdict, f"{size}: Δ max saturated share {d.text()}: {why}; {rtext}", rule
    )


def claim5(data: StudyData) -> Verdict:
    """Small initialization strengthens the attention sink; gating removes it."""
    claim = "small initialization strengthens the attention sink; gating removes it"
    rule = (
        "final sink share paired by seed at the largest size: γ=1 − baseline > 0 (only γ "
        "differs) and γ=1+ε+gate − γ=1+ε < 0 (only the gate differs), each interval against 0; "
        "not measurable when no arm's share exceeds uniform attention's (no sink has formed)"
    )
    g1, g2, g3 = data.role("gamma1"), data.role("gamma1+eps"), data.role("gamma1+eps+gate")
    small = g1 or g2
    if not small:
        return Verdict(claim, INCONCLUSIVE, "needs the γ = 1, γ = 1+ε and γ = 1+ε+gate arms", rule)
    arms = list(dict.fromkeys(a for a in (data.baseline, small, g2, g3) if a))
    size = _largest_with(data, arms, "sink_share")
    if size is None:
        return Verdict(claim, INCONCLUSIVE, "no sink diagnostics at a size with all arms", rule)
    final = {}
    for a in arms:
        final[a] = {k: v[max(v)] for k, v in data.seed_series(a, size, "sink_share").items()}
    uni = uniform_sink_share(data.seq_length())
    means = ", ".join(f"{a} {np.mean(list(final[a].values())):.4f}" for a in arms)
    nums = f"{size}: sink share {means} (uniform attention {uni:.4f})"
    if max(v for a in arms for v in final[a].values()) <= uni:
        return Verdict(
            claim, NOT_MEASURABLE, nums + "; no sink has formed: every share is at or below "
            "uniform attention's", rule,
        )  # fmt: skip
    if not (g2 and g3):  # a sink has formed: the gate's part needs both ε arms
        need = "needs the γ = 1+ε and γ = 1+ε+gate arms"
        return Verdict(claim, INCONCLUSIVE, f"{need}; {nums}", rule)
    parts, verdicts = [], []
    for arm, ref, direction, label in ((small, data.baseline, 1, "γ"), (g3, g2, -1, "gate")):
        seeds = sorted(set(final[arm]) & set(final[ref]))
        d = paired_difference([final[arm][k] for k in seeds], [final[ref][k] for k in seeds])
        v, why = decide(d, 0.0, direction)
        parts.append(f"effect of {label} {d.text()}: {why}")
        verdicts.append(v)
    return Verdict(claim, combine(verdicts), nums + "; " + "; ".join(parts), rule)


def claim6(data: StudyData, grid: dict) -> Verdict:
    """Loss is best at γ = 1 (worse above)."""
    claim = "loss is best at γ = 1 (worse above)"
    rule = (
        "at matched seeds only: the best γ (lowest seed-mean loss) with its 95% interval from "
        "resampling seeds; reproduced if the interval is γ = 1 alone, not reproduced if it "
        "excludes γ = 1"
    )
    if not grid:
        return Verdict(claim, INCONCLUSIVE, "no γ grid in this study", rule)
    parts, verdicts = [], []
    for size, g in grid.items():
        seeds = ", ".join(f"γ={k:g} {v}" for k, v in g["all_seeds"].items())
        b = g["best"]
        if b is None or 1.0 not in g["gamma"]:
            parts.append(f"{size}: no seed finished every γ (seeds {seeds})")
            verdicts.append(INCONCLUSIVE)
            continue
        pts = ", ".join(f"γ={x:g} {y:.4f}" for x, y in zip(g["gamma"], g["mean"], strict=True))
        sd = f"{g['seed_sd']:.4f}" if g["seed_sd"] is not None else "n/a"
        text = (
            f"{size} ({g['lr']}) at matched seed(s) {g['seeds']}: {pts}; best γ = "
            f"{b['best']:g}, ahead of the runner-up by {g['gap']:.4f} (seed sd {sd})"
        )
        if b["seeds"] < 2:
            parts.append(f"{text}; 1 seed: no interval")
            verdicts.append(INCONCLUSIVE)
            continue
        share = ", ".join(f"γ={k:g} {v:.0%}" for k, v in sorted(b["share"].items()))
        parts.append(f"{text}; interval of the best γ [{b['low']:g}, {b['high']:g}] ({share})")
        if b["low"] == b["high"] == 1.0:
            verdicts.append(REPRODUCED)
        elif not b["low"] <= 1.0 <= b["high"]:
            verdicts.append(NOT_REPRODUCED)
        else:
            verdicts.append(INCONCLUSIVE)
    return Verdict(claim, combine(verdicts), "; ".join(parts), rule)


def _dip_rise(series: dict[int, float]) -> tuple[float, float]:
    its = sorted(series)
    low = min(its[:-1], key=series.get)
    return 1 - series[low] / series[its[0]], series[its[-1]] / series[low] - 1


def claim7(data: StudyData) -> Verdict:
    """Condensation then expansion, against each arm's matched control."""
    claim = "condensation then expansion: stable rank dips early at γ = 1, not at γ = 0.5"
    rule = (
        "each γ=1 arm against its matched control (same ε and gate, γ = 0.5), from iteration 0, "
        "paired by seed at the largest size: dip (1 − min/initial stable rank) of the arm − "
        f"control's above {DIP_MIN:g}, and the arm's recovery (final/min − 1) above {DIP_MIN:g}"
    )
    pairs = []
    for name in ("gamma1", "gamma1+eps", "gamma1+eps+gate"):
        arm = data.role(name)
        if arm and (ctrl := data.matched_control(arm)):
            pairs.append((arm, ctrl))
    if not pairs:
        return Verdict(claim, INCONCLUSIVE, "no γ = 1 arm with a matched γ = 0.5 control", rule)
    parts, verdicts = [], []
    for arm, ctrl in pairs:
        size = _largest_with(data, [arm, ctrl], "stable_rank")
        if size is None:
            continue
        a, b = (data.seed_series(x, size, "stable_rank") for x in (arm, ctrl))
        seeds = sorted(k for k in set(a) & set(b) if len(a[k]) >= 3 and len(b[k]) >= 3)
        if not seeds:
            continue
        first = min(min(a[k]) for k in seeds)
        if first != 0:
            parts.append(
                f"{arm} vs {ctrl} ({size}): the first stable rank is logged at iteration "
                f"{first}, not at initialization, so an early collapse is unobserved"
            )
            verdicts.append(INCONCLUSIVE)
            continue
        da, db = ([_dip_rise(x[k]) for k in seeds] for x in (a, b))
        dip = paired_difference([x[0] for x in da], [x[0] for x in db])
        rise = t_interval([x[1] for x in da])
        v1, why1 = decide(dip, DIP_MIN, +1)
        v2, why2 = decide(rise, DIP_MIN, +1)
        parts.append(
            f"{arm} vs {ctrl} ({size}): Δdip {dip.text(3)} ({why1}); recovery {rise.text(3)} "
            f"({why2})"
        )
        verdicts.append(combine([v1, v2]))
    if not parts:
        return Verdict(claim, INCONCLUSIVE, "needs >= 3 stable-rank points per arm", rule)
    return Verdict(claim, combine(verdicts), "; ".join(parts), rule)


def delta_sym_concentration(
    seeds: dict[int, dict], resamples: int = BOOTSTRAP, rng_seed: int = 0
) -> dict:
    """Hard − easy mean Δsym per seed and averaged over seeds, with a document-level bootstrap.

    A uniform improvement (``log p_A = log p_B + c`` on every token) gives Δsym = tanh(c/2) on
    every token, a flat profile: hard − easy = 0 is its null. Easy tokens: difficulty at or
    below the seed's ``EASY_SHARE`` quantile.

    Args:
        seeds: {seed: {"delta": (n,) Δsym, "difficulty": (n,) nats, "document": (n,) int}}.

    Returns:
        {"per_seed": {seed: stat}, "mean", "low", "high" (percentile 95% interval of the mean
        over seeds, resampling documents within each seed), "null": {seed: tanh(c/2)}}.
    """
    rng = np.random.default_rng(rng_seed)
    prepared, per_seed, null = [], {}, {}
    for seed, t in seeds.items():
        delta = np.asarray(t["delta"], dtype=np.float64).ravel()
        diff = np.asarray(t["difficulty"], dtype=np.float64).ravel()
        docs = np.asarray(t["document"]).ravel()
        hard = diff > np.quantile(diff, EASY_SHARE)
        _, inv = np.unique(docs, return_inverse=True)
        k = int(inv.max()) + 1
        sums = np.stack(
            [
                np.bincount(inv, weights=delta * hard, minlength=k),
                np.bincount(inv, weights=hard.astype(float), minlength=k),
                np.bincount(inv, weights=delta * ~hard, minlength=k),
                np.bincount(inv, weights=(~hard).astype(float), minlength=k),
            ]
        )
        prepared.append(sums)
        per_seed[seed] = float(sums[0].sum() / sums[1].sum() - sums[2].sum() / sums[3].sum())
        null[seed] = float(np.tanh(np.arctanh(np.clip(delta, -0.999999, 0.999999)).mean()))
    boot = np.zeros(resamples)
    for sums in prepared:
        idx = rng.integers(0, sums.shape[1], size=(resamples, sums.shape[1]))
        s = sums[:, idx].sum(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            boot += s[0] / s[1] - s[2] / s[3]
    boot /= len(prepared)
    low, high = np.nanquantile(boot, [0.025, 0.975])
    return {
        "per_seed": per_seed,
        "mean": float(np.mean(list(per_seed.values()))),
        "low": float(low),
        "high": float(high),
        "null": null,
    }


def claim8(data: StudyData, cmp: Optional[dict]) -> Verdict:
    """The gains concentrate on mid/high-difficulty tokens."""
    claim = "the gains concentrate on mid/high-difficulty tokens"
    rule = (
        f"mean Δsym on the hardest {1 - EASY_SHARE:.0%} of tokens − on the easiest "
        f"{EASY_SHARE:.0%} (best arm vs baseline, held-out, >= 2 seeds), against 0 (a uniform "
        "improvement of the same mean gives a flat profile); 95% interval from a document-level "
        "bootstrap averaged over seeds"
    )
    if not cmp or cmp.get("error"):
        why = cmp["error"] if cmp else "no pair of finished best-arm and baseline runs"
        return Verdict(claim, INCONCLUSIVE, f"compare: {why}", rule)
    seeds = cmp["seeds"]
    head = f"{cmp['arm']} vs {data.baseline} at {cmp['size']}"
    if len(seeds) < 2:
        return Verdict(
            claim, INCONCLUSIVE, f"{head}: {len(seeds)} seed ({sorted(seeds)}); the profile "
            "needs >= 2 seeds", rule,
        )  # fmt: skip
    r = delta_sym_concentration(seeds)
    per = ", ".join(f"seed {k} {v:+.4f}" for k, v in r["per_seed"].items())
    null = ", ".join(f"{v:+.4f}" for v in r["null"].values())
    iv = Interval(r["mean"], r["low"], r["high"], len(seeds), math.nan, "seeds")
    verdict, why = decide(iv, 0.0, +1)
    nums = (
        f"{head}: hard − easy Δsym {per}; mean {r['mean']:+.4f} [{r['low']:+.4f}, "
        f"{r['high']:+.4f}] (document bootstrap, {len(seeds)} seeds): {why}; uniform-improvement "
        f"level tanh(c/2) per seed {null}"
    )
    return Verdict(claim, verdict, nums, rule)


def _bracketed(data: StudyData, row: Verdict, arms: list[Optional[str]]) -> Verdict:
    """``row`` (a comparison at each arm's own best LR), made inconclusive where the best LR
    of one of ``arms`` lies on its grid's edge: its own best LR is then not known."""
    edges = [e for a in arms if a for s in data.sizes for e in [data.edge_lr(a, s)] if e]
    if not edges:
        return row
    verdict = INCONCLUSIVE if row.verdict in (REPRODUCED, NOT_REPRODUCED) else row.verdict
    numbers = f"{row.numbers}; the best LR is not bracketed: {'; '.join(edges)}"
    return Verdict(row.claim, verdict, numbers, row.rule, row.lr)


def verdicts(data: StudyData, grid: dict, cmp: Optional[dict]) -> list[Verdict]:
    """The rows in the paper's order; claims 1–3 at the shared LR and, with an LR grid, again at
    each arm's own best LR (chosen on the selection seed, compared on the other seeds; a
    decisive verdict there needs every compared arm's best LR inside its grid).

    Args:
        data: the study.
        grid: :func:`~.analysis.gamma_grid`.
        cmp: the Δsym comparison (:func:`claim8`), or None.
    """
    comparisons = [("shared LR", lambda a, s: data.losses(a, s))]
    if data.has_lr_grid:
        comparisons.append(("best LR", data.confirm_losses))
    pair = [data.role("gamma1"), data.baseline]
    four = [*pair, data.role("gamma1+eps+gate"), data.role("gamma0.5+eps+gate")]
    rows = []
    for claim, arms in ((claim1, pair), (claim2, pair), (claim3, four)):
        for label, get in comparisons:
            row = claim(data, get, label)
            rows.append(_bracketed(data, row, arms) if label == "best LR" else row)
    rows += [claim4(data), claim5(data), claim6(data, grid), claim7(data), claim8(data, cmp)]
    return rows
