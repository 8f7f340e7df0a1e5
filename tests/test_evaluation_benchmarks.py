"""``evaluate`` argument checks and the lm-eval benchmark report, without a model.

Every bad value must be refused before any checkpoint is read, exported or evaluated: the heavy
calls are replaced by functions that fail the test when reached. Expected values are written
out by hand from the inputs.
"""

from __future__ import annotations

import re

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


@pytest.fixture(autouse=True)
def checkpoint_paths(tmp_path, monkeypatch):
    """RUN and B exist (in the working directory), so that the CLI's path checks, which come
    before the device check and the benchmark, let the values under test through."""
    monkeypatch.chdir(tmp_path)
    for name in ("RUN", "B"):
        (tmp_path / name).mkdir()


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


NO_CUDA = "CUDA is not available here (torch.cuda.is_available() is False"


@pytest.mark.parametrize(
    "device, message",
    [
        ("cuda", f"device='cuda': {NO_CUDA}"),
        ("cuda:0", f"device='cuda:0': {NO_CUDA}"),
        ("gpu", "device='gpu': not a device string torch reads"),
        ("cuda:x", "device='cuda:x': not a device string torch reads"),
        ("CPU", "device='CPU': not a device string torch reads"),
        ("mps", "device='mps': evaluate runs lm-eval on cpu or cuda only"),
    ],
)
def test_a_device_lm_eval_cannot_run_on_is_refused_before_any_work(
    no_heavy_work, monkeypatch, capsys, device, message
):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert main(TASKS + ["--device", device]) == 2
    err = capsys.readouterr().err
    assert message in err and "Fix: pass --device cpu" in err


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_a_device_it_can_run_on_reaches_the_benchmark(monkeypatch, device):
    from megatron_gamma.evaluation import benchmarks

    seen = {}

    def record(*args, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.setattr(benchmarks, "benchmark", record)
    assert main(TASKS + ["--device", device]) == 2
    assert seen["device"] == device


def test_lm_eval_device_writes_the_forms_lm_eval_honours(monkeypatch):
    """lm-eval uses a device only when it is exactly cpu, cuda or cuda:N (N < the GPU count)."""
    from megatron_gamma.config import ConfigError
    from megatron_gamma.evaluation.benchmarks import lm_eval_device

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert [lm_eval_device(d) for d in ("cpu", "cpu:0", "cpu:1")] == ["cpu", "cpu", "cpu"]
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    assert [lm_eval_device(d) for d in ("cuda", "cuda:0", "cuda:1")] == ["cuda", "cuda:0", "cuda:1"]
    with pytest.raises(ConfigError) as refused:
        lm_eval_device("cuda:2")
    assert str(refused.value) == (
        "device='cuda:2': this machine has 2 CUDA device(s), cuda:0 to cuda:1. Fix: pass "
        "--device cuda:N with N < 2, or --device cuda"
    )


def test_benchmark_refuses_a_device_before_loading_any_task(monkeypatch, tmp_path):
    from megatron_gamma.config import ConfigError
    from megatron_gamma.evaluation import benchmarks

    def reached(*args, **kwargs):
        raise AssertionError("a task was loaded before the device check")

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(benchmarks, "_task_dict", reached)
    monkeypatch.setattr(benchmarks, "export_hf", reached)
    with pytest.raises(ConfigError, match=re.escape(f"device='cuda': {NO_CUDA}")):
        benchmarks.benchmark("RUN", ["hellaswag"], str(tmp_path / "out"), device="cuda")
    assert not (tmp_path / "out").exists()


LAMBADA_YAML = """
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
{metrics}
metadata:
  version: 1.0
"""
PERPLEXITY = "  - metric: perplexity\n    aggregation: perplexity\n    higher_is_better: false\n"
ACC = "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
ACC_NORM = "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"


@pytest.fixture(scope="module")
def lm_eval_tasks(tmp_path_factory):
    """lm-eval's TaskManager and task objects for local tasks shaped like lambada_openai
    (perplexity first, then acc), one with perplexity only, one with acc only, and a group."""
    from lm_eval.tasks import TaskManager

    from megatron_gamma.evaluation.benchmarks import _task_dict

    root = tmp_path_factory.mktemp("lm_eval_tasks")
    data = root / "words.jsonl"
    data.write_text("".join(f'{{"text": "the last word is w{i}"}}\n' for i in range(4)))
    tasks = (
        ("tiny_lambada", PERPLEXITY + ACC),
        ("tiny_ppl", PERPLEXITY),
        ("tiny_acc", ACC),
        ("tiny_choice", ACC + ACC_NORM),
    )
    for name, metrics in tasks:
        (root / f"{name}.yaml").write_text(
            LAMBADA_YAML.format(name=name, data=data, metrics=metrics)
        )
    (root / "tiny_group.yaml").write_text("group: tiny_group\ntask:\n  - tiny_lambada\n")
    manager = TaskManager(include_path=str(root))
    names = ["tiny_lambada", "tiny_ppl", "tiny_acc", "tiny_choice", "tiny_group"]
    return manager, _task_dict(names, manager)


def test_metric_choice_skips_perplexity(lm_eval_tasks):
    from megatron_gamma.config import ConfigError
    from megatron_gamma.evaluation.benchmarks import _choose_metrics

    _, objects = lm_eval_tasks
    acc = {"name": "acc", "mean": True, "higher_is_better": True}
    for paired in (False, True):
        assert _choose_metrics(objects, ["tiny_lambada"], paired) == {"tiny_lambada": acc}
    ppl = {"name": "perplexity", "mean": False, "higher_is_better": False}
    assert _choose_metrics(objects, ["tiny_ppl"], paired=False) == {"tiny_ppl": ppl}
    with pytest.raises(
        ConfigError, match=r"tasks='tiny_ppl': none of its metrics \['perplexity'\]"
    ):
        _choose_metrics(objects, ["tiny_lambada", "tiny_ppl"], paired=True)
    with pytest.raises(ConfigError, match="tasks='tiny_group': a group of lm-eval tasks"):
        _choose_metrics(objects, ["tiny_group"], paired=False)
    # acc listed first, acc_norm after (as hellaswag and arc list them): acc_norm is reported
    norm = {"name": "acc_norm", "mean": True, "higher_is_better": True}
    assert _choose_metrics(objects, ["tiny_choice"], paired=True) == {"tiny_choice": norm}


def _sample(doc_id: int, filt: str = "none", **values) -> dict:
    return {"doc_id": doc_id, "filter": filt, "metrics": list(values), **values}


# lambada_openai as lm-eval 0.4.13 logs it: per item, 'perplexity' is the target's
# log-likelihood and 'acc' 1.0/0.0; the task's perplexity is exp(-mean log-likelihood).
LL_A, ACC_A = [-1.0, -1.0, -1.0, -1.0], [1.0, 0.0, 1.0, 1.0]
LL_B, ACC_B = [-3.0, -3.0, -3.0, -3.0], [1.0, 0.0, 0.0, 0.0]
E = 2.718281828459045  # exp(1) = exp(-mean(LL_A))


def _lambada_output(task: str, ll: list, acc: list, ppl: float, score: float) -> dict:
    result = {"alias": task, "perplexity,none": ppl, "perplexity_stderr,none": "N/A"}
    result.update({"acc,none": score, "acc_stderr,none": "N/A"})
    samples = [
        _sample(i, perplexity=x, acc=y) for i, (x, y) in enumerate(zip(ll, acc, strict=True))
    ]
    return {"results": {task: result}, "samples": {task: samples}}


def test_task_result_uses_lm_evals_score_and_first_filter():
    from megatron_gamma.evaluation.benchmarks import _task_result

    out = _lambada_output("lam", LL_A, ACC_A, ppl=E, score=0.75)
    result, samples = out["results"]["lam"], out["samples"]["lam"]
    acc = {"name": "acc", "mean": True, "higher_is_better": True}
    assert _task_result("lam", acc, result, samples) == {
        "metric": "acc,none",
        "score": 0.75,
        "higher_is_better": True,
        "n": 4,
        "items": {0: 1.0, 1: 0.0, 2: 1.0, 3: 1.0},
    }
    ppl = {"name": "perplexity", "mean": False, "higher_is_better": False}
    assert _task_result("lam", ppl, result, samples) == {
        "metric": "perplexity,none",
        "score": E,  # lm-eval's aggregate, not the mean log-likelihood -1
        "higher_is_better": False,
        "n": 4,
    }
    # gsm8k-shaped: two filters; the first listed is used, with its own items
    result = {"exact_match,strict-match": 0.5, "exact_match,flexible-extract": 1.0}
    samples = [_sample(d, f, exact_match=v) for d, f, v in
               [(0, "strict-match", 1.0), (0, "flexible-extract", 1.0),
                (1, "strict-match", 0.0), (1, "flexible-extract", 1.0)]]  # fmt: skip
    em = {"name": "exact_match", "mean": True, "higher_is_better": True}
    out = _task_result("g", em, result, samples)
    assert (out["metric"], out["score"], out["items"]) == (
        "exact_match,strict-match",
        0.5,
        {0: 1.0, 1: 0.0},
    )
    # a score that is not the mean of the logged items is not paired
    with pytest.raises(ValueError, match=r"task='g': lm-eval's exact_match,strict-match = 0.75"):
        _task_result("g", em, dict(result, **{"exact_match,strict-match": 0.75}), samples)


@pytest.fixture
def fake_models(monkeypatch, lm_eval_tasks):
    """benchmark() with checkpoint 'A' / 'B' standing for models whose lm-eval output is set
    in the returned dict ({'A': out, 'B': out}); the task YAMLs are lm_eval_tasks'."""
    import lm_eval
    import lm_eval.tasks

    from megatron_gamma.evaluation import benchmarks

    manager, _ = lm_eval_tasks
    outputs: dict = {}

    def export(path, out_dir, config=None):
        return {"out_dir": out_dir + ":" + path, "checkpoint": path, "iteration": 7}

    def simple_evaluate(model_args, **kwargs):
        return outputs[model_args["pretrained"].rsplit(":", 1)[1]]

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda include_path=None: manager)
    monkeypatch.setattr(benchmarks, "export_hf", export)
    monkeypatch.setattr(lm_eval, "simple_evaluate", simple_evaluate)
    return outputs


def test_compare_pairs_acc_not_perplexity(fake_models, tmp_path):
    from megatron_gamma.evaluation.benchmarks import benchmark

    fake_models["A"] = _lambada_output("tiny_lambada", LL_A, ACC_A, ppl=E, score=0.75)
    fake_models["B"] = _lambada_output("tiny_lambada", LL_B, ACC_B, ppl=E**3, score=0.25)
    alone = benchmark("A", ["tiny_lambada"], str(tmp_path / "alone"))
    expected = {"metric": "acc,none", "higher_is_better": True, "n": 4, "a": 0.75}
    assert alone["tasks"]["tiny_lambada"] == expected
    report = benchmark(
        "A", ["tiny_lambada"], str(tmp_path / "pair"), compare="B", bootstrap_samples=20000
    )
    # d = A - B per item = (0, 0, 1, 1): a resampled mean is K/4 with K ~ Binomial(4, 1/2), and
    # P(K = 0) = P(K = 4) = 1/16 > 0.025, so the 2.5% and 97.5% quantiles are 0 and 1.
    expected.update(b=0.25, diff=0.5, low=0.0, high=1.0)
    assert report["tasks"]["tiny_lambada"] == expected


def test_perplexity_only_task_is_refused_before_any_export(fake_models, monkeypatch, tmp_path):
    from megatron_gamma.config import ConfigError
    from megatron_gamma.evaluation import benchmarks

    fake_models["A"] = {
        "results": {"tiny_ppl": {"perplexity,none": E}},
        "samples": {"tiny_ppl": [_sample(i, perplexity=x) for i, x in enumerate(LL_A)]},
    }
    alone = benchmarks.benchmark("A", ["tiny_ppl"], str(tmp_path / "alone"))
    assert alone["tasks"]["tiny_ppl"] == {
        "metric": "perplexity,none", "higher_is_better": False, "n": 4, "a": E
    }  # fmt: skip
    assert (
        "| tiny_ppl | perplexity,none | lower | 4 | 2.7183 |"
        in (tmp_path / "alone" / "eval.md").read_text()
    )

    def reached(*args, **kwargs):
        raise AssertionError("exported before the task check")

    monkeypatch.setattr(benchmarks, "export_hf", reached)
    with pytest.raises(ConfigError, match="tasks='tiny_ppl': none of its metrics"):
        benchmarks.benchmark("A", ["tiny_ppl"], str(tmp_path / "pair"), compare="B")
    assert not (tmp_path / "pair").exists()


def test_compare_refuses_different_items_or_metrics(fake_models, tmp_path):
    from megatron_gamma.evaluation.benchmarks import benchmark

    fake_models["A"] = _lambada_output("tiny_lambada", LL_A, ACC_A, ppl=E, score=0.75)
    b = _lambada_output("tiny_lambada", LL_B[:3], ACC_B[:3], ppl=E**3, score=1 / 3)
    b["samples"]["tiny_lambada"][2]["doc_id"] = 9  # B: docs 0, 1, 9; A: 0, 1, 2, 3
    fake_models["B"] = b
    message = (
        "task='tiny_lambada', metric 'acc,none': A scored 4 items, B 3, 2 in common; a paired "
        "comparison needs the same items"
    )
    with pytest.raises(ValueError, match=message):
        benchmark("A", ["tiny_lambada"], str(tmp_path / "items"), compare="B")
    # disjoint items: the same error, not an empty-vector error from the bootstrap
    for i, sample in enumerate(b["samples"]["tiny_lambada"]):
        sample["doc_id"] = 10 + i
    with pytest.raises(ValueError, match="A scored 4 items, B 3, 0 in common"):
        benchmark("A", ["tiny_lambada"], str(tmp_path / "disjoint"), compare="B")
    # same items, another filter for the metric
    b = _lambada_output("tiny_lambada", LL_B, ACC_B, ppl=E**3, score=0.25)
    result = b["results"]["tiny_lambada"]
    result["acc,other"] = result.pop("acc,none")
    for sample in b["samples"]["tiny_lambada"]:
        sample["filter"] = "other"
    fake_models["B"] = b
    with pytest.raises(ValueError, match="A reports 'acc,none' and B 'acc,other'"):
        benchmark("A", ["tiny_lambada"], str(tmp_path / "metric"), compare="B")


def test_eval_md_states_method_scope_and_small_samples(fake_models, tmp_path):
    from megatron_gamma.evaluation.benchmarks import benchmark

    def outputs(lambada_acc: list, acc: list) -> dict:
        lam = _lambada_output("tiny_lambada", LL_A * 10, lambada_acc, E, sum(lambada_acc) / 40)
        small = _lambada_output("tiny_acc", LL_A, acc, E, sum(acc) / 4)
        del small["results"]["tiny_acc"]["perplexity,none"]
        return {k: {**lam[k], **small[k]} for k in ("results", "samples")}

    # tiny_lambada: A right and B wrong on all 40 items, so every resample's mean of A - B is 1
    fake_models["A"], fake_models["B"] = outputs([1.0] * 40, ACC_A), outputs([0.0] * 40, ACC_B)
    out = tmp_path / "pair"
    report = benchmark(
        "A", ["tiny_lambada", "tiny_acc"], str(out), compare="B", bootstrap_samples=500
    )
    assert report["bootstrap"] == {
        "method": "percentile paired bootstrap over items",
        "samples": 500,
        "seed": 0,
        "confidence": 0.95,
        "min_items_for_interval": 30,
    }
    # tiny_acc: d = (0, 0, 1, 1), the interval [0, 1] as in test_compare_pairs_acc_not_perplexity
    assert (report["tasks"]["tiny_acc"]["low"], report["tasks"]["tiny_acc"]["high"]) == (0, 1)
    md = (out / "eval.md").read_text()
    assert "| tiny_lambada | acc,none | higher | 40 | 1.0000 | 0.0000 | +1.0000 | " in md
    assert "| [+1.0000, +1.0000] |" in md
    assert (
        "| tiny_acc | acc,none | higher | 4 | 0.7500 | 0.2500 | +0.5000 | not shown: n < 30 |" in md
    )
    assert "percentile paired bootstrap over the task's n items" in md
    assert "500 resamples, seed 0" in md
    assert "for these two fixed checkpoints" in md and "other training seeds" in md
    assert "One 95% interval per task, 2 tasks, with no adjustment for multiple comparisons" in md
    assert "acc_norm where lm-eval lists it, else the first metric lm-eval lists that it " in md
