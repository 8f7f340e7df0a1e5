"""Megatron-LM's schedule flags: the learning rate and weight decay megatron-core's scheduler
gives under each flag equal the closed forms written out here; the batch-size ramp-up follows
Megatron-LM's rule (computed independently, in exact integer arithmetic); conflicting flags are
named errors; a resumed ramp-up run continues exactly.

The scheduler counts samples (Megatron-LM's unit): iteration k (from 1) trains at the step count
``n`` = samples consumed before it, and the weight decay logged at iteration k is the one set
after its step (``n`` + its batch).
"""

import json
import math
import re
import types

import pytest
from helpers import TINY_MODEL, run_cli

from megatron_gamma.config import ConfigError, load_config
from megatron_gamma.training.schedule import (
    build_scheduler,
    reconcile_schedule,
    schedule_differences,
    warmup_warning,
)

LR, MIN_LR = 3e-3, 3e-4


def closed_lr(n, warmup, decay, style, init=0.0, wsd=None, wsd_style=None):
    """megatron-core's documented schedule at step count n (samples)."""
    if warmup > 0 and n <= warmup:
        return init + (LR - init) * n / warmup
    if style == "constant":
        return LR
    if n > decay:
        return MIN_LR
    if style == "inverse-square-root":
        return max(MIN_LR, LR * math.sqrt(max(warmup, 1)) / math.sqrt(max(n, 1)))
    r = (n - warmup) / (decay - warmup)
    if style == "linear":
        coeff = 1 - r
    elif style == "cosine":
        coeff = 0.5 * (1 + math.cos(math.pi * r))
    else:  # WSD: flat until the last `wsd` steps of the decay span
        anneal = decay - wsd
        if n <= anneal:
            coeff = 1.0
        else:
            q = (n - anneal) / wsd
            coeff = {
                "exponential": 2 * 0.5**q - 1,
                "linear": 1 - q,
                "cosine": 0.5 * (1 + math.cos(math.pi * q)),
                "minus_sqrt": 1 - math.sqrt(q),
            }[wsd_style]
    return MIN_LR + coeff * (LR - MIN_LR)


def closed_wd(n, total, style, start, end):
    if n > total:
        return end
    r = n / total
    coeff = {"linear": r, "cosine": 0.5 * (math.cos(math.pi * (1 - r)) + 1)}[style]
    return start + coeff * (end - start)


def scheduled(overrides: dict, iterations: int):
    """{iteration: (lr used, weight decay after its step)} from megatron-core's scheduler as
    the loop drives it (constant global batch size)."""
    cfg = load_config(None, {"lr": LR, "min_lr": MIN_LR, **overrides})
    optimizer = types.SimpleNamespace(param_groups=[{}])
    sched = build_scheduler(optimizer, cfg)
    out = {}
    for it in range(1, iterations + 1):
        lr = optimizer.param_groups[0]["lr"]
        sched.step(increment=cfg.training.global_batch_size)
        out[it] = (lr, optimizer.param_groups[0]["weight_decay"])
    return cfg, out


@pytest.mark.parametrize(
    "flags, closed",
    [
        (  # warmup as a fraction of the decay span: 0.25 x 20 iterations x 8
            {"lr_warmup_fraction": 0.25, "train_iters": 20},
            dict(warmup=40, decay=160, style="cosine"),
        ),
        (
            {"lr_warmup_iters": 3, "lr_warmup_init": 1e-3, "lr_decay_style": "linear"},
            dict(warmup=24, decay=320, style="linear", init=1e-3),
        ),
        (  # sample-based: train_iters = 200 // 8 = 25
            {
                "train_samples": 200,
                "lr_warmup_samples": 20,
                "lr_decay_samples": 150,
                "lr_decay_style": "linear",
            },
            dict(warmup=20, decay=150, style="linear"),
        ),
        (
            {"lr_warmup_samples": 12, "train_samples": 200, "lr_warmup_fraction": None},
            dict(warmup=12, decay=200, style="cosine"),
        ),
        (
            {"lr_warmup_iters": 4, "lr_decay_style": "inverse-square-root", "train_iters": 30},
            dict(warmup=32, decay=240, style="inverse-square-root"),
        ),
        *[
            (
                {
                    "lr_decay_style": "WSD",
                    "lr_wsd_decay_style": style,
                    "lr_wsd_decay_iters": 10,
                    "lr_warmup_iters": 2,
                    "train_iters": 30,
                },
                dict(warmup=16, decay=240, style="WSD", wsd=80, wsd_style=style),
            )
            for style in ("exponential", "linear", "cosine", "minus_sqrt")
        ],
        (
            {
                "lr_decay_style": "WSD",
                "lr_wsd_decay_samples": 64,
                "train_samples": 240,
                "lr_decay_samples": 200,
            },
            dict(warmup=0, decay=200, style="WSD", wsd=64, wsd_style="exponential"),
        ),
    ],
)
def test_learning_rate_follows_the_closed_form(flags, closed):
    cfg, got = scheduled(flags, 32)
    if "train_samples" in flags:
        assert cfg.training.train_iters == flags["train_samples"] // 8
    for it, (lr, _) in got.items():
        want = closed_lr((it - 1) * 8, **closed)
        assert lr == pytest.approx(want, rel=1e-12, abs=1e-15), (it, lr, want)


@pytest.mark.parametrize("style", ["linear", "cosine"])
def test_weight_decay_schedule_follows_the_closed_form(style):
    flags = {
        "weight_decay_incr_style": style,
        "start_weight_decay": 0.01,
        "end_weight_decay": 0.1,
        "train_iters": 20,
    }
    _, got = scheduled(flags, 24)
    for it, (_, wd) in got.items():
        assert wd == pytest.approx(closed_wd(it * 8, 160, style, 0.01, 0.1), rel=1e-12), it
    _, constant = scheduled({"weight_decay": 0.05}, 5)
    assert {wd for _, wd in constant.values()} == {0.05}


@pytest.mark.parametrize(
    "flags",
    [
        {"train_iters": 5, "lr_warmup_iters": 20, "lr_warmup_init": 1e-4},
        {"train_iters": 5, "lr_warmup_iters": 5},
        {"train_samples": 40, "lr_warmup_samples": 33, "lr_warmup_fraction": None},
    ],
)
def test_a_warmup_that_outlasts_training_is_named_with_the_last_learning_rate(flags):
    cfg, got = scheduled(flags, 5)
    last = got[5][0]
    assert max(lr for lr, _ in got.values()) == last < LR
    warning = warmup_warning(cfg)
    assert "no iteration trains at lr=0.003" in warning
    assert f"(the last trains at {last:.3g})" in warning
    assert "--lr-warmup-iters" in warning


@pytest.mark.parametrize(
    "flags",
    [
        {"train_iters": 5, "lr_warmup_iters": 4},
        {"train_samples": 40, "lr_warmup_samples": 32, "lr_warmup_fraction": None},
    ],
)
def test_a_warmup_that_ends_by_the_last_iteration_is_not_warned_about(flags):
    cfg, got = scheduled(flags, 5)
    assert got[5][0] == pytest.approx(LR, rel=1e-12)
    assert warmup_warning(cfg) is None
    assert warmup_warning(load_config(None, {"train_iters": 5, "lr_warmup_iters": 0})) is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"lr_warmup_fraction": 0.1, "lr_warmup_iters": 5}, "one of lr_warmup_fraction and"),
        ({"lr_warmup_fraction": 0.1, "lr_warmup_samples": 5}, "lr_warmup_samples=5"),
        ({"lr_warmup_iters": 5, "lr_warmup_samples": 40}, "excludes lr_warmup_iters=5"),
        ({"lr_warmup_fraction": 1.5}, "lr_warmup_fraction=1.5: must lie in [0, 1)"),
        ({"train_iters": 10, "train_samples": 800}, "excludes train_samples=800"),
        ({"rampup_batch_size": ["4", "4", "100"]}, "needs sample-based training"),
        (
            {"rampup_batch_size": ["4", "3", "100"], "train_samples": 800},
            "in whole steps of INCR",
        ),
        ({"rampup_batch_size": ["4", "4"], "train_samples": 800}, "three integers"),
        ({"rampup_batch_size": ["4", "4", "0"], "train_samples": 800}, "SAMPLES >= 1"),
        (
            {"rampup_batch_size": ["4", "4", "1000"], "train_samples": 800},
            "more samples than train_samples",
        ),
        (
            {"rampup_batch_size": ["2", "2", "100"], "train_samples": 800},
            "not divisible by micro_batch_size=4",
        ),
        ({"lr_decay_style": "WSD"}, "--lr-wsd-decay-iters"),
        ({"start_weight_decay": 0.01}, "start_weight_decay=0.01: needs weight_decay_incr_style"),
        ({"weight_decay_incr_style": "linear", "start_weight_decay": 0.1}, "needs both"),
        (
            {
                "weight_decay_incr_style": "linear",
                "start_weight_decay": 0.1,
                "end_weight_decay": 0.01,
            },
            "must be >= start_weight_decay",
        ),
        ({"lr_warmup_init": 1.0}, "lr_warmup_init=1.0"),
        ({"fp16": True, "bf16": True}, "fp16=True: excludes bf16=True"),
        ({"min_loss_scale": 2.0**40}, "exceeds initial_loss_scale"),
    ],
)
def test_conflicting_flags_are_named_errors(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value) and "Fix:" in str(err.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"train_samples": 800, "lr_decay_iters": 50}, "lr_decay_iters=50: training is sample"),
        ({"train_samples": 800, "lr_warmup_iters": 2}, "use --lr-warmup-samples"),
        (
            {"train_samples": 800, "lr_decay_style": "WSD", "lr_wsd_decay_iters": 5},
            "use --lr-wsd-decay-samples",
        ),
        ({"lr_decay_samples": 100}, "training is iteration-based"),
        ({"lr_warmup_samples": 16}, "use --lr-warmup-iters"),
    ],
)
def test_iteration_and_sample_based_lengths_do_not_mix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_a_later_layer_switches_between_iterations_and_samples(tmp_path):
    """A recipe is iteration-based; --train-samples (and --lr-warmup-samples) on the command
    line replace its train_iters (lr_warmup_iters) instead of clashing; a later YAML file does
    the same; given together in one layer they still clash; replace() follows the same rule."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("training: {train_iters: 40}\noptimizer: {lr_warmup_iters: 4}\n")
    cfg = load_config(str(recipe), {"train_samples": 800, "lr_warmup_samples": 64})
    t, o = cfg.training, cfg.optimizer
    assert (t.train_samples, t.train_iters, o.lr_warmup_samples, o.lr_warmup_iters) == (
        800, 800 // t.global_batch_size, 64, 0,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="lr_warmup_iters=4: training is sample-based"):
        load_config(str(recipe), {"train_samples": 800})
    later = tmp_path / "samples.yaml"
    later.write_text("training: {train_samples: 1600}\noptimizer: {lr_warmup_samples: 32}\n")
    layered = load_config([str(recipe), str(later)]).training
    assert layered.train_iters == 1600 // t.global_batch_size
    with pytest.raises(ConfigError, match="train_iters=40: excludes train_samples=800"):
        load_config(None, {"train_iters": 40, "train_samples": 800})
    back = cfg.replace(train_iters=10, lr_warmup_iters=2)
    assert (back.training.train_samples, back.training.train_iters) == (None, 10)
    assert (back.optimizer.lr_warmup_samples, back.optimizer.lr_warmup_iters) == (0, 2)


def test_a_later_layer_gives_the_warmup_as_a_fraction(tmp_path):
    """--lr-warmup-fraction is the third of Megatron-LM's warmup alternatives: on the command
    line or in a later file it replaces a recipe's lr_warmup_iters / lr_warmup_samples (the
    warmup is then the fraction of the decay length); in one layer with either it still
    clashes; a later lr_warmup_iters replaces a recipe's fraction."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("training: {train_iters: 40}\noptimizer: {lr_warmup_iters: 4}\n")
    o = load_config(str(recipe), {"lr_warmup_fraction": 0.25}).optimizer
    assert (o.lr_warmup_fraction, o.lr_warmup_iters, o.lr_warmup_samples) == (0.25, 0, 0)
    samples = load_config(None, {"train_samples": 800, "lr_warmup_samples": 64})
    o = samples.replace(lr_warmup_fraction=0.1).optimizer
    assert (o.lr_warmup_fraction, o.lr_warmup_samples) == (0.1, 0)
    fraction = tmp_path / "fraction.yaml"
    fraction.write_text("optimizer: {lr_warmup_fraction: 0.5}\n")
    assert load_config([str(recipe), str(fraction)]).optimizer.lr_warmup_iters == 0
    back = load_config([str(fraction)], {"lr_warmup_iters": 3}).optimizer
    assert (back.lr_warmup_fraction, back.lr_warmup_iters) == (None, 3)
    with pytest.raises(ConfigError, match="can only specify one of lr_warmup_fraction"):
        load_config(None, {"lr_warmup_fraction": 0.25, "lr_warmup_iters": 4})


def ramp_size(consumed: int, start: int, incr: int, samples: int, final: int) -> int:
    """Megatron-LM's ramp-up rule: START + INCR x floor(consumed / (SAMPLES / increments))
    up to SAMPLES consumed samples, then the global batch size."""
    if consumed > samples:
        return final
    increments = (final - start) // incr
    return start + incr * (consumed * increments // samples)


def ramp_iterations(train_samples, start, incr, samples, final) -> int:
    """Megatron-LM's update_train_iters for a ramp-up run."""
    consumed = iterations = 0
    while consumed <= samples:
        consumed += ramp_size(consumed, start, incr, samples, final)
        iterations += 1
    return iterations + (train_samples - consumed) // final


@pytest.mark.parametrize(
    "train_samples, ramp, final",
    [(160, (4, 4, 48), 16), (1000, (8, 8, 96), 32), (500, (4, 4, 1), 8), (64, (4, 12, 64), 16)],
)
def test_train_iters_from_train_samples_with_ramp_up(train_samples, ramp, final):
    cfg = load_config(
        None,
        {
            "train_samples": train_samples,
            "rampup_batch_size": list(ramp),
            "global_batch_size": final,
        },
    )
    assert cfg.training.train_iters == ramp_iterations(train_samples, *ramp, final)
    assert cfg.training.rampup_batch_size == list(ramp)
    assert cfg.replace(seed=7).training.train_iters == cfg.training.train_iters  # round trip


def test_trained_samples_and_the_estimate_count_the_ramp_up_batches():
    """gbs 8, ramp 4 -> 8 in steps of 2 over 20 samples, 100 samples: batches 4, 4, 4 (consumed
    0, 4, 8 < 10), 6, 6 (12, 18 < 20), then 9 whole batches of 8 = 96 samples in 14 iterations
    (by hand from Megatron-LM's rule)."""
    from megatron_gamma.config import trained_samples
    from megatron_gamma.estimate import report

    fields = {"train_samples": 100, "rampup_batch_size": [4, 2, 20], "global_batch_size": 8}
    fields["micro_batch_size"] = 2
    cfg = load_config(None, fields)
    assert (cfg.training.train_iters, trained_samples(cfg.training)) == (14, 96)
    seq = cfg.model.seq_length
    text = report(cfg, 512, 1, 80)
    assert f"{8 * seq:,} / {96 * seq:.4g} (batch-size ramp-up included)" in text
    assert re.search(r"^iterations +14$", text, re.M)
    plain = load_config(None, {**fields, "rampup_batch_size": None})
    assert (plain.training.train_iters, trained_samples(plain.training)) == (12, 96)
    assert f"{8 * seq:,} / {96 * seq:.4g}\n" in report(plain, 512, 1, 80)


def test_resume_reconciliation_covers_the_new_keys():
    base = {"lr_decay_style": "WSD", "lr_wsd_decay_iters": 10, "lr_warmup_iters": 2}
    cfg = load_config(None, base)
    optimizer = types.SimpleNamespace(param_groups=[{}])
    saved = build_scheduler(optimizer, cfg).state_dict()
    assert saved["steps_unit"] == "samples" and saved["wsd_decay_steps"] == 80
    assert schedule_differences(cfg, saved) == []
    changed = cfg.replace(lr_wsd_decay_style="cosine", lr_wsd_decay_iters=5, lr_warmup_init=1e-4)
    diffs = schedule_differences(changed, saved)
    assert len(diffs) == 3, diffs
    assert any("lr_wsd_decay_style: checkpoint 'exponential', config 'cosine'" in d for d in diffs)
    assert any("checkpoint 80, config 40" in d for d in diffs)
    assert any("lr_warmup_init: checkpoint 0.0, config 0.0001" in d for d in diffs)
    kept = reconcile_schedule(
        changed.replace(use_checkpoint_opt_param_scheduler=True, load="ck"), saved, "ck"
    )
    assert schedule_differences(kept, saved) == []
    o = kept.optimizer
    assert (o.lr_wsd_decay_style, o.lr_wsd_decay_iters, o.lr_warmup_init) == ("exponential", 10, 0)
    wd = cfg.replace(weight_decay_incr_style="cosine", start_weight_decay=0.0, end_weight_decay=0.2)
    assert any("weight_decay_incr_style" in d for d in schedule_differences(wd, saved))
    with pytest.raises(ConfigError) as refused:
        reconcile_schedule(changed, saved, "ck", ["hidden_size=128 (the run had 64)"])
    message = str(refused.value)
    assert "lr_warmup_init: checkpoint 0.0, config 0.0001" in message
    assert "differ from the checkpoint's run as well: hidden_size=128 (the run had 64);" in message
    assert "Fix: give the run's model settings where they change shapes" in message
    with pytest.raises(ConfigError) as refused:
        reconcile_schedule(changed, saved, "ck")
    assert "model settings" not in str(refused.value)
    # Only the batch size changed: the schedule in samples differs, and the refusal says why.
    doubled = cfg.replace(global_batch_size=16)
    assert any("checkpoint 80, config 160" in d for d in schedule_differences(doubled, saved))
    with pytest.raises(ConfigError) as refused:
        reconcile_schedule(doubled, saved, "ck", (), ["global_batch_size=16 (the run had 8)"])
    assert "global_batch_size=16 (the run had 8): the schedule counts samples, so" in str(
        refused.value
    )
    # A checkpoint from before the schedule counted samples counted iterations.
    legacy = {k: v for k, v in saved.items() if k not in ("steps_unit", "init_lr")}
    legacy.update(lr_warmup_steps=2, lr_decay_steps=40, wd_incr_steps=40, wsd_decay_steps=80)
    assert schedule_differences(cfg, legacy) == []


def _metrics(run_dir) -> dict[int, dict]:
    with open(run_dir / "metrics.jsonl") as f:
        return {r["iteration"]: r for r in map(json.loads, f) if r["split"] == "train"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ramp_up_run_follows_megatron_and_resumes_exactly(tmp_path, demo_prefix):
    i = TINY_MODEL.index("--lr-warmup-iters")
    model = TINY_MODEL[:i] + TINY_MODEL[i + 2 :]  # sample-based warmup instead
    flags = [
        "pretrain",
        "--data-path",
        demo_prefix,
        *model,
        "--global-batch-size",
        "16",
        "--train-samples",
        "160",
        "--rampup-batch-size",
        "4",
        "4",
        "48",
        "--lr-warmup-samples",
        "24",
        "--lr-decay-style",
        "WSD",
        "--lr-wsd-decay-samples",
        "48",
        "--lr-wsd-decay-style",
        "linear",
        "--weight-decay-incr-style",
        "cosine",
        "--start-weight-decay",
        "0.01",
        "--end-weight-decay",
        "0.1",
        "--log-interval",
        "1",
        "--eval-interval",
        "100",
        "--init-audit",
        "off",
        "--log-diagnostics-interval",
        "0",
    ]
    whole, part = tmp_path / "whole", tmp_path / "part"
    for args in (
        ["--run-dir", str(whole)],
        ["--run-dir", str(part), "--save", str(tmp_path / "ck"), "--exit-interval", "6"],
        ["--run-dir", str(part), "--load", str(tmp_path / "ck")],
    ):
        proc = run_cli([*flags, *args])
        assert proc.returncode == 0, proc.stderr[-3000:]
    got, resumed = _metrics(whole), _metrics(part)
    assert sorted(got) == list(range(1, ramp_iterations(160, 4, 4, 48, 16) + 1))
    consumed = 0
    for it in sorted(got):
        size = ramp_size(consumed, 4, 4, 48, 16)
        rec = got[it]
        assert rec["global_batch_size"] == size, (it, rec["global_batch_size"], size)
        lr = closed_lr(consumed, 24, 160, "WSD", wsd=48, wsd_style="linear")
        assert rec["lr"] == pytest.approx(lr, rel=1e-12), it
        consumed += size
        assert rec["consumed_samples"] == consumed
        assert rec["weight_decay"] == pytest.approx(closed_wd(consumed, 160, "cosine", 0.01, 0.1))
        for key in ("loss", "lr", "global_batch_size", "consumed_samples", "weight_decay"):
            assert resumed[it][key] == rec[key], (it, key)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(whole / "tensorboard"))
    events.Reload()
    sizes = {e.step: e.value for e in events.Scalars("train/global_batch_size")}
    assert sizes == {it: got[it]["global_batch_size"] for it in got}
