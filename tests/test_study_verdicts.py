"""The verdict engine of ``megatron-gamma report`` on synthetic run records with known answers.

Every expected interval is recomputed here by hand from the records (numpy + scipy.stats.t), not
read back from the engine's own helpers.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Optional

import numpy as np
import pytest
from scipy import stats

from megatron_gamma.config import ConfigError, load_config, save_config
from megatron_gamma.data.indexed import compact_builder
from megatron_gamma.study.analysis import (
    StudyData,
    embedding_init,
    gamma_grid,
    loss_table,
    mechanisms,
    multiplier_text,
    rank_dip,
    scaling_fits,
    unigram_loss,
)
from megatron_gamma.study.fits import Interval, trend_interval
from megatron_gamma.study.report import _learned_bar, _multiplicity, stable_rank_cell
from megatron_gamma.study.rundir import RunRecord
from megatron_gamma.study.verdicts import (
    DIP_MIN,
    END_SHARE,
    FIT_SHARE,
    INCONCLUSIVE,
    NOT_MEASURABLE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    Verdict,
    _dip_rise,
    _end_fall,
    _gap_noise,
    claim1,
    claim2,
    claim3,
    claim4,
    claim5,
    claim6,
    claim7,
    claim8,
    concentration_arm,
    decide,
    delta_sym_concentration,
    log_odds_excess,
    verdicts,
)

ARMS = {
    "baseline": (0.5, 1e-5, "none"),
    "gamma1": (1.0, 1e-5, "none"),
    "gamma1+eps": (1.0, 1e-12, "none"),
    "gamma1+eps+gate": (1.0, 1e-12, "elementwise"),
    "gamma0.5+eps+gate": (0.5, 1e-12, "elementwise"),
}


def _t_interval(x, level=0.95):
    x = np.asarray(x, dtype=np.float64)
    half = stats.t.ppf((1 + level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return x.mean() - half, x.mean() + half


def make_study(
    losses,
    widths,
    *,
    arms=None,
    manifest=None,
    diagnostics=None,
    lr=None,
    vocab_size=None,
    unigram_loss=None,
    run_dir=None,
):
    """StudyData from {(arm, size, seed): loss}; widths {size: hidden_size}; N = 1000·width²;
    ``lr`` {(arm, size, seed): (lr, phase, grid)} for LR-grid studies; ``run_dir`` {(arm,
    size): a run directory whose config.yaml gives the embedding's init}."""
    arms = arms or ARMS
    runs = []
    for (arm, size, seed), loss in losses.items():
        gamma, eps, gate = arms[arm]
        entry = {
            "key": f"{arm}/{size}/seed-{seed}",
            "arm": arm,
            "size": size,
            "seed": seed,
            "train_iters": 100,
            "non_embedding": 1000 * widths[size] ** 2 + (7 if gate != "none" else 0),
            "init_gamma": gamma,
            "norm_epsilon": eps,
            "gated_attention": gate,
            "hidden_size": widths[size],
            "num_layers": 2,
            "seq_length": 128,
            "finished": True,
            "loss": loss,
            "record": RunRecord(diagnostics=(diagnostics or {}).get((arm, size, seed), {})),
        }
        if lr and (arm, size, seed) in lr:
            entry["lr"], entry["lr_phase"], entry["grid"] = lr[(arm, size, seed)]
        if run_dir and (arm, size) in run_dir:
            entry["embedding_init"] = embedding_init(run_dir[(arm, size)], entry, vocab_size)
        runs.append(entry)
    manifest = {"name": "synthetic", "baseline": "baseline", **(manifest or {})}
    return StudyData(manifest, runs, vocab_size=vocab_size, unigram_loss=unigram_loss)


def shared(data):
    return data.losses


# --- claim 1: units of replication -------------------------------------------------------


def test_clean_effect_is_reproduced_with_sizes_as_units():
    rng = np.random.default_rng(1)
    widths = {"s1": 256, "s2": 512, "s3": 1024}
    losses, per_size = {}, []
    for i, size in enumerate(widths):
        base = 5.0 - 0.3 * i + rng.normal(0, 0.02, 3)
        gain = np.array([-0.30, -0.32, -0.29]) + 0.01 * i
        for seed in range(3):
            losses[("baseline", size, seed + 1)] = float(base[seed])
            losses[("gamma1", size, seed + 1)] = float(base[seed] + gain[seed])
        per_size.append(gain.mean())
    data = make_study(losses, widths)
    v = claim1(data, data.losses, "shared LR")
    lo, hi = _t_interval(per_size)
    assert v.verdict == REPRODUCED
    assert f"[{lo:+.4f}, {hi:+.4f}] (df 2, 3 sizes)" in v.numbers
    assert "(df 2, 3 seeds)" in v.numbers  # the per-size intervals print theirs


def test_a_one_size_study_scopes_claims_1_and_3_to_that_size():
    """Trial 13, finding 2: with one width claims 1 and 3 printed a bare "reproduced" (the
    interval is that size's, over its seeds), which reads as a claim across sizes; claim 6
    already said "at SIZE only". A decided row names its one size; the same effects at two
    sizes keep their own scope."""
    data, losses = _four_arms(fix_at_1=0.25, fix_at_05=0.0)
    one = make_study({k: v for k, v in losses.items() if k[1] == "s2"}, {"s2": 512})
    scope = "at s2 only, seeds as units; not across sizes"
    for claim in (claim1, claim3):
        v = claim(one, one.losses, "shared LR")
        assert (v.verdict, v.scope) == (REPRODUCED, scope), (claim.__name__, v.numbers)
        assert "at the one size" in v.numbers and v.routes == 1
        two = claim(data, data.losses, "shared LR")
        assert "only" not in two.scope and two.routes == 2  # across sizes, or at each size


def test_seeds_one_arm_lacks_are_named_where_the_pairing_leaves_them_out():
    """Trial 13, finding 4: a run missing from study.json is no unfinished run, and the rows
    paired on the seeds both arms had, judging a size on 2 seeds of 4 without a word. The
    numbers name the seeds each arm lacks at each size; a study with every seed says none."""
    data, losses = _four_arms(fix_at_1=0.25, fix_at_05=0.0)
    assert "left out" not in claim1(data, data.losses, "shared LR").numbers
    gone = {("gamma1", "s2", 3), ("gamma1", "s2", 4), ("gamma0.5+eps+gate", "s1", 2)}
    fewer = make_study({k: v for k, v in losses.items() if k not in gone}, {"s1": 256, "s2": 512})
    note = "paired only on the seeds every compared arm has, so some are left out ("
    v = claim1(fewer, fewer.losses, "shared LR")
    assert "(df 1, 2 seeds)" in v.numbers.split("s2: ")[1]  # s2 judged on seeds 1 and 2
    assert f"{note}s2: gamma1 lacks seeds 3, 4): check that no run is missing" in v.numbers
    v = claim3(fewer, fewer.losses, "shared LR")
    assert (
        f"{note}s1: gamma0.5+eps+gate lacks seed 2; s2: gamma1 lacks seeds 3, 4): check"
        in v.numbers
    )


def test_an_arm_no_better_than_token_frequencies_has_not_learned():
    """Trial 4's sweep: every run ended at 7.3-8.7 nats, below ln V = 8.318 but above the
    7.23 nats of the train split's token frequencies on the held-out split, and the report
    decided claims on them (a γ = 1 "gain" of 0.2 nats between two models that had learned
    less than a frequency table). The bar is now that loss where the study knows it."""
    losses = {}
    for k, e in ((1, 0.0), (2, 0.02), (3, -0.02)):
        losses |= {("baseline", "s1", k): 8.25 + e, ("gamma1", "s1", k): 8.05 + 0.5 * e}
    above_unigram = make_study(losses, {"s1": 256}, vocab_size=4096, unigram_loss=7.2312)
    row = verdicts(above_unigram, {}, None)[0]
    assert (row.verdict, row.scope) == (NOT_MEASURED, "")
    bar = (
        "7.2212 nats, δ = 0.01 nats below the held-out loss of the train split's token "
        "frequencies, 7.2312 nats (add-0.5 smoothed; ln V = ln 4096 = 8.3178 nats is a uniform "
        "predictor's)"
    )
    assert (
        f"not measurable in these runs: not learned, mean final validation loss >= {bar}: "
        "gamma1 at s1 8.0500, baseline at s1 8.2500"
    ) in row.numbers
    assert verdicts(make_study(losses, {"s1": 256}, vocab_size=4096), {}, None)[0].verdict == (
        REPRODUCED  # below ln V: the uniform bar alone let it through
    )
    below = make_study(losses, {"s1": 256}, vocab_size=4096, unigram_loss=8.5)
    assert verdicts(below, {}, None)[0].verdict == REPRODUCED
    assert _learned_bar(above_unigram) == (
        f"An arm has learned where its mean final validation loss is below {bar}; a decided row, "
        "or a null credited to the scale, resting on one that has not is not measurable in these "
        "runs."
    )
    # within δ of the frequency table is not learned either (trial 5: arms 0.005 nats below)
    near = make_study({k: x + 0.205 for k, x in losses.items()}, {"s1": 256}, vocab_size=4096,
                      unigram_loss=8.46)  # fmt: skip
    row = verdicts(near, {}, None)[0]  # the baseline's mean 8.455, 0.005 below 8.46
    assert row.verdict == NOT_MEASURED and row.numbers.endswith(": baseline at s1 8.4550")


def test_unigram_loss_is_the_heldout_cross_entropy_of_train_token_frequencies(tmp_path):
    """fp64 by hand: p(t) = (count + 0.5) / (N + 0.5 V) from the train split's tokens, the
    mean of −ln p over the held-out split's tokens (EODs included, as written)."""
    vocab = 7
    train_docs = [[1, 2, 2, 3], [2, 4, 0]]
    heldout_docs = [[2, 5, 0], [1, 6]]
    prefixes = {}
    for name, docs in (("train", train_docs), ("heldout", heldout_docs)):
        prefix = str(tmp_path / name)
        builder = compact_builder(prefix + ".bin", np.uint16)
        for doc in docs:
            builder.add_document(np.array(doc, dtype=np.uint16), [len(doc)])
        builder.finalize(prefix + ".idx")
        prefixes[name] = prefix
    train = [t for d in train_docs for t in d]
    held = [t for d in heldout_docs for t in d]
    expected = -sum(
        math.log((train.count(t) + 0.5) / (len(train) + 0.5 * vocab)) for t in held
    ) / len(held)
    got = unigram_loss(prefixes["train"], prefixes["heldout"], vocab)
    assert got == pytest.approx(expected, rel=1e-12)
    assert unigram_loss(prefixes["train"], str(tmp_path / "missing"), vocab) is None
    with pytest.raises(ConfigError, match=r"token id 6 >= vocab_size=6: the split was made"):
        unigram_loss(prefixes["train"], prefixes["heldout"], 6)


def test_an_arm_that_has_not_learned_is_not_measurable_and_one_lr_is_scoped():
    """The trial's `mini` study: the baseline's mean final loss 8.3287 lay above ln 4096 =
    8.3178, a uniform predictor's, and γ = 1 "beat" it. Shifted so both arms learned (−3
    nats), the same gain is reproduced, at one shared LR only."""
    losses = {}
    for k, e in ((1, 0.0), (2, 0.02), (3, -0.02)):
        losses |= {("baseline", "s1", k): 8.3287 + e, ("gamma1", "s1", k): 7.90 + 0.5 * e}
    rows = verdicts(make_study(losses, {"s1": 256}, vocab_size=4096), {}, None)
    assert rows[0].lr == "shared LR" and rows[0].verdict == NOT_MEASURED and rows[0].scope == ""
    assert (
        "not measurable in these runs: not learned, mean final validation loss >= 8.3078 nats, "
        "δ = 0.01 nats below ln V = ln 4096 = 8.3178 nats (a uniform predictor's): baseline at "
        "s1 8.3287"
    ) in rows[0].numbers
    learned = {key: x - 3.0 for key, x in losses.items()}
    rows = verdicts(make_study(learned, {"s1": 256}, vocab_size=4096), {}, None)
    assert rows[0].verdict == REPRODUCED
    assert rows[0].label() == (
        "reproduced (at one shared LR, not tuned per arm; at s1 only, seeds as units; not "
        "across sizes)"
    )
    assert rows[1].lr == "best LR" and rows[1].verdict == INCONCLUSIVE and rows[1].scope == ""
    unknown = verdicts(make_study(losses, {"s1": 256}), {}, None)
    assert unknown[0].verdict == REPRODUCED  # no vocabulary size, no uniform-predictor check,
    assert unknown[0].numbers.endswith(  # and the row says it was not made
        "; whether the compared arms learned (mean final loss below ln V, a uniform predictor's) "
        "is not checked: the study records no vocabulary size"
    )
    assert "not checked" not in unknown[1].numbers  # an undecided row needs no such note


def test_the_not_learned_check_reads_only_the_sizes_a_row_judges():
    """Claim 7 judges the largest size only (s2, where both arms learned); the baseline had not
    learned at s1 (mean 8.4100 >= ln 4096). The check read every size of a compared arm and
    made claim 7's row not measurable for a size it never read; claim 1, which reads s1, is
    still flagged there."""
    one = _rank_study(first_iteration=0, arm_dip=0.8)
    losses, diag = {}, {}
    for r in one.runs:
        for size, loss in (("s1", 8.41 if r["arm"] == "baseline" else 8.0), ("s2", 5.0)):
            losses[(r["arm"], size, r["seed"])] = loss + 0.01 * r["seed"]
            diag[(r["arm"], size, r["seed"])] = r["record"].diagnostics
    data = make_study(losses, {"s1": 256, "s2": 512}, diagnostics=diag, vocab_size=4096)
    rows = verdicts(data, {}, None)
    rank = next(v for v in rows if v.claim.startswith("condensation then expansion"))
    assert rank.verdict == REPRODUCED and "not learned" not in rank.numbers, rank.numbers
    assert rank.sizes == ("s2",)
    gain = rows[0]  # claim 1 at the shared LR
    assert gain.sizes == ("s1", "s2")
    mean = np.mean([8.41 + 0.01 * k for k in (1, 2, 3)])
    assert mean >= math.log(4096)
    assert (
        f"not learned, mean final validation loss >= {math.log(4096) - 0.01:.4f} nats, δ = 0.01 "
        f"nats below ln V = ln 4096 = {math.log(4096):.4f} nats (a uniform predictor's): "
        f"baseline at s1 {mean:.4f}" in gain.numbers
    )


def test_the_multiplicity_sentence_counts_decided_rows_and_names_its_k():
    """The trial's smoke report said "The table decides 12 rows" with every row inconclusive."""
    rows = [Verdict("c", v, "n", "r") for v in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)]
    rows += [Verdict("c", NOT_MEASURABLE, "n", "r")]
    text = _multiplicity(rows)
    assert text.startswith("The table has 4 rows and decides 2 of them (reproduced or not ")
    # trial 7: the bound is on false "reproduced" calls, one side of each 95% interval (2.5%),
    # not 1 − 0.95^k, which counted a correct "not reproduced" under a null as a chance error
    assert (
        "k = 4 rows (4 ways) the chance of a false 'reproduced' is at most 4 · 2.5%, 10% (a" in text
    )
    assert "is at most 12 · 2.5%, 30% (a bound" in _multiplicity(rows * 3)
    assert "is at most 44 · 2.5%, 100% (a bound" in _multiplicity(rows * 11)
    assert "called two ways" not in text
    # trial 13, finding 3: claims 1 and 3 over two or more sizes can be called reproduced
    # across sizes or at each measured size, 2.5% each way
    two = [replace(rows[0], routes=2), replace(rows[1], routes=2), *rows[2:]]
    text = _multiplicity(two)
    assert "2.5% of the time per way; the 2 rows of claims 1 and 3 over two or more sizes" in text
    assert "can be called two ways, across sizes or at each measured size, so at most 5%" in text
    assert "k = 4 rows (6 ways) the chance of a false 'reproduced' is at most 6 · 2.5%, 15%" in text
    assert "decides none of them" in _multiplicity(rows[2:])
    # trial 11, finding 6: the bound is not promised where simulations refute it
    assert "They are not established for the condensation rows (claim 7)" in text
    assert "a second look that no file records" in text


def test_pseudo_replicated_effect_is_inconclusive():
    """The committed study's claim-1 losses: 6 (size, seed) pairs pooled give an interval below
    0, but with sizes as the unit it is [-1.41, +0.51] (the issue's numbers)."""
    base = {("d32", 1): 6.214253664016724, ("d32", 2): 6.247605681419373}
    base |= {("d64", 1): 5.7453413009643555, ("d64", 2): 5.846213936805725}
    base |= {("d96", 1): 5.531616032123566, ("d96", 2): 5.590380549430847}
    g1 = {("d32", 1): 5.489409923553467, ("d32", 2): 5.5303598046302795}
    g1 |= {("d64", 1): 5.096186995506287, ("d64", 2): 5.265060544013977}
    g1 |= {("d96", 1): 5.614770412445068, ("d96", 2): 5.493613958358765}
    losses = {("baseline", s, k): x for (s, k), x in base.items()}
    losses |= {("gamma1", s, k): x for (s, k), x in g1.items()}
    data = make_study(losses, {"d32": 32, "d64": 64, "d96": 96})
    pooled_hi = _t_interval([g1[k] - base[k] for k in base])[1]
    assert pooled_hi < -0.01  # pooling pairs would have called it reproduced
    per_size = [np.mean([g1[(s, k)] - base[(s, k)] for k in (1, 2)]) for s in ("d32", "d64", "d96")]
    lo, hi = _t_interval(per_size)
    assert (round(lo, 2), round(hi, 2)) == (-1.41, 0.51)
    v = claim1(data, data.losses, "shared LR")
    assert v.verdict == INCONCLUSIVE
    assert f"[{lo:+.4f}, {hi:+.4f}] (df 2, 3 sizes)" in v.numbers
    # d96: seeds +0.083 / -0.097 -> a 1-df interval of about ±1.14 around -0.0068
    assert "d96: -0.0068 [-1.1499, +1.1363] (df 1, 2 seeds)" in v.numbers


def test_null_effect_is_not_reproduced_and_one_seed_is_inconclusive():
    widths = {"s1": 256, "s2": 512}
    losses = {}
    for size, shift, noises in (
        ("s1", 0.0, (0.001, -0.002, 0.0015)),
        ("s2", -0.2, (-0.001, 0.0025, -0.0005)),
    ):
        for seed, noise in zip((1, 2, 3), noises, strict=True):
            losses[("baseline", size, seed)] = 5.0 + shift
            losses[("gamma1", size, seed)] = 5.0 + shift + noise
    data = make_study(losses, widths)
    assert claim1(data, data.losses, "shared LR").verdict == NOT_REPRODUCED
    one = make_study({("baseline", "s1", 1): 5.0, ("gamma1", "s1", 1): 4.0}, widths)
    v = claim1(one, one.losses, "shared LR")
    assert v.verdict == INCONCLUSIVE and "1 seed: no interval" in v.numbers


def test_one_seed_per_size_says_the_across_sizes_interval_is_the_spread_between_sizes():
    """Trial 4: claim 3 at the best LR printed "1 seed: no interval" at each size and then an
    across-sizes interval narrower than any within a size, with no word on what it rests on.
    Sizes as units make it valid (t with df = sizes − 1 over per-size values); the row now
    says that seed noise is inside that spread, not measured apart."""
    widths = {"s1": 256, "s2": 512, "s3": 1024}
    gains = {"s1": -0.30, "s2": -0.31, "s3": -0.28}
    losses = {}
    for i, s in enumerate(widths):
        losses[("baseline", s, 1)] = 5.0 - 0.3 * i
        losses[("gamma1", s, 1)] = 5.0 - 0.3 * i + gains[s]
    data = make_study(losses, widths)
    v = claim1(data, data.losses, "shared LR")
    lo, hi = _t_interval([losses[("gamma1", s, 1)] - losses[("baseline", s, 1)] for s in widths])
    assert v.verdict == REPRODUCED and hi < -0.01
    assert (
        "across sizes (one seed at every size: the spread between sizes, seed noise inside it "
        f"but not measured apart) -0.2967 [{lo:+.4f}, {hi:+.4f}] (df 2, 3 sizes)" in v.numbers
    )
    losses |= {("baseline", "s1", 2): 5.01, ("gamma1", "s1", 2): 4.70}
    data = make_study(losses, widths)
    v = claim1(data, data.losses, "shared LR")
    assert "; across sizes -0.29" in v.numbers and "one seed at every size" not in v.numbers


def test_seeds_that_do_not_change_the_run_are_inconclusive_not_certain():
    """Every seed gives the same loss in both arms (the seed did not reach the run): the paired
    differences all equal -0.3, whose zero-width interval would have lain below -δ."""
    losses = {}
    for seed in (1, 2, 3):
        losses[("baseline", "s1", seed)] = 5.0
        losses[("gamma1", "s1", seed)] = 4.7
    data = make_study(losses, {"s1": 256})
    v = claim1(data, data.losses, "shared LR")
    assert v.verdict == INCONCLUSIVE
    assert "-0.3000 (3 seeds, all equal: sd 0, no interval)" in v.numbers
    assert "all 3 seeds give the same value (sd 0)" in v.numbers
    assert decide(Interval(-0.3, math.nan, math.nan, 3, 2), 0.01, -1)[0] == INCONCLUSIVE


def test_seeds_that_start_from_the_same_weights_are_one_replicate():
    """Trial 4's s2b: three "seeds" that are one initialization rerun, with 1e-4 nats of
    run-to-run noise (nondeterministic kernels). The losses alone gave Δloss −0.1000 [−0.1001,
    −0.0998] (df 2) and "reproduced". Their weight-matrix diagnostics at iteration 0 are equal,
    value for value, which different seeds' draws never are: the row is inconclusive and names
    the seeds; with seed-dependent draws the same losses decide it."""
    noise = {1: 0.0, 2: 1e-4, 3: -1e-4}
    losses, same, drawn = {}, {}, {}
    for arm, loss in (("baseline", 5.6), ("gamma1", 5.5)):
        for k, e in noise.items():
            losses[(arm, "s1", k)] = loss + e * (1 if arm == "gamma1" else -0.5)
            start = {"stable_rank/qkv.q/layer_00": 30.0, "condensation/qkv.q/layer_00": 0.1}
            same[(arm, "s1", k)] = {0: start, 100: {"stable_rank/qkv.q/layer_00": 20.0 + e}}
            drawn[(arm, "s1", k)] = {0: {**start, "stable_rank/qkv.q/layer_00": 30.0 + 0.01 * k}}
    deltas = [losses[("gamma1", "s1", k)] - losses[("baseline", "s1", k)] for k in noise]
    lo, hi = _t_interval(deltas)
    assert hi < -0.01 and hi - lo < 1e-3  # the pseudo-replicated interval, decided on losses
    rerun = make_study(losses, {"s1": 256}, diagnostics=same)
    assert rerun.same_start("gamma1", "s1") == [[1, 2, 3]]
    row = verdicts(rerun, {}, None)[0]
    assert row.verdict == INCONCLUSIVE and row.scope == ""
    assert f"[{lo:+.4f}, {hi:+.4f}] (df 2, 3 seeds)" in row.numbers
    assert (
        "not independent replicates: gamma1 at s1 seeds 1, 2, 3; baseline at s1 seeds 1, 2, 3 "
        "start from the same weights" in row.numbers
    )
    row = verdicts(make_study(losses, {"s1": 256}, diagnostics=drawn), {}, None)[0]
    assert row.verdict == REPRODUCED and "not independent" not in row.numbers
    # seeds 1 and 3 share a draw, seed 2 differs; a run without iteration-0 diagnostics, or
    # with only non-finite ones, is not checked
    mixed = {key: same[key] if key[2] != 2 else drawn[key] for key in same}
    mixed[("baseline", "s1", 3)] = {100: {"stable_rank/qkv.q/layer_00": 20.0}}
    mixed[("baseline", "s1", 1)] = {0: {"stable_rank/qkv.q/layer_00": math.nan}}
    data = make_study(losses, {"s1": 256}, diagnostics=mixed)
    assert data.same_start("gamma1", "s1") == [[1, 3]]
    assert data.same_start("baseline", "s1") == []


def test_a_diverged_run_is_reported_as_not_finite_not_as_equal_seeds():
    """γ = 1 diverged on seed 2 at s2 (validation loss NaN; training does not stop on NaN, so
    the run finishes), and the baseline on seed 3 at s1 (inf). The engine once printed "+nan (3
    seeds, all equal: sd 0, no interval)" and told the reader to check that the seed changes the
    run. A diverged seed is not dropped either: dropping it would pair only γ = 1's survivors."""
    losses = {}
    for s, shift in (("s1", 0.0), ("s2", -0.3)):
        for k, e in ((1, 0.0), (2, 0.01), (3, -0.01)):
            losses[("baseline", s, k)] = 5.0 + shift + e
            losses[("gamma1", s, k)] = 4.7 + shift + e + 0.002 * k
    losses[("gamma1", "s2", 2)] = math.nan
    losses[("baseline", "s1", 3)] = math.inf
    data = make_study(losses, {"s1": 256, "s2": 512})
    d = [losses[("gamma1", "s2", k)] - losses[("baseline", "s2", k)] for k in (1, 2, 3)]
    assert int(np.sum(~np.isfinite(d))) == 1 and math.isnan(stats.tstd(d))
    v = claim1(data, data.losses, "shared LR")
    assert v.verdict == INCONCLUSIVE
    assert "s1: n/a (3 seeds, 1 not finite: NaN or inf, no interval)" in v.numbers
    assert "s2: n/a (3 seeds, 1 not finite: NaN or inf, no interval)" in v.numbers
    assert "across sizes n/a (2 sizes, 2 not finite: NaN or inf, no interval)" in v.numbers
    assert "2 of 2 sizes not finite (NaN or inf, e.g. a diverged run), no interval" in v.numbers
    assert "sd 0" not in v.numbers
    widths = {"s1": 256, "s2": 512, "s3": 1024}
    trend = {}
    for i, s in enumerate(widths):
        for k, e in ((1, 0.0), (2, 0.01), (3, -0.01)):
            trend[("baseline", s, k)] = 6.0 - 0.5 * i + e
            trend[("gamma1", s, k)] = 6.0 - 0.5 * i - (0.5, 0.28, 0.1)[i] + e + 0.002 * k
    trend[("gamma1", "s3", 1)] = math.nan
    data = make_study(trend, widths)
    v = claim2(data, data.losses, "shared LR")
    assert v.verdict == INCONCLUSIVE
    assert "change over the range n/a (3 sizes, 1 not finite: NaN or inf, no interval)" in (
        v.numbers
    )


def test_a_margin_from_study_json_must_be_finite_and_not_negative():
    """study.json's margin is read by report; a negative one (an edited manifest) made a null
    effect, paired differences 0 ± 0.0099 (df 2), "reproduced": its interval lay below +0.05,
    "beyond −δ". Refused, as the study file refuses it; so are NaN and inf."""
    from megatron_gamma.config import ConfigError

    losses = {}
    for k, e in ((1, 0.0), (2, 0.01), (3, -0.01)):
        losses |= {("baseline", "s1", k): 5.0 + e, ("gamma1", "s1", k): 5.0 + e + 0.004 * (k - 2)}
    lo, hi = _t_interval([0.004 * (k - 2) for k in (1, 2, 3)])
    assert -0.01 < lo < 0 < hi < 0.01  # no gain of δ = 0.01, but below +0.05
    data = make_study(losses, {"s1": 256})
    v = claim1(data, data.losses, "shared LR")
    assert v.verdict == NOT_REPRODUCED and f"[{lo:+.4f}, {hi:+.4f}] (df 2, 3 seeds)" in v.numbers
    for bad in (-0.05, math.nan, math.inf, "0.01", True):
        with pytest.raises(ConfigError, match=r"study\.json margin=.*finite number of nats >= 0"):
            make_study(losses, {"s1": 256}, manifest={"margin": bad})


def _unfinish(data: StudyData, keys: set[str]) -> StudyData:
    """``data`` with the runs ``keys`` unfinished (failed or not yet run: no loss)."""
    runs = [{**r, "finished": False, "loss": None} if r["key"] in keys else r for r in data.runs]
    return StudyData(data.manifest, runs)


def test_a_failed_run_keeps_the_rows_that_compare_its_arm_undecided():
    """γ = 1's seed 4 failed (it crashed, so no loss). Paired on the 3 survivors the gain is
    clear and the engine once called claim 1 reproduced; had the same blow-up left a NaN loss,
    the row was inconclusive. A failed run is missing data, not a loss: the rows that compare
    its arm wait for it, the others do not."""
    losses = {}
    for k, e in ((1, 0.0), (2, 0.01), (3, -0.01), (4, 0.005)):
        losses |= {("baseline", "s1", k): 5.0 + e, ("gamma1", "s1", k): 4.8 + e + 0.003 * k}
        losses |= {("gamma1+eps+gate", "s1", k): 4.7 + e, ("gamma0.5+eps+gate", "s1", k): 4.9 + e}
    data = _unfinish(make_study(losses, {"s1": 256}), {"gamma1/s1/seed-4"})
    d = [losses[("gamma1", "s1", k)] - losses[("baseline", "s1", k)] for k in (1, 2, 3)]
    lo, hi = _t_interval(d)
    assert hi < -0.01  # the survivors alone: "reproduced"
    rows = verdicts(data, {}, None)
    assert rows[0].verdict == INCONCLUSIVE
    assert f"at the one size {np.mean(d):+.4f} [{lo:+.4f}, {hi:+.4f}] (df 2, 3 seeds)" in (
        rows[0].numbers
    )
    assert (
        "not decided while planned runs of the compared arms are 1 unfinished (failed, running "
        "or not started: gamma1/s1/seed-4)" in rows[0].numbers
    )
    other = _unfinish(make_study(losses, {"s1": 256}), {"gamma0.5+eps+gate/s1/seed-2"})
    rows = verdicts(other, {}, None)
    assert rows[0].verdict == REPRODUCED  # claim 1 does not compare that arm
    assert rows[4].verdict == INCONCLUSIVE and "gamma0.5+eps+gate/s1/seed-2" in rows[4].numbers


def test_a_diverged_run_keeps_the_mechanism_rows_undecided():
    """γ = 1 diverged on seed 3: its loss and its sink shares are NaN, and the sink diagnostic
    (finite values only) skipped the run, so claim 5's γ effect was judged on seeds 1-2 alone
    and called reproduced. The diverged run is named and the row waits, as claim 1 does."""
    shares = {"baseline": 0.10, "gamma1": 0.16, "gamma1+eps": 0.20, "gamma1+eps+gate": 0.12}
    losses, diag = {}, {}
    for arm in shares:
        for seed in SINK_NOISE:
            losses[(arm, "s1", seed)] = 5.0 + 0.01 * seed
            x = math.nan if (arm, seed) == ("gamma1", 3) else _sink(shares, arm, seed)
            x0 = math.nan if math.isnan(x) else UNIFORM_128
            diag[(arm, "s1", seed)] = {
                0: {"sink_share/layer_00": x0},
                100: {"sink_share/layer_00": x},
            }
    losses[("gamma1", "s1", 3)] = math.nan
    data = make_study(losses, {"s1": 256}, diagnostics=diag)
    d = [_sink(shares, "gamma1", k) - _sink(shares, "baseline", k) for k in (1, 2)]
    lo, hi = _t_interval(d)
    assert lo > 0.01  # the two survivors alone: "reproduced"
    rows = verdicts(data, {}, None)
    sink = next(r for r in rows if r.claim.startswith("small initialization"))
    assert sink.verdict == INCONCLUSIVE
    assert sink.numbers.startswith(
        "s1: the sink share is NaN or inf in gamma1 seed 3 at iterations 0, 100: missing data"
    )  # trial 14: named, not read around (the two survivors' interval is not printed)
    assert f"[{lo:+.4f}, {hi:+.4f}]" not in sink.numbers
    diverged = "1 diverged (a NaN or inf loss: gamma1/s1/seed-3)"
    assert diverged in sink.numbers and diverged in rows[0].numbers
    assert rows[0].verdict == INCONCLUSIVE and "1 not finite" in rows[0].numbers


def test_an_unfinished_grid_run_keeps_only_the_best_lr_rows_undecided():
    """The baseline's grid point 4e-3 has not run: its best LR is unsettled, so the best-LR row
    waits, while the shared-LR row (which reads no grid run) is decided. A grid point that
    diverged keeps nothing waiting."""
    data = _lr_grid_study({"baseline": 2e-3, "gamma1": 2e-3})
    rows = verdicts(data, {}, None)
    assert (rows[0].verdict, rows[1].verdict) == (REPRODUCED, REPRODUCED)
    waiting = _unfinish(data, {"baseline/s1/seed-500"})
    rows = verdicts(waiting, {}, None)
    assert (rows[0].lr, rows[0].verdict) == ("shared LR", REPRODUCED)
    assert (rows[1].lr, rows[1].verdict) == ("best LR", INCONCLUSIVE)
    assert "unfinished (failed, running or not started: baseline/s1/seed-500)" in rows[1].numbers
    too_high = StudyData(
        data.manifest,
        [{**r, "loss": math.nan} if r["key"] == "baseline/s1/seed-900" else r for r in data.runs],
    )  # the grid's largest LR, 8e-3, diverged: a bad LR, not a missing comparison
    assert [r.verdict for r in verdicts(too_high, {}, None)[:2]] == [REPRODUCED, REPRODUCED]


def test_decide_uses_the_margin_not_the_sign():
    iv = Interval(-0.008, -0.009, -0.007, 3, 2)
    assert decide(iv, 0.01, -1)[0] == NOT_REPRODUCED  # below 0, but not by δ
    assert decide(iv, 0.001, -1)[0] == REPRODUCED
    assert decide(Interval(-0.02, -0.03, -0.005, 3, 2), 0.01, -1)[0] == INCONCLUSIVE
    assert decide(Interval(0.5, 0.2, 0.8, 3, 2), 0.01, +1)[0] == REPRODUCED
    assert decide(Interval(-0.5, math.nan, math.nan, 1, 0), 0.01, -1)[0] == INCONCLUSIVE


# --- claim 2: trends ------------------------------------------------------------------------


def _trend_study(gamma1_rises: bool):
    """Widths where ε = 1e-5 can act at γ = 1 (σ²_emb/ε = 1.53, 0.38, 0.095); the advantage
    shrinks 0.5 -> 0.302 -> 0.1 (not exactly on a line in ln N: residual spread for the
    interval); the baseline's loss falls; γ = 1's falls or rises."""
    widths = {"s1": 256, "s2": 512, "s3": 1024}
    base_loss = {"s1": 5.6, "s2": 5.5, "s3": 5.45}
    adv = {"s1": 0.5, "s2": 0.302, "s3": 0.1}
    if not gamma1_rises:
        base_loss = {"s1": 6.0, "s2": 5.5, "s3": 5.0}
    noise = {1: 0.01, 2: -0.012, 3: 0.004}
    losses = {}
    for s in widths:
        for seed, e in noise.items():
            losses[("baseline", s, seed)] = base_loss[s] + e
            losses[("gamma1", s, seed)] = base_loss[s] - adv[s] + e + 0.002 * seed
    return make_study(losses, widths), widths, losses


def test_artefact_loss_rising_with_size_is_never_reproduced():
    data, widths, losses = _trend_study(gamma1_rises=True)
    g1 = [np.mean([losses[("gamma1", s, k)] for k in (1, 2, 3)]) for s in widths]
    assert g1[2] > g1[1]  # the artefact: γ = 1 got worse from s2 to s3
    v = claim2(data, data.losses, "shared LR")
    assert v.verdict in (INCONCLUSIVE, NOT_REPRODUCED) and "loss rises with size" in v.numbers
    clean, widths, losses = _trend_study(gamma1_rises=False)
    v = claim2(clean, clean.losses, "shared LR")
    assert v.verdict == REPRODUCED
    # the slope's interval by hand: OLS of per-size mean advantage on ln N, df = 1
    x = np.log([1000 * w**2 for w in widths.values()])
    y = np.array(
        [
            np.mean([losses[("baseline", s, k)] - losses[("gamma1", s, k)] for k in (1, 2, 3)])
            for s in widths
        ]
    )
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    se = math.sqrt(resid @ resid / 1 / np.sum((x - x.mean()) ** 2))
    half = stats.t.ppf(0.975, 1) * se
    span = x[-1] - x[0]
    assert f"[{(b - half) * span:+.4f}, {(b + half) * span:+.4f}] (df 1, 3 sizes)" in v.numbers


def test_a_gain_that_never_was_does_not_shrink():
    """γ = 1 is worse than the baseline at every one of 5 sizes, more so as N grows: the
    advantage "changes" by −0.44 nats over the range, an interval well below −δ, and the engine
    once called "the gain of γ = 1 shrinks with size" reproduced (while claim 1 said not
    reproduced). There is no gain at the smallest size to shrink."""
    widths = {f"s{i}": w for i, w in enumerate((128, 256, 512, 1024, 2048))}
    adv = dict(zip(widths, (-0.1, -0.21, -0.33, -0.42, -0.55), strict=True))
    losses = {}
    for i, s in enumerate(widths):
        for k, e in ((1, 0.0), (2, 0.01), (3, -0.01)):
            losses[("baseline", s, k)] = 6.0 - 0.5 * i + e
            losses[("gamma1", s, k)] = 6.0 - 0.5 * i - adv[s] + e + 0.002 * k
    data = make_study(losses, widths)
    v = claim2(data, data.losses, "shared LR")
    assert v.verdict == NOT_REPRODUCED
    per_seed = {s: [losses[("baseline", s, k)] - losses[("gamma1", s, k)] for k in (1, 2, 3)]
                for s in widths}  # fmt: skip
    x = np.log([1000.0 * w**2 for w in widths.values()])
    fit = stats.linregress(x, [np.mean(g) for g in per_seed.values()])
    half, span = stats.t.ppf(0.975, 3) * fit.stderr, x[-1] - x[0]
    change = f"{fit.slope * span:+.4f} [{(fit.slope - half) * span:+.4f}, "
    change += f"{(fit.slope + half) * span:+.4f}] (df 3, 5 sizes)"
    assert f"change over the range {change}" in v.numbers and (fit.slope + half) * span < -0.01
    lo, hi = _t_interval(per_seed["s0"])
    gain = f"{np.mean(per_seed['s0']):+.4f} [{lo:+.4f}, {hi:+.4f}] (df 2, 3 seeds)"
    assert f"gain at s0 (the smallest) {gain}: the interval excludes an effect beyond +0.01" in (
        v.numbers
    )
    assert hi < 0.01


def test_a_trend_needs_three_sizes_not_seeds_across_two():
    """Two sizes, three seeds, the advantage 0.30 -> 0.10 nats: seeds within a size say nothing
    about size-to-size variation, so claim 2 gives no trend verdict (a Welch test over seeds
    once called it reproduced, [-0.2068, -0.1932]), while claim 1 on the same data has sizes as
    units, df 1."""
    losses = {}
    for s, base, adv in (("s1", 6.0, 0.30), ("s2", 5.5, 0.10)):
        for k, e in ((1, 0.0), (2, 0.01), (3, -0.01)):
            losses[("baseline", s, k)] = base + e
            losses[("gamma1", s, k)] = base - adv + e + 0.003 * k
    data = make_study(losses, {"s1": 256, "s2": 512})
    v = claim2(data, data.losses, "shared LR")
    assert v.verdict == INCONCLUSIVE and "paired at 2 size(s)" in v.numbers
    lo, hi = _t_interval([0.30 - 0.003 * k for k in (1, 2, 3)])  # each size's, by seed
    assert "needs >= 3 (df = sizes − 2)" in v.numbers
    assert f"advantage s1: +0.2940 [{lo:+.4f}, {hi:+.4f}] (df 2, 3 seeds)" in v.numbers
    per_size = [np.mean([0.003 * k for k in (1, 2, 3)]) - adv for adv in (0.30, 0.10)]
    lo, hi = _t_interval(per_size)
    assert f"across sizes {np.mean(per_size):+.4f} [{lo:+.4f}, {hi:+.4f}] (df 1, 2 sizes)" in (
        claim1(data, data.losses, "shared LR").numbers
    )
    with pytest.raises(ValueError, match="need >= 3 sizes"):
        trend_interval([0.0, 2.0], [[0.5, 0.52, 0.47], [0.2, 0.25, 0.22]])


def test_identical_arms_give_no_trend_interval_not_a_zero_width_one():
    """γ = 1 and the baseline are one run twice (the init flag did not reach the model): every
    advantage is 0, so the per-size means lie on the line 0 with residual sd 0. The engine once
    called claim 2 not reproduced on the zero-width interval [+0.0000, +0.0000] (df 1)."""
    widths = {"s1": 256, "s2": 512, "s3": 1024}
    losses = {}
    for i, s in enumerate(widths):
        for k, e in ((1, 0.0), (2, 0.01), (3, -0.01)):
            losses[("baseline", s, k)] = losses[("gamma1", s, k)] = 6.0 - 0.4 * i + e
    x = np.log([1000.0 * w**2 for w in widths.values()])
    means = [np.mean([losses[("baseline", s, k)] - losses[("gamma1", s, k)] for k in (1, 2, 3)])
             for s in widths]  # fmt: skip
    b, a = np.polyfit(x, means, 1)
    assert (a, b) == (0.0, 0.0) and np.sum((means - (a + b * x)) ** 2) == 0.0  # no spread
    data = make_study(losses, widths)
    v = claim2(data, data.losses, "shared LR")
    assert v.verdict == INCONCLUSIVE
    assert "+0.0000 (3 sizes, on an exact line: residual sd 0, no interval)" in v.numbers
    assert "the 3 sizes lie on an exact line (residual sd 0), no interval" in v.numbers
    assert "[+0.0000, +0.0000]" not in v.numbers


def test_eps_that_cannot_act_is_not_measurable():
    """At widths 32/64/96, σ²_emb/ε at init is 97.7 / 24.4 / 10.9 for γ = 1, ε = 1e-5: claim 4
    (saturation) is not measurable. Claim 2 is an observation (the paper: "the benefit
    diminishes as model size increases") whose cause the paper puts on ε and the sink: it was
    called not measurable on σ²_emb/ε alone, so a real shrinking went unreported (trial 4).
    Its trend is now judged; ε only scopes the verdict to the trend."""
    widths = {"d32": 32, "d64": 64, "d96": 96}
    adv = {"d32": 0.6, "d64": 0.35, "d96": 0.2}
    losses = {}
    for i, s in enumerate(widths):
        for seed in (1, 2, 3):
            losses[("baseline", s, seed)] = 6.0 - 0.4 * i + 0.01 * seed
            losses[("gamma1", s, seed)] = 6.0 - 0.4 * i - adv[s] + 0.013 * seed
    data = make_study(losses, widths)
    ratios = [w ** (-2.0) / 1e-5 for w in widths.values()]
    assert [round(r, 1) for r in ratios] == [97.7, 24.4, 10.9]
    v = claim2(data, data.losses, "shared LR")
    x = np.log([1000.0 * w**2 for w in widths.values()])
    per_size = [np.mean([adv[s] - 0.003 * k for k in (1, 2, 3)]) for s in widths]
    fit = stats.linregress(x, per_size)
    half, span = stats.t.ppf(0.975, 1) * fit.stderr, x[-1] - x[0]
    assert (fit.slope + half) * span < -0.01  # the advantage shrinks, as an interval shows
    assert f"[{(fit.slope - half) * span:+.4f}, {(fit.slope + half) * span:+.4f}] (df 1" in (
        v.numbers
    )
    assert v.verdict == REPRODUCED
    assert v.scope == "the trend only, not its cause: ε cannot act at initialization at these sizes"
    assert "d32 97.7, d64 24.4, d96 10.9" in v.numbers and "(10ε)^(−1/(2γ)) = 100" in v.numbers
    assert "does not shrink by the paper's ε mechanism" in v.numbers
    losses |= {("gamma1+eps", s, k): x for (a, s, k), x in losses.items() if a == "gamma1"}
    v4 = claim4(make_study(losses, widths))  # no saturation logged: nothing measured
    assert v4.verdict == INCONCLUSIVE and "d96 10.9" in v4.numbers
    assert v4.numbers.startswith("no saturation measured (no γ = 1+ε difference")


def test_eps_that_cannot_act_without_the_small_eps_arm_is_bounded_by_gamma1s_own_share():
    """Without a γ = 1+ε arm, where σ²_emb/ε > 10 at every size (64, 96: 24.4, 10.9), γ = 1's
    own saturated share bounds the difference ε could make (shares are >= 0): none in every
    seed is a measured null, not measurable at this scale; 0.4 is inconclusive (trial 8: it was
    "not measurable" on the ratio alone, which the measured branch no longer accepts); nothing
    logged is inconclusive. Where ε could act (width 512: 0.381) the row needs that arm."""
    losses = {
        (a, s, k): 5.0 + 0.01 * k for a in ("baseline", "gamma1") for s in ("d64", "d96")
        for k in (1, 2)
    }  # fmt: skip
    widths = {"d64": 64, "d96": 96}
    v = claim4(make_study(losses, widths))
    assert v.verdict == INCONCLUSIVE and "d64 24.4, d96 10.9" in v.numbers
    for share, verdict in ((0.0, NOT_MEASURABLE), (0.4, INCONCLUSIVE)):
        diag = {
            ("gamma1", s, k): {it: {"norm_saturated/layer_00": share * it / 100} for it in (0, 100)}
            for s in widths
            for k in (1, 2)
        }
        v = claim4(make_study(losses, widths, diagnostics=diag))
        assert v.verdict == verdict and v.sizes == ("d96",)
        assert v.numbers.startswith(
            f"d96: gamma1's own max saturated share seed 1 {share:.4f}, seed 2 {share:.4f}, a "
            "bound on the difference ε makes"
        )
    wide = {(a, "d512", k): x for (a, s, k), x in losses.items() if s == "d64"}
    v = claim4(make_study(wide, {"d512": 512}))
    assert v.verdict == INCONCLUSIVE and v.numbers.startswith("needs the γ = 1+ε arm")
    assert f"d512 {512**-2 / 1e-5:.3g}" in v.numbers


SINK_NOISE = {1: 0.0, 2: 0.004, 3: -0.003}


def _sink(shares: dict[str, float], arm: str, seed: int) -> float:
    """The final sink share of ``arm`` at ``seed``: its level plus a seed offset that differs
    between arms (by the arm's position in ``shares``), so paired differences vary by seed."""
    return shares[arm] + SINK_NOISE[seed] * (1 + list(shares).index(arm))


def _sink_study(shares: dict[str, float], arms=None, initial: Optional[dict[str, float]] = None):
    """One size, 3 seeds, each arm's final sink share (iteration 100) from :func:`_sink`, and
    at iteration 0 ``initial[arm]`` (default: uniform attention's, :data:`UNIFORM_128`)."""
    losses, diag = {}, {}
    for arm in shares:
        for seed in SINK_NOISE:
            losses[(arm, "s1", seed)] = 5.0
            x, x0 = _sink(shares, arm, seed), (initial or {}).get(arm, UNIFORM_128)
            diag[(arm, "s1", seed)] = {
                it: {"sink_share/layer_00": y, "sink_share/layer_01": y}
                for it, y in ((0, x0), (100, x))
            }
    return make_study(losses, {"s1": 256}, diagnostics=diag, arms=arms)


def _sink_effect(shares: dict[str, float], arm: str, ref: str) -> str:
    d = [_sink(shares, arm, k) - _sink(shares, ref, k) for k in SINK_NOISE]
    lo, hi = _t_interval(d)
    return f"({arm} − {ref}) {np.mean(d):+.4f} [{lo:+.4f}, {hi:+.4f}] (df 2, 3 seeds)"


UNIFORM_128 = float(np.mean([1 / (i + 1) for i in range(1, 128)]))
"""Sequence length 128: uniform causal attention's sink share, mean(1/(i+1), i = 1..127)."""


def test_no_sink_is_not_measurable_in_these_runs_even_without_the_small_eps_arm():
    low = 0.5 * UNIFORM_128
    v = claim5(_sink_study({"baseline": low, "gamma1": low, "gamma1+eps+gate": low}))
    assert v.verdict == NOT_MEASURED and f"(uniform attention {UNIFORM_128:.4f})" in v.numbers
    # trial 7: "at this scale" named a cause the runs cannot tell from training length
    assert v.numbers.endswith(
        "whether larger models or longer training would form one is not separated by these runs"
    )
    shares = {"baseline": 3 * UNIFORM_128, "gamma1": 3 * UNIFORM_128 + 0.05}
    shares["gamma1+eps+gate"] = 3 * UNIFORM_128
    v = claim5(_sink_study(shares))
    # a sink has formed; the gate's part has no ungated twin, so the verdict covers γ's part
    assert v.verdict == REPRODUCED
    assert v.scope == "the γ part only; the gate part not measured"
    assert v.label() == "reproduced (the γ part only; the gate part not measured)"
    assert (
        "effect of the gate: not measured, needs γ = 1+ε+gate and the same arm without the gate"
        in v.numbers
    )
    assert f"effect of γ {_sink_effect(shares, 'gamma1', 'baseline')}" in v.numbers


def test_sink_effects_compare_arms_that_differ_in_one_setting():
    """Without a γ = 1 arm, γ = 1+ε − baseline differs in γ and ε: it is not credited to γ
    (the engine once called this row reproduced). The gate's effect is γ = 1+ε+gate minus the
    same arm without the gate, and only where its ε matches."""
    shares = {"baseline": 0.10, "gamma1+eps": 0.20, "gamma1+eps+gate": 0.12}
    v = claim5(_sink_study(shares))
    assert v.verdict == REPRODUCED and v.scope == "the gate part only; the γ part not measured"
    assert "effect of γ: not measured, needs a γ = 1 arm with the baseline's ε and gate" in (
        v.numbers
    )
    gate = _sink_effect(shares, "gamma1+eps+gate", "gamma1+eps")
    assert f"effect of the gate {gate}: the interval lies beyond -0.01" in v.numbers
    full = claim5(_sink_study({**shares, "gamma1": 0.16}))
    assert full.verdict == REPRODUCED  # +0.06 from γ, −0.08 from the gate, both beyond δ
    assert full.scope == ""  # both parts measured
    other_eps = dict(ARMS, **{"gamma1+eps": (1.0, 1e-8, "none")})
    v = claim5(_sink_study({**shares, "gamma1": 0.16}, arms=other_eps))
    assert v.verdict == REPRODUCED and v.scope == "the γ part only; the gate part not measured"
    assert "effect of the gate: not measured, needs" in v.numbers


def test_an_unfinished_largest_size_keeps_the_sink_row_inconclusive_and_says_which_size():
    """The trial's interrupted sweep: both arms at s2 unfinished, no sink at s1. The row said
    "not measurable" beside "not decided while planned runs ... are unfinished", and showed
    s1's shares for a claim judged at the largest size (s2)."""
    losses, diag = {}, {}
    for arm in ("baseline", "gamma1+eps+gate"):
        for size in ("s1", "s2"):
            losses[(arm, size, 1)] = 5.0
            diag[(arm, size, 1)] = {
                it: {"sink_share/layer_00": 0.5 * UNIFORM_128} for it in (0, 100)
            }
    done = make_study(losses, {"s1": 256, "s2": 512}, diagnostics=diag)
    assert claim5(done).verdict == NOT_MEASURED  # no sink formed, every run finished
    keys = {"baseline/s2/seed-1", "gamma1+eps+gate/s2/seed-1"}
    runs = [
        {**r, "finished": False, "loss": None, "record": RunRecord()} if r["key"] in keys else r
        for r in done.runs
    ]
    rows = verdicts(StudyData(done.manifest, runs), {}, None)
    sink = next(r for r in rows if r.claim.startswith("small initialization"))
    assert sink.verdict == INCONCLUSIVE
    assert sink.numbers.startswith(
        "s1 (the largest size where every compared arm logged it on a common seed; not s2): "
        "sink share at iterations 0 → 100: baseline"
    )
    assert "2 unfinished (failed, running or not started: " in sink.numbers


def test_a_share_a_hair_above_uniform_or_there_at_initialization_is_no_sink():
    """The trial's `mini` study: the baseline's share was 0.0016 above uniform attention's
    already at iteration 0 (0.0018 at the end), γ = 1's at uniform; a strict > over uniform
    counted that as a sink and called the claim not reproduced. A sink needs an arm's share
    more than SINK_MIN = 0.01 above both uniform attention's and its own at iteration 0."""
    u = UNIFORM_128
    shares = {"baseline": u + 0.0018, "gamma1": u}
    v = claim5(_sink_study(shares, initial={"baseline": u + 0.0016}))
    assert v.verdict == NOT_MEASURED
    final = {a: np.mean([_sink(shares, a, k) for k in SINK_NOISE]) for a in shares}
    assert final["baseline"] > u  # the old rule's "a sink has formed"
    assert (
        f"s1: sink share at iterations 0 → 100: baseline {u + 0.0016:.4f} → "
        f"{final['baseline']:.4f}, gamma1 {u:.4f} → {final['gamma1']:.4f} (uniform attention "
        f"{u:.4f}); no sink has formed"
    ) in v.numbers
    at_init = {"baseline": u + 0.05, "gamma1": u + 0.02}
    assert claim5(_sink_study(at_init, initial=at_init)).verdict == NOT_MEASURED
    grown = claim5(_sink_study(at_init, initial={"baseline": u + 0.045, "gamma1": u}))
    assert grown.verdict == NOT_REPRODUCED  # gamma1 grew 0.02 past its start: a sink formed
    assert "a sink has formed in gamma1;" in grown.numbers
    assert grown.scope == "the γ part only; the gate part not measured"


def test_saturation_is_measured_where_the_diagnostic_can_see_it():
    """Width 256, γ = 1, ε = 1e-5: σ²_emb/ε = 1.53, within the diagnostic's own threshold
    (σ² <= 10 ε is saturated), so claim 4 is judged on the measured shares. At width 64 (24.4)
    ε cannot act at initialization, but the same measured difference is read all the same
    (trial 7: the row was 'not measurable' before the measurement was read): it is reproduced,
    saying that the hidden states shrank in training."""
    losses, diag = {}, {}
    for arm, sat in (("baseline", 0.0), ("gamma1", 0.6), ("gamma1+eps", 0.0)):
        for k, e in ((1, 0.0), (2, 0.02), (3, -0.01)):
            losses[(arm, "s1", k)] = 5.0
            value = sat + e if sat else 0.0
            diag[(arm, "s1", k)] = {it: {"norm_saturated/layer_00": value} for it in (0, 100)}
    d = np.array([0.6, 0.62, 0.59])
    lo, hi = _t_interval(d)
    v = claim4(make_study(losses, {"s1": 256}, diagnostics=diag))
    assert v.verdict == REPRODUCED
    assert f"s1: Δ max saturated share {d.mean():+.4f} [{lo:+.4f}, {hi:+.4f}] (df 2" in v.numbers
    v = claim4(make_study(losses, {"s1": 64}, diagnostics=diag))
    assert v.verdict == REPRODUCED and f"[{lo:+.4f}, {hi:+.4f}]" in v.numbers
    assert (
        "the interval lies beyond +0.01; measured although σ²_emb/ε > 10 at initialization at "
        "every size: the hidden states shrank during training; σ²_emb/ε at init" in v.numbers
    )


@pytest.mark.parametrize("width", [256, 64], ids=["eps-acts", "eps-cannot-act"])
def test_a_non_finite_saturation_of_either_compared_arm_leaves_claim_4_undecided(width):
    """γ = 1+ε's saturated share is inf at one seed and iteration: whether ε can act at
    initialization (width 256, σ²_emb/ε 1.53) or not (width 64, 24.4), the row reads no maximum
    around it and is inconclusive at that size, naming the run and the iteration (one path in
    ``claim4`` for both)."""
    losses, diag = {}, {}
    for arm, sat in (("baseline", 0.0), ("gamma1", 0.6), ("gamma1+eps", 0.0)):
        for k in (1, 2, 3):
            losses[(arm, "s1", k)] = 5.0
            diag[(arm, "s1", k)] = {it: {"norm_saturated/layer_00": sat} for it in (0, 100)}
    diag[("gamma1+eps", "s1", 2)][100]["norm_saturated/layer_00"] = math.inf
    v = claim4(make_study(losses, {"s1": width}, diagnostics=diag))
    why = (
        "the saturated share is NaN or inf in gamma1+eps seed 2 at iteration 100: missing data, "
        "and a mean, maximum or last value read around it would compare other iterations or "
        "matrices than the other arm's"
    )
    assert (v.verdict, v.sizes, v.reason) == (INCONCLUSIVE, ("s1",), why)
    assert v.numbers.startswith(f"s1: {why}; σ²_emb/ε at init (")


@pytest.mark.parametrize(
    ("shares", "verdict", "why"),
    [
        ((0.0, 0.001, 0.0), NOT_MEASURABLE, "ε cannot act at these sizes, which explains the null"),
        ((0.0, 0.03, 0.001), INCONCLUSIVE, "the interval includes +0.01"),
    ],
)
def test_where_eps_cannot_act_a_measured_null_is_not_measurable(shares, verdict, why):
    """Width 64 (σ²_emb/ε 24.4 at every size): a measured saturation difference whose interval
    lies below the margin is explained by the scale (not measurable at this scale); one that
    includes the margin is inconclusive, not explained away."""
    losses, diag = {}, {}
    for arm in ("baseline", "gamma1", "gamma1+eps"):
        for k, share in enumerate(shares, start=1):
            losses[(arm, "s1", k)] = 5.0
            value = share if arm == "gamma1" else 0.0
            diag[(arm, "s1", k)] = {it: {"norm_saturated/layer_00": value} for it in (0, 100)}
    lo, hi = _t_interval(np.array(shares))
    v = claim4(make_study(losses, {"s1": 64}, diagnostics=diag))
    assert v.verdict == verdict and f"[{lo:+.4f}, {hi:+.4f}]" in v.numbers
    assert why in v.numbers and (hi < 0.01) == (verdict == NOT_MEASURABLE)


def _saturation_study(shares, loss=5.0, size="s1", **kw):
    """Width 64 (σ²_emb/ε = 64^-2 / 1e-5 = 24.4 > 10 by default: ε cannot act at
    initialization), the baseline and γ = 1 (no γ = 1+ε arm), γ = 1's max saturated share
    ``shares[k - 1]`` at seed k."""
    losses, diag = {}, {}
    for k, share in enumerate(shares, start=1):
        for arm in ("baseline", "gamma1"):
            losses[(arm, size, k)] = loss
            value = share if arm == "gamma1" else 0.0
            diag[(arm, size, k)] = {it: {"norm_saturated/layer_00": value * it / 100}
                                    for it in (0, 100)}  # fmt: skip
    return make_study(losses, {size: 64}, diagnostics=diag, **kw)


def test_a_diagnostic_nan_or_logged_over_another_span_is_not_read_around():
    """Trial 14, finding 2: with finite losses, a NaN diagnostic was left out of each
    iteration's mean and a run's last finite point read as its "final" one, so whatever the
    arms logged differently was credited to the factor (claim 5: 42 of 50 null studies
    "reproduced" with the baseline's shares NaN, or not logged, after 60% of training; claim
    4: 50 of 50 with γ = 1+ε's saturation NaN at its peak; claim 7: 37 of 50). Now a NaN or inf
    diagnostic leaves the row undecided, naming the runs and iterations, and claim 5 reads every
    compared run at the same iterations; a first share logged after initialization cannot
    show that no sink formed."""
    u = UNIFORM_128
    shares = {"baseline": 0.10, "gamma1": 0.16}
    data = _sink_study(shares)
    assert claim5(data).verdict == REPRODUCED
    for r in data.runs:
        if r["arm"] == "baseline" and r["seed"] == 2:
            r["record"].diagnostics[100]["sink_share/layer_01"] = math.nan
    v = claim5(data)
    assert v.verdict == INCONCLUSIVE
    assert v.numbers.startswith(
        "s1: the sink share is NaN or inf in baseline seed 2 at iteration 100"
    )
    # the baseline logged to iteration 100 only, gamma1 on to 200, where its share is larger
    data = _sink_study(shares)
    for r in data.runs:
        if r["arm"] == "gamma1":
            r["record"].diagnostics[200] = {
                k: x + 0.3 for k, x in r["record"].diagnostics[100].items()
            }
    v = claim5(data)
    assert (
        "sink share at iterations 0 → 100, the last every compared run logged (some logged "
        "up to 200" in v.numbers
    )
    assert _sink_effect(shares, "gamma1", "baseline") in v.numbers  # read at 100, not at 200
    # a first share logged after initialization: no sink seen to form is not "no sink formed"
    late = _sink_study(
        {"baseline": u + 0.3, "gamma1": u + 0.3}, initial={"baseline": u + 0.3, "gamma1": u + 0.3}
    )
    for r in late.runs:
        r["record"].diagnostics = {it + 200: x for it, x in r["record"].diagnostics.items()}
    v = claim5(late)
    assert v.verdict == INCONCLUSIVE and "is at iteration 200, after initialization" in v.numbers
    # claim 4 reads no maximum around a NaN or inf (here γ = 1's own share bounding it)
    sat = _saturation_study([0.0, 0.0, 0.0])
    assert claim4(sat).verdict == NOT_MEASURABLE
    for r in sat.runs:
        if r["arm"] == "gamma1" and r["seed"] == 1:
            r["record"].diagnostics[50] = {"norm_saturated/layer_00": math.inf}
    v = claim4(sat)
    assert (
        v.verdict == INCONCLUSIVE
        and "saturated share is NaN or inf in gamma1 seed 1 at iteration 50" in v.numbers
    )
    # claim 7 does not average the other matrices around a NaN one
    rank = _rank_study(first_iteration=0, arm_dip=0.8)
    assert claim7(rank).verdict == REPRODUCED
    for r in rank.runs:  # a second matrix, 1.0 everywhere but NaN once
        for it, values in r["record"].diagnostics.items():
            bad = r["arm"] == "gamma1" and r["seed"] == 3 and it == 40
            values["stable_rank/qkv.k/layer_00"] = math.nan if bad else 1.0
    v = claim7(rank)
    assert v.verdict == INCONCLUSIVE
    assert "the stable rank is NaN or inf in gamma1 seed 3 at iteration 40" in v.numbers


def test_a_saturation_bound_needs_an_interval_within_the_margin():
    """Trial 9 #7: without a γ = 1+ε arm, γ = 1's own max saturated share bounds the
    difference ε makes; the engine called a null "not measurable at this scale" on one seed,
    or on seeds whose t-interval reaches past the margin (0.0090-0.0099: [0.0089, 0.0102]).
    A null now needs >= 2 seeds and the upper end of their interval at or below 0.01 (or 0 in
    every one of them)."""
    close = (0.0090, 0.0095, 0.0098, 0.0099)
    lo, hi = _t_interval(close)
    assert hi > 0.01 and max(close) <= 0.01  # the old rule's "within the margin in every seed"
    v = claim4(_saturation_study(close))
    assert v.verdict == INCONCLUSIVE and v.sizes == ("s1",)
    assert (
        f": +{np.mean(close):.4f} [{lo:+.4f}, {hi:+.4f}] (df 3, 4 seeds): the interval reaches "
        "above the margin 0.01, and the study has no γ = 1+ε arm to tell whether ε does it"
    ) in v.numbers
    for one in ((0.0090,), (0.0,)):  # one seed: no interval, not even at 0
        v = claim4(_saturation_study(one))
        assert v.verdict == INCONCLUSIVE
        assert "one seed, no interval: a measured null needs >= 2 seeds" in v.numbers
    low = (0.001, 0.002, 0.0015)
    lo, hi = _t_interval(low)
    assert hi <= 0.01
    v = claim4(_saturation_study(low))
    assert v.verdict == NOT_MEASURABLE
    assert (
        f"s1: gamma1's own max saturated share seed 1 0.0010, seed 2 0.0020, seed 3 0.0015, a "
        f"bound on the difference ε makes: +0.0015 [{lo:+.4f}, {hi:+.4f}] (df 2, 3 seeds), at or "
        "below the margin 0.01; σ²_emb/ε at init (γ = 1, ε = 1e-05): s1 24.4"
    ) in v.numbers
    assert v.numbers.endswith("ε cannot act at these sizes, which explains the null")
    zero = claim4(_saturation_study((0.0, 0.0)))
    assert zero.verdict == NOT_MEASURABLE and ": 0 in all 2 seeds, within the margin" in (
        zero.numbers
    )


def test_a_null_in_arms_that_have_not_learned_is_not_credited_to_the_scale():
    """Trial 9 #8: γ = 1's mean loss 8.30, above the bar 6.755 (δ below the token
    frequencies' 6.765): the row stayed "not measurable at this scale ... which explains the
    null", though training length explains a null in a model that learned nothing as well."""
    kw = {"vocab_size": 4096, "unigram_loss": 6.765}
    rows = verdicts(_saturation_study((0.0, 0.0, 0.0), loss=8.3, **kw), {}, None)
    row = next(r for r in rows if r.claim.startswith("ε = 1e-5 saturates"))
    assert row.verdict == NOT_MEASURED and "explains the null" not in row.numbers
    assert row.numbers.endswith(
        "ε cannot act at these sizes; not measurable in these runs: not learned, mean final "
        "validation loss >= 6.7550 nats, δ = 0.01 nats below the held-out loss of the train "
        "split's token frequencies, 6.7650 nats (add-0.5 smoothed; ln V = ln 4096 = 8.3178 nats "
        "is a uniform predictor's): gamma1 at s1 8.3000 (so the null may be the training "
        "length, not the scale)"
    )
    rows = verdicts(_saturation_study((0.0, 0.0, 0.0), loss=5.0, **kw), {}, None)
    row = next(r for r in rows if r.claim.startswith("ε = 1e-5 saturates"))
    assert row.verdict == NOT_MEASURABLE and row.numbers.endswith("which explains the null")
    rows = verdicts(_saturation_study((0.0, 0.0, 0.0), loss=8.3), {}, None)  # V unknown
    row = next(r for r in rows if r.claim.startswith("ε = 1e-5 saturates"))
    assert row.verdict == NOT_MEASURABLE and row.numbers.endswith(
        "which explains the null; whether the compared arms learned (mean final loss below ln V, "
        "a uniform predictor's) is not checked: the study records no vocabulary size"
    )


def test_saturation_is_judged_only_where_eps_can_act():
    """Diagnostics at d64 only (σ²_emb/ε 24.4, where ε cannot act) and a d512 size (0.381)
    without them: the engine once read d64 as "not reproduced"; it now finds no size where ε
    can act with diagnostics. Saturation logged on disjoint seeds gives no pair, not a crash."""
    losses, diag = {}, {}
    for arm, sat in (("baseline", 0.0), ("gamma1", 0.0), ("gamma1+eps", 0.0)):
        for size in ("d64", "d512"):
            for k in (1, 2, 3):
                losses[(arm, size, k)] = 5.0
        for k in (1, 2, 3):
            diag[(arm, "d64", k)] = {it: {"norm_saturated/layer_00": sat} for it in (0, 100)}
    v = claim4(make_study(losses, {"d64": 64, "d512": 512}, diagnostics=diag))
    assert v.verdict == INCONCLUSIVE
    assert "no saturation diagnostics on a common seed at a size where ε can act" in v.numbers
    disjoint = {key: d for key, d in diag.items() if (key[0] == "gamma1") == (key[2] == 1)}
    disjoint = {(a, "d512", k): d for (a, _, k), d in disjoint.items()}
    v = claim4(make_study(losses, {"d64": 64, "d512": 512}, diagnostics=disjoint))
    assert v.verdict == INCONCLUSIVE


def test_eps_acts_is_read_from_the_embedding_init_each_run_drew(tmp_path):
    """Trial 9 #5: the study's set: gave every arm init_gamma_overrides embedding=2, and the
    engine read σ²_emb/ε off the arm's init_gamma (64^-2 / 1e-5 = 24.4: "ε cannot act ...,
    which explains the null"). By hand, the embedding's σ = 64^-2, so σ²_emb/ε = 64^-4 / 1e-5
    = 0.00596, where ε can act: without the γ = 1+ε arm the row is inconclusive. Under
    init_method normal σ_emb = init_method_std; under the vocab fan-in policy d_in is the
    padded vocabulary (4000 → 4096)."""
    cases = {
        "override": ({"init_gamma_overrides": "embedding=2"}, 64.0**-4 / 1e-5),
        "normal": ({"init_method": "normal", "init_method_std": 0.01}, 0.01**2 / 1e-5),
        "vocab": ({"embedding_fan_in": "vocab"}, 4096.0**-2 / 1e-5),
    }
    for name, (fields, ratio) in cases.items():
        dirs = {}
        for arm in ("baseline", "gamma1"):
            d = tmp_path / name / arm
            d.mkdir(parents=True)
            gamma = 0.5 if arm == "baseline" else 1.0
            cfg = load_config(None, {"hidden_size": 64, "init_gamma": gamma, **fields})
            save_config(cfg, str(d / "config.yaml"))
            dirs[(arm, "d64")] = str(d)
        data = _saturation_study((0.0, 0.0), size="d64", run_dir=dirs, vocab_size=4000)
        assert data.embedding_variance_over_eps("gamma1", "d64") == pytest.approx(ratio, rel=1e-12)
        if name == "override":
            v = claim4(data)
    assert v.verdict == INCONCLUSIVE and v.numbers.startswith("needs the γ = 1+ε arm; ")
    assert (
        "σ²_emb/ε at init (γ = 2 for the embedding, from init_gamma_overrides (gamma1's γ 1), "
        f"ε = 1e-05): d64 {64.0**-4 / 1e-5:.3g}; ε acts where σ²_emb ≤ 10ε (the saturation "
        "diagnostic's threshold), i.e. embedding fan-in ≥ (10ε)^(−1/(2γ)) = 10"
    ) in v.numbers


def test_sink_shares_on_disjoint_seeds_give_no_pair():
    losses, diag = {}, {}
    for arm, seeds in (("baseline", (1, 2)), ("gamma1", (3, 4)), ("gamma1+eps+gate", (1, 3))):
        for k in seeds:
            losses[(arm, "s1", k)] = 5.0
            diag[(arm, "s1", k)] = {it: {"sink_share/layer_00": 0.2} for it in (0, 100)}
    v = claim5(make_study(losses, {"s1": 256}, diagnostics=diag))
    assert v.verdict == INCONCLUSIVE


def _reviewer_sinks(finals: dict[str, float]):
    """Trial 9 #2's construction: one size, 4 seeds, every arm's sink share 0.02 at iteration
    0 and ``finals[arm]`` plus a seed offset × (the arm's position + 1) at iteration 100."""
    losses, diag = {}, {}
    for i, (arm, y) in enumerate(finals.items()):
        for k, e in REVIEW_NOISE.items():
            losses[(arm, "s1", k)] = 5.0
            diag[(arm, "s1", k)] = {
                0: {"sink_share/layer_00": 0.02},
                100: {"sink_share/layer_00": y + e * (i + 1)},
            }
    return make_study(losses, {"s1": 64}, diagnostics=diag)


REVIEW_NOISE = {1: 0.0, 2: 0.001, 3: -0.001, 4: 0.0005}


def _review_effect(finals: dict[str, float], arm: str, ref: str) -> str:
    index = list(finals)
    d = [
        (finals[arm] + e * (index.index(arm) + 1)) - (finals[ref] + e * (index.index(ref) + 1))
        for e in REVIEW_NOISE.values()
    ]
    lo, hi = _t_interval(d)
    return f"({arm} − {ref}) {np.mean(d):+.4f} [{lo:+.4f}, {hi:+.4f}] (df 3, 4 seeds)"


@pytest.mark.parametrize("gamma1", [0.034, 0.0199])
def test_a_sink_part_is_decided_only_where_one_of_its_own_arms_formed_a_sink(gamma1):
    """Trial 9 #2: a sink only in the ungated γ = 1+ε (0.080, uniform attention 0.0349) let the
    row decide the γ part, γ = 1 − baseline, though neither arm formed one (finals 0.034 or
    0.0199 and 0.020, both below uniform): "reproduced" from γ = 1 at 0.034 (its interval lies
    beyond +0.01), "not reproduced" from 0.0199. Each part now needs a sink in its own arms:
    the γ part is not measured, and the row is the gate part's call, scoped so."""
    finals = {"baseline": 0.020, "gamma1": gamma1, "gamma1+eps": 0.080, "gamma1+eps+gate": 0.030}
    v = claim5(_reviewer_sinks(finals))
    gamma = _review_effect(finals, "gamma1", "baseline")
    lo = float(gamma.split("[")[1].split(",")[0])
    hi = float(gamma.split(", ")[1].split("]")[0])
    assert lo > 0.01 if gamma1 == 0.034 else hi < 0.01  # the old rule decided it either way
    assert (v.verdict, v.scope) == (
        REPRODUCED,
        "the gate part only; the γ part not measured: no sink in its arms",
    )
    assert (
        f"a sink has formed in gamma1+eps; effect of γ {gamma}: not measured, no sink in its arms "
        "(neither gamma1's final share nor baseline's exceeds both uniform attention's and its "
        "own first logged share by more than 0.01)" in v.numbers
    )
    gate = _review_effect(finals, "gamma1+eps+gate", "gamma1+eps")
    assert f"effect of the gate {gate}: the interval lies beyond -0.01" in v.numbers


def test_a_sink_in_the_gamma_part_alone_leaves_the_gate_part_unmeasured():
    """The other way round: γ = 1 forms a sink (0.080), the gate pair does not (0.020,
    0.030): the γ part decides, the gate part is not measured. With no γ = 1 arm and a sink
    only in the baseline, the one part the study has formed none in its arms: not measurable
    in these runs."""
    finals = {"baseline": 0.020, "gamma1": 0.080, "gamma1+eps": 0.020, "gamma1+eps+gate": 0.030}
    v = claim5(_reviewer_sinks(finals))
    assert (v.verdict, v.scope) == (
        REPRODUCED,
        "the γ part only; the gate part not measured: no sink in its arms",
    )
    gamma = _review_effect(finals, "gamma1", "baseline")
    assert f"effect of γ {gamma}: the interval lies beyond +0.01" in v.numbers
    only_base = {"baseline": 0.080, "gamma1+eps": 0.020, "gamma1+eps+gate": 0.030}
    v = claim5(_reviewer_sinks(only_base))
    assert v.verdict == NOT_MEASURED and "a sink has formed in baseline;" in v.numbers
    assert "effect of γ: not measured, needs a γ = 1 arm" in v.numbers
    assert v.numbers.endswith(
        "; no part has a sink in its own arms: whether larger models or longer training would "
        "form one there is not separated by these runs"
    )


def test_a_gated_baseline_has_no_gate_fix_to_credit():
    """Every arm has the baseline's gate: the fixes differ from the baseline in ε alone, so no
    arm plays γ = 1+ε+gate (the engine once called claim 3 reproduced here)."""
    arms = {
        "baseline": (0.5, 1e-5, "elementwise"),
        "gamma1": (1.0, 1e-5, "elementwise"),
        "gamma1+eps": (1.0, 1e-12, "elementwise"),
        "gamma0.5+eps": (0.5, 1e-12, "elementwise"),
    }
    losses = {}
    for i, s in enumerate(("s1", "s2")):
        for k, e in {1: 0.0, 2: 0.011, 3: -0.007, 4: 0.004}.items():
            b = 5.5 - 0.3 * i + e
            losses |= {("baseline", s, k): b, ("gamma1", s, k): b - 0.2 + 0.5 * e}
            losses |= {("gamma1+eps", s, k): b - 0.6 + 0.3 * e * k}
            losses |= {("gamma0.5+eps", s, k): b - 0.05 - 0.2 * e}
    data = make_study(losses, {"s1": 256, "s2": 512}, arms=arms)
    assert data.role("gamma1+eps") == "gamma1+eps" and data.role("gamma1+eps+gate") is None
    assert concentration_arm(data) == "gamma1"
    assert claim3(data, data.losses, "shared LR").verdict == INCONCLUSIVE


def test_every_size_deciding_alike_decides_at_the_measured_sizes():
    """Trial 7: γ = 1 beats γ = 0.5 by 0.6 nats at s1 and 0.3 at s2, each size's interval over
    its four seeds far below −δ, yet the across-sizes interval (df 1, t = 12.7) includes −δ:
    the gain that claim 2 expects to shrink kept claim 1 inconclusive however clear each size
    was. Every size's own call, seeds as units, now decides it at the measured sizes, scoped
    so; sizes that disagree leave it open."""
    noise = {1: 0.0, 2: 0.011, 3: -0.007, 4: 0.004}
    losses = {}
    for i, (s, gain) in enumerate((("s1", 0.6), ("s2", 0.3))):
        for k, e in noise.items():
            losses[("baseline", s, k)] = 5.5 - 0.3 * i + e
            losses[("gamma1", s, k)] = 5.5 - 0.3 * i - gain + 0.5 * e
    data = make_study(losses, {"s1": 256, "s2": 512})
    v = claim1(data, data.losses, "shared LR")
    per_size = {
        s: [losses[("gamma1", s, k)] - losses[("baseline", s, k)] for k in noise]
        for s in ("s1", "s2")
    }
    for d in per_size.values():
        lo, hi = _t_interval(d)
        assert hi < -0.01 and f"[{lo:+.4f}, {hi:+.4f}] (df 3, 4 seeds)" in v.numbers
    means = [np.mean(d) for d in per_size.values()]
    half = stats.t.ppf(0.975, 1) * np.std(means, ddof=1) / math.sqrt(2)
    assert np.mean(means) + half > -0.01  # the across-sizes interval includes −δ
    assert v.verdict == REPRODUCED
    assert v.scope == "at each measured size (s1, s2), seeds as units; not across sizes"
    assert v.numbers.endswith(
        "the interval includes -0.01; at each size: s1 reproduced, s2 reproduced: reproduced at "
        "every measured size"
    )
    row = verdicts(data, {}, None)[0]  # the shared-LR scope joins it
    assert row.label() == (
        "reproduced (at one shared LR, not tuned per arm; at each measured size (s1, s2), seeds "
        "as units; not across sizes)"
    )
    mixed = dict(losses)
    for k, e in noise.items():  # s2: no gain at all
        mixed[("gamma1", "s2", k)] = mixed[("baseline", "s2", k)] + 0.5 * e
    m = make_study(mixed, {"s1": 256, "s2": 512})
    v = claim1(m, m.losses, "shared LR")
    assert (v.verdict, v.scope) == (INCONCLUSIVE, "")
    assert v.numbers.endswith("at each size: s1 reproduced, s2 not reproduced")


def test_a_size_that_reverses_a_decided_row_makes_it_inconclusive():
    """Trial 8: γ = 1 wins by 0.49 nats at four sizes and loses by 0.057 at the largest, each
    size's interval over four seeds clear of −δ: the across-sizes interval (df 4) lies below −δ
    and the row read "reproduced", the reversal at the largest size in its numbers only."""
    noise = {1: 0.0, 2: 0.011, 3: -0.007, 4: 0.004}
    widths = {f"s{i}": 64 * (i + 1) for i in range(5)}
    losses = {}
    for i, s in enumerate(widths):
        gain = 0.057 if i == 4 else -0.49
        for k, e in noise.items():
            losses[("baseline", s, k)] = 5.5 - 0.1 * i + e
            losses[("gamma1", s, k)] = 5.5 - 0.1 * i + gain + 0.5 * e
    data = make_study(losses, widths)
    means = [-0.49 + 0.5 * np.mean(list(noise.values())) - np.mean(list(noise.values()))] * 4
    means.append(0.057 - 0.5 * np.mean(list(noise.values())))
    half = stats.t.ppf(0.975, 4) * np.std(means, ddof=1) / math.sqrt(5)
    assert np.mean(means) + half < -0.01  # the across-sizes interval alone says reproduced
    v = claim1(data, data.losses, "shared LR")
    assert (v.verdict, v.scope) == (INCONCLUSIVE, "")
    assert v.numbers.endswith(
        "at each size: s0 reproduced, s1 reproduced, s2 reproduced, s3 reproduced, s4 not "
        "reproduced: the sizes disagree, s4 not reproduced where the across-sizes interval says "
        "reproduced, so neither holds for every size"
    )


def test_an_interaction_against_the_paper_at_every_size_is_not_reproduced_there():
    """Trial 7, the committed study's shape: the fixes help γ = 0.5 more than γ = 1 at both
    sizes (interaction +0.2 and +0.05 nats), each size's interval above −δ, but the two sizes
    differ, so the across-sizes interval (df 1) stayed inconclusive. Each size says not
    reproduced, and so does the row, at the measured sizes."""
    noise = {1: 0.0, 2: 0.011, 3: -0.007, 4: 0.004}
    losses = {}
    for i, (s, against) in enumerate((("s1", 0.2), ("s2", 0.05))):
        for k, e in noise.items():
            b = 5.5 - 0.3 * i + e
            g1 = b - 0.3 + 0.5 * e
            losses |= {("baseline", s, k): b, ("gamma1", s, k): g1}
            losses[("gamma0.5+eps+gate", s, k)] = b - 0.3 - 0.2 * e
            losses[("gamma1+eps+gate", s, k)] = g1 - 0.3 + against + 0.3 * e * k * (1 + i)
    data = make_study(losses, {"s1": 256, "s2": 512})
    v = claim3(data, data.losses, "shared LR")
    inter = {
        s: [
            (losses[("gamma1+eps+gate", s, k)] - losses[("gamma1", s, k)])
            - (losses[("gamma0.5+eps+gate", s, k)] - losses[("baseline", s, k)])
            for k in noise
        ]
        for s in ("s1", "s2")
    }
    assert all(_t_interval(d)[0] > -0.01 for d in inter.values())
    assert "interaction" in v.numbers and "the interval includes -0.01" in v.numbers
    assert v.verdict == NOT_REPRODUCED
    assert v.scope == "at each measured size (s1, s2), seeds as units; not across sizes"
    assert "at each size: s1 not reproduced, s2 not reproduced: not reproduced at every " in (
        v.numbers
    )


# --- claim 3: the interaction ---------------------------------------------------------------


def _four_arms(fix_at_1: float, fix_at_05: float, with_control: bool = True):
    widths = {"s1": 256, "s2": 512}
    noise = {1: 0.0, 2: 0.011, 3: -0.007, 4: 0.004}
    losses = {}
    for i, s in enumerate(widths):
        for seed, e in noise.items():
            b = 5.5 - 0.3 * i + e
            g1 = b - 0.2 + 0.5 * e
            losses[("baseline", s, seed)] = b
            losses[("gamma1", s, seed)] = g1
            losses[("gamma1+eps+gate", s, seed)] = g1 - fix_at_1 + 0.3 * e * seed * (1 + i)
            if with_control:
                losses[("gamma0.5+eps+gate", s, seed)] = b - fix_at_05 - 0.2 * e
    return make_study(losses, widths), losses


def test_gate_main_effect_is_not_credited_to_gamma():
    """The fixes help γ = 0.5 more than γ = 1 (0.25 vs 0.1 nats): the old rule (advantage of
    γ=1+ε+gate above γ=1's) said reproduced; the interaction says not reproduced."""
    data, losses = _four_arms(fix_at_1=0.1, fix_at_05=0.25)
    v = claim3(data, data.losses, "shared LR")
    assert v.verdict == NOT_REPRODUCED
    per_size, squared_errors = [], []
    for s in ("s1", "s2"):
        inter = [
            (losses[("gamma1+eps+gate", s, k)] - losses[("gamma1", s, k)])
            - (losses[("gamma0.5+eps+gate", s, k)] - losses[("baseline", s, k)])
            for k in (1, 2, 3, 4)
        ]
        lo, hi = _t_interval(inter)
        assert f"[{lo:+.4f}, {hi:+.4f}] (df 3, 4 seeds)" in v.numbers
        per_size.append(np.mean(inter))
        squared_errors.append(np.var(inter, ddof=1) / 4)
    # the two size means land 0.0012 apart, closer than their seeds know them (SE about 0.0035):
    # the interval's width comes from the seed noise (random effects, τ² = 0), not from that gap
    noise = np.mean(squared_errors)
    assert np.var(per_size, ddof=1) < noise
    half = stats.t.ppf(0.975, 1) * math.sqrt(noise / 2)
    mean = np.mean(per_size)
    assert (
        f"across sizes: interaction {mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}] (df 1, "
        "2 sizes; its width set by the seed noise within the sizes, which exceeds the spread "
        "between them)" in v.numbers
    )
    equal, _ = _four_arms(fix_at_1=0.2, fix_at_05=0.2)
    assert claim3(equal, equal.losses, "shared LR").verdict != REPRODUCED
    wider, losses = _four_arms(fix_at_1=0.4, fix_at_05=0.05)
    v = claim3(wider, wider.losses, "shared LR")
    assert (v.verdict, v.scope) == (REPRODUCED, "")  # widths 256, 512: σ²_emb/ε 1.53, 0.381
    # Trial 7: at widths 64 and 96 (σ²_emb/ε 24.4 and 10.9 at γ = 1, ε = 1e-5) ε cannot act, so
    # "removing both blockers" is in effect the gate alone, and the decided row says so.
    narrow = make_study({(a, {"s1": "n1", "s2": "n2"}[s], k): x for (a, s, k), x in losses.items()},
                        {"n1": 64, "n2": 96})  # fmt: skip
    v = claim3(narrow, narrow.losses, "shared LR")
    assert (v.verdict, v.scope) == (
        REPRODUCED,
        "the gate in effect: ε cannot act at initialization at these sizes",
    )
    assert "n1 24.4, n2 10.9" in v.numbers


def test_a_gain_that_never_was_does_not_widen():
    """γ = 1 is about 0.5 nats worse than γ = 0.5 without the fixes and 0.1 worse with them:
    the interaction is about −0.4 nats at both sizes (the engine once called "removing both blockers
    widens the gain of γ = 1" reproduced on it), but there is no gain of γ = 1 to widen."""
    losses = {}
    for i, s in enumerate(("s1", "s2")):
        for k, e in {1: 0.0, 2: 0.011, 3: -0.007, 4: 0.004}.items():
            b = 5.5 - 0.3 * i + e
            c = b - 0.2 - 0.2 * e
            losses |= {("baseline", s, k): b, ("gamma1", s, k): b + 0.5 + 0.02 * i + 0.5 * e}
            losses[("gamma0.5+eps+gate", s, k)] = c
            losses[("gamma1+eps+gate", s, k)] = c + 0.1 + 0.01 * i + 0.3 * e * k
    data = make_study(losses, {"s1": 256, "s2": 512})
    v = claim3(data, data.losses, "shared LR")
    assert v.verdict == NOT_REPRODUCED
    inter, gain = [], []
    for s in ("s1", "s2"):
        g3 = np.array([losses[("gamma1+eps+gate", s, k)] for k in (1, 2, 3, 4)])
        g1 = np.array([losses[("gamma1", s, k)] for k in (1, 2, 3, 4)])
        c = np.array([losses[("gamma0.5+eps+gate", s, k)] for k in (1, 2, 3, 4)])
        b = np.array([losses[("baseline", s, k)] for k in (1, 2, 3, 4)])
        inter.append(np.mean((g3 - g1) - (c - b)))
        lo, hi = _t_interval(g3 - c)
        gain.append(np.mean(g3 - c))
        assert (
            f"γ=1's gain with the fixes {gain[-1]:+.4f} [{lo:+.4f}, {hi:+.4f}] (df 3, 4 seeds)"
            in (v.numbers)
        )
    lo, hi = _t_interval(inter)
    assert hi < -0.01  # the interaction alone: "reproduced"
    assert (
        f"interaction {np.mean(inter):+.4f} [{lo:+.4f}, {hi:+.4f}] (df 1, 2 sizes): the "
        + ("interval lies beyond -0.01")
        in v.numbers
    )
    lo, hi = _t_interval(gain)
    assert (
        f"γ=1's gain with the fixes {np.mean(gain):+.4f} [{lo:+.4f}, {hi:+.4f}] (df 1, 2 "
        + ("sizes): the interval excludes an effect beyond -0.01")
        in v.numbers
    )


def test_no_gamma05_fixes_arm_is_inconclusive():
    data, _ = _four_arms(fix_at_1=0.4, fix_at_05=0.0, with_control=False)
    v = claim3(data, data.losses, "shared LR")
    assert v.verdict == INCONCLUSIVE
    assert "the study has no γ = 0.5 + fixes arm; the gate's main effect cannot be" in v.numbers


# --- claim 6: the γ grid at matched seeds -------------------------------------------------


def _grid_arm(g: float) -> str:
    return "gamma1+eps+gate" if g == 1.0 else f"gamma1+eps+gate@gamma={g:g}"


def _grid_study(seeds_per_gamma: dict[float, list[int]], curve, noise=0.005, values=None):
    """A γ grid at one size: (StudyData, {(arm, size, seed): loss}); ``values`` the manifest's
    grid (default: the γ values given)."""
    arms = dict(ARMS)
    losses = {}
    rng = np.random.default_rng(3)
    for g, seeds in seeds_per_gamma.items():
        arm = _grid_arm(g)
        arms[arm] = (g, 1e-12, "elementwise")
        for seed in seeds:
            losses[(arm, "s1", seed)] = curve(g) + rng.normal(0, noise)
    for seed in range(1, 6):
        losses[("baseline", "s1", seed)] = 6.0
    grid = sorted(values or seeds_per_gamma)
    manifest = {"gamma_grid": {"arm": "gamma1+eps+gate", "values": grid, "sizes": ["s1"]}}
    return make_study(losses, {"s1": 256}, arms=arms, manifest=manifest), losses


def test_gamma_grid_refuses_a_grid_arm_whose_recorded_settings_differ_from_its_base():
    curve = {0.5: 5.4, 1.0: 5.0, 1.5: 5.3}.get
    data, _ = _grid_study({0.5: [1, 2], 1.0: [1, 2], 1.5: [1, 2]}, curve, 0)
    assert sorted(gamma_grid(data)["s1"]["gamma"]) == [0.5, 1.0, 1.5]
    odd = _with_arm_fields(data, {_grid_arm(1.5): {"weight_decay": 0.0}})
    with pytest.raises(ConfigError) as e:
        gamma_grid(odd)
    assert str(e.value).startswith(
        "study.json: arms 'gamma1+eps+gate' and 'gamma1+eps+gate@gamma=1.5' would be compared as "
        "differing in γ alone, but their arm settings also differ in weight_decay (weight_decay: "
        "unset vs 0.0)"
    )


def test_gamma_grid_compares_matched_seeds_only():
    """γ = 1 has 2 seeds, the others 1: only seed 1 is matched, so no interval."""
    values = {0.5: 5.4873, 0.75: 4.9889, 1.0: 4.98, 1.25: 5.0330, 1.5: 5.3978}
    data, _ = _grid_study({0.5: [1], 0.75: [1], 1.0: [1, 2], 1.25: [1], 1.5: [1]}, values.get, 0)
    grid = gamma_grid(data)
    assert grid["s1"]["seeds"] == [1] and grid["s1"]["mean"][2] == pytest.approx(4.98)
    v = claim6(data, grid, "shared LR")
    assert v.verdict == INCONCLUSIVE and "1 seed: no interval" in v.numbers
    assert "lowest at γ = 1; γ=0.75 − γ=1 (seeds [1]) +0.0089 (1 seed: no interval)" in v.numbers
    assert "γ=1.25 − γ=1 (seeds [1]) +0.0530 (1 seed: no interval)" in v.numbers
    assert "(shared LR)" in v.numbers


def _neighbour_text(losses: dict, near: float) -> str:
    """γ = near − γ = 1 paired by the seeds both finished, with its t interval, from the
    synthetic losses themselves."""
    by_arm: dict[str, dict[int, float]] = {}
    for (arm, _, seed), x in losses.items():
        if arm.startswith("gamma1+eps+gate"):
            by_arm.setdefault(arm, {})[seed] = x
    a, b = by_arm[_grid_arm(near)], by_arm[_grid_arm(1.0)]
    seeds = sorted(set(a) & set(b))
    d = np.array([a[k] - b[k] for k in seeds])
    lo, hi = _t_interval(d)
    return (
        f"γ={near:g} − γ=1 (seeds {seeds}) {d.mean():+.4f} [{lo:+.4f}, {hi:+.4f}] (df {d.size - 1}"
    )


def test_gamma_grid_neighbours_paired_by_seed():
    clear, losses = _grid_study(
        {g: [1, 2, 3, 4, 5] for g in (0.5, 1.0, 1.5)}, lambda g: (g - 1) ** 2 + 5
    )
    v = claim6(clear, gamma_grid(clear), "shared LR")
    assert (v.verdict, v.scope) == (REPRODUCED, "at s1 only, seeds as units; not across sizes")
    assert _neighbour_text(losses, 0.5) in v.numbers and _neighbour_text(losses, 1.5) in v.numbers
    elsewhere, _ = _grid_study({g: [1, 2, 3, 4] for g in (0.5, 1.0, 1.5)}, lambda g: (g - 1.5) ** 2)
    assert claim6(elsewhere, gamma_grid(elsewhere), "shared LR").verdict == NOT_REPRODUCED
    flat, _ = _grid_study({g: [1, 2, 3, 4] for g in (0.75, 1.0, 1.25)}, lambda g: 5.0, noise=0.02)
    assert claim6(flat, gamma_grid(flat), "shared LR").verdict == INCONCLUSIVE


def test_gamma_grid_neighbours_pair_on_their_own_seeds():
    """γ = 0.5, farther from 1 than γ = 0.75, failed on seeds 2-4. The neighbours were paired
    only on the seeds every γ finished (seed 1: no interval), and the failed runs would keep the
    row waiting; γ = 0.75 and γ = 1.25 are compared with γ = 1 on the seeds each pair finished,
    and a farther γ neither shrinks nor blocks that."""
    curve = lambda g: 5 + 2 * (g - 1) ** 2  # noqa: E731
    full, losses = _grid_study({g: [1, 2, 3, 4] for g in (0.5, 0.75, 1.0, 1.25)}, curve)
    data = _unfinish(full, {f"{_grid_arm(0.5)}/s1/seed-{k}" for k in (2, 3, 4)})
    losses = {key: x for key, x in losses.items() if key[0] != _grid_arm(0.5) or key[2] == 1}
    row = _claim6_rows(data)[0]
    assert row.verdict == REPRODUCED
    assert "at the seed(s) every γ finished [1]:" in row.numbers
    for near in (0.75, 1.25):
        text = _neighbour_text(losses, near)
        assert "(seeds [1, 2, 3, 4])" in text and "(df 3" in text and text in row.numbers
    assert "unfinished" not in row.numbers


def test_gamma_grid_without_a_gamma_above_one_cannot_show_worse_above():
    """Grid {0.5, 1}, 2 seeds, γ = 1 ahead by 1e-4 nats (seed sd 0.02): the engine once read
    the best γ's resampling interval [1, 1] as reproduced."""
    data, losses = _grid_study(
        {0.5: [1, 2], 1.0: [1, 2]}, lambda g: 5.0 + 1e-4 * (g < 1), noise=0.02
    )
    v = claim6(data, gamma_grid(data), "shared LR")
    assert v.verdict == INCONCLUSIVE and "no γ above 1 in the grid: not measured" in v.numbers
    assert _neighbour_text(losses, 0.5) in v.numbers


def test_a_diverged_gamma_is_not_the_lowest_loss():
    """γ = 0.5 diverged on seed 2 (NaN): its mean is NaN, which np.argmin once took as the
    lowest ("lowest at γ = 0.5"); its side is not finite, so not decided."""
    data, losses = _grid_study({g: [1, 2, 3] for g in (0.5, 1.0, 1.5)}, lambda g: (g - 1) ** 2 + 5)
    for run in data.runs:
        if run["arm"] == _grid_arm(0.5) and run["seed"] == 2:
            run["loss"] = math.nan
    grid = gamma_grid(data)
    assert math.isnan(grid["s1"]["mean"][0]) and grid["s1"]["best"] == 1.0
    v = claim6(data, grid, "shared LR")
    assert v.verdict == INCONCLUSIVE and "lowest at γ = 1;" in v.numbers
    assert "γ=0.5 − γ=1 (seeds [1, 2, 3]) n/a (3 seeds, 1 not finite: NaN or inf, no interval)" in (
        v.numbers
    )
    assert _neighbour_text(losses, 1.5) in v.numbers


def _claim6_rows(data):
    grids = {"shared LR": gamma_grid(data), "best LR": gamma_grid(data, "best")}
    rows = verdicts(data, grids, None)
    return [r for r in rows if r.claim.startswith("loss is lower at γ = 1 than")]


def test_gamma_grid_at_one_shared_lr_does_not_stand_alone():
    """No LR grid: γ = 1 is best at the one shared LR (each neighbour +0.25 nats), but γ moves
    the best LR (the committed CPU study: γ = 0.5 wants 4x γ = 1's), so that may be the LR, not
    γ. The engine once gave claim 6 a single row, reproduced; it now has a shared-LR row and a
    best-LR row that says the γs' own best LRs were not measured."""
    data, losses = _grid_study(
        {g: [1, 2, 3, 4] for g in (0.5, 1.0, 1.5)}, lambda g: (g - 1) ** 2 + 5
    )
    shared, best = _claim6_rows(data)
    assert (shared.lr, shared.verdict) == ("shared LR", REPRODUCED)
    assert _neighbour_text(losses, 0.5) in shared.numbers
    assert _neighbour_text(losses, 1.5) in shared.numbers
    assert (best.lr, best.verdict) == ("best LR", INCONCLUSIVE)
    assert best.numbers.startswith("not measured: this study has no LR grid")
    rows = verdicts(data, {"shared LR": gamma_grid(data)}, None)
    both, shared_only = ["shared LR", "best LR"], ["shared LR"]
    # claims 1-3, then 4 and 5 (shared-LR runs only), 6, then 7 and 8 (shared-LR runs only)
    assert [r.lr for r in rows] == both * 3 + shared_only * 2 + both + shared_only * 2


def _gamma_lr_study(bests: dict[float, float], grid: tuple):
    """γ ∈ {0.5, 1, 1.5} (γ = 1+ε+gate's γ grid) at one size, each with an LR grid on seed 1
    (shared LR 2e-3) whose loss is lowest at ``bests[γ]``; seeds 2-4 at that best LR, each
    neighbour of γ = 1 about 0.25 nats worse. Returns (StudyData, {γ: {seed: loss}} at the best
    LR)."""
    arms, losses, lr, at_best = dict(ARMS), {}, {}, {}
    for g, b in bests.items():
        arm = _grid_arm(g)
        arms[arm] = (g, 1e-12, "elementwise")
        for x in grid:
            seed = 1 if x == 2e-3 else 100 + round(x * 1e5)
            losses[(arm, "s1", seed)] = 5 + (g - 1) ** 2 + abs(math.log(x / b))
            lr[(arm, "s1", seed)] = (x, "shared" if x == 2e-3 else "grid", True)
        for seed in (2, 3, 4):
            y = 5 + (g - 1) ** 2 + 0.01 * seed + 0.003 * g * (seed % 2)
            losses[(arm, "s1", seed)] = at_best.setdefault(g, {})[seed] = y
            lr[(arm, "s1", seed)] = (b, "shared" if b == 2e-3 else "confirm", False)
    for seed in (1, 2, 3, 4):
        losses[("baseline", "s1", seed)] = 6.0
    manifest = {
        "shared_lr": 2e-3,
        "lr_select_seed": 1,
        "gamma_grid": {"arm": "gamma1+eps+gate", "values": [0.5, 1.0, 1.5], "sizes": ["s1"]},
    }
    return make_study(losses, {"s1": 256}, arms=arms, manifest=manifest, lr=lr), at_best


def test_gamma_grid_at_the_best_lr_needs_each_best_lr_bracketed():
    """Every γ confirmed at its own best LR, but γ = 0.5's is its grid's largest and γ = 1.5's
    its smallest: their own best LRs are not known, so "γ = 1 is best" at those LRs is not the
    claim. The engine once read this grid at the best LR without the edge check, reproduced."""
    data, at_best = _gamma_lr_study({0.5: 4e-3, 1.0: 2e-3, 1.5: 1e-3}, (1e-3, 2e-3, 4e-3))
    expected = []
    for near in (0.5, 1.5):
        d = np.array([at_best[near][k] - at_best[1.0][k] for k in (2, 3, 4)])
        lo, hi = _t_interval(d)
        assert lo > 0.01
        expected.append(
            f"γ={near:g} − γ=1 (seeds [2, 3, 4]) {d.mean():+.4f} [{lo:+.4f}, {hi:+.4f}] "
            "(df 2, 3 seeds)"
        )
    shared, best = _claim6_rows(data)
    assert shared.verdict == INCONCLUSIVE and "1 seed: no interval" in shared.numbers
    assert (best.lr, best.verdict) == ("best LR", INCONCLUSIVE)
    assert "s1 (best LR) at the seed(s) every γ finished [2, 3, 4]" in best.numbers
    assert all(e in best.numbers for e in expected)
    edges = (
        "the best LR is not bracketed: gamma1+eps+gate@gamma=0.5 at s1: best LR 0.004 is the "
        "largest of [0.001, 0.002, 0.004]; gamma1+eps+gate@gamma=1.5 at s1: best LR 0.001 is "
        "the smallest of [0.001, 0.002, 0.004]"
    )
    assert edges in best.numbers
    wide, _ = _gamma_lr_study({0.5: 4e-3, 1.0: 2e-3, 1.5: 1e-3}, (5e-4, 1e-3, 2e-3, 4e-3, 8e-3))
    shared, best = _claim6_rows(wide)
    assert best.verdict == REPRODUCED and all(e in best.numbers for e in expected)
    assert "not bracketed" not in best.numbers


def test_gamma_grid_sides_come_from_the_planned_grid():
    """The grid [0.5, 0.75, 1, 1.5] whose γ = 0.75 never finished: γ = 0.5 is farther from 1 and
    easier to beat, so the side below is not measured rather than judged on γ = 0.5. A grid
    where only γ = 1 finished gives no verdict (and no crash)."""
    curve = lambda g: (g - 1) ** 2 + 5  # noqa: E731
    data, _ = _grid_study(
        {g: [1, 2, 3] for g in (0.5, 1.0, 1.5)}, curve, values=[0.5, 0.75, 1.0, 1.5]
    )
    v = claim6(data, gamma_grid(data), "shared LR")
    assert v.verdict == INCONCLUSIVE
    assert (
        "γ=0.75 (nearest below 1) did not finish on a seed γ = 1 finished: not measured"
        in v.numbers
    )
    alone, _ = _grid_study({1.0: [1, 2, 3]}, curve, values=[0.5, 1.0, 1.5])
    v = claim6(alone, gamma_grid(alone), "shared LR")
    assert v.verdict == INCONCLUSIVE and "no seed finished γ = 1 and another γ" in v.numbers


def _two_size_grid(curves: dict[str, dict[float, float]]):
    """γ ∈ {0.5, 1, 1.5} at the sizes of ``curves`` ({size: {γ: loss}}), seeds 1-4: γ = 1 at
    its curve on every seed, γ = 0.5 and 1.5 at theirs + 0.00, 0.01, 0.02, 0.03 on seeds 1-4
    (the construction of trial 9's review, exp/claim6.py, without its random noise)."""
    arms, losses = dict(ARMS), {}
    for size, curve in curves.items():
        for g, y in curve.items():
            arms[_grid_arm(g)] = (g, 1e-12, "elementwise")
            for seed in (1, 2, 3, 4):
                losses[(_grid_arm(g), size, seed)] = y + (0 if g == 1.0 else 0.01 * (seed - 1))
        for seed in (1, 2, 3, 4):
            losses[("baseline", size, seed)] = 6.0
    grid = {"arm": "gamma1+eps+gate", "values": [0.5, 1.0, 1.5], "sizes": list(curves)}
    widths = {"s1": 128, "s2": 256}
    data = make_study(
        losses, {s: widths[s] for s in curves}, arms=arms, manifest={"gamma_grid": grid}
    )
    return claim6(data, gamma_grid(data), "shared LR")


def test_gamma_grid_sizes_that_disagree_leave_claim6_inconclusive():
    """Trial 9 #9: γ = 1 best at s1 by 0.3-0.4 nats, γ = 0.5 better at s2 by 0.1. Claim 6 once
    let s2's "not reproduced" decide the whole row, unscoped. By hand, per-seed differences
    c + 0.00, 0.01, 0.02, 0.03: mean c + 0.015, sd sqrt(0.0005/3) = 0.012910, se 0.0064550,
    t(0.975, 3) = 3.18245, half-width 0.020543."""
    s1 = {0.5: 5.40, 1.0: 5.00, 1.5: 5.30}
    v = _two_size_grid({"s1": s1, "s2": {0.5: 4.60, 1.0: 4.70, 1.5: 4.90}})
    assert (v.verdict, v.scope) == (INCONCLUSIVE, "")
    for text in (
        "γ=0.5 − γ=1 (seeds [1, 2, 3, 4]) +0.4150 [+0.3945, +0.4355] (df 3",
        "γ=1.5 − γ=1 (seeds [1, 2, 3, 4]) +0.3150 [+0.2945, +0.3355] (df 3",
        "γ=0.5 − γ=1 (seeds [1, 2, 3, 4]) -0.0850 [-0.1055, -0.0645] (df 3",
        "γ=1.5 − γ=1 (seeds [1, 2, 3, 4]) +0.2150 [+0.1945, +0.2355] (df 3",
    ):
        assert text in v.numbers
    assert v.numbers.endswith(
        "the sizes disagree: reproduced at s1, not at s2, so neither holds for every size"
    )
    agree = _two_size_grid({"s1": s1, "s2": {0.5: 4.90, 1.0: 4.70, 1.5: 4.95}})
    assert (agree.verdict, agree.scope) == (
        REPRODUCED,
        "at each measured size (s1, s2), seeds as units; not across sizes",
    )
    assert "γ=1.5 − γ=1 (seeds [1, 2, 3, 4]) +0.2650 [+0.2445, +0.2855] (df 3" in agree.numbers
    # s2 flat: differences 0.015 [-0.0055, +0.0355] include +0.01, so s2 is undecided
    open_ = _two_size_grid({"s1": s1, "s2": {0.5: 4.70, 1.0: 4.70, 1.5: 4.70}})
    assert (open_.verdict, open_.scope) == (INCONCLUSIVE, "")
    assert "+0.0150 [-0.0055, +0.0355] (df 3" in open_.numbers
    assert open_.numbers.endswith("at each size: s1 reproduced, s2 inconclusive")
    one = _two_size_grid({"s1": s1})
    assert (one.verdict, one.scope) == (REPRODUCED, "at s1 only, seeds as units; not across sizes")
    worse = _two_size_grid({"s2": {0.5: 4.60, 1.0: 4.70, 1.5: 4.90}})
    assert (worse.verdict, worse.scope) == (
        NOT_REPRODUCED,
        "at s2 only, seeds as units; not across sizes",
    )


# --- claim 7: condensation from iteration 0 against the matched control -------------------


def _rank_study(first_iteration: int, arm_dip: float):
    widths = {"s1": 256}
    losses, diag = {}, {}
    for seed, e in ((1, 0.0), (2, 0.01), (3, -0.01)):
        # 10 points after the first (claim 7 reads none below 6): flat at the dip to iteration
        # 50, then a linear rise to 100; the control recovers too (rise 0.1)
        for arm, dip, rise, k in (("gamma1", arm_dip, 0.4, 1.0), ("baseline", 0.02, 0.1, 0.5)):
            losses[(arm, "s1", seed)] = 5.0
            low, high = 30.0 * (1 - dip - k * e), 30.0 * (1 - dip) * (1 + rise)
            ranks = {first_iteration: 30.0}
            ranks |= {t: low + (high - low) * max(0, t - 50) / 50 for t in range(60, 101, 10)}
            ranks |= {t: low for t in (10, 20, 30, 40, 50) if t > first_iteration}
            draw = 1 + 1e-3 * seed  # each seed draws other matrices (dip and rise: ratios)
            diag[(arm, "s1", seed)] = {
                it: {"stable_rank/qkv.q/layer_00": r * draw} for it, r in ranks.items()
            }
    return make_study(losses, widths, diagnostics=diag)


def test_condensation_needs_iteration_zero_and_the_matched_control():
    late = _rank_study(first_iteration=25, arm_dip=0.8)
    v = claim7(late)
    assert (
        v.verdict == INCONCLUSIVE and "logged at iteration 25, not at initialization" in v.numbers
    )
    assert "gamma1 vs baseline" in v.numbers  # same ε and gate, γ = 0.5
    assert claim7(_rank_study(first_iteration=0, arm_dip=0.8)).verdict == REPRODUCED
    assert claim7(_rank_study(first_iteration=0, arm_dip=0.02)).verdict == NOT_REPRODUCED
    clear = _rank_study(first_iteration=0, arm_dip=0.8)
    unlogged = {(r["arm"], r["size"], r["seed"]): r["loss"] for r in clear.runs}
    unlogged |= {("gamma1+eps+gate", "s1", k): 4.9 for k in (1, 2, 3)}
    unlogged |= {("gamma0.5+eps+gate", "s1", k): 4.95 for k in (1, 2, 3)}
    diag = {(r["arm"], r["size"], r["seed"]): r["record"].diagnostics for r in clear.runs}
    v = claim7(make_study(unlogged, {"s1": 256}, diagnostics=diag))
    assert v.verdict == INCONCLUSIVE  # a pair it cannot judge is said, not skipped
    assert "gamma1+eps+gate vs gamma0.5+eps+gate: no size where both logged" in v.numbers
    lone = {k: x for k, x in unlogged.items() if k[0] != "gamma0.5+eps+gate"}
    v = claim7(make_study(lone, {"s1": 256}, diagnostics=diag))
    assert v.verdict == REPRODUCED  # gamma1 vs baseline, as above; the lone arm is named
    assert "gamma1+eps+gate: no matched γ = 0.5 control, not judged" in v.numbers


def test_condensation_needs_the_control_logged_from_iteration_zero_too():
    """The γ = 1 arm logged from iteration 0, its control from 60, after its own dip: the
    control's dip is unobserved, so the difference of dips is not evidence."""
    losses, diag = {}, {}
    for k, e in ((1, 0.0), (2, 0.01), (3, -0.01)):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        diag[("gamma1", "s1", k)] = {
            it: {"stable_rank/q": r} for it, r in ((0, 30.0), (50, 30 * (0.5 - e)), (100, 21.0))
        }
        diag[("baseline", "s1", k)] = {
            it: {"stable_rank/q": r} for it, r in ((60, 15.0), (80, 15 * (0.99 + e)), (100, 21.0))
        }
    v = claim7(make_study(losses, {"s1": 256}, diagnostics=diag))
    assert v.verdict == INCONCLUSIVE and "logged at iteration 60" in v.numbers


def test_a_stable_rank_still_falling_at_the_last_point_has_no_measured_recovery():
    """γ = 1's stable rank 30 → 15 (iteration 50) → 12 (iteration 100, the last point): its
    minimum is the last point. The minimum once excluded the last point (15 at iteration 50),
    which made the 'recovery' 12/15 − 1 = −0.2 and the row 'not reproduced'."""
    losses, diag = {}, {}
    for k, e in ((1, 0.0), (2, 0.01), (3, -0.01)):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        diag[("gamma1", "s1", k)] = {
            it: {"stable_rank/q": r} for it, r in ((0, 30.0), (50, 30 * (0.5 - e)), (100, 12.0))
        }
        diag[("baseline", "s1", k)] = {
            it: {"stable_rank/q": r} for it, r in ((0, 30.0), (50, 29.0 - e), (100, 28.0))
        }
    data = make_study(losses, {"s1": 256}, diagnostics=diag)
    v = claim7(data)
    assert v.verdict == NOT_MEASURED
    assert (
        "the stable rank of gamma1 is still falling at the last point (its minimum reaches the "
        "last point, iteration 100) in seed(s) [1, 2, 3], so no recovery is measured" in v.numbers
    )
    m = mechanisms(data)["gamma1|s1"]
    assert (m["rank_first"], m["rank_min"], m["rank_min_iteration"]) == (30.0, 12.0, 100)
    assert m["rank_dip"] == pytest.approx(0.6) and m["rank_rise"] is None
    b = mechanisms(data)["baseline|s1"]
    assert (b["rank_min"], b["rank_min_iteration"]) == (28.0, 100)


def _control_falling_study(control_last: float):
    """γ = 1 dips and recovers (30 → 15 − e → 20.5 → 21) in three seeds; its control, γ = 0.5,
    goes 30 → 29.5 → 29.5 → ``control_last`` at iterations 0, 50, 90, 100, its minimum the last
    point, so its fall over the last 10% of training is (29.5 − ``control_last``)/30."""
    losses, diag = {}, {}
    offsets = (0.0, 0.2, -0.3)
    for k, e in enumerate(offsets, start=1):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        diag[("gamma1", "s1", k)] = {
            it: {"stable_rank/q": r}
            for it, r in ((0, 30.0), (50, 15.0 - e), (90, 20.5), (100, 21.0))
        }
        diag[("baseline", "s1", k)] = {
            it: {"stable_rank/q": r}
            for it, r in ((0, 30.0), (50, 29.5), (90, 29.5), (100, control_last))
        }
    deltas = [(1 - (15.0 - e) / 30) - (1 - control_last / 30) for e in offsets]
    return make_study(losses, {"s1": 256}, diagnostics=diag), deltas


def test_a_control_still_dipping_at_the_last_point_has_no_measured_dip():
    """The control falls 29.5 → 26 over the last 10% of training, 0.117 of its initial 30, more
    than DIP_MIN: it is still dipping, its dip (1 − min/first) only how far it had fallen so
    far, so Δdip = arm − control is not measured."""
    data, deltas = _control_falling_study(26.0)
    v = claim7(data)
    lo, hi = _t_interval(deltas)
    assert v.verdict == NOT_MEASURED and v.scope == ""
    assert (
        f"gamma1 vs baseline (s1): Δdip to the last point {np.mean(deltas):+.3f} [{lo:+.3f}, "
        f"{hi:+.3f}] (df 2, 3 seeds); the stable rank of baseline (the control) is still "
        "dipping at the last point (iteration 100): it fell by +0.1167 (3 seeds, all equal: sd 0, "
        "no interval) of its initial value over the last 10% of training (the least-squares "
        "slope over the logged points in its last 20%, at least 2: iterations 90-100, 2 "
        "points); per seed 0.117 (seed 1), 0.117 (seed 2), 0.117 (seed 3); the value itself (no "
        "interval: no spread across seeds), 0.1167, is at least 0.05, so its dip is not "
        "measured, nor Δdip" in v.numbers
    )
    assert "gamma1 is still falling" not in v.numbers
    assert v.numbers.endswith(
        "(a matter of training length, not only of scale: longer runs, with diagnostics to "
        "their end, would measure it)"
    )
    mech = mechanisms(data)
    assert stable_rank_cell(mech["baseline|s1"]) == (
        "30.00 → 26.00 (it 100): still falling at the last point, so no minimum and no "
        "recovery measured"
    )


def test_a_control_falling_by_the_margin_left_has_no_measured_dip():
    """Trial 8: the control falls 29.9 → 28.6 over the last 10% of training (iterations 90 to
    100), 0.043 of its initial 30 (under DIP_MIN), while Δdip is about 0.073, only 0.023 above
    DIP_MIN: one more such stretch of training would close that margin, so Δdip is not
    measured."""
    losses, diag = {}, {}
    for k, e in enumerate((0.0, 0.2, -0.3), start=1):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        diag[("gamma1", "s1", k)] = {
            it: {"stable_rank/q": r}
            for it, r in ((0, 30.0), (50, 26.4 - e), (90, 27.5), (100, 28.0))
        }
        diag[("baseline", "s1", k)] = {
            it: {"stable_rank/q": r} for it, r in ((0, 30.0), (50, 29.9), (90, 29.9), (100, 28.6))
        }
    v = claim7(make_study(losses, {"s1": 256}, diagnostics=diag))
    assert v.verdict == NOT_MEASURED and v.scope == ""
    assert (
        "it fell by +0.0433 (3 seeds, all equal: sd 0, no interval) of its initial value over "
        "the last 10% of training (the least-squares slope over the logged points in its last "
        "20%, at least 2: iterations 90-100, 2 points); per seed 0.043 (seed 1), 0.043 (seed 2), "
        "0.043 (seed 3); the value itself (no interval: no spread across seeds), 0.0433, is as "
        "much as the margin Δdip has left over 0.05" in v.numbers
    )
    assert "so one more such stretch of training could close it: Δdip is not measured" in (
        v.numbers
    )


def test_a_control_falling_slowly_at_the_last_point_gives_dip_over_the_window():
    """Trial 7: the control falls 29.5 → 29 at its end, 0.008 of its initial 30 over the last
    10% of training (the committed study's controls: 16.042 → 16.035). Its minimum is its last
    point, but a fall that small does not stop the row: Δdip is read over the runs' window
    (the control's dip so far), and the decided verdict is scoped to that window. Before,
    any fall at the last point, however small, made the row not measurable.
    Logged every 10 iterations (10 points after iteration 0, so the minima are cross-fitted):
    γ = 1 30 → 15 − e (iterations 10-40) → 20.5 (50, 60) → 21 (70-100); the control 30 → 29.5
    (10-80) → 29.25 → 29. By hand: the arm's cross-fitted minimum 15 − e, its end 21; the
    control's lowest even-indexed point 29.25 (iteration 90) read as (29.5 + 29)/2, its lowest
    odd-indexed 29 (100) read as 29.25: minimum 29.25; its end slope over 80-100 −0.025 a
    step, a fall of 0.25/30 = 0.0083 over the last 10%."""
    losses, diag = {}, {}
    offsets = (0.0, 0.2, -0.3)
    for k, e in enumerate(offsets, start=1):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        arm = [30.0] + [15.0 - e] * 4 + [20.5] * 2 + [21.0] * 4
        ctrl = [30.0] + [29.5] * 8 + [29.25, 29.0]
        for name, ranks in (("gamma1", arm), ("baseline", ctrl)):
            diag[(name, "s1", k)] = {10 * i: {"stable_rank/q": r} for i, r in enumerate(ranks)}
    v = claim7(make_study(losses, {"s1": 256}, diagnostics=diag))
    deltas = [(29.25 - 15.0 + e) / 30 for e in offsets]
    lo, hi = _t_interval(deltas)
    rises = [21.0 / (15.0 - e) - 1 for e in offsets]
    rlo, rhi = _t_interval(rises)
    assert lo > DIP_MIN and rlo > DIP_MIN
    assert v.verdict == REPRODUCED
    assert v.scope == "Δdip over the runs' window; a control still falling slowly at its end"
    assert v.numbers == (
        f"gamma1 vs baseline (s1): Δdip {np.mean(deltas):+.3f} [{lo:+.3f}, {hi:+.3f}] (df 2, 3 "
        f"seeds) (the interval lies beyond +0.05); recovery {np.mean(rises):+.3f} [{rlo:+.3f}, "
        f"{rhi:+.3f}] (df 2, 3 seeds) (the interval lies beyond +0.05); min (cross-fitted) and "
        "end each read over 3 logged points; read at 10 logged points after iteration 0, every "
        "10 iterations: a dip shorter than 10 iterations is not seen; Δdip over the runs' "
        "window: the control may still be falling at its end, but slowly: it fell by +0.0083 (3 "
        "seeds, all equal: sd 0, no interval) of its initial value over the last 10% of "
        "training (the least-squares slope over the logged points in its last 20%, at least 2: "
        "iterations 80-100, 3 points); per seed 0.008 (seed 1), 0.008 (seed 2), 0.008 (seed 3); "
        "the value itself (no interval: no spread across seeds), 0.0083, is below 0.05"
    )


def test_end_fall_is_a_least_squares_slope_by_hand():
    """Trial 10 (finding 3): the control's fall at its end is −slope · 0.1·T / SR at iteration
    0, slope the least-squares slope over the points logged after iteration 0 in the last 20%
    of training, at least the last 2 (trial 9's interpolated difference of two single points
    read one noisy point at each end). By hand: 30 → 24 → 19.5 → 15 at 0, 300, 700, 1000:
    only 1000 lies in 800-1000, so the line through 700 and 1000, slope −0.015, fall 1.5/30 =
    0.05; points 800, 900, 1000 at 16, 15.5, 14: slope −0.01, fall 1/20 = 0.05, the point at
    0 never fitted; 855 and 950 at 16.04 and 16.0 (both at or after 0.8·950 = 760): slope
    −0.04/95, fall 0.04/95·95/20 = 0.002; a rise is a negative fall."""
    assert (END_SHARE, FIT_SHARE) == (0.1, 0.2)
    e = _end_fall({0: 30.0, 300: 24.0, 700: 19.5, 1000: 15.0})
    assert (e.fall, e.start, e.stop, e.points) == (pytest.approx(0.05, abs=1e-12), 700, 1000, 2)
    e = _end_fall({0: 20.0, 500: 17.0, 800: 16.0, 900: 15.5, 1000: 14.0})
    assert (e.fall, e.start, e.points) == (pytest.approx(0.05, abs=1e-12), 800, 3)
    e = _end_fall({0: 20.0, 855: 16.04, 950: 16.0})
    assert (e.fall, e.start, e.points) == (pytest.approx(0.002, abs=1e-12), 855, 2)
    assert _end_fall({0: 10.0, 90: 8.0, 100: 9.0}).fall == pytest.approx(-0.1)  # it rose
    # a noisy end: the slope is fit over all 11 points, not read from the last one
    its = list(range(0, 1001, 20))
    wiggle = {t: 20.0 - 0.005 * t + (0.3 if t == 1000 else 0.0) for t in its}
    x = np.array([t for t in its if t >= 800], dtype=float)
    y = np.array([wiggle[t] for t in its if t >= 800])
    assert _end_fall(wiggle).fall == pytest.approx(-np.polyfit(x, y, 1)[0] * 100 / 20.0)


def _linear_control_study(iterations, control_end: float):
    """Trial 9's pair (``synth8.py``): γ = 1 dips 30 → 6 (iteration 300) and recovers to 12
    (iteration 1000); its control falls linearly 30 → ``control_end`` over the whole run and
    never flattens; three seeds, the same trajectories logged at ``iterations``."""

    def arm(t):
        return 30 - 24 * t / 300 if t <= 300 else 6 + 6 * (t - 300) / 700

    def ctrl(t, seed):
        return 30 - (30 - control_end) * t / 1000 + 0.01 * seed * (t > 0)

    losses, diag = {}, {}
    for k, e in enumerate((0.0, 0.2, -0.3), start=1):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        diag[("gamma1", "s1", k)] = {t: {"stable_rank/q": arm(t) - e} for t in iterations}
        diag[("baseline", "s1", k)] = {t: {"stable_rank/q": ctrl(t, k)} for t in iterations}
    return make_study(losses, {"s1": 256}, diagnostics=diag)


@pytest.mark.parametrize(
    "control_end, verdict, fall",
    [
        (15.0, NOT_MEASURED, 0.05),  # trial 9's pair: (16.5 − 15)/30
        (10.0, NOT_MEASURED, 2 / 30),  # (12 − 10)/30
        (20.0, REPRODUCED, 1 / 30),  # (21 − 20)/30, over the runs' window
    ],
)
def test_a_control_still_falling_gets_one_verdict_however_often_it_was_logged(
    control_end, verdict, fall
):
    """Trial 9: the fall at the control's end was read over the last *logged interval*, so the
    same linear control (30 → 15) was "falling slowly" (0.01 of 30 per interval, reproduced)
    logged at 51 points and still dipping (0.15, not measurable) at 4. Over the last 10% of
    training it falls by the same share either way, by hand (30 − control_end)/10/30. (Logged
    at 6 points after iteration 0, the fewest claim 7 reads a minimum from.)"""
    dense = claim7(_linear_control_study(list(range(0, 1001, 20)), control_end))
    sparse = claim7(_linear_control_study([0, 100, 250, 400, 550, 700, 1000], control_end))
    assert dense.verdict == sparse.verdict == verdict
    assert "at least 2: iterations 800-1000, 11 points)" in dense.numbers
    assert "at least 2: iterations 700-1000, 2 points)" in sparse.numbers
    for v in (dense, sparse):
        per_seed = f"{fall:.3f}"
        assert f"per seed {per_seed} (seed 1), {per_seed} (seed 2), {per_seed} (seed 3)" in (
            v.numbers
        )
        assert f"the value itself (no interval: no spread across seeds), {fall:.4f}," in (v.numbers)
        if verdict == REPRODUCED:
            assert (
                v.scope == "Δdip over the runs' window; a control still falling slowly at its end"
            )


def test_dip_and_rise_read_windows_of_three_logged_points_by_hand():
    """Trial 10 (finding 4): where 6 or more points are logged after iteration 0 the minimum
    is cross-fitted: the lowest even-indexed point (0-based, after iteration 0) read as the
    mean of its odd-indexed neighbours, the lowest odd-indexed one as the mean of its
    even-indexed neighbours, the two averaged; the end is the mean of the last 3; single
    points below 6. (Trial 9's window centred on the lowest point held that point: 14 and 13
    in the first two cases, a bias that a flat noisy trajectory turned into a recovery.)
    By hand, 14 12 16 18 20 22: evens 14 16 20 → 14 at 0, read 12; odds 12 18 22 → 12 at 1,
    read (14 + 16)/2 = 15; low 13.5, end 20. 12 14 16 17 18 19: 12 → 14; 14 → (12 + 16)/2 =
    14; low 14, end 18. 20 19 18 17 16 16.5: evens → 16 at 4, read (17 + 16.5)/2; odds →
    16.5 at 5, read 16; both windows reach the last point: no recovery."""
    dip, rise = _dip_rise({0: 30.0, 10: 14.0, 20: 12.0, 30: 16.0, 40: 18.0, 50: 20.0, 60: 22.0})
    assert (dip, rise) == (pytest.approx(1 - 13.5 / 30), pytest.approx(20 / 13.5 - 1))
    dip, rise = _dip_rise({0: 30.0, 10: 12.0, 20: 14.0, 30: 16.0, 40: 17.0, 50: 18.0, 60: 19.0})
    assert (dip, rise) == (pytest.approx(1 - 14 / 30), pytest.approx(18 / 14 - 1))
    dip, rise = _dip_rise({0: 30.0, 10: 20.0, 20: 19.0, 30: 18.0, 40: 17.0, 50: 16.0, 60: 16.5})
    assert dip == pytest.approx(1 - (16.75 + 16.0) / 2 / 30) and rise is None
    # five points after iteration 0: single points, min 12, end 19
    dip, rise = _dip_rise({0: 30.0, 10: 14.0, 20: 12.0, 30: 16.0, 40: 18.0, 50: 19.0})
    assert (dip, rise) == (pytest.approx(0.6), pytest.approx(19 / 12 - 1))
    assert _dip_rise({0: 10.0, 50: 11.0, 100: 12.0}) == (0.0, pytest.approx(0.2))  # no dip


def _cross_fit(after: np.ndarray) -> float:
    """The cross-fitted minimum of the points after iteration 0, written out here apart from
    :func:`~megatron_gamma.study.analysis.rank_dip`."""
    readings = []
    for parity in (0, 1):
        idx = np.arange(parity, len(after), 2)
        at = int(idx[np.argmin(after[idx])])
        near = [after[i] for i in (at - 1, at + 1) if 0 <= i < len(after)]
        readings.append(np.mean(near))
    return float(np.mean(readings))


def _flat_after_dip_study(seed: int, points: int = 51, sd: float = 0.04):
    """Trial 9's null (``mech9.py`` B): γ = 1 dips 30 → 12 at the first logged point after
    iteration 0 and stays there, its control 30 → 24, each later point with independent noise
    of ``sd`` (relative); four seeds. The true recovery is 0."""
    rng = np.random.default_rng(seed)
    losses, diag = {}, {}
    its = np.linspace(0, 1000, points).astype(int)
    for k in range(1, 5):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        for arm, level in (("gamma1", 12.0), ("baseline", 24.0)):
            diag[(arm, "s1", k)] = {
                int(t): {"stable_rank/q": 30.0 if t == 0 else level * (1 + sd * rng.normal())}
                for t in its
            }
    return make_study(losses, {"s1": 256}, diagnostics=diag)


def test_a_flat_noisy_trajectory_after_its_dip_is_not_a_recovery():
    """Trial 9: the lowest of 50 noisy points lies about 2.3 sd below their level, so
    final/min − 1 with a single-point minimum made this flat arm (4% noise) "recover" by
    +0.151 [+0.072, +0.231]: reproduced (25% of such simulated studies). A 3-point window
    centred on the lowest point still held it: +0.067 [−0.005, +0.139] here. Cross-fitted
    (trial 10), the points the minimum is read on are not those it was chosen on, and the
    recovery's interval covers the true 0."""
    data = _flat_after_dip_study(seed=0)
    series = data.seed_series("gamma1", "s1", "stable_rank")
    single, windowed, crossed = [], [], []
    for k in sorted(series):
        after = np.array([series[k][t] for t in sorted(series[k])][1:])
        j = int(np.argmin(after))
        single.append(after[-1] / after[j] - 1)
        windowed.append(after[-3:].mean() / after[max(j - 1, 0) : j + 2].mean() - 1)
        crossed.append(after[-3:].mean() / _cross_fit(after) - 1)
    assert _t_interval(single)[0] > DIP_MIN  # the single-point rule decided a recovery
    assert np.mean(windowed) > DIP_MIN  # trial 9's window: its mean still above the margin
    v = claim7(data)
    lo, hi = _t_interval(crossed)
    assert lo < 0 < hi
    assert v.verdict in (INCONCLUSIVE, NOT_REPRODUCED)
    assert f"recovery {np.mean(crossed):+.3f} [{lo:+.3f}, {hi:+.3f}] (df 3, 4 seeds)" in v.numbers
    assert "min (cross-fitted) and end each read over 3 logged points" in v.numbers


def test_a_clear_recovery_read_over_windows_is_still_reproduced():
    """γ = 1 30 → 12 − e → 13 → 15 → 17 → 19 → 21 → 23 (iterations 0-700), its control 30 →
    27 → 26 → 25 → 25.5 → 26 → 26 → 26. By hand, cross-fitted (trial 10): the arm's minimum
    (13 + (12 − e + 15)/2)/2 = (53 − e)/4, its end (19 + 21 + 23)/3 = 21, dip 1 − (53 − e)/120,
    rise 84/(53 − e) − 1; the control's minimum ((26 + 25.5)/2 + (25 + 26)/2)/2 = 25.625, dip
    1 − 25.625/30; its end flat (26, 26 over the last 20%): a fall of 0, no window scope."""
    losses, diag = {}, {}
    offsets = (0.0, 0.5, -0.5)
    for k, e in enumerate(offsets, start=1):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        arm = (30.0, 12.0 - e, 13.0, 15.0, 17.0, 19.0, 21.0, 23.0)
        ctrl = (30.0, 27.0, 26.0, 25.0, 25.5, 26.0, 26.0, 26.0)
        for name, ranks in (("gamma1", arm), ("baseline", ctrl)):
            diag[(name, "s1", k)] = {100 * i: {"stable_rank/q": r} for i, r in enumerate(ranks)}
    v = claim7(make_study(losses, {"s1": 256}, diagnostics=diag))
    deltas = [25.625 / 30 - (53 - e) / 120 for e in offsets]
    rises = [84 / (53 - e) - 1 for e in offsets]
    (lo, hi), (rlo, rhi) = _t_interval(deltas), _t_interval(rises)
    assert rlo > DIP_MIN and lo > DIP_MIN
    assert v.verdict == REPRODUCED and v.scope == ""
    assert v.numbers == (
        f"gamma1 vs baseline (s1): Δdip {np.mean(deltas):+.3f} [{lo:+.3f}, {hi:+.3f}] (df 2, 3 "
        f"seeds) (the interval lies beyond +0.05); recovery {np.mean(rises):+.3f} [{rlo:+.3f}, "
        f"{rhi:+.3f}] (df 2, 3 seeds) (the interval lies beyond +0.05); min (cross-fitted) and "
        "end each read over 3 logged points; read at 7 logged points after iteration 0, every "
        "100 iterations: a dip shorter than 100 iterations is not seen"
    )


def _one_low_point_study(points: int):
    """γ = 1 30 → flat at 12 over ``points`` logged points after iteration 0 (every 100
    iterations), one of them low by "noise" (12 · (0.9 − 0.01·seed), at position seed mod 4,
    never the last); its control flat at 24; four seeds. The true recovery is 0."""
    losses, diag = {}, {}
    for k in range(1, 5):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        arm = [30.0] + [12.0] * points
        arm[1 + k % 4] = 12.0 * (0.9 - 0.01 * k)
        ctrl = [30.0] + [24.0 + 0.1 * k] * points
        for name, ranks in (("gamma1", arm), ("baseline", ctrl)):
            diag[(name, "s1", k)] = {100 * i: {"stable_rank/q": r} for i, r in enumerate(ranks)}
    return make_study(losses, {"s1": 256}, diagnostics=diag)


def test_a_minimum_from_fewer_than_six_points_is_not_measured():
    """Trial 11 (finding 2): below 6 points after iteration 0 the minimum was the single
    lowest point, biased low, so a flat arm "recovered": here by hand 12/(12 · (0.9 − 0.01k))
    − 1 = 0.112-0.149 in the four seeds, an interval beyond 0.05: "reproduced", with a true
    recovery of 0 and no word of single points. Now not measurable in these runs, and the row
    says why and how to log more; 6 points (cross-fitted) read no recovery."""
    rises = [1 / (0.9 - 0.01 * k) - 1 for k in range(1, 5)]
    assert _t_interval(rises)[0] > DIP_MIN  # the old single-point reading's call
    v = claim7(_one_low_point_study(5))
    assert v.verdict == NOT_MEASURED and v.scope == ""
    lo, hi = _t_interval(rises)
    assert f"recovery {np.mean(rises):+.3f} [{lo:+.3f}, {hi:+.3f}] (df 3, 4 seeds)" in v.numbers
    assert (
        "fewer than 6 stable-rank points logged after iteration 0 (the arm's seed 1 has 5), "
        "where a single-point minimum reads biased low" in v.reason
    )
    assert "diagnostics_points, at least 7 with iteration 0, or --log-diagnostics-interval" in (
        v.numbers
    )
    dense = claim7(_one_low_point_study(6))
    assert dense.verdict in (NOT_REPRODUCED, INCONCLUSIVE)
    assert "recovery +0.0" in dense.numbers or "recovery -0.0" in dense.numbers


def test_a_mechanism_row_decided_on_shared_lr_runs_is_scoped_to_that_lr():
    """Claims 4, 5, 7 and 8 read only the shared-LR runs, and their diagnostics depend on the
    LR as the loss does (trial 4: claim 7 reproduced in docs/reproduction.md with the γ = 0.5
    controls at a quarter of their own best LR). A decided one carried no scope, as if it held
    at every LR; it now says "at one shared LR", as claims 1-3 and 6 do."""
    losses, diag = {}, {}
    for k, e in enumerate((0.0, 0.2, -0.3), start=1):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        draw = 1 + 1e-3 * k  # each seed draws other matrices
        arm = [30.0] + [15.0 - e] * 3 + [21.0] * 4
        ctrl = [30.0] + [29.0 + 0.1 * e] * 3 + [29.5] * 4
        for name, ranks in (("gamma1", arm), ("baseline", ctrl)):
            diag[(name, "s1", k)] = {
                10 * i: {"stable_rank/q": r * draw} for i, r in enumerate(ranks)
            }
    rows = verdicts(make_study(losses, {"s1": 256}, diagnostics=diag), {}, None)
    row = rows[10]
    assert row.claim == claim7(make_study(losses, {"s1": 256}, diagnostics=diag)).claim
    assert (row.lr, row.verdict) == ("shared LR", REPRODUCED)
    assert row.label() == "reproduced (at one shared LR, not tuned per arm)"


def test_the_stable_rank_mean_compares_the_same_matrices_across_arms():
    """The trial's smoke study: the gated arm's mean included its gate matrices, the
    baseline's could not, so the two started 24.89 vs 25.77 from draws equal up to scale. The
    mean is over the matrices every arm logged: q (30 → 12 → 18) here, not the gate's 10."""
    losses, diag = {}, {}
    for arm in ("baseline", "gamma1+eps+gate"):
        losses[(arm, "s1", 1)] = 5.0
        extra = {"stable_rank/gate/layer_00": 10.0} if arm != "baseline" else {}
        diag[(arm, "s1", 1)] = {
            it: {"stable_rank/qkv.q/layer_00": r, **extra}
            for it, r in ((0, 30.0), (50, 12.0), (100, 18.0))
        }
    m = mechanisms(make_study(losses, {"s1": 256}, diagnostics=diag))
    for arm in ("baseline", "gamma1+eps+gate"):
        e = m[f"{arm}|s1"]
        assert (e["rank_first"], e["rank_min"], e["rank_final"]) == (30.0, 12.0, 18.0), arm
        assert e["rank_rise"] == pytest.approx(0.5)


def test_the_condensation_series_compares_the_same_matrices_across_arms():
    """report.json's condensation series (its ``series`` are :func:`mechanisms`') averaged
    every matrix an arm logged, so the gated arm's gate score (0.9 here) lifted its mean to
    (c + (1 − c) + 0.9)/3 = 0.633 against the baseline's (c + (1 − c))/2 = 0.5 for identical
    q and k matrices. It is now the mean over the matrices every arm logged, as the stable
    rank's is."""
    losses, diag = {}, {}
    for arm in ("baseline", "gamma1+eps+gate"):
        losses[(arm, "s1", 1)] = 5.0
        gate = {"condensation/gate/layer_00": 0.9} if arm != "baseline" else {}
        diag[(arm, "s1", 1)] = {
            it: {"condensation/qkv.q/layer_00": c, "condensation/qkv.k/layer_00": 1 - c, **gate}
            for it, c in ((0, 0.2), (50, 0.6), (100, 0.4))
        }
    m = mechanisms(make_study(losses, {"s1": 256}, diagnostics=diag))
    for arm in ("baseline", "gamma1+eps+gate"):
        assert m[f"{arm}|s1"]["condensation"] == pytest.approx({0: 0.5, 50: 0.5, 100: 0.5}), arm


# --- claim 8: Δsym by difficulty ------------------------------------------------------------


def _pairs(rng, extras: dict[int, float], n=2000, easy_loss=None) -> dict[int, dict]:
    """Seeds scoring the same n held-out tokens of true difficulty D ~ U(0, 10) nats: B's loss
    is D plus seed noise; A gains 0.1 nats plus ``extras[seed]`` on tokens with D > 3 (or, with
    ``easy_loss``, loses that much on tokens with D <= 3 and gains nothing elsewhere), plus
    seed noise. Each seed's difficulty is its own pair's mean loss, as ``compare`` writes it,
    and each model's loss is kept (``loss_a``, ``loss_b``; as synthetic numbers, a few
    slightly below 0)."""
    true = rng.uniform(0, 10, n)
    out = {}
    for seed, extra in extras.items():
        logp_b = -true + rng.normal(0, 0.3, n)
        if easy_loss is None:
            gain = 0.1 + extra * (true > 3)
        else:
            gain = -easy_loss * (true <= 3)
        dlogp = gain + rng.normal(0, 0.3, n)
        out[seed] = {
            "delta": np.tanh(dlogp / 2),
            "difficulty": -(2 * logp_b + dlogp) / 2,
            "dlogp": dlogp,
            "loss_a": -(logp_b + dlogp),
            "loss_b": -logp_b,
        }
    return out


def _hard(seeds: dict[int, dict], seed: int) -> np.ndarray:
    """Seed ``seed``'s hard tokens by the other seeds' mean difficulty, by hand."""
    others = np.mean([t["difficulty"] for k, t in seeds.items() if k != seed], axis=0)
    return others > np.quantile(others, 0.3)


def _hard_minus_easy(seeds: dict[int, dict], seed: int) -> float:
    hard, delta = _hard(seeds, seed), seeds[seed]["delta"]
    return float(delta[hard].mean() - delta[~hard].mean())


def test_delta_sym_against_the_uniform_improvement_profile():
    rng = np.random.default_rng(0)
    uniform = _pairs(rng, {1: 0.0, 2: 0.0, 3: 0.0})
    r = delta_sym_concentration(uniform)
    for s, t in uniform.items():  # a uniform shift c gives tanh(c/2) on every token
        assert r["null"][s] == pytest.approx(np.tanh(t["dlogp"].mean() / 2), abs=1e-9)
        assert r["per_seed"][s] == pytest.approx(_hard_minus_easy(uniform, s), abs=1e-12)
    lo, hi = _t_interval([_hard_minus_easy(uniform, s) for s in uniform])
    assert (r["interval"].low, r["interval"].high) == pytest.approx((lo, hi))
    assert r["interval"].df == 2 and lo < 0 < hi
    data = make_study({("baseline", "s1", 1): 5.0}, {"s1": 256})
    cmp = {"arm": "gamma1", "size": "s1", "seeds": _pairs(rng, {1: 0.4, 2: 0.4, 3: 0.4})}
    assert claim8(data, cmp).verdict == REPRODUCED
    one = {"arm": "gamma1", "size": "s1", "seeds": _pairs(rng, {1: 0.4})}
    v = claim8(data, one)
    assert v.verdict == INCONCLUSIVE and "needs >= 2 seeds" in v.numbers


def test_difficulty_from_the_pair_itself_makes_a_profile_from_noise():
    """A and B differ by noise alone (1 nat per token, on true difficulty D ~ U(0, 2)): binned
    by each seed's own difficulty, hard − easy is clearly negative (B "better on hard tokens");
    binned by the other seeds' difficulty it is not."""
    rng = np.random.default_rng(1)
    true = rng.uniform(0, 2, 4000)
    seeds = {}
    for seed in (1, 2, 3, 4):
        logp_b = -true + rng.normal(0, 0.3, true.size)
        dlogp = rng.normal(0, 1.0, true.size)
        seeds[seed] = {"delta": np.tanh(dlogp / 2), "difficulty": -logp_b - dlogp / 2}
    own = []
    for t in seeds.values():
        hard = t["difficulty"] > np.quantile(t["difficulty"], 0.3)
        own.append(t["delta"][hard].mean() - t["delta"][~hard].mean())
    assert _t_interval(own)[1] < -0.05  # the artefact, by hand
    r = delta_sym_concentration(seeds)
    assert r["interval"].low < 0 < r["interval"].high
    assert [r["per_seed"][s] for s in seeds] == pytest.approx(
        [_hard_minus_easy(seeds, s) for s in seeds], abs=1e-12
    )


COMMITTED_COMPARE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "reproduction", "compare"
)


def _committed_tokens() -> tuple[dict[int, dict], np.ndarray]:
    """The committed study's held-out tokens (docs/reproduction/compare/seed-N/tokens.npz: the
    recipe against the baseline at d64, four seeds, the same 8,192 tokens of 7 documents)."""
    seeds, docs = {}, None
    for seed in (1, 2, 3, 4):
        with np.load(os.path.join(COMMITTED_COMPARE, f"seed-{seed}", "tokens.npz")) as z:
            seeds[seed] = {
                "delta": z["delta_sym"].ravel(),
                "difficulty": z["difficulty"].ravel(),
                "loss_a": -z["logp_a"].ravel(),
                "loss_b": -z["logp_b"].ravel(),
            }
            docs = z["document"].ravel()
    return seeds, docs


def test_claim8_adds_the_documents_sampling_to_its_interval():
    """Trial 7: every seed scores the same 7 documents (one holds 55% of the tokens), so an
    interval over seeds alone treats them as fixed. The document jackknife of the seed-mean
    hard − easy, by hand, adds its variance to the seeds'; df by Welch–Satterthwaite, the
    document term's df the Bell–McCaffrey df of the documents' token counts, 2.20 (trial 9:
    design-based; D − 1 = 6 overstated it, the data-based (Σa)²/Σa² − 1 was a noisy
    underestimate), capped at the seeds' 3: the Welch df is above 3 here, so df 3."""
    seeds, docs = _committed_tokens()
    ids, counts = np.unique(docs, return_counts=True)
    assert ids.size == 7 and counts.max() / counts.sum() > 0.5
    per_seed = [_hard_minus_easy(seeds, k) for k in seeds]
    left = []
    for d in ids:
        keep = docs != d
        sub = {k: {kk: v[keep] for kk, v in t.items()} for k, t in seeds.items()}
        left.append(np.mean([_hard_minus_easy(sub, k) for k in sub]))
    a = (np.array(left) - np.mean(left)) ** 2
    seed_se2 = np.var(per_seed, ddof=1) / 4
    doc_se2 = 6 / 7 * a.sum()
    assert doc_se2 > seed_se2  # the documents vary more than the seeds
    assert counts.tolist() == [1474, 1236, 4482, 189, 298, 307, 206]
    doc_df = 2.2027  # document_df(counts): the closed form, checked against the matrices
    welch = (seed_se2 + doc_se2) ** 2 / (seed_se2**2 / 3 + doc_se2**2 / doc_df)
    assert welch > 3
    df = 3
    half = stats.t.ppf(0.975, df) * math.sqrt(seed_se2 + doc_se2)
    r = delta_sym_concentration(seeds, docs)
    assert r["documents"] == 7 and r["interval"].df == pytest.approx(df)
    assert r["interval"].mean == pytest.approx(np.mean(per_seed))
    assert (r["interval"].low, r["interval"].high) == pytest.approx(
        (np.mean(per_seed) - half, np.mean(per_seed) + half)
    )
    lo, hi = _t_interval(per_seed)
    assert r["interval"].low < lo and r["interval"].high > hi
    assert r["interval"].text() == "-0.0170 [-0.0737, +0.0397] (df 3, 4 seeds × 7 documents)"
    # one document: its sampling cannot be measured, and the row says so (trial 8)
    one = np.zeros_like(docs)
    with pytest.raises(ValueError, match="all 8192 scored tokens come from one document"):
        delta_sym_concentration(seeds, one)
    data = make_study({("baseline", "s1", 1): 5.0}, {"s1": 256})
    v = claim8(data, {"arm": "gamma1+eps+gate", "size": "s1", "seeds": seeds, "documents": one})
    assert v.verdict == INCONCLUSIVE and "Fix: score more held-out documents" in v.numbers


def test_claim8_is_inconclusive_where_the_model_defining_difficulty_decides_it():
    """Trial 7, on the committed tokens read over seeds alone: with difficulty from the
    baseline's loss alone hard − easy is +0.048 (reproduced), from the arm's alone −0.110 (not
    reproduced), from their mean −0.017 (inconclusive). Each is a fair reading of "token
    difficulty"; the row may not rest on the choice, so it is inconclusive and names all
    three. With the documents' sampling in the intervals (df 3), the baseline's alone is
    inconclusive too, +0.0484 [+0.0083, +0.0885], and the arm's alone still not reproduced,
    −0.1103 [−0.2020, −0.0187]: inconclusive again, the call depending on the model."""
    seeds, docs = _committed_tokens()
    by = {}
    for key in ("difficulty", "loss_b", "loss_a"):
        alt = {k: {"delta": t["delta"], "difficulty": t[key]} for k, t in seeds.items()}
        by[key] = np.mean([_hard_minus_easy(alt, k) for k in alt])
    assert [round(by[k], 4) for k in ("difficulty", "loss_b", "loss_a")] == [
        -0.017,
        0.0484,
        -0.1103,
    ]
    data = make_study({("baseline", "s1", 1): 5.0}, {"s1": 256})
    cmp = {"arm": "gamma1+eps+gate", "size": "s1", "seeds": seeds, "documents": None}
    v = claim8(data, cmp)
    assert v.verdict == INCONCLUSIVE
    assert "hard − easy Δsym seed 1 -0.0059, seed 2 -0.0262, seed 3 -0.0404, seed 4 +0.0044" in (
        v.numbers
    )
    # trial 14, finding 3: each reading is also taken beyond a gain uniform in log-odds (here
    # it lowers every hard − easy), and the three readings still disagree
    assert v.numbers.endswith(
        "the call depends on which model defines difficulty (both models' mean loss: "
        "not reproduced, the baseline's loss alone: inconclusive, the arm's alone: not "
        "reproduced)"
    )
    v = claim8(data, {**cmp, "documents": docs})
    assert v.verdict == INCONCLUSIVE and "over seeds and documents" in v.numbers
    assert "hard − easy +0.0484 [+0.0083, +0.0885] (df 3, 4 seeds × 7 documents)" in v.numbers
    assert "hard − easy -0.1103 [-0.2020, -0.0187] (df 3, 4 seeds × 7 documents)" in v.numbers
    assert v.numbers.endswith(
        "the call depends on which model defines difficulty (both models' mean loss: "
        "not reproduced, the baseline's loss alone: inconclusive, the arm's alone: not "
        "reproduced)"
    )
    without = {k: {"delta": t["delta"], "difficulty": t["difficulty"]} for k, t in seeds.items()}
    v = claim8(data, {**cmp, "seeds": without})
    assert "over seeds (documents not known)" in v.numbers
    assert v.numbers.endswith(
        "difficulty from each model alone and the log-odds null not checked (no per-model losses)"
    )


def test_a_gain_uniform_in_log_odds_is_no_concentration_on_hard_tokens():
    """Trial 14, finding 3: near p = 1 no model gains uniformly in log p (log p_A <= 0 caps an
    easy token's gain), so any better model has a larger Δsym on hard tokens: a gain of c in
    log-odds on every token, with no difficulty mechanism, was "reproduced" in 40 of 40
    studies. Each token's Δsym under the log-odds gain that matches the observed mean is now
    subtracted first. Reference: Δsym under a shift c computed directly from p_B
    (σ(logit p_B + c)); a gain that does favour hard tokens beyond it is still reproduced."""
    rng = np.random.default_rng(3)
    n = 4000
    true = rng.uniform(0.01, 8, n)  # the baseline's loss per token, nats
    seeds = {}
    for k in (1, 2, 3, 4):
        lpb = -np.clip(true + rng.normal(0, 0.2, n), 1e-3, None)
        logit = lpb - np.log(-np.expm1(lpb))
        lpa = -np.log1p(np.exp(-(logit + 0.3 + rng.normal(0, 0.1, n))))  # log σ(logit + 0.3)
        seeds[k] = {"delta": np.tanh((lpa - lpb) / 2), "difficulty": -(lpa + lpb) / 2,
                    "loss_a": -lpa, "loss_b": -lpb}  # fmt: skip
    excess, c = log_odds_excess(seeds[1]["delta"], seeds[1]["loss_b"])
    p_b = np.exp(-seeds[1]["loss_b"])
    p = 1 / (1 + np.exp(-(np.log(p_b / (1 - p_b)) + c)))
    assert np.allclose(excess, seeds[1]["delta"] - (p - p_b) / (p + p_b))
    assert abs(excess.mean()) < 1e-9 and c == pytest.approx(0.3, abs=0.02)
    data = make_study({("baseline", "s1", 1): 5.0}, {"s1": 256})
    r = delta_sym_concentration(seeds)
    assert r["interval"].low > 0.01  # the old rule's "reproduced": hard − easy beyond the margin
    v = claim8(data, {"arm": "gamma1", "size": "s1", "seeds": seeds})
    assert v.verdict == NOT_REPRODUCED and "hard − easy beyond it " in v.numbers
    hard = {
        k: {**t, "delta": np.where(true > 4, np.tanh(0.3), t["delta"])} for k, t in seeds.items()
    }
    for t in hard.values():
        t["loss_a"] = t["loss_b"] - 2 * np.arctanh(t["delta"])
    assert claim8(data, {"arm": "gamma1", "size": "s1", "seeds": hard}).verdict != NOT_REPRODUCED


def test_claim8_reads_the_learned_bar_off_the_compared_checkpoints_too():
    """Trial 5: the compared checkpoints scored 7.83 and 8.12 nats on the held-out tokens,
    above the 7.23 nats of the token frequencies, while the report's "learned" check read the
    runs' logged losses only, and claim 8 was reproduced. The compared models' own losses now
    face the bar: not measurable, naming them."""
    rng = np.random.default_rng(0)
    seeds = _pairs(rng, {1: 0.4, 2: 0.4, 3: 0.4})
    runs = {k: {"a": {"mean_loss": 7.0}, "b": {"mean_loss": 7.1}} for k in seeds}
    cmp = {"arm": "gamma1", "size": "s1", "seeds": seeds, "runs": runs}
    data = make_study({("baseline", "s1", 1): 5.0}, {"s1": 256}, vocab_size=4096)
    data.unigram_loss = 7.2297
    assert claim8(data, cmp).verdict == REPRODUCED  # both below the bar
    runs[2] = {"a": {"mean_loss": 7.8280}, "b": {"mean_loss": 8.1238}}
    v = claim8(data, cmp)
    assert v.verdict == NOT_MEASURED
    assert v.numbers == (
        "gamma1 vs baseline at s1: not learned: the compared checkpoints' mean loss over the "
        "scored tokens is not below 7.2197 nats, δ = 0.01 nats below the held-out loss of the "
        "train split's token frequencies, 7.2297 nats (add-0.5 smoothed; ln V = ln 4096 = "
        "8.3178 nats is a uniform predictor's): seed 2 a 7.8280, seed 2 b 8.1238"
    )


@pytest.mark.parametrize("elsewhere", ["outside", "other_run"])
def test_claim8_compares_only_each_runs_own_checkpoints(tmp_path, elsewhere):
    """compare followed a run's config.yaml to a `save` outside the study directory (trial 5),
    or to another run's checkpoints inside it (trial 6: the baseline compared with itself), and
    scored other models than those whose losses the report read. sweep saves inside each run,
    so a checkpoint outside its own run directory is refused, named, before compare runs."""
    from megatron_gamma.study.report import run_compare

    study = tmp_path / "study"
    outside = (
        tmp_path / "elsewhere" / "checkpoints"
        if elsewhere == "outside"
        else study / "baseline" / "s1" / "seed-1" / "checkpoints"
    )
    ckpt = outside / "iter_0000002"
    ckpt.mkdir(parents=True)
    (outside / "latest_checkpointed_iteration.txt").write_text("2")
    (ckpt / "metadata.json").write_text("{}")
    for arm in ("gamma1+eps+gate", "baseline"):
        run = study / arm / "s1" / "seed-1"
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.yaml").write_text(f"checkpoint:\n  save: {outside}\n")
    losses = {("gamma1+eps+gate", "s1", 1): 4.8, ("baseline", "s1", 1): 5.0}
    data = make_study(losses, {"s1": 256}, manifest={"heldout": str(tmp_path / "h")})
    data.dir = str(study)
    got = run_compare(data, str(tmp_path / "report"))
    run = study / "gamma1+eps+gate" / "s1" / "seed-1"
    assert got["error"].startswith(
        f"checkpoint {str(ckpt)!r} lies outside its run directory {str(run)!r}"
    )
    assert not (tmp_path / "report").exists()


def test_delta_sym_seeds_are_the_unit_not_documents():
    """Two seeds whose hard − easy values have opposite signs: tokens or documents taken as
    replicates once gave a narrow interval above 0 (reproduced); over seeds it is t with
    df 1."""
    rng = np.random.default_rng(0)
    seeds = _pairs(rng, {1: 0.2, 2: -0.12}, n=20000)
    per_seed = [_hard_minus_easy(seeds, s) for s in seeds]
    assert per_seed[0] > 0 > per_seed[1]
    lo, hi = _t_interval(per_seed)
    v = claim8(make_study({("baseline", "s1", 1): 5.0}, {"s1": 256}), {
        "arm": "gamma1+eps+gate", "size": "s1", "seeds": seeds
    })  # fmt: skip
    assert v.verdict == INCONCLUSIVE and f"[{lo:+.4f}, {hi:+.4f}] (df 1, 2 seeds)" in v.numbers


def test_a_profile_without_a_gain_is_not_a_concentrated_gain():
    """The arm loses 0.4 nats on the easiest tokens and nothing on the rest: hard − easy is
    well above 0, but there is no gain to concentrate, and the hard-token part says so."""
    rng = np.random.default_rng(0)
    seeds = _pairs(rng, {1: 0.0, 2: 0.0, 3: 0.0}, easy_loss=0.4)
    hard = [seeds[s]["delta"][_hard(seeds, s)].mean() for s in seeds]
    lo, hi = _t_interval(hard)
    data = make_study({("baseline", "s1", 1): 5.0}, {"s1": 256})
    v = claim8(data, {"arm": "gamma1+eps+gate", "size": "s1", "seeds": seeds})
    assert min(_hard_minus_easy(seeds, s) for s in seeds) > 0.1 and hi < 0.01
    assert v.verdict == NOT_REPRODUCED
    assert f"Δsym on the hard tokens {np.mean(hard):+.4f} [{lo:+.4f}, {hi:+.4f}] (df 2" in v.numbers
    short = {**seeds, 3: {k: x[:-1] for k, x in seeds[3].items()}}
    v = claim8(data, {"arm": "gamma1+eps+gate", "size": "s1", "seeds": short})
    assert v.verdict == INCONCLUSIVE and "scored the same held-out tokens" in v.numbers


def test_the_concentration_arm_is_fixed_before_losses_are_read():
    """The engine once compared whichever arm had the lowest loss: here γ = 0.5 with both fixes,
    which would have judged a small-initialization claim on a γ = 0.5 model."""
    losses = {}
    for k in (1, 2):
        losses |= {("baseline", "s1", k): 5.0, ("gamma1", "s1", k): 4.95}
        losses |= {("gamma1+eps+gate", "s1", k): 4.8, ("gamma0.5+eps+gate", "s1", k): 4.7}
    assert concentration_arm(make_study(losses, {"s1": 256})) == "gamma1+eps+gate"
    two = {key: x for key, x in losses.items() if key[0] in ("baseline", "gamma1")}
    assert concentration_arm(make_study(two, {"s1": 256})) == "gamma1"
    # Trial 7: the claim names what the comparison credits, the recipe's three changes or γ.
    assert claim8(make_study(losses, {"s1": 256}), None).claim.startswith(
        "γ = 1+ε+gate's gains over the baseline (γ, ε and the gate together, as the paper "
        "compares its recipe) are larger on the hardest 70% of tokens"
    )
    assert claim8(make_study(two, {"s1": 256}), None).claim.startswith(
        "γ = 1's gains over the baseline (γ alone) are larger"
    )


def test_roles_pair_arms_that_differ_in_one_setting():
    """A γ = 0.5 + gate arm at ε = 1e-8 is not the control of γ = 1 + gate at ε = 1e-12: the
    interaction would mix in ε, and the engine once reported it as reproduced."""
    arms = dict(ARMS, **{"gamma0.5+eps+gate": (0.5, 1e-8, "elementwise")})
    data, losses = _four_arms(fix_at_1=0.4, fix_at_05=0.05)
    mixed = make_study(losses, {"s1": 256, "s2": 512}, arms=arms)
    assert mixed.role("gamma0.5+eps+gate") is None and data.role("gamma0.5+eps+gate")
    v = claim3(mixed, mixed.losses, "shared LR")
    assert v.verdict == INCONCLUSIVE and "the study has no γ = 0.5 + fixes arm" in v.numbers


def _with_arm_fields(data: StudyData, extra: dict[str, dict]) -> StudyData:
    """``data`` as sweep records it now: every run with ``arm_fields`` (its arm's factors, plus
    ``extra[arm]``)."""
    runs = []
    for r in data.runs:
        factors = {k: r[k] for k in ("init_gamma", "norm_epsilon", "gated_attention")}
        runs.append({**r, "arm_fields": {**factors, **extra.get(r["arm"], {})}})
    return StudyData(data.manifest, runs)


def _paired_losses() -> dict:
    losses = {}
    for k in (1, 2):
        losses |= {("baseline", "s1", k): 5.0, ("gamma1", "s1", k): 4.9 + 0.01 * k}
        losses |= {("gamma1+eps+gate", "s1", k): 4.8, ("gamma0.5+eps+gate", "s1", k): 4.85}
    return losses


def test_roles_refuse_a_pair_whose_recorded_arm_settings_differ_beyond_the_factor():
    """The confound of a study file written before arms were restricted: γ = 1 also dropped
    weight decay and fc2's γ, so "γ alone" would be credited with both."""
    old = make_study(_paired_losses(), {"s1": 256})
    data = _with_arm_fields(
        old, {"gamma1": {"weight_decay": 0.0, "init_gamma_overrides": "fc2=0.5"}}
    )
    assert data.other_fields("gamma1") == {"weight_decay": 0.0, "init_gamma_overrides": "fc2=0.5"}
    assert data.other_fields("baseline") == {}
    assert data.unmatched_fields("baseline", "gamma1") == {
        "init_gamma_overrides": (None, "fc2=0.5"),
        "weight_decay": (None, 0.0),
    }
    message = (
        "study.json: arms 'baseline' and 'gamma1' would be compared as differing in γ alone, but "
        "their arm settings also differ in init_gamma_overrides, weight_decay "
        "(init_gamma_overrides: unset vs 'fc2=0.5'; weight_decay: unset vs 0.0), and a verdict "
        "would credit that difference to γ. Fix: sweep the arms again with those fields in the "
        "study's set: (every arm gets them), or compare them in a separate study"
    )
    with pytest.raises(ConfigError) as e:
        data.role("gamma1")
    assert str(e.value) == message
    with pytest.raises(ConfigError) as e:  # the report's verdicts: refused, not decided
        verdicts(data, {}, None)
    assert str(e.value) == message
    # the other pairs are matched and still resolve
    assert data.role("gamma1+eps+gate") == "gamma1+eps+gate"
    assert data.role("gamma0.5+eps+gate") == "gamma0.5+eps+gate"
    # the control of the fixes differing in the gate's pair: named with the compared factor
    gated = _with_arm_fields(old, {"gamma0.5+eps+gate": {"qk_layernorm": True}})
    with pytest.raises(ConfigError, match=r"differing in γ alone, .* in qk_layernorm "):
        gated.role("gamma0.5+eps+gate")
    fixed = _with_arm_fields(old, {"gamma1+eps+gate": {"init_method": "normal"}})
    with pytest.raises(ConfigError, match=r"'baseline' and 'gamma1\+eps\+gate' .* γ, ε and the"):
        fixed.role("gamma1+eps+gate")


def test_roles_prefer_the_arm_matched_in_every_recorded_setting():
    losses = _paired_losses() | {("gamma1-wd0", "s1", k): 4.5 for k in (1, 2)}
    arms = dict(ARMS, **{"gamma1-wd0": (1.0, 1e-5, "none")})
    # gamma1-wd0 has γ = 1 at the baseline's ε and gate, and one more size would make it win
    losses[("gamma1-wd0", "s2", 1)] = 4.4
    losses[("baseline", "s2", 1)] = 4.9
    old = make_study(losses, {"s1": 256, "s2": 512}, arms=arms)
    assert old.role("gamma1") == "gamma1-wd0"  # before: matched on γ, ε and the gate alone
    data = _with_arm_fields(old, {"gamma1-wd0": {"weight_decay": 0.0}})
    assert data.role("gamma1") == "gamma1"
    assert data.matched_control("gamma1") == "baseline"
    with pytest.raises(
        ConfigError, match=r"'gamma1-wd0' and 'baseline' .*\(weight_decay: 0\.0 vs unset\)"
    ):
        data.matched_control("gamma1-wd0")


def test_an_old_manifest_without_arm_fields_and_factor_only_fields_pair_as_before():
    old = make_study(_paired_losses(), {"s1": 256})
    assert all("arm_fields" not in r for r in old.runs)
    new = _with_arm_fields(old, {})
    for data in (old, new):
        assert (
            data.other_fields("gamma1") == {} and data.unmatched_fields("baseline", "gamma1") == {}
        )
        assert [data.role(n) for n in ("gamma1", "gamma1+eps+gate", "gamma0.5+eps+gate")] == [
            "gamma1",
            "gamma1+eps+gate",
            "gamma0.5+eps+gate",
        ]
        assert data.matched_control("gamma1+eps+gate") == "gamma0.5+eps+gate"
    assert [(r.claim, r.verdict) for r in verdicts(old, {}, None)] == [
        (r.claim, r.verdict) for r in verdicts(new, {}, None)
    ]


# --- LR grid, old manifests, fits -----------------------------------------------------------


def test_lr_grid_best_lr_rows_and_old_manifest_defaults():
    widths = {"s1": 256}
    losses, lr = {}, {}
    for arm, best in (("baseline", 1e-3), ("gamma1", 3e-4)):
        for x in (1e-4, 3e-4, 1e-3, 3e-3):
            shared = x == 3e-3
            losses[(arm, "s1", 1 if shared else 100 + int(x * 1e5))] = 5.0 + abs(math.log(x / best))
        for seed in (2, 3, 4):
            spread = 0.0 if arm == "gamma1" else 0.002 * (seed - 3)  # paired sd > 0, mean -0.3
            losses[(arm, "s1", seed)] = (4.7 if arm == "gamma1" else 5.0) + 0.01 * seed + spread
            lr[(arm, "s1", seed)] = (best, "confirm", False)
    for arm in ("baseline", "gamma1"):
        for x in (1e-4, 3e-4, 1e-3):
            lr[(arm, "s1", 100 + int(x * 1e5))] = (x, "grid", True)
        lr[(arm, "s1", 1)] = (3e-3, "shared", True)
    manifest = {"shared_lr": 3e-3, "lr_select_seed": 1, "margin": 0.05}
    data = make_study(losses, widths, manifest=manifest, lr=lr)
    assert data.best_lr("gamma1", "s1") == 3e-4 and data.best_lr("baseline", "s1") == 1e-3
    assert data.confirm_losses("gamma1", "s1") == {2: 4.72, 3: 4.73, 4: 4.74}
    rows = verdicts(data, {}, None)
    assert [r.lr for r in rows[:6]] == ["shared LR", "best LR"] * 3
    best = rows[1]
    assert best.verdict == REPRODUCED and "-0.3000" in best.numbers and "δ = 0.05" in best.rule
    rows_best, diffs = loss_table(data, "best")
    assert [(r["arm"], r["lr"], r["seeds"]) for r in rows_best] == [
        ("baseline", 1e-3, 3),
        ("gamma1", 3e-4, 3),
    ]
    assert diffs[("gamma1", "s1")].mean == pytest.approx(4.73 - 5.03)
    old = make_study({("baseline", "s1", 1): 5.0, ("gamma1", "s1", 1): 4.9}, widths)
    assert old.margin == 0.01 and not old.has_lr_grid


def test_without_an_lr_grid_the_best_lr_rows_say_not_measured():
    """One shared LR: γ = 1 ahead by 0.2 nats on 3 seeds is reproduced at that LR, and the
    best-LR row says the arms' own best LRs were not measured instead of being left out."""
    losses = {}
    for k, e in ((1, 0.0), (2, 0.01), (3, -0.01)):
        losses |= {("baseline", "s1", k): 5.0 + e, ("gamma1", "s1", k): 4.8 + e + 0.002 * k}
    rows = verdicts(make_study(losses, {"s1": 256}, manifest={"shared_lr": 3e-3}), {}, None)
    assert [r.lr for r in rows[:6]] == ["shared LR", "best LR"] * 3
    assert rows[0].verdict == REPRODUCED
    assert rows[1].verdict == INCONCLUSIVE and rows[1].claim == rows[0].claim
    assert rows[1].numbers.startswith("not measured: this study has no LR grid")


def _lr_grid_study(best: dict[str, float], grid=(1e-3, 2e-3, 4e-3, 8e-3), shared_lr=2e-3):
    """Arms baseline and gamma1 at one size: an LR grid on seed 1 whose loss is smallest at
    ``best[arm]``; seeds 2-4 at that LR (confirm runs, or shared runs where the shared LR
    wins); gamma1 0.3 nats below the baseline on average over seeds 2-4 (-0.298, -0.3, -0.302)."""
    losses, lr = {}, {}
    for arm, b in best.items():
        offset = -0.3 if arm == "gamma1" else 0.0
        for x in grid:
            seed = 1 if x == shared_lr else 100 + round(x * 1e5)
            losses[(arm, "s1", seed)] = 5.0 + offset + abs(math.log(x / b))
            lr[(arm, "s1", seed)] = (x, "shared" if x == shared_lr else "grid", True)
        for seed in (2, 3, 4):
            spread = 0.002 * (3 - seed) if arm == "gamma1" else 0.0  # paired sd > 0
            losses[(arm, "s1", seed)] = 5.0 + offset + 0.01 * seed + spread
            lr[(arm, "s1", seed)] = (b, "shared" if b == shared_lr else "confirm", False)
    manifest = {"shared_lr": shared_lr, "lr_select_seed": 1}
    return make_study(losses, {"s1": 256}, manifest=manifest, lr=lr)


def test_a_best_lr_row_of_other_sizes_does_not_vouch_for_a_shared_lr_row():
    """Trial 14, finding 1: an LR grid at s1 only (a study may tune the LR at its small size)
    gave a best-LR row of s1 alone, whose agreement let the shared-LR row through its LR check
    at s2 too, where both arms' penalties were not measured and the baseline's 0.6-nat gap
    there could be all its LR's (40 of 40 simulated studies "reproduced at each measured
    size"). A best-LR row vouches only for the sizes it read."""
    losses, lr = {}, {}
    for arm, offset in (("baseline", 0.0), ("gamma1", -0.05)):
        for x in (1e-3, 2e-3, 4e-3):  # s1's grid on seed 1; the shared LR 2e-3 wins it
            seed = 1 if x == 2e-3 else 100 + round(x * 1e5)
            losses[(arm, "s1", seed)] = 5.0 + offset + abs(math.log(x / 2e-3))
            lr[(arm, "s1", seed)] = (x, "shared" if x == 2e-3 else "grid", True)
        for seed in (2, 3, 4):
            e = 0.002 * (seed - 3) * (arm == "gamma1")
            losses[(arm, "s1", seed)] = 5.0 + offset + 0.01 * seed + e
            lr[(arm, "s1", seed)] = (2e-3, "shared", False)
        for seed in (1, 2, 3, 4):  # s2 at the shared LR only: the baseline 0.6 nats worse
            e = 0.003 * (seed - 2.5) * (arm == "gamma1")
            losses[(arm, "s2", seed)] = 4.5 + (0.6 if arm == "baseline" else 0.0) + e
            lr[(arm, "s2", seed)] = (2e-3, "shared", False)
    manifest = {"shared_lr": 2e-3, "lr_select_seed": 1}
    data = make_study(losses, {"s1": 256, "s2": 512}, manifest=manifest, lr=lr)
    shared_row, best_row = verdicts(data, {}, None)[:2]
    assert best_row.sizes == ("s1",) and best_row.verdict == REPRODUCED
    assert shared_row.sizes == ("s1", "s2") and shared_row.verdict == INCONCLUSIVE
    assert "baseline at s2 not measured (no LR grid run)" in shared_row.numbers
    assert (
        "at each arm's own best LR it was read at s1 only, not at every size this row reads "
        "(s1, s2), so the difference at the shared LR may be the learning rate's"
        in shared_row.numbers
    )
    s1_only = StudyData(data.manifest, [r for r in data.runs if r["size"] == "s1"])
    assert verdicts(s1_only, {}, None)[0].verdict == REPRODUCED  # the same check at s1 passes


def test_an_arm_whose_shared_lr_wins_its_grid_is_compared_on_its_shared_runs():
    data = _lr_grid_study({"baseline": 2e-3, "gamma1": 2e-3})
    assert data.best_lr("baseline", "s1") == 2e-3
    assert data.confirm_losses("baseline", "s1") == {2: 5.02, 3: 5.03, 4: 5.04}  # not seed 1
    assert data.edge_lr("baseline", "s1") is None
    best = verdicts(data, {}, None)[1]
    assert best.lr == "best LR" and best.verdict == REPRODUCED and "-0.3000" in best.numbers


def test_a_best_lr_that_won_its_grid_within_its_noise_scopes_the_best_lr_row():
    """Trial 5: the baseline's best LR beat its neighbour by 0.002 nats on the one selection
    seed (sd between seeds 0.15 at that LR), and the best-LR row read a bare "reproduced". A
    win below δ, or below twice the gap's seed noise (trial 7: picks won by 0.024-0.033 nats
    went unflagged, where gaps between two LRs vary by 0.016-0.047 between seeds), names the
    two LRs and scopes the decided row to the LRs chosen. The baseline's losses at its best LR
    over the four seeds, 5.0 (seed 1, its grid run) and 5.02-5.04, give a gap noise of √2 ×
    their sd."""
    data = _lr_grid_study({"baseline": 4e-3, "gamma1": 4e-3})
    assert (
        verdicts(data, {}, None)[1].label()
        == "reproduced (at s1 only, seeds as units; not across sizes)"
    )
    noise = math.sqrt(2) * np.std([5.0, 5.02, 5.03, 5.04], ddof=1)
    assert 0.01 < 2 * noise == pytest.approx(0.0483, abs=1e-4)
    for gap, flagged in ((0.002, True), (0.03, True), (0.06, False)):
        for r in data.runs:
            if r["grid"] and r["arm"] == "baseline" and r["lr"] == 8e-3:
                r["loss"] = data.lr_grid("baseline", "s1")[4e-3] + gap
        row = verdicts(data, {}, None)[1]
        assert row.lr == "best LR" and row.verdict == REPRODUCED
        if not flagged:
            assert (
                row.scope == "at s1 only, seeds as units; not across sizes"
                and "best LR chosen" not in row.numbers
            )
            continue
        assert row.scope == (
            "at s1 only, seeds as units; not across sizes; at LRs chosen on one seed, some by a "
            "gap within its noise"
        )
        assert (
            f"best LR chosen by a gap within its noise: baseline at s1: best LR 0.004 beat 0.008 "
            f"by {gap:.4f} nats on seed 1 alone, less than 2 × the gap's seed noise, 2 × "
            f"{noise:.4f} (√2 × the sd of baseline's loss over 4 seeds at 0.004) (another seed "
            "may choose another LR)" in row.numbers
        )


def test_the_gap_noise_is_measured_where_the_runner_up_is_the_shared_lr():
    """Where the runner-up LR is the shared LR, run on every seed, the gap between it and the
    best LR is measured on each seed, and its own sd is the noise (seeds' common offsets cancel
    in it), not √2 × the sd of the loss at the best LR."""
    data = _lr_grid_study({"baseline": 4e-3, "gamma1": 4e-3}, shared_lr=2e-3)
    best = data.confirm_losses("baseline", "s1")  # seeds 2-4 at 4e-3: 5.02, 5.03, 5.04
    runner = {2: 5.03, 3: 5.05, 4: 5.045}  # the shared LR 2e-3 on seeds 2-4
    extra = [
        {**r, "key": f"baseline/s1/shared-{k}", "seed": k, "loss": runner[k], "lr": 2e-3,
         "lr_phase": "shared", "grid": False}
        for r in data.runs if r["arm"] == "baseline" and r["seed"] == 2
        for k in runner
    ]  # fmt: skip
    both = StudyData(data.manifest, data.runs + extra)
    grid = both.lr_grid("baseline", "s1")
    assert both.best_lr("baseline", "s1") == 4e-3 and both.losses("baseline", "s1")[3] == 5.05
    gaps = [grid[2e-3] - grid[4e-3]] + [runner[k] - best[k] for k in (2, 3, 4)]
    noise, how = _gap_noise(both, "baseline", "s1", 4e-3, 2e-3)
    assert noise == pytest.approx(np.std(gaps, ddof=1)) and how == "the sd of that gap over 4 seeds"
    noise, how = _gap_noise(both, "baseline", "s1", 4e-3, 8e-3)  # 8e-3 ran on seed 1 alone
    assert noise == pytest.approx(math.sqrt(2) * np.std([grid[4e-3], *best.values()], ddof=1))
    assert how == "√2 × the sd of baseline's loss over 4 seeds at 0.004"


def _with_shared_runs(data: StudyData, arm: str, losses: dict[int, float]) -> StudyData:
    """``data`` plus ``arm``'s runs at the shared LR 2e-3 on the seeds of ``losses``."""
    template = next(r for r in data.runs if r["arm"] == arm and r["seed"] == 2)
    extra = [
        {**template, "key": f"{arm}/s1/shared-{k}", "seed": k, "loss": loss, "lr": 2e-3,
         "lr_phase": "shared", "grid": False}
        for k, loss in losses.items()
    ]  # fmt: skip
    return StudyData(data.manifest, data.runs + extra)


def test_a_best_lr_the_confirm_seeds_refute_keeps_the_best_lr_row_undecided():
    """Trial 13, finding 1: the baseline's best LR, 4e-3, was picked on seed 1, but on seeds
    2-4 its runs at the shared LR 2e-3 beat those at 4e-3 (the shared LR, a grid point, won
    where the pick lost), and the best-LR row still compared the baseline at 4e-3 and called
    gamma1's gain reproduced (32 of 40 simulated null studies with one lucky grid run). The
    paired penalty, shared − chosen, with its 95% t interval below 0 makes the decided row
    inconclusive and names it; a penalty above 0 (the pick confirmed) leaves the row as it
    was."""
    data = _lr_grid_study({"baseline": 4e-3, "gamma1": 4e-3})
    chosen = data.confirm_losses("baseline", "s1")  # seeds 2-4 at 4e-3: 5.02, 5.03, 5.04
    assert verdicts(data, {}, None)[1].verdict == REPRODUCED
    refuting = {2: 4.99, 3: 5.0, 4: 5.012}
    row = verdicts(_with_shared_runs(data, "baseline", refuting), {}, None)[1]
    penalty = [refuting[k] - chosen[k] for k in (2, 3, 4)]
    low, high = _t_interval(penalty)
    assert high < 0 and row.lr == "best LR" and row.verdict == INCONCLUSIVE
    assert (
        f"not decided: the chosen best LR is refuted: baseline at s1: its chosen LR 0.004 lost "
        f"to the shared LR 0.002 on the confirm seeds (loss at the shared LR − at the chosen, "
        f"{np.mean(penalty):+.4f} [{low:+.4f}, {high:+.4f}] (df 2, 3 seeds)), so that arm's own "
        "best LR is not known and this row does not compare it there" in row.numbers
    )
    confirming = {2: 5.05, 3: 5.07, 4: 5.075}
    row = verdicts(_with_shared_runs(data, "baseline", confirming), {}, None)[1]
    assert _t_interval([confirming[k] - chosen[k] for k in (2, 3, 4)])[0] > 0
    assert row.verdict == REPRODUCED and "refuted" not in row.numbers


def test_confirm_runs_that_start_from_the_same_weights_keep_the_best_lr_row_undecided():
    """The best-LR row reads the confirm runs (seeds 2-4 at each arm's best LR), so the
    same-start check reads those: γ = 1's seeds 2 and 4 share a draw there, while the
    shared-LR runs (other runs) are not checked by that row."""
    data = _lr_grid_study({"baseline": 4e-3, "gamma1": 4e-3})
    assert verdicts(data, {}, None)[1].verdict == REPRODUCED
    for r in data.runs:
        if r["lr_phase"] == "confirm":
            draw = 30.0 if (r["arm"], r["seed"]) in {("gamma1", 2), ("gamma1", 4)} else r["seed"]
            r["record"] = RunRecord(diagnostics={0: {"stable_rank/q": draw}})
    assert data.same_start("gamma1", "s1", best=True) == [[2, 4]]
    assert data.same_start("gamma1", "s1") == []  # the shared-LR runs log nothing at 0
    best = verdicts(data, {}, None)[1]
    assert (best.lr, best.verdict) == ("best LR", INCONCLUSIVE)
    assert "not independent replicates: gamma1 at s1 seeds 2, 4 start from" in best.numbers


def test_a_best_lr_on_its_grid_edge_keeps_the_best_lr_verdicts_inconclusive():
    data = _lr_grid_study({"baseline": 8e-3, "gamma1": 4e-3})
    assert data.edge_lr("baseline", "s1") == (
        "baseline at s1: best LR 0.008 is the largest of [0.001, 0.002, 0.004, 0.008]"
    )
    assert data.edge_lr("gamma1", "s1") is None
    rows = verdicts(data, {}, None)
    assert "not bracketed" not in rows[0].numbers  # the shared-LR row
    best = rows[1]
    assert best.lr == "best LR" and best.verdict == INCONCLUSIVE
    assert "-0.3000" in best.numbers and "the best LR is not bracketed: baseline at s1" in (
        best.numbers
    )
    rows_best, _ = loss_table(data, "best")
    assert [(r["arm"], r["lr"], r["edge"] is not None) for r in rows_best] == [
        ("baseline", 8e-3, True),
        ("gamma1", 4e-3, False),
    ]
    extended = _lr_grid_study(
        {"baseline": 8e-3, "gamma1": 4e-3}, grid=(1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)
    )
    assert verdicts(extended, {}, None)[1].verdict == REPRODUCED


def _four_arm_grid_study(edge_at_s2: bool):
    """The four arms of claim 3 at s1 and baseline and gamma1 alone at s2, each with an LR grid
    [1e-3, 2e-3, 4e-3, 8e-3] on seed 1 (best at 2e-3 or 4e-3, inside it) and seeds 2-4 at its
    best LR; with ``edge_at_s2`` the baseline's best LR at s2 is the grid's largest, 8e-3."""
    offsets = {"baseline": 0.0, "gamma1": -0.3, "gamma0.5+eps+gate": -0.1, "gamma1+eps+gate": -0.6}
    spreads = {"baseline": 0.0, "gamma1": 1.0, "gamma0.5+eps+gate": 0.5, "gamma1+eps+gate": 2.0}
    bests = {(a, "s1"): 2e-3 if a == "baseline" else 4e-3 for a in offsets}
    bests |= {("baseline", "s2"): 8e-3 if edge_at_s2 else 2e-3, ("gamma1", "s2"): 4e-3}
    losses, lr = {}, {}
    for (arm, size), b in bests.items():
        for x in (1e-3, 2e-3, 4e-3, 8e-3):
            seed = 1 if x == 2e-3 else 100 + round(x * 1e5)
            losses[(arm, size, seed)] = 5.0 + offsets[arm] + abs(math.log(x / b))
            lr[(arm, size, seed)] = (x, "shared" if x == 2e-3 else "grid", True)
        for seed in (2, 3, 4):
            spread = 0.002 * (3 - seed) * spreads[arm]  # paired differences with sd > 0
            scale = 1.2 if size == "s2" else 1.0
            losses[(arm, size, seed)] = 5.0 + scale * offsets[arm] + 0.01 * seed + spread
            lr[(arm, size, seed)] = (b, "shared" if b == 2e-3 else "confirm", False)
    manifest = {"shared_lr": 2e-3, "lr_select_seed": 1}
    return make_study(losses, {"s1": 256, "s2": 512}, manifest=manifest, lr=lr)


def test_a_best_lr_on_its_grid_edge_at_a_size_a_row_does_not_judge_leaves_the_row_as_is():
    """The baseline's best LR at s2 is its grid's largest. Claim 1 compares s1 and s2, so its
    best-LR row is inconclusive; claim 3 compares only s1 (the gated arms ran there alone), so
    its row reads as it does when the baseline's s2 grid is bracketed. The edge check once read
    every size of the study, and made claim 3's row inconclusive for a size it never used."""
    edged, bracketed = _four_arm_grid_study(True), _four_arm_grid_study(False)
    assert edged.edge_lr("baseline", "s2") == (
        "baseline at s2: best LR 0.008 is the largest of [0.001, 0.002, 0.004, 0.008]"
    )
    assert [edged.edge_lr(a, "s1") for a in edged.arms] == [None] * 4
    rows, reference = verdicts(edged, {}, None), verdicts(bracketed, {}, None)
    claim1_best, claim3_best = rows[1], rows[5]
    assert (claim1_best.lr, claim1_best.sizes, claim1_best.verdict) == (
        "best LR",
        ("s1", "s2"),
        INCONCLUSIVE,
    )
    assert "the best LR is not bracketed: baseline at s2" in claim1_best.numbers
    assert "not bracketed" not in reference[1].numbers
    assert (claim3_best.lr, claim3_best.sizes) == ("best LR", ("s1",))
    assert claim3_best == reference[5] and claim3_best.verdict == REPRODUCED
    assert "not bracketed" not in claim3_best.numbers


def test_a_diverged_grid_run_is_never_the_best_lr():
    """γ = 1 diverged (NaN) at the shared LR 2e-3 on the selection seed only; its finite grid
    points put its best LR at 1e-3, the grid's smallest. study.json lists shared runs before
    grid runs, and a NaN compares neither less nor greater, so the NaN run, first, was taken as
    the best LR: bracketed, "confirmed" on the shared runs of seeds 2-4, and the best-LR row
    called reproduced. Its best LR is on the grid's edge: inconclusive."""
    losses, lr = {}, {}
    for arm, off in (("baseline", 0.0), ("gamma1", -0.3)):
        for seed in (1, 2, 3, 4):
            spread = 0.002 * (seed - 2) if arm == "gamma1" else 0.0
            losses[(arm, "s1", seed)] = 5.0 + off + 0.01 * seed + spread
            lr[(arm, "s1", seed)] = (2e-3, "shared", seed == 1)
    for arm, pts in (("baseline", {1e-3: 5.4, 4e-3: 5.3}), ("gamma1", {1e-3: 4.6, 4e-3: 6.0})):
        for x, y in pts.items():
            losses[(arm, "s1", 100 + round(x * 1e5))] = y
            lr[(arm, "s1", 100 + round(x * 1e5))] = (x, "grid", True)
    losses[("gamma1", "s1", 1)] = math.nan
    data = make_study(losses, {"s1": 256}, manifest={"shared_lr": 2e-3, "lr_select_seed": 1}, lr=lr)
    grid = data.lr_grid("gamma1", "s1")
    assert list(grid)[0] == 2e-3 and math.isnan(grid[2e-3])  # the manifest's order
    finite = {x: y for x, y in grid.items() if np.isfinite(y)}
    assert min(finite, key=finite.get) == 1e-3 == min(grid)  # by hand: the smallest LR
    assert data.best_lr("gamma1", "s1") == 1e-3 and data.best_lr("baseline", "s1") == 2e-3
    assert data.edge_lr("gamma1", "s1") == (
        "gamma1 at s1: best LR 0.001 is the smallest of [0.001, 0.002, 0.004]"
    )
    best = verdicts(data, {}, None)[1]
    assert best.lr == "best LR" and best.verdict == INCONCLUSIVE
    assert "the best LR is not bracketed: gamma1 at s1: best LR 0.001 is the smallest" in (
        best.numbers
    )


def test_fits_only_where_identified_and_sizes_from_the_baseline():
    widths = {f"s{i}": w for i, w in enumerate((64, 128, 256))}
    losses = {}
    for s, w in widths.items():
        for seed in (1, 2):
            losses[("baseline", s, seed)] = 2.0 + 50 * (1000 * w**2) ** -0.3 + 0.001 * seed
            losses[("gamma1+eps+gate", s, seed)] = losses[("baseline", s, seed)] - 0.05
    data = make_study(losses, widths)
    assert data.size_n == {s: 1000 * w**2 for s, w in widths.items()}  # not the gated arm's +7
    fits = scaling_fits(data)
    assert (
        fits["baseline"]["fit"] is None
        and "more sizes than parameters" in fits["baseline"]["error"]
    )
    assert fits["gamma1+eps+gate"]["multiplier"] == {}
    assert "no identified baseline fit" in fits["gamma1+eps+gate"]["multiplier_reason"]["s0"]


def test_scaling_fits_take_sizes_as_units():
    """4 sizes × 3 seeds whose seed offsets cancel in each size's mean, on an exact power law:
    the fit has one point per size (df 1), recovers E, A, α, and the multiplier is printed as a
    point estimate."""
    widths = {f"s{i}": w for i, w in enumerate((64, 128, 256, 512))}
    losses = {}
    for s, w in widths.items():
        law = 2.0 + 50 * (1000 * w**2) ** -0.3
        for seed, e in ((1, 0.02), (2, -0.03), (3, 0.01)):
            losses[("baseline", s, seed)] = law + e
            losses[("gamma1+eps+gate", s, seed)] = law - 0.05 + e
    fits = scaling_fits(make_study(losses, widths))
    fit = fits["baseline"]["fit"]
    assert fit.points == 4
    assert (fit.e, fit.alpha) == pytest.approx((2.0, 0.3), rel=1e-5)
    assert fit.a == pytest.approx(50, rel=1e-4)
    text = multiplier_text(fits["gamma1+eps+gate"])
    assert "x (point estimate, no interval)" in text


def test_loss_table_delta_prints_its_interval_and_degrees_of_freedom():
    """The report's Δ cell: mean paired difference, the 95% t interval computed here with scipy,
    df = paired seeds - 1 and the seeds; without an interval, the reason and the seed count (3
    seeds whose differences are all equal once printed "(1 seed)")."""
    arm, base = [5.1, 5.3, 5.0], [5.5, 5.6, 5.2]
    d = np.subtract(arm, base)
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    losses = {("baseline", "s1", k): x for k, x in enumerate(base, 1)}
    losses |= {("gamma1", "s1", k): x for k, x in enumerate(arm, 1)}
    losses |= {("baseline", "s2", k): 5.0 + 0.01 * k for k in (1, 2, 3)}
    losses |= {("gamma1", "s2", k): 4.7 + 0.01 * k for k in (1, 2, 3)}
    losses |= {("baseline", "s3", 1): 5.5, ("gamma1", "s3", 1): 5.1}
    rows, _ = loss_table(make_study(losses, {"s1": 256, "s2": 512, "s3": 1024}))
    cells = {(r["arm"], r["size"]): r.get("diff_text", "") for r in rows}
    assert cells[("gamma1", "s1")] == (
        f"{d.mean():+.4f} [{d.mean() - half:+.4f}, {d.mean() + half:+.4f}] (df 2, 3 seeds)"
    )
    assert cells[("gamma1", "s2")] == "-0.3000 (3 seeds, all equal: sd 0, no interval)"
    assert cells[("gamma1", "s3")] == "-0.4000 (1 seed: no interval)"
    assert cells[("baseline", "s1")] == ""


def test_report_markdown_of_an_lr_grid_study_without_a_gamma_grid(tmp_path):
    """The LR-grid table's per-arm losses once overwrote the γ-grid variable, and the report
    crashed ('float' object is not subscriptable) on a study with an LR grid and no γ grid."""
    import time

    from megatron_gamma.study import report as report_module
    from megatron_gamma.study.analysis import mechanisms

    data = _lr_grid_study({"baseline": 2e-3, "gamma1": 2e-3})
    data.dir = str(tmp_path)
    data.manifest["sweep_command"] = "megatron-gamma sweep synthetic.yaml"
    for run in data.runs:  # what the sweep's manifest records besides make_study's fields
        run.update(params=run["non_embedding"] + 1000, tokens=100 * 16 * 128)
    grids = {"shared LR": gamma_grid(data), "best LR": gamma_grid(data, "best")}
    assert grids == {"shared LR": {}, "best LR": {}}
    md = report_module._markdown(
        data, loss_table(data)[0], loss_table(data, "best")[0], scaling_fits(data), grids,
        mechanisms(data), None, verdicts(data, grids, None), {}, "report", None, None,
        time.time(),
    )  # fmt: skip
    assert "No γ grid in this study." in md
    row = "| baseline | s1 | 0.001: 5.6931, **0.002: 5.0000**, 0.004: 5.6931, 0.008: 6.3863 |"
    assert row in md


def test_report_markdown_lists_the_gamma_grid_at_both_lrs(tmp_path):
    """The "Loss against γ" section: one line per size at the shared LR and one at the best
    LR, the latter naming the γs whose best LR is on its grid's edge."""
    import json
    import time

    from megatron_gamma.study import report as report_module
    from megatron_gamma.study.analysis import mechanisms

    data, at_best = _gamma_lr_study({0.5: 4e-3, 1.0: 2e-3, 1.5: 1e-3}, (1e-3, 2e-3, 4e-3))
    data.dir = str(tmp_path)
    data.manifest["sweep_command"] = "megatron-gamma sweep synthetic.yaml"
    for run in data.runs:
        run.update(params=run["non_embedding"] + 1000, tokens=100 * 16 * 128)
    grids = {"shared LR": gamma_grid(data), "best LR": gamma_grid(data, "best")}
    md = report_module._markdown(
        data, loss_table(data)[0], loss_table(data, "best")[0], scaling_fits(data), grids,
        mechanisms(data), None, verdicts(data, grids, None), {}, "report", None, None,
        time.time(),
    )  # fmt: skip
    bests = {0.5: 4e-3, 1.0: 2e-3, 1.5: 1e-3}
    at_shared = ", ".join(
        f"γ={g:g}: {5 + (g - 1) ** 2 + abs(math.log(2e-3 / b)):.4f}" for g, b in bests.items()
    )
    assert f"- s1, shared LR (matched seeds [1]): {at_shared}" in md
    means = ", ".join(f"γ={g:g}: {np.mean(list(at_best[g].values())):.4f}" for g in (0.5, 1, 1.5))
    assert f"- s1, best LR (matched seeds [2, 3, 4]): {means}; lowest at γ = 1" in md
    assert "; not bracketed: gamma1+eps+gate@gamma=0.5 at s1: best LR 0.004 is the largest" in md
    assert json.loads(json.dumps(report_module._jsonable(grids)))["best LR"]["s1"]["edges"] == {
        "0.5": data.edge_lr(_grid_arm(0.5), "s1"),
        "1.5": data.edge_lr(_grid_arm(1.5), "s1"),
    }


def _penalty_study(best_gap: float, shared_lr: float | None = 2e-3, diagnostics=None):
    """Arms baseline and gamma1 at one size, every seed (1-4) at the shared LR 2e-3 (the
    manifest's ``shared_lr``: None as in a study whose sizes have their own LR), where
    gamma1 is 0.3 nats below the baseline (0.299-0.301 by seed); gamma1's own best LR is the
    shared LR, the baseline's is 8e-3 (its grid on seed 1, the shared LR a grid point), where
    its confirm runs (seeds 2-4) lie ``best_gap`` + 0.004·(seed − 3)² above gamma1's shared-LR
    losses. ``diagnostics`` {(arm, size, seed): {iteration: {key: value}}}, the baseline's
    confirm runs under seed 5000 + seed."""
    losses, lr = {}, {}
    for arm, offset in (("baseline", 0.0), ("gamma1", -0.3)):
        for seed in (1, 2, 3, 4):
            jitter = 0.001 * (seed - 2.5) if arm == "gamma1" else 0.0
            losses[(arm, "s1", seed)] = 5.0 + offset + 0.01 * seed + jitter
            lr[(arm, "s1", seed)] = (2e-3, "shared", seed == 1)
        best = 8e-3 if arm == "baseline" else 2e-3
        for x in (1e-3, 4e-3, 8e-3, 1.6e-2):
            seed = 100 + round(x * 1e5)
            below = 0.28 if arm == "baseline" else 0.0  # the baseline's best beats its shared
            losses[(arm, "s1", seed)] = 5.01 + offset - below + abs(math.log(x / best))
            lr[(arm, "s1", seed)] = (x, "grid", True)
    for seed in (2, 3, 4):  # the baseline's confirm runs at its own best LR
        spread = 0.004 * (seed - 3) ** 2  # the gap varies between seeds
        losses[("baseline", "s1", 5000 + seed)] = losses[("gamma1", "s1", seed)] + best_gap + spread
    manifest = {"shared_lr": shared_lr, "lr_select_seed": 1}
    data = make_study(losses, {"s1": 256}, manifest=manifest, lr=lr, diagnostics=diagnostics)
    for r in data.runs:  # the confirm runs carry the seeds they confirm
        if r["seed"] > 5000:
            r["seed"], r["lr"], r["lr_phase"], r["grid"] = r["seed"] - 5000, 8e-3, "confirm", False
    return data


def test_a_shared_lr_gap_that_is_one_arms_distance_from_its_best_lr_is_not_credited_to_gamma():
    """Trial 9: claim 1's "reproduced" at the shared LR was, at d64, 96 % γ = 0.5's distance
    from its own best LR (penalty 0.295 of the 0.307-nat gap), while at each arm's own best LR
    the difference was unresolved. Here the baseline's confirm runs at 8e-3 sit 0.28 nats below
    its shared-LR runs, so at the arms' own best LRs gamma1 leads by 0.02 nats only: the
    shared-LR row's 0.3-nat gap is mostly the LR's, and the row is not decided. Where the
    best-LR row agrees (the baseline 0.15 nats off its best LR, gamma1 still 0.15 ahead at
    the arms' own best LRs), the shared-LR row stands, the penalties listed."""
    data = _penalty_study(best_gap=0.0)  # at own best LRs: equal losses
    rows = verdicts(data, {}, None)
    shared_row, best_row = rows[0], rows[1]
    assert (best_row.lr, best_row.verdict) == ("best LR", NOT_REPRODUCED)
    # By hand: shared-LR baseline losses 5.02, 5.03, 5.04 (seeds 2-4); its confirm runs
    # gamma1's shared-LR losses 4.7195, 4.7305, 4.7415 plus 0.004, 0, 0.004.
    pen = [5.02 - 4.7235, 5.03 - 4.7305, 5.04 - 4.7455]
    lo, hi = _t_interval(pen)
    assert shared_row.lr == "shared LR" and shared_row.verdict == INCONCLUSIVE
    assert shared_row.scope == ""
    assert f"baseline at s1 +{np.mean(pen):.4f} [{lo:+.4f}, {hi:+.4f}] (df 2" in shared_row.numbers
    assert "(its best LR 0.008, 4× the shared 0.002)" in shared_row.numbers
    assert "gamma1 at s1 0 (its best LR is the shared LR)" in shared_row.numbers
    assert "at each arm's own best LR this claim is not reproduced" in shared_row.numbers
    assert shared_row.reason.startswith("not decided: the shared LR is more than δ = 0.01 nats")
    # trial 11, finding 5: the paired difference of the penalties, gamma1's 0 minus the
    # baseline's, is what the LR adds to the shared-LR gap: −pen by seed
    dlo, dhi = _t_interval([-x for x in pen])
    assert (
        "(the paired difference of the LR penalties, gamma1 − baseline, which is what the LR "
        f"adds to the gap at the shared LR: at s1 {-np.mean(pen):+.4f} [{dlo:+.4f}, {dhi:+.4f}] "
        "(df 2, 3 seeds))" in shared_row.reason
    )
    assert shared_row.console_line().endswith(f"inconclusive: {shared_row.reason}")
    agreed = verdicts(_penalty_study(best_gap=0.15), {}, None)
    assert agreed[1].verdict == REPRODUCED
    assert agreed[0].verdict == REPRODUCED and "baseline at s1 +0.14" in agreed[0].numbers
    assert agreed[0].scope.startswith("at one shared LR, not tuned per arm")


def test_the_lr_penalty_rule_holds_where_each_size_has_its_own_shared_lr():
    """Trial 10, finding 1: the penalty rule read the study-wide ``shared_lr``, which a study
    whose sizes have their own LR (examples/studies/paper-gpu.yaml) records as None, so it
    skipped every arm and the shared-LR row stood "reproduced" in 100 of 100 simulated studies
    with no γ effect at the arms' own best LRs. Each arm-size's shared LR now comes from its own
    shared-LR runs: the same rows as with the study-wide value."""
    for best_gap in (0.0, 0.15):
        with_value = verdicts(_penalty_study(best_gap), {}, None)[:2]
        per_size = verdicts(_penalty_study(best_gap, shared_lr=None), {}, None)[:2]
        assert per_size == with_value
    assert per_size[0].verdict == REPRODUCED and "baseline at s1 +0.14" in per_size[0].numbers
    undecided = verdicts(_penalty_study(0.0, shared_lr=None), {}, None)[0]
    assert undecided.verdict == INCONCLUSIVE and "(its best LR 0.008, 4× the shared 0.002)" in (
        undecided.numbers
    )


def test_an_lr_penalty_that_cannot_be_measured_leaves_a_disagreeing_row_undecided():
    """Where an arm-size's distance from its own best LR cannot be measured (here: no seed ran
    both its shared and its best LR), it may exceed δ: a shared-LR row the best-LR row does not
    confirm is not decided, and the penalty is listed as not measured."""
    data = _penalty_study(best_gap=0.0)
    data.runs = [r for r in data.runs if r["lr_phase"] != "confirm"]
    data.finished = [r for r in data.finished if r["lr_phase"] != "confirm"]
    shared = verdicts(data, {}, None)[0]
    assert shared.verdict == INCONCLUSIVE
    assert "baseline at s1 not measured (no seed ran both LRs)" in shared.numbers


def test_mechanism_rows_read_at_a_shared_lr_far_from_an_arms_best_are_not_decided(monkeypatch):
    """Trial 10, finding 2: claims 4, 5, 7 and 8 read only the shared-LR runs, and the LR check
    never reached them: a control that dipped as much as the γ = 1 arm at its own best LR, and
    less only at the shared LR, gave claim 7 "reproduced". A decided mechanism row of an
    LR-grid study now lists the compared arms' LR penalties and is inconclusive where one
    exceeds δ; where every compared arm ran at its own best LR it stands."""
    from megatron_gamma.study import verdicts as engine

    def decided(data, lr="shared LR"):  # no reading at the best LRs
        verdict = REPRODUCED if lr == "shared LR" else INCONCLUSIVE
        return Verdict("condensation", verdict, "Δdip +0.38", "rule", lr, sizes=("s1",))

    monkeypatch.setattr(engine, "claim7", decided)
    data = _penalty_study(best_gap=0.0)
    monkeypatch.setattr(engine, "_condensation_arms", lambda d: {"gamma1": "baseline"})
    row = next(v for v in verdicts(data, {}, None) if v.claim == "condensation")
    pen = [5.02 - 4.7235, 5.03 - 4.7305, 5.04 - 4.7455]
    lo, hi = _t_interval(pen)
    assert row.verdict == INCONCLUSIVE and row.scope == ""
    assert f"baseline at s1 +{np.mean(pen):.4f} [{lo:+.4f}, {hi:+.4f}] (df 2" in row.numbers
    assert "gamma1 at s1 0 (its best LR is the shared LR)" in row.numbers
    assert row.reason.startswith(
        "not decided: the shared LR may be more than δ = 0.01 nats (in loss) off the own best LR "
        "of 1 compared arm-size (the upper end of its penalty's 95% interval above δ, or no "
        "interval, or its best LR on its grid's edge or chosen within its noise), and these "
        "diagnostics, which depend on the LR"
    )
    assert "not how much this diagnostic changes with the LR" in row.numbers
    at_best = engine._lr_confounded(data, decided(data), ["gamma1"])
    assert at_best.verdict == REPRODUCED
    assert "paired by seed): gamma1 at s1 0 (its best LR is the shared LR) (a loss" in (
        at_best.numbers
    )


def test_a_mechanism_row_gates_on_the_upper_bound_of_the_lr_penalty(monkeypatch):
    """Trial 11, finding 1: the mechanism rows' LR gate compared the penalty's mean with δ, so
    a penalty of +0.0015 whose 95% interval reaches above δ let claim 7 stand. By hand (the
    baseline's confirm runs 0.292 + 0.004·(seed − 3)² above gamma1's shared-LR losses, which
    carry 0.001·(seed − 2.5)) the per-seed penalties are 0.3 − 0.292 − (0.0035, 0.0005,
    0.0055): mean below δ, upper bound above it. The row is now inconclusive; a best LR on
    its grid's edge (gamma1's shared LR the smallest once its 1e-3 grid run is gone) counts as
    not measured, 0 penalty or not."""
    from megatron_gamma.study import verdicts as engine

    def decided(data, lr="shared LR"):  # no reading at the best LRs
        verdict = REPRODUCED if lr == "shared LR" else INCONCLUSIVE
        return Verdict("condensation", verdict, "Δdip +0.38", "rule", lr, sizes=("s1",))

    monkeypatch.setattr(engine, "claim7", decided)
    monkeypatch.setattr(engine, "_condensation_arms", lambda d: {"gamma1": "baseline"})
    pen = [0.3 - 0.292 - x for x in (0.0035, 0.0005, 0.0055)]
    lo, hi = _t_interval(pen)
    assert np.mean(pen) < 0.01 < hi  # the old gate passed it
    data = _penalty_study(best_gap=0.292)
    row = next(v for v in verdicts(data, {}, None) if v.claim == "condensation")
    assert row.verdict == INCONCLUSIVE
    assert f"baseline at s1 {np.mean(pen):+.4f} [{lo:+.4f}, {hi:+.4f}] (df 2" in row.numbers
    assert row.reason.startswith("not decided: the shared LR may be more than δ = 0.01 nats")
    assert engine._lr_confounded(data, decided(data), ["gamma1"]).verdict == REPRODUCED
    data.runs = [r for r in data.runs if not (r["arm"] == "gamma1" and r.get("lr") == 1e-3)]
    data.finished = [r for r in data.finished if r in data.runs]
    edge = engine._lr_confounded(data, decided(data), ["gamma1"])
    assert edge.verdict == INCONCLUSIVE
    assert (
        "gamma1 at s1 0 (its best LR is the shared LR; its best LR not known: gamma1 at s1: best "
        "LR 0.002 is the smallest of [0.002, 0.004, 0.008, 0.016])" in edge.numbers
    )


def _dips_at_best_lr(control_best_dip: float):
    """_penalty_study's arms (gamma1 at its own best LR, the shared one; the baseline at a
    quarter of its own, penalty about 0.3 nats) with stable ranks logged every 10 iterations,
    10 points after iteration 0: gamma1 30 → 12 + 0.1·(seed − 3) (iterations 10-40) → 24
    (50-100), the baseline at the shared LR 30 → 28.5 → 29, and at its own best LR 30 →
    30·(1 − ``control_best_dip``) → back to 29; each seed's run scaled by 1 + 0.001·seed (its
    own draw; dips are ratios). The truth: Δdip (16.5 + 0.05)/30 over seeds 1-4 at the shared
    LR; at the best LRs (seeds 2-4) 0.6 − ``control_best_dip``."""
    diag = {}

    def series(low: float, end: float, k: int) -> dict:
        ranks = [30.0] + [low] * 4 + [end] * 6
        return {10 * i: {"stable_rank/q": r * (1 + 1e-3 * k)} for i, r in enumerate(ranks)}

    for k in (1, 2, 3, 4):
        diag[("gamma1", "s1", k)] = series(12.0 + 0.1 * (k - 3), 24.0, k)
        diag[("baseline", "s1", k)] = series(28.5, 29.0, k)
        diag[("baseline", "s1", 5000 + k)] = series(30 * (1 - control_best_dip), 29.0, k)
    return _penalty_study(best_gap=0.0, diagnostics=diag)


def test_claim7_at_the_best_lr_gives_its_numbers_and_decides_nothing():
    """Trial 11, finding 1 gave claim 7 a best-LR row (the confirm runs log the same
    diagnostics) that let the shared-LR row through its LR check where the two agreed. Trial 15
    showed that agreement proves nothing: the grid picks a best LR to within half a step, which
    bounds the loss a pick gives up, not how far the stable rank moves within that half step,
    and a pick on the shared LR's side of the true best biases both rows alike (6-25 of 40
    false "reproduced" in simulated null studies). So the best-LR row prints Δdip at the picks
    and decides nothing, and the shared-LR row is held by its LR check (here the baseline's
    penalty, about 0.3 nats): inconclusive whether the control, at its own best LR, dips as deep
    as γ = 1 (0.6) or as little as at the shared LR (0.05)."""
    for control_best_dip, read in ((0.6, NOT_REPRODUCED), (0.05, REPRODUCED)):
        rows = verdicts(_dips_at_best_lr(control_best_dip), {}, None)
        shared, best = (v for v in rows if v.claim.startswith("condensation then expansion"))
        assert (shared.lr, best.lr) == ("shared LR", "best LR")
        assert (best.verdict, best.scope) == (INCONCLUSIVE, ""), best.numbers
        assert best.reason.startswith(f"not decided (it read {read}): each arm is read at the LR")
        assert shared.verdict == INCONCLUSIVE, shared.numbers
        assert "(its best LR 0.008, 4× the shared 0.002)" in shared.numbers
        assert f"gamma1 vs baseline (s1): Δdip {16.55 / 30:+.3f}" in shared.numbers
        delta = 0.6 - control_best_dip  # printed −0.000 where it is 0: rounding
        assert best.numbers.startswith("gamma1 vs baseline (s1): Δdip ")
        assert f"{abs(delta):.3f} [" in best.numbers.split("(df")[0]
        assert "this claim is reproduced too" not in shared.numbers


def test_a_null_credited_to_scale_or_training_length_names_the_learning_rate(monkeypatch):
    """Trial 11, finding 4: a mechanism null credited to the scale ("not measurable at this
    scale, which explains the null") or to training length ("not measurable in these runs")
    skipped the LR check, although the baseline ran at a quarter of its own best LR (penalty
    about 0.3 nats). Such a row now lists the penalties and, with one over δ, is inconclusive,
    the learning rate named beside the scale; with every arm at its own best LR it keeps its
    verdict and its reason, the penalties listed."""
    from megatron_gamma.study import verdicts as engine

    scale = Verdict(
        "saturation", NOT_MEASURABLE, f"null{engine.EXPLAINS_NULL}", "rule", sizes=("s1",),
        reason=f"ε cannot act{engine.EXPLAINS_NULL}",
    )  # fmt: skip
    runs = Verdict("sink", NOT_MEASURED, "no sink formed", "rule", sizes=("s1",), reason="no sink")
    data = _penalty_study(best_gap=0.0)
    for row in (scale, runs):
        out = engine._lr_confounded(data, row, ["gamma1", "baseline"])
        assert out.verdict == INCONCLUSIVE
        assert engine.EXPLAINS_NULL not in out.numbers and engine.EXPLAINS_NULL not in out.reason
        assert "(its best LR 0.008, 4× the shared 0.002)" in out.numbers
        assert "so the learning rate may explain the null as well" in out.reason
        assert out.reason.startswith(row.reason.replace(engine.EXPLAINS_NULL, ""))
        kept = engine._lr_confounded(data, row, ["gamma1"])
        assert (kept.verdict, kept.reason) == (row.verdict, row.reason)
        assert "gamma1 at s1 0 (its best LR is the shared LR)" in kept.numbers


# --- the console line: a row the study cannot test carries its reason -------------------------


def _untestable_rows() -> list[Verdict]:
    """A study of the baseline and γ = 1 alone at one size, four seeds, no LR or γ grid: claim
    1 at the shared LR is decided; the best-LR rows, claims 3 and 6 cannot be tested."""
    losses = {}
    for k, e in ((1, 0.0), (2, 0.01), (3, -0.01), (4, 0.005)):
        losses |= {("baseline", "s1", k): 5.0 + e, ("gamma1", "s1", k): 4.8 + e + 0.003 * k}
    return verdicts(make_study(losses, {"s1": 256}), {}, None)


def test_a_row_the_study_cannot_test_carries_its_reason_to_the_console():
    """``report`` printed a bare "inconclusive" for a row the study cannot test while report.md
    gave the reason; each such row now carries it, and it is the text of report.md's column
    (``numbers``), not a second wording."""
    rows = _untestable_rows()
    by_claim = {(v.claim.split(" (")[0], v.lr): v for v in rows}
    decided = by_claim[("γ = 1 beats γ = 0.5", "shared LR")]
    assert decided.verdict == REPRODUCED and decided.reason == ""
    assert decided.console_line() == f"- {decided.claim} [shared LR]: {decided.label()}"
    best = by_claim[("γ = 1 beats γ = 0.5", "best LR")]
    assert best.verdict == INCONCLUSIVE
    assert best.console_line() == (
        f"- {best.claim} [best LR]: inconclusive: not measured: this study has no LR grid, so "
        "each arm's own best LR is unknown and a difference at one shared LR may be the arms' "
        "different best LRs (add lr_grid to the study file)"
    )
    claim3 = next(v for v in rows if v.claim.startswith("removing both blockers"))
    assert claim3.console_line().endswith(
        "[shared LR]: inconclusive: needs the γ = 1 and γ = 1+ε+gate arms"
    )
    claim6 = next(v for v in rows if v.claim.startswith("loss is lower at γ = 1"))
    assert claim6.console_line().endswith(": inconclusive: no γ grid in this study")
    untestable = [v for v in rows if v.reason]
    assert len(untestable) == len(rows) - 1  # claim 2 too: one size gives no trend
    for v in untestable:
        assert v.verdict not in (REPRODUCED, NOT_REPRODUCED), v
        assert v.reason in v.numbers, v  # report.md's text
        assert v.console_line() == f"- {v.claim} [{v.lr}]: {v.label()}: {v.reason}"
    for v in rows:  # as the CLI reads report.json back
        assert Verdict(**v.as_dict()).console_line() == v.console_line()


def test_report_prints_the_reason_of_a_row_it_cannot_test(tmp_path, monkeypatch, capsys):
    """The console of ``megatron-gamma report`` (its report.json read back), with the report's
    analysis replaced by the rows above."""
    import json

    from megatron_gamma import cli
    from megatron_gamma.study import report as report_module

    rows = _untestable_rows()
    (tmp_path / "study.json").write_text("{}")

    def fake_report(study_dir, output=None, command=None, note=None):
        path = tmp_path / "report" / "report.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"verdicts": [v.as_dict() for v in rows]}))
        return {"json": str(path), "report": str(tmp_path / "report.md")}

    monkeypatch.setattr(report_module, "report", fake_report)
    assert cli.main(["report", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split("verdicts (the numbers and rules: ")[1]
    lines = printed.splitlines()[1:]
    assert lines == [v.console_line() for v in rows]
    claim6 = next(v for v in rows if v.claim.startswith("loss is lower at γ = 1"))
    assert f"- {claim6.claim} [shared LR]: inconclusive: no γ grid in this study" in lines


def test_a_linear_v_reads_its_cross_fitted_minimum_one_step_above_its_vertex():
    """Closed form (trial 10, finding 4): a V with slope s per logged point and vertex L at an
    even position m reads L + s from both halves (the even vertex's odd neighbours are L + s;
    the lowest odd points, m ± 1, read their even neighbours (L + 2s + L)/2 = L + s), whatever
    m and the number of points; its end is the mean of the last 3. Here s = 2, L = 10, m = 4
    of 11 points after iteration 0: low 12, end (18 + 20 + 22)/3 = 20, rise 20/12 − 1; the
    report's Mechanisms entry (the seed mean, one seed) reads the same numbers."""
    after = [10.0 + 2.0 * abs(i - 4) for i in range(11)]
    series = {0: 30.0} | {10 * (i + 1): r for i, r in enumerate(after)}
    r = rank_dip(series)
    assert (r.low, r.end, r.window, r.low_iteration) == (12.0, 20.0, 3, 50)
    assert (r.dip, r.rise) == (pytest.approx(0.6), pytest.approx(20 / 12 - 1))
    assert _dip_rise(series) == (r.dip, r.rise)
    data = make_study(
        {("gamma1", "s1", 1): 5.0},
        {"s1": 256},
        diagnostics={("gamma1", "s1", 1): {t: {"stable_rank/q": v} for t, v in series.items()}},
    )
    m = mechanisms(data)["gamma1|s1"]
    assert (m["rank_min"], m["rank_final"], m["rank_min_iteration"]) == (12.0, 20.0, 50)
    assert m["rank_rise"] == pytest.approx(20 / 12 - 1)
    assert stable_rank_cell(m) == "30.00 → 12.00 (it 50) → 20.00"


def test_the_mechanisms_table_reads_claim_7s_minimum():
    """Trial 10 (finding 6): the Mechanisms table took the single lowest seed-mean point, so
    trial 9's flat arm (30 → 12, then flat with 8% noise; true recovery 0) showed a recovery
    of about +0.10 at 51 points. It now reads :func:`rank_dip` of the seed mean, claim 7's
    rule, and its recovery lies near 0 where the single-point one did not."""
    data = _flat_after_dip_study(seed=3, sd=0.08)
    mean = data.series(
        "gamma1", "s1", "stable_rank", data.common_keys(data.arms, "s1", "stable_rank")
    )
    r, m = rank_dip(mean), mechanisms(data)["gamma1|s1"]
    assert (m["rank_min"], m["rank_final"], m["rank_rise"]) == (r.low, r.end, r.rise)
    values = [mean[t] for t in sorted(mean)][1:]
    assert values[-1] / min(values) - 1 > DIP_MIN  # the old single-point reading
    assert abs(m["rank_rise"]) < DIP_MIN


def _mid_min_control_study():
    """γ = 1 30 → 10 → 12 → … → 28 (iterations 0-1000, every 100) in three seeds; its control
    30 → 18 at iteration 100 (its lowest point), 23 to iteration 800, then 21.2 and 19.4: its
    minimum lies mid-run, but it falls at 0.018 a step at its end, (0.018 · 100)/30 = 0.06 of
    its initial value per 10% of training (least squares over 800, 900, 1000, exact here)."""
    losses, diag = {}, {}
    for k, e in enumerate((0.0, 0.2, -0.3), start=1):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        arm = [30.0] + [10.0 - e + 2.0 * i for i in range(10)]
        ctrl = [30.0, 18.0] + [23.0] * 7 + [21.2 + e / 10, 19.4 - e / 10]
        for name, ranks in (("gamma1", arm), ("baseline", ctrl)):
            diag[(name, "s1", k)] = {100 * i: {"stable_rank/q": r} for i, r in enumerate(ranks)}
    return make_study(losses, {"s1": 256}, diagnostics=diag)


def test_a_control_falling_at_its_end_is_tested_wherever_its_minimum_lies():
    """Trial 10 (finding 3): the end-fall test ran only for a control whose minimum reached its
    last point; one whose lowest point lay mid-run (by noise, or a real early dip) counted as
    "recovered" however fast it still fell at its end. Every control seed is tested now, and
    the fall is judged by its upper 95% bound across seeds (Student t, df 2): by hand the
    slopes over 800-1000 (x = −100, 0, 100) are −(3.6 + e/10)/200 a step, falls
    (1.8 + e/20)/30 = 0.06 + e/600, bounded above 0.05."""
    data = _mid_min_control_study()
    b = data.seed_series("baseline", "s1", "stable_rank")
    assert all(_dip_rise(s)[1] is not None for s in b.values())  # its minimum: not at the end
    falls = [0.06 + e / 600 for e in (0.0, 0.2, -0.3)]
    assert [_end_fall(b[k]).fall for k in (1, 2, 3)] == pytest.approx(falls)
    lo, hi = _t_interval(falls)
    v = claim7(data)
    assert v.verdict == NOT_MEASURED
    assert (
        f"it fell by {np.mean(falls):+.4f} [{lo:+.4f}, {hi:+.4f}] (df 2, 3 seeds) of its initial "
        "value over the last 10% of training (the least-squares slope over the logged points in "
        "its last 20%, at least 2: iterations 800-1000, 3 points)" in v.numbers
    )
    assert f"the upper bound of its 95% interval, {hi:.4f}, is at least 0.05" in v.numbers


def _claim7sim_study(rng, points: int, sd: float):
    """The reviewer's ``claim7sim.py`` case b (trial 10): γ = 1 dips to 0.25 of 30 at 10% of
    training, then rises to 25; its control falls linearly by 0.06 of 30 per 10% of training
    to the end (truth: still dipping, not measurable); per-point noise ``sd`` (relative),
    four seeds, ``points`` logged points over 1000 iterations."""
    its = np.linspace(0, 1000, points).astype(int)

    def arm(t):
        return 30 - 22.5 * t / 100 if t <= 100 else 7.5 + 17.5 * (t - 100) / 900

    losses, diag = {}, {}
    for k in range(1, 5):
        losses |= {("gamma1", "s1", k): 5.0, ("baseline", "s1", k): 5.0}
        for name, f in (("gamma1", arm), ("baseline", lambda t: 30 * (1 - 0.6 * t / 1000))):
            diag[(name, "s1", k)] = {
                int(t): {"stable_rank/q": f(t) * (1 if t == 0 else 1 + sd * rng.normal())}
                for t in its
            }
    return make_study(losses, {"s1": 256}, diagnostics=diag)


def test_a_noisy_control_still_dipping_is_rarely_called_reproduced():
    """Trial 10 (finding 3): with 51 points and 8% noise the engine called this still-dipping
    control's row "reproduced" in 18 of 300 simulated studies (6%); the slope fit over the last
    20% of training in every seed, bounded across seeds, calls it in at most 1 of 100."""
    rng = np.random.default_rng(2)
    calls = [claim7(_claim7sim_study(rng, 51, 0.08)).verdict for _ in range(100)]
    assert calls.count(REPRODUCED) <= 1
    assert calls.count(NOT_MEASURED) >= 95


def test_a_noisy_flat_arm_is_rarely_called_a_recovery():
    """Trial 10 (finding 4): trial 9's flat arm (30 → 12, then flat; control 30 → 24, flat)
    with 51 points and 8% noise was "reproduced" in 12 of 200 simulated studies (6%) with the
    minimum a 3-point window centred on the lowest point; cross-fitted, in at most 1 of 100."""
    calls = [claim7(_flat_after_dip_study(seed, 51, 0.08)).verdict for seed in range(100)]
    assert calls.count(REPRODUCED) <= 1
