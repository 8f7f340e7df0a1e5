"""``evaluate`` argument checks and the lm-eval benchmark report, without a model.

Every bad value must be refused before any checkpoint is read, exported or evaluated: the heavy
calls are replaced by functions that fail the test when reached. Expected values are written
out by hand from the inputs.
"""

from __future__ import annotations

import pytest

from megatron_gamma.cli import main


@pytest.fixture
def no_heavy_work(monkeypatch):
    """Held-out loss, checkpoint export and lm-eval all fail the test if reached."""
    import lm_eval

    from megatron_gamma.evaluation import benchmarks, evaluate

    def reached(*args, **kwargs):
        raise AssertionError("heavy work started before the argument check")

    monkeypatch.setattr(evaluate, "evaluate", reached)
    monkeypatch.setattr(benchmarks, "export_hf", reached)
    monkeypatch.setattr(benchmarks, "benchmark", reached)
    monkeypatch.setattr(lm_eval, "simple_evaluate", reached)


LOSS = ["evaluate", "RUN", "--data-path", "data/x"]
TASKS = ["evaluate", "RUN", "--tasks", "hellaswag"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (LOSS + ["--eval-tokens", "0"], "--eval-tokens=0: must be >= 1"),
        (LOSS + ["--eval-tokens", "-5"], "--eval-tokens=-5: must be >= 1"),
        (LOSS + ["--micro-batch-size", "0"], "--micro-batch-size=0: must be >= 1"),
        (LOSS + ["--seq-length", "0"], "--seq-length=0: must be >= 1"),
        (TASKS + ["--batch-size", "0"], "--batch-size=0: must be >= 1"),
        (TASKS + ["--compare", "B", "--bootstrap-samples", "0"], "--bootstrap-samples=0: must"),
        (TASKS + ["--compare", "B", "--bootstrap-samples", "-3"], "--bootstrap-samples=-3: must"),
        (TASKS + ["--num-fewshot", "-1"], "--num-fewshot=-1: must be >= 0"),
        (TASKS + ["--limit", "2.7"], "--limit=2.7: lm-eval reads a value below 1 as a fraction"),
        (TASKS + ["--limit", "0"], "--limit=0.0: lm-eval reads"),
        (TASKS + ["--limit", "-1"], "--limit=-1.0: lm-eval reads"),
        (TASKS + ["--limit", "nan"], "--limit=nan: lm-eval reads"),
        (TASKS + ["--limit", "inf"], "--limit=inf: lm-eval reads"),
    ],
)
def test_bad_values_are_refused_before_any_work(no_heavy_work, capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Fix:" in err


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], dict(limit=None, batch_size=1, bootstrap_samples=10000)),
        (["--limit", "0.25"], dict(limit=0.25, batch_size=1, bootstrap_samples=10000)),
        (["--limit", "3", "--batch-size", "2"], dict(limit=3, batch_size=2, bootstrap_samples=1e4)),
        (["--bootstrap-samples", "1"], dict(limit=None, batch_size=1, bootstrap_samples=1)),
    ],
)
def test_good_values_reach_the_benchmark_unchanged(monkeypatch, flags, expected):
    from megatron_gamma.evaluation import benchmarks

    seen = {}

    def record(*args, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(benchmarks, "benchmark", record)
    assert main(TASKS + ["--compare", "B"] + flags) == 2
    assert {k: seen[k] for k in expected} == expected
    assert type(seen["limit"]) is type(expected["limit"])  # 3, not 3.0
