"""The verdict table of ``megatron-gamma report``: one row per claim of the paper (two for the
loss claims 1-3 and 6: at the shared LR and at each arm's own best LR, the latter inconclusive
when the study has no LR grid), each with its rule, the measured numbers and intervals it read,
and a verdict. Never a verdict without its numbers.

Verdicts:

- *reproduced*: the interval lies beyond the pre-registered margin δ in the claim's direction;
- *not reproduced*: the interval lies on the other side of δ (it excludes an effect of size δ
  in the claim's direction);
- *inconclusive*: the interval includes both, or there are too few seeds/sizes for an interval
  (df < 1), or an arm the claim needs is missing, or a planned run of an arm it compares has
  not finished or has diverged (:func:`_complete`), or seeds of an arm it compares start from
  the same weights (:func:`_independent`), or the data cannot show the effect;
- *not measurable at this scale*: the mechanism cannot act in these models (the number why),
  and a measured null in models that learned says so;
- *not measurable in these runs*: the runs are too short to show it, whatever the scale: a
  compared arm has not learned (its mean final loss is not below the held-out loss of the train
  split's token frequencies, at a size the row judges: :attr:`Verdict.sizes`, :func:`_learned`;
  claim 8 also reads the compared checkpoints' own loss; a null otherwise not measurable at
  this scale included, since training length would explain it as well), or a γ = 1 arm's
  stable rank is still falling at its last logged point, or its control's still dipping there
  (claim 7); longer runs, not larger models, would measure it. Claim 7 also says it where a
  seed of a compared pair logged fewer than 6 stable-rank points after iteration 0 (too few
  to read a minimum without selection bias: the same runs logged more densely would measure
  it). Claim 5 also says it where no
  sink has formed in the runs, and of a part (γ, the gate) where neither of its own two arms
  formed one: whether larger models or longer training would form one is not separated.

In a study with an LR grid a mechanism row (claims 4, 5, 7, 8 at the shared LR), decided or
*not measurable ...*, is inconclusive where a compared arm may have run more than δ (in loss)
from its own best LR (:func:`_lr_confounded`): a null is then not credited to the scale or
training length alone. Claim 7 is also read at each arm's own best LR, a row that gives the
numbers and decides nothing (:func:`_unbounded_best_lr`: the grid bounds the loss a pick gives
up, not how far a diagnostic moves with the LR).

A decided verdict that covers less than the claim says so in its scope (:attr:`Verdict.scope`):
a loss claim's shared-LR row holds "at one shared LR, not tuned per arm"; a two-part claim
with one part unmeasured covers the measured part only.

Units of replication: seeds within a size (paired by seed); sizes across sizes (the mean of
per-size mean differences, Student-t with df = sizes − 1; a trend needs >= 3 sizes, df =
sizes − 2); never pooled (size, seed) pairs, and never tokens or documents of one run (claim 8
is Student-t over per-seed values, with the sampling of the documents every seed scored added to
its interval). Each compared pair differs in one setting
(:meth:`~.analysis.StudyData.matching`); claim 8's arm is fixed in advance
(:func:`concentration_arm`), not chosen by loss. Every row is its own 95% call: the table does
not adjust for multiplicity, and the report says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from megatron_gamma.diagnostics.attention import uniform_sink_share
from megatron_gamma.diagnostics.norm import SATURATION_FACTOR
from megatron_gamma.study.analysis import (
    RANK_WINDOW,
    StudyData,
    gamma_grid_arms,
    rank_dip,
    rank_window,
)
from megatron_gamma.study.fits import (
    Interval,
    crossed_interval,
    paired_difference,
    size_interval,
    t_interval,
    trend_interval,
)

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NOT_MEASURABLE = "not measurable at this scale"
NOT_MEASURED = "not measurable in these runs"
"""The runs are too short to show the effect, whatever the scale (module docstring)."""
EXPLAINS_NULL = ", which explains the null"
"""How a *not measurable at this scale* row credits its null to the scale; :func:`_learned`
drops it where a compared arm has not learned (training length then explains it as well)."""
EPS_ACTS_MAX = SATURATION_FACTOR
"""σ²_emb/ε at initialization above which ε cannot act on the first RMSNorm: the saturation
diagnostic's own threshold (a token is saturated when σ²(h) <= 10 ε,
:data:`~megatron_gamma.diagnostics.norm.SATURATION_FACTOR`)."""
SATURATION_MIN = 0.01
"""Margin on the saturated-token share (1% of tokens) for claim 4."""
SINK_MIN = 0.01
"""Margin on the sink share (1% of the attention mass) for claim 5: on the effects (γ, gate),
and on the sink itself: a sink has formed only where an arm's seed-mean final share exceeds
both uniform attention's and its own first logged share (iteration 0) by more than this, since
a smaller excess, or one present at initialization, is below the smallest effect the rule
counts."""
DIP_MIN = 0.05
"""Margin on the relative stable-rank dip (and recovery) for claim 7."""
END_SHARE = 0.1
"""Share of training (of the last logged iteration) over which claim 7 expresses how far a
control still falls at its end (:func:`_end_fall`)."""
FIT_SHARE = 0.2
"""Share of training at its end whose logged points claim 7 fits the control's end slope to
(:func:`_end_fall`)."""
EASY_SHARE = 0.3
"""Share of tokens (easiest first, by difficulty) counted as easy in the Δsym verdict."""
CONCENTRATION_MIN = 0.01
"""Margin on hard − easy mean Δsym (Δsym lies in [−1, 1]) for claim 8."""
UNFINISHED_LISTED = 6
"""Unfinished (or diverged) runs named in a row that they keep undecided (the rest are
counted)."""


@dataclass
class Verdict:
    """One row of the verdict table.

    Attributes:
        claim: the paper's claim.
        verdict: one of the five verdicts (module docstring).
        numbers: the measured effects with their intervals and degrees of freedom.
        rule: the decision rule.
        lr: which runs the row reads: ``shared LR`` (every arm at the study's shared LR; the
            mechanism claims 4 and 5 and the Δsym claim 8 read only these, and claim 7 without
            an LR grid) or ``best LR`` (each arm at its own best LR).
        scope: what a decided verdict covers when that is less than the claim (e.g. one part
            of a two-part claim), printed beside the verdict; empty when it covers the claim.
        sizes: the model sizes (the study's size names) whose runs the row's numbers compare,
            e.g. only the largest for the mechanism claims; the not-learned check
            (:func:`_learned`) reads these only. Empty when the row compared none.
        reason: why the study cannot test the row, where it cannot: an arm, grid or run it
            lacks, runs unfinished or not learned, a mechanism that cannot act or did not
            show (``not measurable ...``). The same text is part of ``numbers`` (report.md's
            column), built from one string; the console prints it with the verdict
            (:meth:`console_line`). Empty where the numbers decide the row, or leave it open
            by their interval alone.
        routes: the ways the row can be called reproduced, each by an interval at the 2.5%
            level (one side): 2 for claims 1 and 3 over two or more sizes, called across
            sizes or at each measured size (:func:`at_each_size`), else 1; the report's
            multiplicity bound sums them (trial 13, finding 3).
    """

    claim: str
    verdict: str
    numbers: str
    rule: str
    lr: str = "shared LR"
    scope: str = ""
    sizes: tuple[str, ...] = ()
    reason: str = ""
    routes: int = 1

    def label(self) -> str:
        """The verdict with its scope: ``reproduced (the γ part only; …)``."""
        return f"{self.verdict} ({self.scope})" if self.scope else self.verdict

    def console_line(self) -> str:
        """The row as ``report`` prints it on the console: claim, LR, :meth:`label` and, where
        the study cannot test the row, its :attr:`reason`."""
        line = f"- {self.claim} [{self.lr}]: {self.label()}"
        return f"{line}: {self.reason}" if self.reason else line

    def as_dict(self) -> dict:
        return {
            "claim": self.claim,
            "verdict": self.verdict,
            "scope": self.scope,
            "numbers": self.numbers,
            "rule": self.rule,
            "lr": self.lr,
            "sizes": list(self.sizes),
            "reason": self.reason,
        }


def decide(iv: Interval, margin: float, direction: int) -> tuple[str, str]:
    """Verdict of an interval against the margin: the claim is ``effect < −margin``
    (direction −1) or ``effect > +margin`` (direction +1).

    Returns:
        (verdict, why): reproduced when the interval lies beyond the margin in the claim's
        direction, not reproduced when it lies entirely on the other side, else inconclusive
        (also without an interval: df < 1, every unit the same value, or a unit that is NaN
        or inf, e.g. a diverged run's loss).
    """
    if iv.nonfinite:
        unit = iv.unit.split()[0]
        return INCONCLUSIVE, (
            f"{iv.nonfinite} of {iv.n} {unit} not finite (NaN or inf, e.g. a diverged run), no "
            f"interval: such a {unit[:-1]} is neither dropped (its failure is part of the result) "
            "nor averaged"
        )
    if iv.no_spread and iv.is_slope:
        return INCONCLUSIVE, (
            f"the {iv.n} {iv.unit.split()[0]} lie on an exact line (residual sd 0), no interval: "
            "check that the arms differ"
        )
    if iv.no_spread:
        return INCONCLUSIVE, (
            f"all {iv.n} {iv.unit.split()[0]} give the same value (sd 0), no interval: check that "
            "the seed changes the run and that the arms differ"
        )
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


def _untested(claim: str, why: str, rule: str, lr: str = "shared LR") -> Verdict:
    """An inconclusive row the study cannot test, whose numbers are its reason ``why``."""
    return Verdict(claim, INCONCLUSIVE, why, rule, lr, reason=why)


def _reasons(*parts: str) -> str:
    """Reasons joined, the empty ones left out."""
    return "; ".join(p for p in parts if p)


def _scope(per_size: dict[str, Interval]) -> str:
    """How the per-size intervals combine: "at the one size", or "across sizes", which with a
    single seed at every size says that the interval is the spread between the sizes alone
    (seed noise is inside it, not measured apart: valid for sizes as units, and narrower than
    no interval at any size)."""
    if len(per_size) == 1:
        return "at the one size"
    if all(d.n == 1 for d in per_size.values()):
        return (
            "across sizes (one seed at every size: the spread between sizes, seed noise inside "
            "it but not measured apart)"
        )
    return "across sizes"


def across_sizes(per_size: dict[str, Interval]) -> Interval:
    """Sizes as the unit: Student-t over the per-size mean differences (df = sizes − 1), no
    narrower than the seed noise within the sizes allows (:func:`~.fits.size_interval`); with
    one size, that size's seed interval."""
    if len(per_size) == 1:
        return next(iter(per_size.values()))
    return size_interval(list(per_size.values()))


def at_each_size(across: str, per_size: dict[str, str]) -> tuple[str, str, str]:
    """The call where the across-sizes interval leaves a claim open but every size decides it
    the same way: an intersection-union call at the measured sizes, seeds the unit within each.

    With few sizes the across-sizes interval is wide (df = sizes − 1: with two sizes t = 12.7,
    so sizes whose effects differ in size but not in sign leave it inconclusive), while each
    size's own interval, over its seeds, may be decided. Where ``across`` is inconclusive and
    every one of two or more sizes is reproduced (or every one not reproduced), that verdict
    holds at the measured sizes, not beyond them, and says so in its scope. Where the
    across-sizes interval is decided but a size's own interval decides the opposite (a gain on
    average that reverses at the largest size), the row is inconclusive.

    Args:
        across: the verdict of the across-sizes interval.
        per_size: {size: the verdict of that size's interval(s)}.

    With one size the interval is that size's over its seeds, and a decided ``across`` is
    scoped "at SIZE only, seeds as units; not across sizes" (trial 13, finding 2: a one-width
    study printed a bare "reproduced", which reads as a claim about scale).

    Returns:
        (verdict, scope, text): ``across`` and "" where it is decided and no size opposes it,
        or where the sizes do not all agree; inconclusive where a size opposes a decided
        ``across``; text lists each size's verdict where there are two or more sizes.
    """
    if len(per_size) == 1:
        decided = across in (REPRODUCED, NOT_REPRODUCED)
        scope = f"at {next(iter(per_size))} only, seeds as units; not across sizes"
        return across, scope if decided else "", ""
    if not per_size:
        return across, "", ""
    text = "at each size: " + ", ".join(f"{s} {v}" for s, v in per_size.items())
    calls = set(per_size.values())
    opposite = {REPRODUCED: NOT_REPRODUCED, NOT_REPRODUCED: REPRODUCED}.get(across)
    if against := [s for s, v in per_size.items() if v == opposite]:
        return (
            INCONCLUSIVE,
            "",
            (
                f"{text}: the sizes disagree, {', '.join(against)} {opposite} where the "
                f"across-sizes interval says {across}, so neither holds for every size"
            ),
        )
    if across != INCONCLUSIVE or len(calls) != 1 or calls <= {INCONCLUSIVE}:
        return across, "", text
    (verdict,) = calls
    scope = f"at each measured size ({', '.join(per_size)}), seeds as units; not across sizes"
    return verdict, scope, f"{text}: {verdict} at every measured size"


Losses = Callable[[str, str], dict[int, float]]


def _paired(get: Losses, data: StudyData, arm: str, ref: str) -> dict[str, Interval]:
    out = {}
    for s in data.sizes:
        a, b = get(arm, s), get(ref, s)
        common = sorted(set(a) & set(b))
        if common:
            out[s] = paired_difference([a[k] for k in common], [b[k] for k in common])
    return out


def _unpaired(get: Losses, data: StudyData, arms: list[Optional[str]]) -> str:
    """The seeds that some of ``arms`` have at a size and others lack, which the pairing
    leaves out, as text ("" where every arm has the same seeds at every size where two or more
    have any): a run missing from ``study.json`` is not among the unfinished runs
    (:meth:`~.analysis.StudyData.incomplete` reads the manifest), so the row would otherwise
    be judged on fewer seeds without a word (trial 13, finding 4)."""
    parts = []
    for s in data.sizes:
        seeds = {a: set(get(a, s)) for a in dict.fromkeys(x for x in arms if x)}
        present = {a: k for a, k in seeds.items() if k}
        union = set().union(*present.values()) if len(present) > 1 else set()
        lacking = [
            f"{a} lacks seed{'s' if len(union - k) > 1 else ''} "
            f"{', '.join(map(str, sorted(union - k)))}"
            for a, k in present.items()
            if union - k
        ]
        if lacking:
            parts.append(f"{s}: {', '.join(lacking)}")
    if not parts:
        return ""
    return (
        f"paired only on the seeds every compared arm has, so some are left out ({'; '.join(parts)}"
        "): check that no run is missing from study.json"
    )


def _per_size_text(per_size: dict[str, Interval]) -> str:
    return "; ".join(f"{s}: {d.text()}" for s, d in per_size.items())


def _ratio_text(data: StudyData, arm: str) -> tuple[dict[str, float], str]:
    """({size: σ²_emb/ε at init}, its text) of ``arm``: σ_emb as its runs drew the embedding
    (:meth:`~.analysis.StudyData.embedding_init`: the embedding's own γ where
    ``init_gamma_overrides`` sets one, init_method_std under ``init_method: normal``)."""
    sizes = data.arm_sizes(arm)
    ratios = {s: r for s in sizes if (r := data.embedding_variance_over_eps(arm, s)) is not None}
    st = data.settings(arm)
    eps = st["norm_epsilon"]
    gammas = {i.gamma for s in sizes if (i := data.embedding_init(arm, s))}
    how = f"ε acts where σ²_emb ≤ {EPS_ACTS_MAX:g}ε (the saturation diagnostic's threshold)"
    if len(gammas) == 1 and None not in gammas:
        (g,) = gammas
        head = f"σ²_emb/ε at init (γ = {g:g}"
        if g != st["init_gamma"]:
            head += " for the embedding, from init_gamma_overrides "
            head += f"({arm}'s γ {st['init_gamma']:g})"
        need = (EPS_ACTS_MAX * eps) ** (-1 / (2 * g))
        how += f", i.e. embedding fan-in ≥ ({EPS_ACTS_MAX:g}ε)^(−1/(2γ)) = {need:.0f}"
    elif gammas == {None}:
        head = "σ²_emb/ε at init (init_method normal: σ_emb = init_method_std whatever γ"
    else:
        head = "σ²_emb/ε at init (σ_emb as each run drew it"
    text = (
        f"{head}, ε = {eps:.0e}): "
        + ", ".join(f"{s} {r:.3g}" for s, r in ratios.items())
        + f"; {how}"
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


def _baseline_settings(data: StudyData) -> str:
    st = data.settings(data.baseline)
    return f"ε = {st['norm_epsilon']:.0e}, gate {st['gated_attention']}"


def claim1(data: StudyData, get: Losses, lr: str) -> Verdict:
    """γ = 1 beats the baseline's γ at the baseline's ε and gate."""
    gamma = data.settings(data.baseline)["init_gamma"]
    claim = f"γ = 1 beats γ = {gamma:g} (both with the baseline's {_baseline_settings(data)})"
    rule = (
        f"Δloss = γ=1 − baseline, paired by seed within a size; across sizes the mean of "
        f"per-size means (sizes as units, t with df = sizes − 1): reproduced if the interval "
        f"lies below −δ, not reproduced if above −δ (δ = {data.margin:g} nats); where that "
        "interval is inconclusive but every size's (seeds as units) says the same, that holds "
        "at the measured sizes"
    )
    g1 = data.role("gamma1")
    if not g1:
        return _untested(claim, "no γ = 1 arm with the baseline's ε and gate", rule, lr)
    per_size = _paired(get, data, g1, data.baseline)
    if not per_size:
        return _untested(claim, f"no finished seed of {g1} and the baseline", rule, lr)
    total = across_sizes(per_size)
    across, why = decide(total, data.margin, -1)
    each = {s: decide(d, data.margin, -1)[0] for s, d in per_size.items()}
    verdict, scope, text = at_each_size(across, each)
    nums = f"Δloss {_per_size_text(per_size)}; {_scope(per_size)} {total.text()}: {why}"
    nums += "".join(f"; {x}" for x in (text, _unpaired(get, data, [g1, data.baseline])) if x)
    routes = 2 if len(per_size) > 1 else 1
    return Verdict(claim, verdict, nums, rule, lr, scope, tuple(per_size), routes=routes)


def claim2(data: StudyData, get: Losses, lr: str) -> Verdict:
    """The gain of γ = 1 shrinks with size under the baseline's ε and gate."""
    claim = f"the gain of γ = 1 shrinks with size under the baseline's {_baseline_settings(data)}"
    rule = (
        "advantage (baseline − γ=1, paired by seed) against ln N: the change over the measured "
        "range (slope of the per-size means × ln(N_max/N_min)), sizes as units (df = sizes − 2, "
        "so >= 3 sizes), below −δ, and a gain to shrink: the advantage at the smallest paired "
        "size above +δ (seeds as units, df = seeds − 1); reproduced if both hold, not "
        "reproduced if either interval lies on the other side of δ; both arms' losses must "
        f"fall with N; where σ²_emb/ε > {EPS_ACTS_MAX:g} at every size (ε cannot act) the trend "
        "is judged all the same (the paper reports the shrinking as an observation) and a "
        "decided verdict is scoped to the trend, not to ε as its cause"
    )
    g1 = data.role("gamma1")
    if not g1:
        return _untested(claim, "no γ = 1 arm with the baseline's ε and gate", rule, lr)
    groups = {}
    for s in data.sizes:
        a, b = get(g1, s), get(data.baseline, s)
        if common := sorted(set(a) & set(b)):
            groups[s] = [b[k] - a[k] for k in common]
    adv = "; ".join(f"{s}: {t_interval(g).text()}" for s, g in groups.items())
    ratios, rtext = _ratio_text(data, g1)
    if ratios and all(r > EPS_ACTS_MAX for r in ratios.values()):
        rtext += (
            "; ε cannot act at any size here, so a gain that shrinks here does not shrink by "
            "the paper's ε mechanism"
        )
        cause = "the trend only, not its cause: ε cannot act at initialization at these sizes"
    else:
        cause = ""
    nums = f"advantage {adv or 'none paired'}; {rtext}"
    if len(groups) < 3:
        why = (
            f"the γ = 1 arm is paired at {len(groups)} size(s): a trend across sizes, with sizes "
            "as units, needs >= 3 (df = sizes − 2)"
        )
        return Verdict(
            claim, INCONCLUSIVE, f"{nums}; {why}", rule, lr, sizes=tuple(groups), reason=why
        )
    x = np.log([data.size_n[s] for s in groups])
    slope = trend_interval(x, list(groups.values()))
    span = float(x[-1] - x[0])
    change = replace(slope, mean=slope.mean * span, low=slope.low * span, high=slope.high * span)
    smallest = next(iter(groups))
    gain = t_interval(groups[smallest])
    trend, why_trend = decide(change, data.margin, -1)
    start, why_start = decide(gain, data.margin, +1)
    verdict = combine([trend, start])
    why = f"{why_trend}; gain at {smallest} (the smallest) {gain.text()}: {why_start}"
    nums = f"advantage {adv}; change over the range {change.text()}; {rtext}"
    rises = _loss_rises(data, get, g1) + _loss_rises(data, get, data.baseline)
    if rises and verdict == REPRODUCED:
        verdict = INCONCLUSIVE
        why += "; but loss rises with size: " + ", ".join(rises) + " (not a scaling trend)"
    scope = cause if verdict in (REPRODUCED, NOT_REPRODUCED) else ""
    return Verdict(claim, verdict, f"{nums}: {why}", rule, lr, scope, tuple(groups))


def claim3(data: StudyData, get: Losses, lr: str) -> Verdict:
    """Removing both blockers widens the gain: the interaction γ × fixes."""
    claim = "removing both blockers (smaller ε + gate) widens the gain of γ = 1"
    rule = (
        "interaction (γ=1+ε+gate − γ=1) − (γ=0.5+ε+gate − baseline), and a gain to widen: γ=1's "
        "gain with both fixes (γ=1+ε+gate − γ=0.5+ε+gate), each paired by seed within a size "
        "(the seeds with all four arms), sizes as units across sizes: reproduced if both "
        "intervals lie below −δ, not reproduced if either lies above −δ (δ = "
        f"{data.margin:g} nats); where the sizes leave that open but every size (seeds as "
        "units) calls it the same, that holds at the measured sizes; where σ²_emb/ε > "
        f"{EPS_ACTS_MAX:g} at γ = 1 with the baseline's ε at every size (ε cannot act), a "
        "decided verdict is scoped to the gate"
    )
    g1, g3, c = data.role("gamma1"), data.role("gamma1+eps+gate"), data.role("gamma0.5+eps+gate")
    if not g1 or not g3:
        return _untested(claim, "needs the γ = 1 and γ = 1+ε+gate arms", rule, lr)
    fix1 = _paired(get, data, g3, g1)
    if not c:
        nums = "fixes at γ = 1: " + _per_size_text(fix1) if fix1 else ""
        why = (
            "the study has no γ = 0.5 + fixes arm; the gate's main effect cannot be separated "
            "(the control is γ = 1+ε+gate's exact ε and gate at the baseline's γ)"
        )
        return Verdict(claim, INCONCLUSIVE, f"{why}. {nums}", rule, lr, reason=why)
    per_size, gain, parts = {}, {}, []
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
        gain[s] = paired_difference([arms[0][k] for k in seeds], [arms[2][k] for k in seeds])
        parts.append(
            f"{s} (seeds {seeds}): fixes at γ=1 {f1:+.4f}, at γ=0.5 {f05:+.4f}, "
            f"interaction {per_size[s].text()}, γ=1's gain with the fixes {gain[s].text()}"
        )
    if not per_size:
        why = "no seed has all four arms (γ ∈ {0.5, 1} × fixes) at one size"
        return _untested(claim, why, rule, lr)
    total, total_gain = across_sizes(per_size), across_sizes(gain)
    v1, why1 = decide(total, data.margin, -1)
    v2, why2 = decide(total_gain, data.margin, -1)
    nums = "; ".join(parts) + (
        f"; {_scope(per_size)}: interaction {total.text()}: {why1}; γ=1's gain with the fixes "
        f"{total_gain.text()}: {why2}"
    )
    each = {
        s: combine([decide(per_size[s], data.margin, -1)[0], decide(gain[s], data.margin, -1)[0]])
        for s in per_size
    }
    verdict, scope, text = at_each_size(combine([v1, v2]), each)
    nums += "".join(f"; {x}" for x in (text, _unpaired(get, data, [g3, g1, c, data.baseline])) if x)
    ratios, rtext = _ratio_text(data, g1)
    if ratios and all(r > EPS_ACTS_MAX for r in ratios.values()):
        nums += f"; {rtext}; ε cannot act at any size here, so the fixes act through the gate"
        if verdict in (REPRODUCED, NOT_REPRODUCED):
            gate = "the gate in effect: ε cannot act at initialization at these sizes"
            scope = "; ".join(x for x in (scope, gate) if x)
    routes = 2 if len(per_size) > 1 else 1
    return Verdict(claim, verdict, nums, rule, lr, scope, tuple(per_size), routes=routes)


def _largest_with(
    data: StudyData,
    arms: list[str],
    prefix: str,
    sizes: Optional[list[str]] = None,
    phase: str = "shared",
) -> Optional[str]:
    """The largest of ``sizes`` (default: all) where every arm logged ``prefix`` on a common
    seed in its runs of ``phase`` (:meth:`~.analysis.StudyData.seed_series`), else None."""
    for s in reversed(sizes if sizes is not None else data.sizes):
        logged = [set(data.seed_series(a, s, prefix, phase)) for a in arms]
        if set.intersection(*logged):
            return s
    return None


def _non_finite_why(what: str, bad: list[str]) -> str:
    """Why a row that would read a diagnostic NaN or inf somewhere (``bad``:
    :meth:`~.analysis.StudyData.non_finite`) is not decided (trial 14, finding 2: read around
    the gap, a null became 37-50 of 50 false "reproduced")."""
    return (
        f"the {what} is NaN or inf in {'; '.join(bad)}: missing data, and a mean, maximum or "
        "last value read around it would compare other iterations or matrices than the other "
        "arm's"
    )


def _size_label(data: StudyData, size: str) -> str:
    """``size``, or where larger sizes of the study were not read (an arm has no diagnostics
    there on a common seed, e.g. its run has not finished) ``SIZE (... not LARGER)``, so a
    number from a smaller size is never read as the largest size's."""
    larger = data.sizes[data.sizes.index(size) + 1 :]
    if not larger:
        return size
    return (
        f"{size} (the largest size where every compared arm logged it on a common seed; not "
        f"{', '.join(larger)})"
    )


def claim4(data: StudyData) -> Verdict:
    """ε = 1e-5 saturates RMSNorm under small initialization."""
    claim = "ε = 1e-5 saturates RMSNorm under small initialization"
    rule = (
        "max saturated-token share, γ=1 (the baseline's ε) − γ=1+ε (smaller ε; only ε differs), "
        "paired by seed at the largest size where ε can act (σ²_emb/ε <= "
        f"{EPS_ACTS_MAX:g}) and both arms logged saturation: reproduced if the interval lies "
        f"above {SATURATION_MIN:g}; where σ²_emb/ε > {EPS_ACTS_MAX:g} at every size (ε cannot "
        "act at initialization), the largest size with both arms' saturation is read all the "
        "same: an interval above the margin is reproduced (the hidden states shrank in "
        "training), one below it not measurable at this scale, and one that includes the "
        "margin inconclusive; without the γ = 1+ε arm, γ = 1's own max saturated share bounds "
        "the difference: not measurable at this scale where its t-interval over >= 2 seeds lies "
        "at or below the margin (or it is 0 in every one of >= 2 seeds), else inconclusive; "
        "where an arm has not learned, a null is not measurable in these runs"
    )
    g1, g2 = data.role("gamma1"), data.role("gamma1+eps")
    if not g1:
        return _untested(claim, "needs the γ = 1 and γ = 1+ε arms", rule)
    ratios, rtext = _ratio_text(data, g1)

    def measured(sizes: Optional[list[str]]) -> tuple[str, Optional[Interval], tuple[str, ...]]:
        """(text, Δ max saturated share, (its size,)) at the largest of ``sizes`` with both
        arms' saturation on a common seed, each seed's maxima over the iterations both arms
        logged; ("", None, ()) where there is none, and (why, None, (size,)) where a compared
        run's saturation is not finite."""
        size = _largest_with(data, [g1, g2], "norm_saturated", sizes) if g2 else None
        if size is None:
            return "", None, ()
        bad = data.non_finite([g1, g2], size, "norm_saturated")
        if bad:
            return _non_finite_why("saturated share", bad), None, (size,)
        a, b = (data.seed_series(x, size, "norm_saturated") for x in (g1, g2))
        both = {k: sorted(set(a[k]) & set(b[k])) for k in set(a) & set(b)}
        seeds = sorted(k for k, its in both.items() if its)
        d = paired_difference(
            [max(a[k][i] for i in both[k]) for k in seeds],
            [max(b[k][i] for i in both[k]) for k in seeds],
        )
        return f"{size}: Δ max saturated share {d.text()}", d, (size,)

    cannot_act = bool(ratios) and all(r > EPS_ACTS_MAX for r in ratios.values())
    if not cannot_act and not g2:
        why = "needs the γ = 1+ε arm"
        return Verdict(claim, INCONCLUSIVE, f"{why}; {rtext}", rule, reason=why)
    acting = [s for s in data.sizes if ratios.get(s, 0.0) <= EPS_ACTS_MAX]
    text, d, at = measured(None if cannot_act else acting)
    if d is None and at:  # a compared run's saturation is not finite
        return Verdict(
            claim, INCONCLUSIVE, f"{at[0]}: {text}; {rtext}", rule, sizes=at, reason=text
        )
    if cannot_act:
        if d is None:
            return _saturation_bound(data, g1, claim, rule, rtext)
        verdict, why = decide(d, SATURATION_MIN, +1)
        if verdict == REPRODUCED:
            why += (
                f"; measured although σ²_emb/ε > {EPS_ACTS_MAX:g} at initialization at every "
                "size: the hidden states shrank during training"
            )
        reason = ""
        if verdict == NOT_REPRODUCED:
            verdict, reason = NOT_MEASURABLE, f"ε cannot act at these sizes{EXPLAINS_NULL}"
            why += f": {reason}"
        return Verdict(claim, verdict, f"{text}: {why}; {rtext}", rule, sizes=at, reason=reason)
    if d is None:
        why = (
            "no saturation diagnostics on a common seed at a size where ε can act "
            f"({', '.join(acting)})"
        )
        return Verdict(claim, INCONCLUSIVE, f"{why}; {rtext}", rule, reason=why)
    verdict, why = decide(d, SATURATION_MIN, +1)
    return Verdict(claim, verdict, f"{text}: {why}; {rtext}", rule, sizes=at)


def _saturation_bound(data: StudyData, g1: str, claim: str, rule: str, rtext: str) -> Verdict:
    """Claim 4 where ε cannot act at initialization at any size and no γ = 1+ε difference was
    measured: γ = 1's own max saturated share bounds the difference (shares are >= 0), so
    where the upper end of its t-interval over >= 2 seeds lies at or below the margin (or every
    one of >= 2 seeds saturated no token, an interval of sd 0) that is a measured null,
    explained by the scale (not measurable at this scale). One seed (no interval), an interval
    that reaches past the margin, or no saturation logged leaves the row inconclusive: only
    more seeds, or the γ = 1+ε arm, could tell."""
    size = _largest_with(data, [g1], "norm_saturated")
    if size is None:
        why = f"no saturation measured (no γ = 1+ε difference, no saturation diagnostics of {g1})"
        return Verdict(
            claim, INCONCLUSIVE, f"{why}; {rtext}: ε cannot act at initialization, but the "
            "hidden states may shrink in training", rule, reason=why,
        )  # fmt: skip
    bad = data.non_finite([g1], size, "norm_saturated")
    if bad:
        why = _non_finite_why("saturated share", bad)
        return Verdict(
            claim, INCONCLUSIVE, f"{size}: {why}; {rtext}", rule, sizes=(size,), reason=why
        )
    shares = {k: max(v.values()) for k, v in data.seed_series(g1, size, "norm_saturated").items()}
    each = ", ".join(f"seed {k} {v:.4f}" for k, v in shares.items())
    head = f"{size}: {g1}'s own max saturated share {each}, a bound on the difference ε makes"
    scale = f"ε cannot act at these sizes{EXPLAINS_NULL}"
    null = f"; {rtext}: {scale}"
    values = list(shares.values())
    iv = t_interval(values)
    if len(values) >= 2 and all(v == 0 for v in values):
        return Verdict(
            claim, NOT_MEASURABLE, f"{head}: 0 in all {len(values)} seeds, within the margin "
            f"{SATURATION_MIN:g}{null}", rule, sizes=(size,), reason=scale,
        )  # fmt: skip
    if iv.has_interval and iv.high <= SATURATION_MIN:
        return Verdict(
            claim, NOT_MEASURABLE, f"{head}: {iv.text()}, at or below the margin "
            f"{SATURATION_MIN:g}{null}", rule, sizes=(size,), reason=scale,
        )  # fmt: skip
    if len(values) < 2:
        why = (
            f"one seed, no interval: a measured null needs >= 2 seeds whose interval lies at or "
            f"below the margin {SATURATION_MIN:g}"
        )
    elif not iv.has_interval:
        why = decide(iv, SATURATION_MIN, +1)[1]
    else:
        why = f"the interval reaches above the margin {SATURATION_MIN:g}"
    lacks = "the study has no γ = 1+ε arm to tell whether ε does it"
    return Verdict(
        claim, INCONCLUSIVE, f"{head}: {iv.text()}: {why}, and {lacks}; {rtext}", rule,
        sizes=(size,), reason=lacks,
    )  # fmt: skip


def _sink_arms(data: StudyData) -> tuple[Optional[str], Optional[str], Optional[str]]:
    """(γ = 1, γ = 1+ε+gate without its gate, γ = 1+ε+gate): claim 5's arms besides the
    baseline (None where the study has no such arm)."""
    g3 = data.role("gamma1+eps+gate")
    base_gate = data.settings(data.baseline)["gated_attention"]
    return data.role("gamma1"), g3 and data.matching(g3, gated_attention=base_gate), g3


def _part(label: str) -> str:
    """``the γ part``, ``the gate part`` from an effect's label (``γ``, ``the gate``)."""
    return f"the {label.removeprefix('the ')} part"


def claim5(data: StudyData) -> Verdict:
    """Small initialization strengthens the attention sink; gating reduces it."""
    claim = "small initialization strengthens the attention sink; gating reduces it"
    rule = (
        "final sink share paired by seed at the largest size: γ=1 − baseline (only γ differs) "
        f"above +{SINK_MIN:g}, and γ=1+ε+gate − the same arm ungated (only the gate differs) "
        f"below −{SINK_MIN:g}; a sink has formed in an arm whose seed-mean final share exceeds "
        "both uniform attention's and its own at the first logged point (iteration 0) by more "
        f"than {SINK_MIN:g}, the effects' margin; a part is measured only where a sink has "
        "formed in one of its own two arms, else not measured (no sink in its arms); not "
        "measurable in these runs when no part is; a part whose arms the study lacks is not "
        "measured, and a verdict then covers the measured part only"
    )
    g1, ungated, g3 = _sink_arms(data)
    arms = [a for a in dict.fromkeys((data.baseline, g1, ungated, g3)) if a]
    if len(arms) < 2:
        return _untested(claim, "needs the γ = 1 or the γ = 1+ε+gate arm", rule)
    size = _largest_with(data, arms, "sink_share")
    if size is None:
        return _untested(claim, "no sink diagnostics at a size with all arms", rule)
    bad = data.non_finite(arms, size, "sink_share")
    if bad:
        why = _non_finite_why("sink share", bad)
        return Verdict(claim, INCONCLUSIVE, f"{size}: {why}", rule, sizes=(size,), reason=why)
    series = {a: data.seed_series(a, size, "sink_share") for a in arms}
    logged = [set(v) for a in arms for v in series[a].values()]
    common = set.intersection(*logged)
    if not common:
        why = f"no iteration at {size} at which every compared run logged the sink share"
        return Verdict(claim, INCONCLUSIVE, why, rule, sizes=(size,), reason=why)
    first_it, final_it = min(common), max(common)  # every compared seed read at the same two
    final = {a: {k: v[final_it] for k, v in series[a].items()} for a in arms}
    first = {a: {k: v[first_it] for k, v in series[a].items()} for a in arms}
    uni = uniform_sink_share(data.seq_length())
    mean_final = {a: float(np.mean(list(final[a].values()))) for a in arms}
    mean_first = {a: float(np.mean(list(first[a].values()))) for a in arms}
    means = ", ".join(f"{a} {mean_first[a]:.4f} → {mean_final[a]:.4f}" for a in arms)
    later = max(max(it) for it in logged)
    end = (
        f", the last every compared run logged (some logged up to {later}: trial 14, the arms "
        "are read at one iteration)"
        if later > final_it
        else ""
    )
    nums = (
        f"{_size_label(data, size)}: sink share at iterations {first_it} → {final_it}{end}: "
        f"{means} (uniform attention {uni:.4f})"
    )
    formed = [a for a in arms if mean_final[a] - max(uni, mean_first[a]) > SINK_MIN]
    if not formed and first_it != 0:
        why = (
            f"the first sink share every compared run logged is at iteration {first_it}, after "
            "initialization: a sink that formed before it is not seen, so whether one formed "
            "is unobserved"
        )
        return Verdict(claim, INCONCLUSIVE, f"{nums}; {why}", rule, sizes=(size,), reason=why)
    if not formed:
        why = (
            "no sink has formed: no arm's final share exceeds both uniform attention's and its "
            f"own first logged share by more than {SINK_MIN:g} (the effects' margin)"
        )
        return Verdict(
            claim, NOT_MEASURED, f"{nums}; {why}; whether larger models or longer training "
            "would form one is not separated by these runs", rule, sizes=(size,), reason=why,
        )  # fmt: skip
    parts, verdicts, unmeasured, unpaired, sinkless = [], [], [], [], []
    for arm, ref, direction, label, need in (
        (g1, data.baseline, 1, "γ", "a γ = 1 arm with the baseline's ε and gate"),
        (g3, ungated, -1, "the gate", "γ = 1+ε+gate and the same arm without the gate"),
    ):
        if not (arm and ref):
            parts.append(f"effect of {label}: not measured, needs {need}")
            unmeasured.append(label)
            continue
        seeds = sorted(set(final[arm]) & set(final[ref]))
        if not seeds:
            parts.append(
                f"effect of {label}: not measured, {arm} and {ref} share no seed with sink "
                "diagnostics"
            )
            unmeasured.append(label)
            unpaired.append(label)
            continue
        d = paired_difference([final[arm][k] for k in seeds], [final[ref][k] for k in seeds])
        if arm not in formed and ref not in formed:
            parts.append(
                f"effect of {label} ({arm} − {ref}) {d.text()}: not measured, no sink in its arms "
                f"(neither {arm}'s final share nor {ref}'s exceeds both uniform attention's and "
                f"its own first logged share by more than {SINK_MIN:g})"
            )
            sinkless.append(label)
            continue
        v, why = decide(d, SINK_MIN, direction)
        parts.append(f"effect of {label} ({arm} − {ref}) {d.text()}: {why}")
        verdicts.append((label, v))
    nums += f"; a sink has formed in {', '.join(formed)}; " + "; ".join(parts)
    if not verdicts and sinkless and not unpaired:
        why = "no part has a sink in its own arms"
        return Verdict(
            claim, NOT_MEASURED, f"{nums}; {why}: whether larger models or longer training "
            "would form one there is not separated by these runs", rule, sizes=(size,),
            reason=why,
        )  # fmt: skip
    if not verdicts:  # every part is "not measured" and why
        return Verdict(claim, INCONCLUSIVE, nums, rule, sizes=(size,), reason="; ".join(parts))
    verdict = combine([v for _, v in verdicts])
    scope = ""
    if (unmeasured or sinkless) and verdict != INCONCLUSIVE:
        missing = [f"{_part(x)} not measured" for x in unmeasured]
        missing += [f"{_part(x)} not measured: no sink in its arms" for x in sinkless]
        scope = f"{' and '.join(_part(x) for x, _ in verdicts)} only; {'; '.join(missing)}"
    return Verdict(claim, verdict, nums, rule, scope=scope, sizes=(size,))


def _grid_sizes_call(per_size: dict[str, str]) -> tuple[str, str, str]:
    """Claim 6's call over the sizes its grid measured, each size decided on its own seeds
    (there is no across-sizes interval): one size decides "at SIZE only", two or more that all
    decide alike decide "at each measured size" (both :func:`at_each_size`); sizes that decide
    opposite ways, or a decided size beside an undecided one, leave the row inconclusive.

    Returns:
        (verdict, scope, text); text says how the sizes disagree, or lists each size's call.
    """
    if len(per_size) == 1:
        return at_each_size(next(iter(per_size.values())), per_size)
    yes = [s for s, v in per_size.items() if v == REPRODUCED]
    no = [s for s, v in per_size.items() if v == NOT_REPRODUCED]
    if yes and no:
        return (
            INCONCLUSIVE,
            "",
            f"the sizes disagree: reproduced at {', '.join(yes)}, not at {', '.join(no)}, so "
            "neither holds for every size",
        )
    return at_each_size(INCONCLUSIVE, per_size)


def claim6(data: StudyData, grid: dict, lr: str) -> Verdict:
    """Loss is best at γ = 1 (worse above and below), at the shared LR or at each γ's own best
    LR (``grid``: :func:`~.analysis.gamma_grid` of that phase)."""
    claim = (
        "loss is lower at γ = 1 than at the γ grid's nearest values below and above (the paper: "
        "best at γ = 1; the optimum lies between those neighbours)"
    )
    rule = (
        "the loss of the grid's nearest γ below 1 and nearest above 1, each minus γ = 1's, "
        "paired by seed (the seeds both finished; t, df = seeds − 1): reproduced if both intervals "
        f"lie above +δ (δ = {data.margin:g} nats), not reproduced if either lies below +δ; a "
        "side whose grid γ did not finish, or a grid without a γ on that side, is not measured; "
        "at the best LR, a size where one of the three γ's best LR is on its grid's edge is not "
        "decided; each size on its own seeds: one size decides at that size only, several "
        "decide only if every size decides alike (then at each measured size), else inconclusive"
    )
    if not grid:
        return _untested(claim, "no γ grid in this study", rule, lr)
    values = sorted(data.manifest["gamma_grid"].get("values") or [])
    parts, calls, judged = [], {}, set()
    for size, g in grid.items():
        seeds = ", ".join(f"γ={k:g} {v}" for k, v in g["all_seeds"].items())
        if 1.0 not in (values or g["gamma"]):
            parts.append(f"{size}: the grid has no γ = 1")
            calls[size] = INCONCLUSIVE
            continue
        losses = g["losses"]
        if 1.0 not in losses or len(losses) < 2:
            parts.append(f"{size}: no seed finished γ = 1 and another γ (seeds {seeds})")
            calls[size] = INCONCLUSIVE
            continue
        pts = ", ".join(f"γ={x:g} {y:.4f}" for x, y in zip(g["gamma"], g["mean"], strict=True))
        text = f"{size} ({g['lr']}) at the seed(s) every γ finished {g['seeds']}: {pts or 'none'}"
        text += f"; lowest at γ = {g['best']:g}" if g["best"] is not None else ""
        grid_values = values or g["gamma"]
        below = max((x for x in grid_values if x < 1.0), default=None)
        above = min((x for x in grid_values if x > 1.0), default=None)
        sides = []
        for side, near in (("below", below), ("above", above)):
            if near is None:
                sides.append((f"no γ {side} 1 in the grid: not measured", INCONCLUSIVE))
            elif near not in losses or not set(losses[near]) & set(losses[1.0]):
                at = " at its best LR" if g["lr"] == "best LR" else ""
                sides.append(
                    (
                        f"γ={near:g} (nearest {side} 1) did not finish{at} on a seed γ = 1 "
                        "finished: not measured",
                        INCONCLUSIVE,
                    )
                )
            else:
                both = sorted(set(losses[near]) & set(losses[1.0]))
                judged.add(size)
                d = paired_difference(
                    [losses[near][k] for k in both], [losses[1.0][k] for k in both]
                )
                v, why = decide(d, data.margin, +1)
                sides.append((f"γ={near:g} − γ=1 (seeds {both}) {d.text()}: {why}", v))
        verdict = combine([v for _, v in sides])
        text += "; " + "; ".join(t for t, _ in sides)
        edges = [g["edges"][x] for x in (below, 1.0, above) if x in g["edges"]]
        if edges:
            verdict = INCONCLUSIVE if verdict in (REPRODUCED, NOT_REPRODUCED) else verdict
            text += f"; the best LR is not bracketed: {'; '.join(edges)}"
        parts.append(text)
        calls[size] = verdict
    verdict, scope, text = _grid_sizes_call(calls)
    nums = "; ".join(parts) + (f"; {text}" if text else "")
    at = tuple(s for s in data.sizes if s in judged)
    return Verdict(claim, verdict, nums, rule, lr, scope, sizes=at)


def _neighbour_arms(data: StudyData) -> list[str]:
    """The γ-grid arms claim 6 compares: γ = 1 and the grid's nearest γ below and above it
    (a γ farther out, diverged or unfinished, changes neither comparison)."""
    values = (data.manifest.get("gamma_grid") or {}).get("values") or []
    near = {1.0, max((x for x in values if x < 1.0), default=None)}
    near.add(min((x for x in values if x > 1.0), default=None))
    return [a for a in gamma_grid_arms(data) if data.settings(a)["init_gamma"] in near]


def _dip_rise(series: dict[int, float]) -> tuple[float, Optional[float]]:
    """(dip, rise) of a stable-rank trajectory {iteration: stable rank} by
    :func:`~.analysis.rank_dip`, the rule the report's Mechanisms table reads too: the minimum
    cross-fitted (located on one half of the logged points, read on the other) where at least
    6 points are logged after initialization; rise None where it reaches the last point."""
    r = rank_dip(series)
    return r.dip, r.rise


@dataclass(frozen=True)
class EndFall:
    """How far a control's stable rank falls at its end (:func:`_end_fall`).

    Attributes:
        fall: −slope · END_SHARE · T / (stable rank at the first point); negative where it rose.
        start, stop: the first and last logged iterations the slope was fit to (stop = T).
        points: how many logged points it was fit to.
    """

    fall: float
    start: int
    stop: int
    points: int


def _end_fall(series: dict[int, float]) -> EndFall:
    """How far a stable-rank trajectory {iteration: stable rank} falls over the last
    :data:`END_SHARE` of training at its end rate, as a share of its first (initial) value:
    −slope · END_SHARE · T / SR₀, T the last logged iteration, slope the least-squares slope
    over the points logged after initialization in the last :data:`FIT_SHARE` of training
    (iteration >= (1 − FIT_SHARE)·T), extended back to the last 2 logged points where fewer lie
    there (a line through 2 points: sparse logging; the interval across seeds carries its
    noise). A share of training, so the same trajectory gives the same fall however often it
    was logged (trial 9), and a slope over every point in the stretch, not a difference of two
    single noisy points (trial 10, finding 3). Rounded to 12 decimals (below that, rounding)."""
    its = sorted(series)[1:]
    stop = its[-1]
    fit = [i for i in its if i >= (1 - FIT_SHARE) * stop - 1e-9]
    if len(fit) < 2:
        fit = its[-2:]
    x = np.asarray(fit, dtype=np.float64)
    y = np.asarray([series[i] for i in fit], dtype=np.float64)
    slope = float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))
    fall = round(-slope * END_SHARE * stop / series[min(series)], 12)
    return EndFall(fall, int(fit[0]), int(stop), len(fit))


def _end_span(ends: dict[int, EndFall]) -> str:
    """Where a control's end falls (:func:`_end_fall`, ``ends`` by seed) were measured: the
    share of training, and each distinct stretch of iterations the slope was fit to."""
    spans = []
    for e in ends.values():
        text = f"iterations {e.start}-{e.stop}, {e.points} points"
        if text not in spans:
            spans.append(text)
    return (
        f"over the last {END_SHARE:.0%} of training (the least-squares slope over the logged "
        f"points in its last {FIT_SHARE:.0%}, at least 2: {'; '.join(spans)})"
    )


def _end_bound(iv: Interval) -> tuple[float, str]:
    """The upper bound claim 7 compares a control's end fall with, and its words: the high end
    of its 95% interval across seeds (Student t, df = seeds − 1), or, with no interval (one
    seed, or seeds that all fell by the same amount), the value itself."""
    if iv.has_interval:
        return iv.high, f"the upper bound of its 95% interval, {iv.high:.4f},"
    why = "one seed" if iv.n < 2 else "no spread across seeds"
    return iv.mean, f"the value itself (no interval: {why}), {iv.mean:.4f},"


FEW_POINTS = "fewer than"
"""How :func:`_few_points`'s reason starts."""


def _few_points(a: dict[int, dict], b: dict[int, dict], seeds: list[int]) -> str:
    """Why claim 7 cannot read the pair's minima, or "": some seed of the arm (``a``) or its
    control (``b``), {seed: {iteration: stable rank}}, logged fewer than 2 ×
    :data:`~.analysis.RANK_WINDOW` points after iteration 0, where
    :func:`~.analysis.rank_dip` reads the minimum as the single lowest point: the lowest of a
    few noisy points lies 0.8-1.2 sd below their level, which makes a flat arm recover (trial 11,
    finding 2: 5.5-13.5 % false "reproduced", more with more seeds, as the interval narrows and
    the bias stays) and biases each dip by its own arm's noise, so Δdip too."""
    short = sorted(
        (len(x[k]) - 1, name, k) for name, x in (("arm", a), ("control", b)) for k in seeds
    )
    n, name, k = short[0]
    if n >= 2 * RANK_WINDOW:
        return ""
    return (
        f"{FEW_POINTS} {2 * RANK_WINDOW} stable-rank points logged after iteration 0 (the "
        f"{name}'s seed {k} has {n}), where a single-point minimum reads biased low (the lowest "
        "of a few noisy points lies below their level), which makes a flat arm recover and "
        "biases each dip by its arm's noise: log more points (the study file's "
        f"diagnostics_points, at least {2 * RANK_WINDOW + 1} with iteration 0, or "
        "--log-diagnostics-interval)"
    )


def _logging(a: dict[int, dict], b: dict[int, dict], seeds: list[int]) -> str:
    """At what logging claim 7 read a pair (``a`` the arm, ``b`` its control, {seed:
    {iteration: stable rank}}): the points logged after iteration 0 and the largest step
    between two logged iterations, K. A dip shorter than K iterations can fall between two
    logged points, so a control's short dip is not seen (trial 11, finding 3: equal dips of
    different length gave "reproduced" at 10-100 points and "not reproduced" at 500)."""
    points = sorted({len(x[k]) - 1 for x in (a, b) for k in seeds})
    step = max(int(np.max(np.diff(sorted(x[k])))) for x in (a, b) for k in seeds)
    even = all(len(set(np.diff(sorted(x[k])))) == 1 for x in (a, b) for k in seeds)
    count = f"{points[0]}-{points[-1]}" if len(points) > 1 else str(points[0])
    return (
        f"read at {count} logged points after iteration 0, {'every' if even else 'at most'} "
        f"{step} iterations{'' if even else ' apart'}: a dip shorter than {step} iterations "
        "is not seen"
    )


def _condensation_arms(data: StudyData) -> dict[str, Optional[str]]:
    """{γ = 1 arm: its matched γ = 0.5 control or None} for claim 7."""
    names = ("gamma1", "gamma1+eps", "gamma1+eps+gate")
    arms = [a for a in dict.fromkeys(data.role(n) for n in names) if a]
    return {a: data.matched_control(a) for a in arms}


def claim7(data: StudyData, lr: str = "shared LR") -> Verdict:
    """Condensation then expansion, against each arm's matched control: each seed's dip and
    recovery by :func:`~.analysis.rank_dip` (the minimum cross-fitted, trial 10 finding 4; the
    rule the Mechanisms table reads, finding 6), and the control's fall at its end by
    :func:`_end_fall` in every seed, judged by its upper 95% bound across seeds (finding 3).
    ``lr``: ``shared LR`` reads the shared-LR runs, ``best LR`` each arm's runs at its own best
    LR (trial 11, finding 1: the confirm runs log the same diagnostics)."""
    phase = "best" if lr == "best LR" else "shared"
    claim = (
        "condensation then expansion: the stable rank dips more at γ = 1 than at its γ = 0.5 "
        "control, then recovers (the paper: an early dip at γ = 1, none at γ = 0.5; when the "
        "dip comes, and whether the control dips too, are not tested)"
    )
    rule = (
        "each γ=1 arm against its matched control (same ε and gate, γ = 0.5), from iteration 0, "
        "paired by seed at the largest size, the stable rank averaged over the matrices both "
        "arms have (a gated pair's gate matrices included, so it can differ from the "
        "Mechanisms table's, which averages those every arm has): dip (1 − min/initial stable "
        "rank) of the arm − "
        f"control's above {DIP_MIN:g}, and the arm's recovery (end/min − 1) above {DIP_MIN:g}, "
        f"the min and the end each read over {RANK_WINDOW} logged points after iteration 0, "
        f"which needs at least {2 * RANK_WINDOW} logged after it in every seed of both arms "
        "(fewer: not measurable in these runs, since a single-point minimum reads biased low): "
        "the end the mean of the last ones, the min cross-fitted (the lowest even-indexed "
        "point located and read as the mean of the odd-indexed points next to it, and the "
        "reverse, the two readings averaged: the lowest of many noisy points lies below their "
        "level, so a min read on the points it was chosen on makes a flat trajectory recover); "
        "not measurable where the "
        "arm's min reaches its last point in a seed (still falling: no recovery measured), or "
        "where the control's fall at its end, −slope · "
        f"{END_SHARE:g}·T / initial stable rank (its fall over the last {END_SHARE:.0%} of "
        "training, T the last logged iteration, at the least-squares slope over the logged "
        f"points in the last {FIT_SHARE:.0%} of training, at least 2; a share of training, not "
        "of logging), measured in every seed, has an upper 95% bound across seeds (Student t, "
        f"seeds the unit) of at least {DIP_MIN:g} (still dipping: its dip, and so Δdip, not "
        "measured), or as large as the margin Δdip's interval has left over it; a control "
        "whose bound is below both but above 0 gives Δdip over the runs' window, and a decided "
        "verdict says so; read only at the logged iterations: the row names the largest step "
        "K between them, and a dip shorter than K iterations (a control's brief dip) is not "
        "seen"
    )
    controls = _condensation_arms(data)
    pairs = [(a, c) for a, c in controls.items() if c]
    parts = [f"{a}: no matched γ = 0.5 control, not judged" for a, c in controls.items() if not c]
    if not pairs:
        why = f" ({'; '.join(parts)})" if parts else ""
        return _untested(claim, f"no γ = 1 arm with a matched γ = 0.5 control{why}", rule, lr)
    verdicts, judged, windowed = [], set(), False
    untested, tested = [], False  # why a pair was not tested; whether one was
    for arm, ctrl in pairs:
        size = _largest_with(data, [arm, ctrl], "stable_rank", phase=phase)
        if size is None:
            untested.append(f"{arm} vs {ctrl}: no size where both logged the stable rank")
            parts.append(untested[-1])
            verdicts.append(INCONCLUSIVE)
            continue
        roles = data.common_keys([arm, ctrl], size, "stable_rank")
        at = _size_label(data, size)
        bad = data.non_finite([arm, ctrl], size, "stable_rank", phase, roles)
        if bad:
            untested.append(f"{arm} vs {ctrl} ({at}): {_non_finite_why('stable rank', bad)}")
            parts.append(untested[-1])
            verdicts.append(INCONCLUSIVE)
            continue
        a, b = (data.seed_series(x, size, "stable_rank", phase, roles) for x in (arm, ctrl))
        seeds = sorted(k for k in set(a) & set(b) if len(a[k]) >= 3 and len(b[k]) >= 3)
        if not seeds:
            untested.append(f"{arm} vs {ctrl} ({at}): no common seed with >= 3 stable-rank points")
            parts.append(untested[-1])
            verdicts.append(INCONCLUSIVE)
            continue
        first = max(min(x[k]) for x in (a, b) for k in seeds)
        if first != 0:
            untested.append(
                f"{arm} vs {ctrl} ({at}): a first stable rank is logged at iteration "
                f"{first}, not at initialization, so an early collapse is unobserved"
            )
            parts.append(untested[-1])
            verdicts.append(INCONCLUSIVE)
            continue
        judged.add(size)
        da, db = ([_dip_rise(x[k]) for k in seeds] for x in (a, b))
        dip = paired_difference([x[0] for x in da], [x[0] for x in db])
        unmeasured = []
        if falling := [k for k, x in zip(seeds, da, strict=True) if x[1] is None]:
            w = rank_window(len(a[falling[0]]) - 1)
            around = (
                f" (cross-fitted over the {w} logged points around its lowest)" if w > 1 else ""
            )
            unmeasured.append(
                f"the stable rank of {arm} is still falling at the last point (its minimum"
                f"{around} reaches the last point, iteration {max(a[falling[0]])}) in seed(s) "
                f"{falling}, so no recovery is measured"
            )
        ends = {k: _end_fall(b[k]) for k in seeds}
        slow = {k: e.fall for k, e in ends.items()}
        end = t_interval(list(slow.values()))
        bound, bound_text = _end_bound(end)
        per_seed = ", ".join(f"{f:.3f} (seed {k})" for k, f in slow.items())
        fell = (
            f"it fell by {end.text(4)} of its initial value {_end_span(ends)}; per seed {per_seed}"
        )
        if dipping := bound >= DIP_MIN:
            unmeasured.append(
                f"the stable rank of {ctrl} (the control) is still dipping at the last point "
                f"(iteration {max(b[seeds[0]])}): {fell}; {bound_text} is at least "
                f"{DIP_MIN:g}, so its dip is not measured, nor Δdip"
            )
        left = dip.low - DIP_MIN if dip.has_interval else math.inf
        if not dipping and 0 < left <= bound:
            unmeasured.append(
                f"the stable rank of {ctrl} (the control) is still falling at the last point: "
                f"{fell}; {bound_text} is as much as the margin Δdip has left over "
                f"{DIP_MIN:g} ({left:.4f}), so one more such stretch of training could close "
                "it: Δdip is not measured"
            )
        if not unmeasured and (few := _few_points(a, b, seeds)):
            unmeasured.append(few)
        window = ""
        if not dipping and not unmeasured and bound > 0:
            window = (
                f"Δdip over the runs' window: the control may still be falling at its end, "
                f"but slowly: {fell}; {bound_text} is below {DIP_MIN:g}"
            )
        if unmeasured:
            untested.append("; ".join(unmeasured))
            rises = [x[1] for x in da]
            few = unmeasured[-1].startswith(FEW_POINTS)
            rise = f"; recovery {t_interval(rises).text(3)}" if few and None not in rises else ""
            parts.append(
                f"{arm} vs {ctrl} ({at}): Δdip to the last point {dip.text(3)}{rise}; "
                + "; ".join(unmeasured)
                + (
                    " (a matter of logging, not of scale: the same runs logged more densely "
                    "would measure it)"
                    if few
                    else " (a matter of training length, not only of scale: longer runs, with "
                    "diagnostics to their end, would measure it)"
                )
            )
            verdicts.append(NOT_MEASURED)
            continue
        tested = True
        rise = t_interval([x[1] for x in da])
        v1, why1 = decide(dip, DIP_MIN, +1)
        v2, why2 = decide(rise, DIP_MIN, +1)
        parts.append(
            f"{arm} vs {ctrl} ({at}): Δdip {dip.text(3)} ({why1}); recovery {rise.text(3)} ({why2})"
            f"; min (cross-fitted) and end each read over {RANK_WINDOW} logged points; "
            + _logging(a, b, seeds)
            + (f"; {window}" if window else "")
        )
        verdicts.append(combine([v1, v2]))
        windowed |= bool(window)
    verdict = NOT_MEASURED if set(verdicts) == {NOT_MEASURED} else combine(verdicts)
    at = tuple(s for s in data.sizes if s in judged)
    scope = ""
    if windowed and verdict in (REPRODUCED, NOT_REPRODUCED):
        scope = "Δdip over the runs' window; a control still falling slowly at its end"
    reason = "" if tested else "; ".join(untested)
    return Verdict(claim, verdict, "; ".join(parts), rule, lr, scope, at, reason)


def _profile(
    deltas: dict[int, np.ndarray], diffs: dict[int, np.ndarray], keep: Optional[np.ndarray] = None
) -> tuple[dict[int, float], dict[int, float]]:
    """({seed: hard − easy mean Δsym}, {seed: mean Δsym on the hard tokens}) over the tokens
    ``keep`` selects (all without it), each seed's tokens split by the other seeds' mean
    difficulty at its ``EASY_SHARE`` quantile."""
    per_seed, hard_mean = {}, {}
    for seed, delta in deltas.items():
        others = np.mean([d for k, d in diffs.items() if k != seed], axis=0)
        if keep is not None:
            others, delta = others[keep], delta[keep]
        hard = others > np.quantile(others, EASY_SHARE)
        hard_mean[seed] = float(delta[hard].mean())
        per_seed[seed] = hard_mean[seed] - float(delta[~hard].mean())
    return per_seed, hard_mean


def log_odds_excess(delta: np.ndarray, loss_b: np.ndarray) -> tuple[np.ndarray, float]:
    """Each token's Δsym less its Δsym under a gain uniform in log-odds, and that gain c.

    A gain uniform in log p cannot reach the easy tokens (log p_A <= 0 caps an easy token's
    gain at its own loss), so any better model shows a larger Δsym on hard tokens; a gain of c
    in log-odds on every token, logit p_A = logit p_B + c, is one no model is kept from, and
    it too gives hard tokens the larger Δsym (trial 14, finding 3: 40 of 40 such studies
    called "reproduced"). c is fitted so that that gain's mean Δsym equals the observed mean
    (bisection; Δsym under it rises with c), and each token's Δsym under it,
    (p − p_B)/(p + p_B) with p = σ(logit p_B + c), is subtracted.

    Args:
        delta: (n,) Δsym = (p_A − p_B)/(p_A + p_B), float64.
        loss_b: (n,) −log p_B, nats, the reference (baseline) model's loss on each token.

    Returns:
        ((n,) the excess, float64; c in nats of log-odds).
    """
    log_p = -np.clip(np.asarray(loss_b, dtype=np.float64), 1e-12, None)
    logit_b = log_p - np.log(-np.expm1(log_p))
    p_b = np.exp(log_p)

    def null(c: float) -> np.ndarray:
        p = 1.0 / (1.0 + np.exp(-(logit_b + c)))
        return (p - p_b) / (p + p_b)

    target, low, high = float(np.mean(delta)), -50.0, 50.0
    for _ in range(100):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if null(mid).mean() < target else (low, mid)
    c = 0.5 * (low + high)
    return np.asarray(delta, dtype=np.float64) - null(c), c


def delta_sym_concentration(seeds: dict[int, dict], documents: Optional[np.ndarray] = None) -> dict:
    """Hard − easy mean Δsym per seed, and mean Δsym on the hard tokens, with seeds as the unit
    of replication and each seed's tokens sorted by the other seeds' difficulty.

    A uniform improvement (``log p_A = log p_B + c`` on every token) gives Δsym = tanh(c/2) on
    every token, a flat profile: hard − easy = 0 is its null. A seed's own difficulty (its two
    models' mean loss) shares their noise with its Δsym, which alone makes hard − easy negative
    (regression to the mean); the difficulty of seed s's tokens is therefore the mean over the
    other seeds' pairs, which scored the same held-out tokens. Easy tokens: that difficulty at
    or below its ``EASY_SHARE`` quantile. Tokens of one seed are not independent replicates of
    the effect: the intervals are Student-t over the per-seed values (df = seeds − 1), and,
    with ``documents``, also hold the sampling of the documents every seed scored
    (:func:`~.fits.crossed_interval`: a document jackknife; df by Welch–Satterthwaite from
    seeds − 1 and the documents' Bell–McCaffrey df, at most seeds − 1), since an interval over
    seeds alone speaks for those documents only.

    Args:
        seeds: {seed: {"delta": (n,) Δsym, "difficulty": (n,) nats}} (float arrays, the same
            n tokens in the same order for every seed), at least 2 seeds.
        documents: (n,) the document of each token (the same for every seed), or None.

    Returns:
        {"per_seed": {seed: hard − easy}, "interval": :class:`~.fits.Interval` of hard − easy
        over seeds, "hard": {seed: mean Δsym on the hard tokens}, "hard_interval": its
        interval, "null": {seed: tanh(c/2), the uniform-improvement level}, "documents": how
        many documents (None without ``documents``)}.

    Raises:
        ValueError: fewer than 2 seeds, seeds that scored different numbers of tokens, or
            ``documents`` of another length, of one document, or one whose removal leaves a
            seed without hard or easy tokens.
    """
    deltas = {k: np.asarray(t["delta"], dtype=np.float64).ravel() for k, t in seeds.items()}
    diffs = {k: np.asarray(t["difficulty"], dtype=np.float64).ravel() for k, t in seeds.items()}
    sizes = {k: d.size for k, d in deltas.items()} | {k: d.size for k, d in diffs.items()}
    if len(seeds) < 2 or len(set(sizes.values())) != 1:
        raise ValueError(
            f"tokens per seed {sizes}: need >= 2 seeds that scored the same held-out tokens"
        )
    per_seed, hard_mean = _profile(deltas, diffs)
    null = {
        seed: float(np.tanh(np.arctanh(np.clip(delta, -0.999999, 0.999999)).mean()))
        for seed, delta in deltas.items()
    }
    interval = t_interval(list(per_seed.values()))
    hard_interval = t_interval(list(hard_mean.values()))
    count = None
    if documents is not None:
        doc = np.asarray(documents).ravel()
        if doc.size != next(iter(sizes.values())):
            raise ValueError(f"documents for {doc.size} tokens, the seeds scored {sizes}")
        ids, tokens = np.unique(doc, return_counts=True)
        count = int(ids.size)
        if count < 2:
            raise ValueError(
                f"all {doc.size} scored tokens come from one document: an interval over seeds "
                "speaks for that document only, and the documents' sampling cannot be "
                "measured. Fix: score more held-out documents"
            )
        left = [_profile(deltas, diffs, doc != d) for d in ids]
        if not all(np.isfinite(list(p.values())).all() for p, _ in left):
            raise ValueError(
                "a document without which a seed has no hard or no easy token: the documents' "
                "sampling cannot be measured. Fix: score more held-out documents"
            )
        interval = crossed_interval(
            list(per_seed.values()), [np.mean(list(p.values())) for p, _ in left], tokens
        )
        hard_interval = crossed_interval(
            list(hard_mean.values()), [np.mean(list(h.values())) for _, h in left], tokens
        )
    return {
        "per_seed": per_seed,
        "interval": interval,
        "hard": hard_mean,
        "hard_interval": hard_interval,
        "null": null,
        "documents": count,
    }


def concentration_arm(data: StudyData) -> Optional[str]:
    """The arm claim 8 compares with the baseline, fixed before any loss is read: γ = 1 with
    both fixes (the paper's recipe), else γ = 1 alone; None when the study has neither."""
    return data.role("gamma1+eps+gate") or data.role("gamma1")


def concentration_missing(data: StudyData) -> str:
    """Why claim 8 has no comparison when ``compare`` did not run."""
    arm = concentration_arm(data)
    if arm is None:
        return "the study has no γ = 1 arm (γ = 1+ε+gate or γ = 1 with the baseline's ε, gate)"
    return f"no seed where both {arm} and the baseline finished at one size"


def claim8(data: StudyData, cmp: Optional[dict]) -> Verdict:
    """The gains concentrate on mid/high-difficulty tokens, as measured here: larger on the
    hardest ``1 − EASY_SHARE`` of the tokens than on the easiest ``EASY_SHARE`` (the paper's
    "rather than easy or extremely noisy tokens" has a noisy tail this contrast does not
    separate, so the claim names the contrast it tests)."""
    arm = concentration_arm(data)
    whose = (
        "γ = 1+ε+gate's gains over the baseline (γ, ε and the gate together, as the paper "
        "compares its recipe)"
        if arm is not None and arm == data.role("gamma1+eps+gate")
        else "γ = 1's gains over the baseline (γ alone)"
    )
    claim = (
        f"{whose} are larger on the hardest {1 - EASY_SHARE:.0%} of tokens than on the easiest "
        f"{EASY_SHARE:.0%} (the paper: mid/high-difficulty tokens; its noisy tail is not "
        "separated)"
    )
    rule = (
        f"held-out, γ=1+ε+gate (else γ=1; fixed in advance, not chosen by loss) vs baseline, so "
        "the recipe's whole effect, not γ's alone; per seed, tokens sorted by the other seeds' "
        "difficulty (a seed's own shares its noise; difficulty the two models' mean loss), then "
        "Student-t over seeds with the scored documents' sampling added (a document jackknife; "
        "df Welch–Satterthwaite's from seeds − 1 and the documents' Bell–McCaffrey df, at most "
        "seeds − 1): mean Δsym on the hardest "
        f"{1 - EASY_SHARE:.0%} of tokens − on the easiest {EASY_SHARE:.0%} (a gain uniform "
        "in log p gives a flat profile, 0), the same beyond a gain uniform in log-odds (per "
        "seed the shift that gives the observed mean Δsym, each token's Δsym under it "
        "subtracted: such a gain, which no easy token caps, also favours hard tokens), and mean "
        f"Δsym on the hardest {1 - EASY_SHARE:.0%} (a gain there), each against "
        f"+{CONCENTRATION_MIN:g}: reproduced if all three intervals lie above it, not "
        "reproduced if any lies below it; the first two's call with difficulty from the "
        "baseline's loss alone and from the arm's alone must agree, else inconclusive (which "
        "model defines difficulty would decide it)"
    )
    if not cmp or cmp.get("error"):
        why = cmp["error"] if cmp else concentration_missing(data)
        return _untested(claim, f"compare: {why}", rule)
    seeds, at = cmp["seeds"], (cmp["size"],)
    head = f"{cmp['arm']} vs {data.baseline} at {cmp['size']}"
    bar, what = learned_bar(data) or (None, "")
    flat = [
        f"seed {k} {side} {run[side]['mean_loss']:.4f}"
        for k, run in (cmp.get("runs") or {}).items()
        for side in ("a", "b")
        if bar is not None and not run[side]["mean_loss"] < bar
    ]
    if flat:
        why = (
            "not learned: the compared checkpoints' mean loss over the scored tokens is not "
            f"below {what}: {', '.join(flat)}"
        )
        return Verdict(claim, NOT_MEASURED, f"{head}: {why}", rule, sizes=at, reason=why)
    if len(seeds) < 2:
        why = f"{len(seeds)} seed ({sorted(seeds)}); the profile needs >= 2 seeds"
        return Verdict(claim, INCONCLUSIVE, f"{head}: {why}", rule, sizes=at, reason=why)
    docs = cmp.get("documents")
    try:
        r = delta_sym_concentration(seeds, docs)
    except ValueError as e:
        return Verdict(claim, INCONCLUSIVE, f"{head}: {e}", rule, sizes=at, reason=str(e))
    per = ", ".join(f"seed {k} {v:+.4f}" for k, v in r["per_seed"].items())
    null = ", ".join(f"{v:+.4f}" for v in r["null"].values())
    v1, why1 = decide(r["interval"], CONCENTRATION_MIN, +1)
    v2, why2 = decide(r["hard_interval"], CONCENTRATION_MIN, +1)
    over = "over seeds and documents" if r["documents"] else "over seeds (documents not known)"
    nums = (
        f"{head}: hard − easy Δsym {per}; {over} {r['interval'].text()}: {why1}; Δsym on "
        f"the hard tokens {r['hard_interval'].text()}: {why2}; uniform-improvement level "
        f"tanh(c/2) per seed {null}"
    )
    if not all("loss_a" in t and "loss_b" in t for t in seeds.values()):
        nums += (
            "; difficulty from each model alone and the log-odds null not checked (no "
            "per-model losses)"
        )
        verdict = combine([v1, v2])
        return Verdict(
            claim, INCONCLUSIVE if verdict == REPRODUCED else verdict, nums, rule, sizes=at
        )
    fits = {k: log_odds_excess(t["delta"], t["loss_b"]) for k, t in seeds.items()}
    shifts = ", ".join(f"{c:+.4f}" for _, c in fits.values())
    nums += f"; the gain uniform in log-odds with that mean Δsym, c per seed {shifts}"
    calls = {}
    for name, key in (
        ("both models' mean loss", "difficulty"),
        ("the baseline's loss alone", "loss_b"),
        ("the arm's alone", "loss_a"),
    ):
        excess = {k: {"delta": fits[k][0], "difficulty": t[key]} for k, t in seeds.items()}
        odds = delta_sym_concentration(excess, docs)["interval"]
        v3, why3 = decide(odds, CONCENTRATION_MIN, +1)
        if key == "difficulty":
            calls[name] = combine([v1, v2, v3])
            nums += f"; hard − easy beyond it {odds.text()}: {why3}: {calls[name]}"
            continue
        alt = {k: {"delta": t["delta"], "difficulty": t[key]} for k, t in seeds.items()}
        ra = delta_sym_concentration(alt, docs)
        calls[name] = combine(
            [*(decide(ra[x], CONCENTRATION_MIN, +1)[0] for x in ("interval", "hard_interval")), v3]
        )
        nums += (
            f"; with difficulty from {name}: hard − easy {ra['interval'].text()}, beyond the "
            f"log-odds gain {odds.text()}, hard {ra['hard_interval'].text()}: {calls[name]}"
        )
    verdict = calls["both models' mean loss"]
    if len(set(calls.values())) > 1:
        verdict = INCONCLUSIVE
        nums += (
            "; the call depends on which model defines difficulty ("
            + ", ".join(f"{n}: {v}" for n, v in calls.items())
            + ")"
        )
    return Verdict(claim, verdict, nums, rule, sizes=at)


SHARED_LR_SCOPE = "at one shared LR, not tuned per arm"
"""The scope of a decided shared-LR row (claims 1-3 and 6, and 4, 5, 7 and 8, which read only
the shared-LR runs): the arms' own best LRs may differ, and in docs/reproduction.md the gain at
the shared LR was 5-26x the best-LR one; saturation, sink share, stable rank and Δsym depend on
the LR too."""


def _at_shared_lr(row: Verdict) -> Verdict:
    """``row`` (a claim read at the shared LR) with :data:`SHARED_LR_SCOPE` added to the scope
    of a decided verdict."""
    if row.verdict not in (REPRODUCED, NOT_REPRODUCED):
        return row
    return replace(row, scope="; ".join(x for x in (SHARED_LR_SCOPE, row.scope) if x))


def learned_bar(data: StudyData) -> Optional[tuple[float, str]]:
    """The loss an arm's mean loss must lie below for it to have learned, and its description:
    δ (the study's margin, the smallest effect it counts) below the held-out loss of the train
    split's token frequencies (:attr:`~.analysis.StudyData.unigram_loss`), or below ln V, a
    uniform predictor's, without that loss. A model at or near that loss has learned nothing
    beyond how often each token occurs. None when the vocabulary size is unknown."""
    if not data.vocab_size:
        return None
    uniform = float(np.log(data.vocab_size))
    if data.unigram_loss is not None:
        ref = data.unigram_loss
        what = (
            f"the held-out loss of the train split's token frequencies, {ref:.4f} nats (add-0.5 "
            f"smoothed; ln V = ln {data.vocab_size} = {uniform:.4f} nats is a uniform "
            "predictor's)"
        )
    else:
        ref = uniform
        what = f"ln V = ln {data.vocab_size} = {uniform:.4f} nats (a uniform predictor's)"
    bar = ref - data.margin
    return bar, f"{bar:.4f} nats, δ = {data.margin:g} nats below {what}"


def _learned(data: StudyData, row: Verdict, arms: list[Optional[str]]) -> Verdict:
    """``row``, made not measurable in these runs (:data:`NOT_MEASURED`) where a decided
    verdict, or one not measurable at this scale, rests on an arm that has not learned: its
    seed-mean final validation loss at a size the row compares (:attr:`Verdict.sizes`; a size
    the row does not judge, e.g. a smaller one for a claim read at the largest, is not read) is
    not below the held-out loss of the train split's token frequencies
    (:attr:`~.analysis.StudyData.unigram_loss`): such a model has learned nothing beyond how
    often each token occurs, and its differences say nothing of the paper's effects. The bar
    is δ below that loss, or below ln V without it (:func:`learned_bar`; unknown V: no check,
    and a decided or not-measurable row says so). Losses read: the row's LR phase (confirm
    runs for ``best LR``). A row not measurable at this scale (a measured null credited to the
    scale) becomes not measurable in these runs as well, its "which explains the null"
    dropped: the hidden states may shrink in training until ε acts (claim 4's measured
    branch), so in a model that has not learned, the scale and the training length explain
    the null alike. An inconclusive row keeps its verdict and gets the same note."""
    if not data.vocab_size:
        if row.verdict not in (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE):
            return row
        unchecked = (
            "whether the compared arms learned (mean final loss below ln V, a uniform "
            "predictor's) is not checked: the study records no vocabulary size"
        )
        return replace(row, numbers=f"{row.numbers}; {unchecked}")
    bar, what = learned_bar(data)
    get = data.confirm_losses if row.lr == "best LR" else data.losses
    flat = [
        f"{a} at {s} {mean:.4f}"
        for a in dict.fromkeys(a for a in arms if a)
        for s in row.sizes
        if (losses := get(a, s)) and (mean := float(np.mean(list(losses.values())))) >= bar
    ]
    if not flat:
        return row
    decided = row.verdict in (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)
    why = f"not learned, mean final validation loss >= {what}: {', '.join(flat)}"
    numbers, reason = row.numbers, row.reason
    if row.verdict == NOT_MEASURABLE:
        numbers, reason = numbers.replace(EXPLAINS_NULL, ""), reason.replace(EXPLAINS_NULL, "")
        why += " (so the null may be the training length, not the scale)"
    note = f"{NOT_MEASURED + ': ' if decided else ''}{why}"
    verdict = NOT_MEASURED if decided else row.verdict
    return replace(
        row,
        verdict=verdict,
        numbers=f"{numbers}; {note}",
        scope="",
        reason=_reasons(reason, why),
    )


def _independent(data: StudyData, row: Verdict, arms: list[Optional[str]]) -> Verdict:
    """``row``, made inconclusive where seeds of one of ``arms``, at a size the row compares
    (:attr:`Verdict.sizes`), start from the same weights
    (:meth:`~.analysis.StudyData.same_start`; the row's LR phase): they did not change the
    initialization, so the between-seed spread in the row's intervals is run-to-run noise,
    not the spread of the initialization the claim is about, and the interval (df = seeds − 1)
    counts one replicate several times. An undecided row keeps its verdict and gets the
    note."""
    best = row.lr == "best LR"
    same = [
        f"{a} at {s} seeds {', '.join(map(str, group))}"
        for a in dict.fromkeys(a for a in arms if a)
        for s in row.sizes
        for group in data.same_start(a, s, best)
    ]
    if not same:
        return row
    verdict = INCONCLUSIVE if row.verdict in (REPRODUCED, NOT_REPRODUCED) else row.verdict
    why = (
        f"not independent replicates: {'; '.join(same)} start from the same "
        "weights (equal weight-matrix diagnostics at iteration 0), so the seed did not change "
        "the initialization and each such group is one replicate. Fix: check that each run's "
        "--seed reaches its model (sweep sets it per seed) and that no run loads its weights "
        "from a checkpoint (a --pretrained-checkpoint in the study's config starts every run "
        "from the same weights, whatever γ); a rerun of a seed is not a new seed"
    )
    return _with_reason(row, verdict, why)


def _with_reason(row: Verdict, verdict: str, why: str) -> Verdict:
    """``row`` made ``verdict``, ``why`` added to its numbers and to its reasons; its scope kept
    while the verdict stays what it was, none once it changed."""
    return replace(
        row,
        verdict=verdict,
        numbers=f"{row.numbers}; {why}",
        scope=row.scope if verdict == row.verdict else "",
        reason=_reasons(row.reason, why),
    )


def _bracketed(data: StudyData, row: Verdict, arms: list[Optional[str]]) -> Verdict:
    """``row`` (a comparison at each arm's own best LR), made inconclusive where the best LR
    of one of ``arms`` lies on its grid's edge at a size the row compares
    (:attr:`Verdict.sizes`): its own best LR is then not known. A row that compares no size
    names the edges at every size, where they say why no seed was compared."""
    sizes = row.sizes or data.sizes
    edges = [e for a in arms if a for s in sizes for e in [data.edge_lr(a, s)] if e]
    if not edges:
        return row
    verdict = INCONCLUSIVE if row.verdict in (REPRODUCED, NOT_REPRODUCED) else row.verdict
    why = f"the best LR is not bracketed: {'; '.join(edges)}"
    return _with_reason(row, verdict, why)


def _gap_noise(
    data: StudyData, arm: str, size: str, best: float, runner: float
) -> tuple[float, str]:
    """The seed noise (sd, nats) of the loss gap between ``arm``'s best LR and the runner-up
    at ``size``, and how it was measured: the sd of the gap itself over the seeds that ran
    both LRs (the runner-up is the shared LR, run on every seed), or else √2 × the sd between
    seeds of the loss at the best LR (the two LRs as independent draws: larger than the gap's
    own sd where a seed's runs at two LRs agree); (0.0, "") with one seed."""
    grid = data.lr_grid(arm, size)
    at_best = {**data.confirm_losses(arm, size), data.select_seed: grid[best]}
    shared = data.shared_lr_of(arm, size)
    if shared is not None and np.isclose(runner, shared):
        at_runner = {**data.losses(arm, size), data.select_seed: grid[runner]}
        seeds = sorted(set(at_best) & set(at_runner))
        gaps = [at_runner[k] - at_best[k] for k in seeds]
        if len(gaps) > 1 and all(np.isfinite(gaps)):
            return float(np.std(gaps, ddof=1)), f"the sd of that gap over {len(gaps)} seeds"
    losses = list(at_best.values())
    if len(losses) < 2 or not all(np.isfinite(losses)):
        return 0.0, ""
    noise = float(np.sqrt(2) * np.std(losses, ddof=1))
    return noise, f"√2 × the sd of {arm}'s loss over {len(losses)} seeds at {best:g}"


def _close_pick(data: StudyData, arm: str, size: str) -> str:
    """How ``arm``'s best LR at ``size`` beat the next-best LR of its grid on the one selection
    seed by less than δ or than twice the seed noise of such a gap (:func:`_gap_noise`),
    whichever is larger, or "" where it won by more (or there is no grid to pick from): a gap
    that small may reverse on another seed."""
    grid = data.lr_grid(arm, size)
    best = data.best_lr(arm, size)
    others = {lr: x for lr, x in grid.items() if lr != best and np.isfinite(x)}
    if best is None or not others or not np.isfinite(grid[best]):
        return ""
    runner = min(others, key=others.get)
    gap = others[runner] - grid[best]
    noise, how = _gap_noise(data, arm, size, best, runner)
    limit = max(data.margin, 2 * noise)
    if gap >= limit:
        return ""
    bound = (
        f"δ = {data.margin:g}"
        if limit == data.margin
        else f"2 × the gap's seed noise, 2 × {noise:.4f} ({how})"
    )
    return (
        f"{arm} at {size}: best LR {best:g} beat {runner:g} by {gap:.4f} nats on seed "
        f"{data.select_seed} alone, less than {bound}"
    )


def _close_best(data: StudyData, row: Verdict, arms: list[Optional[str]]) -> Verdict:
    """``row`` (a comparison at each arm's own best LR), its decided verdict scoped where the
    best LR of one of ``arms``, at a size the row compares, beat the next-best LR of its grid on
    the one selection seed by less than δ or than twice the seed noise of such a gap, whichever
    is larger: a difference that small may reverse on another seed, so which LR is the arm's
    best is not settled, and the row holds at the LRs chosen. The gap's seed noise:
    :func:`_gap_noise`."""
    close = [
        text
        for arm in dict.fromkeys(a for a in arms if a)
        for size in row.sizes
        if (text := _close_pick(data, arm, size))
    ]
    if not close:
        return row
    note = f"best LR chosen by a gap within its noise: {'; '.join(close)}"
    numbers = f"{row.numbers}; {note} (another seed may choose another LR)"
    if row.verdict not in (REPRODUCED, NOT_REPRODUCED):
        return replace(row, numbers=numbers)
    scope = "at LRs chosen on one seed, some by a gap within its noise"
    return replace(row, numbers=numbers, scope="; ".join(x for x in (row.scope, scope) if x))


def _seed_penalties(data: StudyData, arm: str, size: str) -> dict[int, float]:
    """{seed: ``arm``'s loss at its shared LR − its loss at its own best LR} over the seeds that
    ran both (the confirm seeds), seeds sorted: its LR penalty per seed, nats."""
    at_shared, at_best = data.losses(arm, size), data.confirm_losses(arm, size)
    return {k: at_shared[k] - at_best[k] for k in sorted(set(at_shared) & set(at_best))}


def _refuted_picks(data: StudyData, row: Verdict, arms: list[Optional[str]]) -> Verdict:
    """``row`` (a comparison at each arm's own best LR), made inconclusive where it is decided
    and the confirm seeds refute the best LR of one of ``arms`` at a size the row compares: its
    loss at the shared LR minus its loss at the chosen LR, paired by seed over the seeds that
    ran both, has the upper end of its 95% interval below 0, so the shared LR beat the "best"
    one and the arm's own best LR is not known; the row would credit that arm's distance from
    its best LR to the claim's factor (trial 13, finding 1: one lucky grid run on the selection
    seed gave 32 of 40 false "reproduced" at one size). Every refuted pick is named, with its
    interval, in the numbers of an undecided row too."""
    refuted = []
    for arm in dict.fromkeys(a for a in arms if a):
        for size in row.sizes:
            best, shared = data.best_lr(arm, size), data.shared_lr_of(arm, size)
            if best is None or shared is None or np.isclose(best, shared):
                continue
            per_seed = _seed_penalties(data, arm, size)
            if not per_seed:
                continue
            pen = t_interval(list(per_seed.values()), "seeds")
            if pen.has_interval and pen.high < 0:
                refuted.append(
                    f"{arm} at {size}: its chosen LR {best:g} lost to the shared LR {shared:g} "
                    f"on the confirm seeds (loss at the shared LR − at the chosen, "
                    f"{pen.text()})"
                )
    if not refuted:
        return row
    why = (
        f"the chosen best LR is refuted: {'; '.join(refuted)}, so that arm's own best LR is "
        "not known and this row does not compare it there"
    )
    if row.verdict not in (REPRODUCED, NOT_REPRODUCED):
        return replace(row, numbers=f"{row.numbers}; {why}")
    return _with_reason(row, INCONCLUSIVE, f"not decided: {why}")


def _complete(data: StudyData, row: Verdict, arms: list[Optional[str]]) -> Verdict:
    """``row``, made inconclusive (whatever it would say otherwise, *not measurable*
    included) where a planned run of one of ``arms`` has not finished or has diverged (a NaN
    or inf loss, whose NaN diagnostics the mechanism claims would skip; which runs count:
    :meth:`~.analysis.StudyData.incomplete`): a failed or diverged run is missing data, not a
    loss, and the runs that survived may flatter an arm; nor is a study still running judged
    at an interim look."""
    unfinished, diverged = data.incomplete([a for a in arms if a], row.lr == "best LR")
    if not unfinished and not diverged:
        return row
    verdict = INCONCLUSIVE
    parts = []
    for keys, what in (
        (unfinished, "unfinished (failed, running or not started"),
        (diverged, "diverged (a NaN or inf loss"),
    ):
        if keys:
            listed = ", ".join(keys[:UNFINISHED_LISTED])
            more = len(keys) - UNFINISHED_LISTED
            parts.append(f"{len(keys)} {what}: {listed}{f' and {more} more' if more > 0 else ''})")
    fix = []
    if unfinished:
        fix.append("sweep finishes the unfinished")
    if diverged:
        fix.append(
            "a diverged run is a result (that arm diverged at that LR), not a loss to average"
        )
    why = (
        f"not decided while planned runs of the compared arms are {' and '.join(parts)}: "
        f"{'; '.join(fix)}"
    )
    return _with_reason(row, verdict, why)


def _lr_penalties(
    data: StudyData, row: Verdict, arms: list[Optional[str]], strict: bool = False
) -> tuple[list[str], list[str]]:
    """Each of ``arms``' LR penalty at each size ``row`` compares: its loss at its shared LR
    (:meth:`~.analysis.StudyData.shared_lr_of`: the study's, or the size's own) minus its loss at
    its own best LR, paired by seed over the seeds that ran both (the confirm seeds); 0 exactly
    where its best LR is the shared LR. Returns the texts of all, and those of the arm-sizes
    whose mean penalty exceeds δ (the shared LR is measurably off their own best) or cannot be
    measured (no grid, no shared-LR run, or no seed that ran both), which may exceed it.

    ``strict`` (the mechanism rows, :func:`_lr_confounded`; trial 11, finding 1): an arm-size
    counts among those off where the upper end of its penalty's 95% interval exceeds δ (or it
    has no interval), not its mean, and where its best LR, the shared one included, is not
    known: on its grid's edge (:meth:`~.analysis.StudyData.edge_lr`) or chosen by a gap within
    its noise (:func:`_close_pick`), which may put the shared LR at 0 penalty by chance."""
    every, off = [], []
    for arm in dict.fromkeys(a for a in arms if a):
        for size in row.sizes:
            best, shared = data.best_lr(arm, size), data.shared_lr_of(arm, size)
            unknown = [x for x in (data.edge_lr(arm, size), _close_pick(data, arm, size)) if x]
            unknown = f"; its best LR not known: {'; '.join(unknown)}" if strict and unknown else ""
            if best is not None and shared is not None and np.isclose(best, shared):
                every.append(f"{arm} at {size} 0 (its best LR is the shared LR{unknown})")
                if unknown:
                    off.append(every[-1])
                continue
            per_seed = _seed_penalties(data, arm, size)
            if best is None or shared is None or not per_seed:
                missing = (
                    "no LR grid run" if best is None
                    else "no shared-LR run" if shared is None
                    else "no seed ran both LRs"
                )  # fmt: skip
                text = f"{arm} at {size} not measured ({missing})"
                every.append(text)
                off.append(text)
                continue
            pen = t_interval(list(per_seed.values()), "seeds")
            text = (
                f"{arm} at {size} {pen.text()} (its best LR {best:g}, "
                f"{best / shared:g}× the shared {shared:g}{unknown})"
            )
            every.append(text)
            high = pen.high if pen.has_interval else math.inf
            if pen.mean > data.margin or (strict and (high > data.margin or unknown)):
                off.append(text)
    return every, off


def _with_penalties(
    data: StudyData, row: Verdict, arms: list[Optional[str]], mechanism: bool = False
) -> tuple[Verdict, list[str]]:
    """``row`` with each compared arm's LR penalty (:func:`_lr_penalties`, strict for a
    ``mechanism`` row) added to its numbers where it is decided in a study with an LR grid (a
    ``mechanism`` row also where its null is credited to the scale or to training length:
    *not measurable ...*), and the penalties over δ or not measured; ``(row, [])``
    otherwise."""
    judged = (REPRODUCED, NOT_REPRODUCED, *((NOT_MEASURABLE, NOT_MEASURED) if mechanism else ()))
    if not data.has_lr_grid or row.verdict not in judged:
        return row, []
    every, off = _lr_penalties(data, row, arms, strict=mechanism)
    if not every:
        return row, []
    numbers = (
        f"{row.numbers}; LR penalties (loss at the shared LR − loss at the arm's own best LR, "
        f"paired by seed): {'; '.join(every)}"
    )
    if mechanism:
        numbers += (
            " (a loss penalty bounds how far in loss an arm ran from its best LR, not how much "
            "this diagnostic changes with the LR: in a flat loss basin a small penalty can hide "
            "a large change)"
        )
    return replace(row, numbers=numbers), off


def _off_best(data: StudyData, off: list[str], strict: bool = False) -> str:
    """Why the arm-sizes ``off`` (:func:`_lr_penalties`, ``strict`` or not) leave a row open."""
    many = f"{len(off)} compared arm-size{'s' if len(off) > 1 else ''}"
    if strict:
        return (
            f"the shared LR may be more than δ = {data.margin:g} nats (in loss) off the own best "
            f"LR of {many} (the upper end of its penalty's 95% interval above δ, or no "
            "interval, or its best LR on its grid's edge or chosen within its noise)"
        )
    return (
        f"the shared LR is more than δ = {data.margin:g} nats off (or not measured against) the "
        f"own best LR of {many}"
    )


def _lr_dependent(
    data: StudyData, shared: Verdict, best: Verdict, arms: list[Optional[str]]
) -> Verdict:
    """``shared`` (a claim read at the shared LR), with each compared arm's LR penalty
    (:func:`_with_penalties`) added to its numbers, and made inconclusive where it is decided,
    the shared LR lies more than δ from some compared arm's own best LR (or that distance is
    not measured), and ``best`` (the same claim at each arm's own best LR, judged) does not
    reach the same verdict: the difference at the shared LR may then be the arms' distances
    from their own best LRs, an effect of the learning rate, credited to the claim's factor
    (docs/reproduction.md: at d64 γ = 0.5's penalty was 96 % of claim 1's shared-LR gap).
    ``best`` vouches only where it read every size ``shared`` did (:func:`_covers`)."""
    shared, off = _with_penalties(data, shared, arms)
    if not off or (best.verdict == shared.verdict and _covers(best, shared)):
        return shared
    at_best = (
        f"at each arm's own best LR this claim is {best.verdict}"
        if _covers(best, shared)
        else f"at each arm's own best LR it was read at {_sizes_text(best)} only, not at every "
        f"size this row reads ({', '.join(shared.sizes)})"
    )
    why = (
        f"not decided: {_off_best(data, off)}, and {at_best}, so the difference at the shared "
        "LR may be the learning rate's, not the claim's factor's"
    )
    return _with_reason(shared, INCONCLUSIVE, why + _penalty_difference(data, shared, arms))


def _covers(best: Verdict, shared: Verdict) -> bool:
    """Whether the best-LR row ``best`` read every size the shared-LR row ``shared`` reads: an
    LR grid run at some sizes only (a study may tune the LR at its small sizes) checks nothing
    at the others (trial 14, finding 1: 38 and 40 of 40 false "reproduced" where the largest
    size's gap was all the learning rate's)."""
    return set(shared.sizes) <= set(best.sizes)


def _sizes_text(row: Verdict) -> str:
    return ", ".join(row.sizes) if row.sizes else "no size"


def _penalty_difference(data: StudyData, row: Verdict, arms: list[Optional[str]]) -> str:
    """For a row that compares two arms (``arms``: the arm, then its reference), the paired
    difference of their LR penalties at each size the row compares, as text ("" otherwise, or
    where a size has no seed that ran both LRs of both arms): D = penalty(arm) −
    penalty(reference) per seed over the confirm seeds, nats, Student t, df = seeds − 1. D is
    what the arms' distances from their own best LRs add to the gap at the shared LR (the gap
    minus D is the gap at the best LRs, seed by seed), so equal penalties cancel (trial 11,
    finding 5: the rule above blocks on each arm's penalty, and prints D so that a reader sees
    where they cancel)."""
    pair = list(dict.fromkeys(a for a in arms if a))
    if len(pair) != 2:
        return ""
    texts = []
    for size in row.sizes:
        pens = [_seed_penalties(data, arm, size) for arm in pair]
        seeds = sorted(set(pens[0]) & set(pens[1]))
        if not seeds:
            return ""
        d = paired_difference([pens[0][k] for k in seeds], [pens[1][k] for k in seeds])
        texts.append(f"at {size} {d.text()}")
    return (
        f" (the paired difference of the LR penalties, {pair[0]} − {pair[1]}, which is what "
        f"the LR adds to the gap at the shared LR: {'; '.join(texts)})"
    )


def _lr_confounded(data: StudyData, row: Verdict, arms: list[Optional[str]]) -> Verdict:
    """``row`` (a mechanism claim: 4, 5, 7 or 8, read at the shared LR only), with the compared
    arms' LR penalties (:func:`_with_penalties`, strict: the upper 95% bound, and a best LR on
    its grid's edge or chosen within its noise counted as not measured) added, made
    inconclusive where it is decided, or a null credited to the scale or to training length
    (*not measurable ...*; trial 11, finding 4), and some compared arm may have run more than
    δ from its own best LR: saturation, sink share, stable rank and Δsym depend on the LR, and
    no reading at each arm's own best LR exists to separate the LR's effect from the claim's
    factor's (trial 10: a control that dipped as much as the γ = 1 arm at its own best LR, and
    less only at the shared LR, gave claim 7 "reproduced"). The gate reads the loss penalty,
    not the diagnostic's own change with the LR, which a flat loss basin can hide (trial 11,
    finding 1)."""
    row, off = _with_penalties(data, row, arms, mechanism=True)
    if not off:
        return row
    if row.verdict in (NOT_MEASURABLE, NOT_MEASURED):
        row = replace(
            row,
            numbers=row.numbers.replace(EXPLAINS_NULL, ""),
            reason=row.reason.replace(EXPLAINS_NULL, ""),
        )
        why = (
            f"not credited to the scale or to training length alone: "
            f"{_off_best(data, off, True)}, "
            "and these diagnostics, which depend on the LR, were read at the shared LR only, "
            "so the learning rate may explain the null as well"
        )
    else:
        why = (
            f"not decided: {_off_best(data, off, True)}, and these diagnostics, which depend on "
            "the LR, were read at the shared LR only, so the difference may be the learning "
            "rate's, not the claim's factor's"
        )
    return _with_reason(row, INCONCLUSIVE, why)


def _unbounded_best_lr(row: Verdict) -> Verdict:
    """``row`` (a diagnostic claim read at each arm's own best LR: claim 7's confirm runs),
    its numbers kept, made inconclusive where it would decide or credit a null to the scale or
    training length. The grid picks each arm's best LR on one seed, to within half a grid step
    at best, which bounds the loss it gives up (δ) but not how far this diagnostic moves with
    the LR: nothing in the runs measures that, so a difference at the picks can be the picks'
    offsets from the true best LRs (trial 15: with a true best LR between grid points, a
    diagnostic moving 0.1 per LR doubling, and no difference at the true best LRs, 6-25 of 40
    simulated studies called a best-LR diagnostic row reproduced, more with more seeds, as the
    offset is a bias; and a shared-LR row that this row vouched for followed it). The row is
    read as each arm's diagnostic near its own best LR, not as a test of the claim."""
    if row.verdict not in (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE, NOT_MEASURED):
        return row
    why = (
        f"not decided (it read {row.verdict}): each arm is read at the LR its grid picked on one "
        "seed, which brings its loss within the grid's resolution of its own best but leaves "
        "unmeasured how far this diagnostic moves within that resolution, so the difference "
        "may be the picks' offsets from the true best LRs"
    )
    return _with_reason(row, INCONCLUSIVE, why)


def _unmeasured_best_lr(row: Verdict) -> Verdict:
    """The best-LR row of a study without an LR grid: not measured, so inconclusive."""
    why = (
        "not measured: this study has no LR grid, so each arm's own best LR is unknown and a "
        "difference at one shared LR may be the arms' different best LRs (add lr_grid to the "
        "study file)"
    )
    return _untested(row.claim, why, row.rule, "best LR")


def verdicts(data: StudyData, grids: dict[str, dict], cmp: Optional[dict]) -> list[Verdict]:
    """The rows in the paper's order; claims 1–3 and 6 at the shared LR and again at each
    arm's own best LR (chosen on the selection seed, compared on the other seeds; a decisive
    verdict there needs every compared arm's best LR inside its grid; without an LR grid that
    row is inconclusive, not measured); claims 4, 5, 7 and 8 at the shared LR, undecided (and
    a null not credited to the scale or training length) in an LR-grid study where a compared
    arm may have run more than δ from its own best LR (:func:`_lr_confounded`); with an LR
    grid claim 7 also at each arm's own best LR, a row that decides nothing
    (:func:`_unbounded_best_lr`).

    Args:
        data: the study.
        grids: {"shared LR": :func:`~.analysis.gamma_grid`, "best LR": its ``best`` phase}
            ({} without a γ grid).
        cmp: the Δsym comparison of :func:`concentration_arm` against the baseline
            (:func:`claim8`), or None.
    """
    pair = [data.role("gamma1"), data.baseline]
    four = [*pair, data.role("gamma1+eps+gate"), data.role("gamma0.5+eps+gate")]

    def judged(row: Verdict, arms: list[Optional[str]]) -> Verdict:
        """``row`` scoped to the shared LR where it reads the shared-LR runs, then checked for
        seeds that did not change the initialization, arms that have not learned and
        unfinished runs."""
        scoped = _at_shared_lr(row) if row.lr == "shared LR" else row
        return _complete(data, _learned(data, _independent(data, scoped, arms), arms), arms)

    rows = []
    for claim, arms in ((claim1, pair), (claim2, pair), (claim3, four)):
        shared = claim(data, data.losses, "shared LR")
        if data.has_lr_grid:
            best = _bracketed(data, claim(data, data.confirm_losses, "best LR"), arms)
            best = judged(_refuted_picks(data, _close_best(data, best, arms), arms), arms)
            rows += [judged(_lr_dependent(data, shared, best, arms), arms), best]
        else:
            shared = judged(shared, arms)
            rows += [shared, _unmeasured_best_lr(shared)]

    def mechanism(row: Verdict, arms: list[Optional[str]]) -> Verdict:
        return judged(_lr_confounded(data, row, arms), arms)

    rows.append(mechanism(claim4(data), [data.role("gamma1"), data.role("gamma1+eps")]))
    rows.append(mechanism(claim5(data), [data.baseline, *_sink_arms(data)]))
    grid_arms = _neighbour_arms(data)
    shared = claim6(data, grids.get("shared LR", {}), "shared LR")
    if data.has_lr_grid:
        best = claim6(data, grids.get("best LR", {}), "best LR")
        best = judged(
            _refuted_picks(data, _close_best(data, best, grid_arms), grid_arms), grid_arms
        )
        rows += [judged(_lr_dependent(data, shared, best, grid_arms), grid_arms), best]
    else:
        shared = judged(shared, grid_arms)
        rows += [shared, _unmeasured_best_lr(shared)]
    rank_arms = [x for pair in _condensation_arms(data).items() for x in pair]
    rows.append(mechanism(claim7(data), rank_arms))
    if data.has_lr_grid:
        rows.append(judged(_unbounded_best_lr(claim7(data, "best LR")), rank_arms))
    rows.append(mechanism(claim8(data, cmp), [concentration_arm(data), data.baseline]))
    return rows
