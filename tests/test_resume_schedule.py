"""Resuming with a changed learning-rate schedule: a named error, or the flag-chosen schedule.

Megatron-LM semantics: ``--override-opt-param-scheduler`` trains on with the config's schedule
from the checkpoint's iteration, ``--use-checkpoint-opt-param-scheduler`` keeps the checkpoint's.
Expected learning rates are megatron-core's documented schedule in closed form (linear warmup
from 0, cosine decay to min_lr), evaluated at the step count before each iteration (the schedule
counts samples, Megatron-LM's unit; with a constant global batch size the ratios are those of
iterations).
"""

import json
import math

import pytest
import yaml
from helpers import TINY_MODEL, pretrain, run_cli

BASE = ["--train-iters", "8", "--eval-interval", "100", "--log-interval", "1"]
CHANGED = ["--lr", "1e-2", "--min-lr", "1e-3", "--train-iters", "12"]


def cosine_lr(step: int, max_lr: float, min_lr: float, warmup: int, decay: int) -> float:
    if step <= warmup:
        return max_lr * step / warmup
    if step > decay:
        return min_lr
    ratio = (step - warmup) / (decay - warmup)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (max_lr - min_lr)


def logged(run_dir, key: str) -> dict[int, float]:
    with open(run_dir / "metrics.jsonl") as f:
        recs = [json.loads(line) for line in f]
    return {r["iteration"]: r[key] for r in recs if r["split"] == "train"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_changed_schedule_on_resume_errors_overrides_or_keeps(tmp_path, demo_prefix):
    ckpt = str(tmp_path / "ckpt")
    first = pretrain(tmp_path / "first", demo_prefix, *BASE, "--exit-interval", "4", "--save", ckpt)
    assert sorted(first["train"]) == [1, 2, 3, 4]
    lrs = logged(tmp_path / "first", "lr")
    for it in range(1, 5):  # TINY_MODEL: lr 3e-3, min_lr 3e-4, 2 warmup iterations
        assert lrs[it] == pytest.approx(cosine_lr(it - 1, 3e-3, 3e-4, 2, 8), rel=1e-9), it

    args = ["pretrain", "--data-path", demo_prefix, "--load", ckpt, "--split", "95,5,0"]
    proc = run_cli([*args, "--run-dir", str(tmp_path / "refused"), *TINY_MODEL, *BASE, *CHANGED])
    assert proc.returncode == 2, proc.stderr[-2000:]
    for difference in (
        "lr: checkpoint 0.003, config 0.01",
        "min_lr: checkpoint 0.0003, config 0.001",
        "decay samples (lr_decay_iters or train_iters, x global_batch_size; or "
        "lr_decay_samples or train_samples; at least warmup samples + 1, which megatron-core "
        "requires): checkpoint 64, config 96",
        "--override-opt-param-scheduler",
        "--use-checkpoint-opt-param-scheduler",
    ):
        assert difference in proc.stderr, difference
    assert "model settings" not in proc.stderr  # the model is the run's

    # Another model shape too: the refusal names it beside the schedule, so the user does not
    # fix the schedule first and only then learn that the checkpoint takes no other shape.
    wider = ["--hidden-size", "128", "--run-dir", str(tmp_path / "wider")]
    proc = run_cli([*args, *TINY_MODEL, *BASE, *CHANGED, *wider])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "lr: checkpoint 0.003, config 0.01" in proc.stderr
    assert "model settings differ from the checkpoint's run as well: " in proc.stderr
    assert "hidden_size=128 (the run had 64)" in proc.stderr

    both = ["--override-opt-param-scheduler", "--use-checkpoint-opt-param-scheduler"]
    proc = run_cli([*args, "--run-dir", str(tmp_path / "both"), *BASE, *CHANGED, *both])
    assert proc.returncode == 2 and "override_opt_param_scheduler=True" in proc.stderr

    for flag, expected in (
        ("--override-opt-param-scheduler", dict(lr=1e-2, min_lr=1e-3, decay=12)),
        ("--use-checkpoint-opt-param-scheduler", dict(lr=3e-3, min_lr=3e-4, decay=8)),
    ):
        run = tmp_path / flag.strip("-")
        got = pretrain(run, demo_prefix, *BASE, *CHANGED, "--load", ckpt, flag)
        assert sorted(got["train"]) == list(range(5, 13)), flag
        lrs = logged(run, "lr")
        for it in range(5, 13):
            want = cosine_lr(it - 1, expected["lr"], expected["min_lr"], 2, expected["decay"])
            assert lrs[it] == pytest.approx(want, rel=1e-9), (flag, it)
        with open(run / "config.yaml") as f:
            recorded = yaml.safe_load(f)["optimizer"]
        assert recorded["lr"] == expected["lr"] and recorded["min_lr"] == expected["min_lr"]
        assert (recorded["lr_decay_iters"] or 12) == expected["decay"], flag
