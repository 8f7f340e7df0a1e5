"""An MoE run logs its routers' auxiliary losses (``load_balancing_loss``, ``z_loss``) as
Megatron-LM does: the value of each training step in metrics.jsonl and TensorBoard, their mean
over a logging interval in the console line; each equals a float64 reference recomputed in the
test from every router's input and weight, averaged over layers, micro-batches and
data-parallel ranks. A dense model logs neither."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re

import pytest
import torch
from distributed import run_distributed
from helpers import close

from megatron_gamma.config import load_config
from megatron_gamma.training.moe_metrics import tracked_names

BASE = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16}
BASE.update(micro_batch_size=2, global_batch_size=4, train_iters=3, split="95,5,0")
BASE.update(init_audit="off", eval_iters=0, progress_bar=False, log_diagnostics_interval=0)
BASE.update(log_interval=2)
MOE = {"num_experts": 4, "moe_router_topk": 2, "moe_aux_loss_coeff": 0.05}
MOE.update(moe_z_loss_coeff=1e-3)


def _names(**model) -> list[str]:
    return tracked_names(load_config(None, {**BASE, **model}).model)


def test_tracked_names_follow_the_router_settings():
    assert _names() == []
    assert _names(num_experts=4) == ["load_balancing_loss"]
    assert _names(num_experts=4, moe_z_loss_coeff=1e-3) == ["load_balancing_loss", "z_loss"]
    balancing = "moe_router_load_balancing_type"
    assert _names(num_experts=4, **{balancing: "seq_aux_loss"}) == ["seq_load_balancing_loss"]
    assert _names(num_experts=4, **{balancing: "global_aux_loss"}) == ["global_load_balancing_loss"]
    assert _names(num_experts=4, **{balancing: "none"}, moe_z_loss_coeff=1e-3) == ["z_loss"]


def _reference(logits: torch.Tensor, topk: int) -> dict[str, float]:
    """One router call's losses in float64, from megatron-core's documented formulas, divided
    by their coefficients as its tracker stores them: E * sum_i f_i * P_i (f_i: the share of
    the T * topk routed slots that expert i gets, P_i: its mean softmax probability) and the
    mean over tokens of logsumexp(logits)^2."""
    num_tokens, experts = logits.shape
    scores = torch.softmax(logits, dim=-1)
    chosen = torch.topk(scores, topk, dim=-1).indices
    counts = torch.bincount(chosen.flatten(), minlength=experts).double()
    f = counts / (num_tokens * topk)
    p = scores.mean(dim=0)
    z = torch.logsumexp(logits, dim=-1).square().mean()
    return {"load_balancing_loss": float(experts * (f * p).sum()), "z_loss": float(z)}


def _train(run_dir: str, prefix: str, overrides: dict) -> dict:
    """Train in this process; return this rank's router references {(iteration, layer): [one
    per micro-batch]}, rank 0's metrics.jsonl train records and console lines, and the
    TensorBoard scalars of rank 0 ({tag: {step: value}})."""
    from megatron.core.transformer.moe.router import TopKRouter

    from megatron_gamma.training.loop import Trainer, run_callbacks

    cfg = load_config(None, {**BASE, "data_path": [prefix], "run_dir": run_dir, **overrides})
    trainer = Trainer(cfg)
    refs: dict[tuple[int, int], list[dict[str, float]]] = {}

    def capture(router, args, kwargs):
        if not (router.training and torch.is_grad_enabled()):
            return
        hidden = args[0].detach().double().reshape(-1, args[0].shape[-1])
        logits = hidden @ router.weight.detach().double().t()
        key = (trainer.state.iteration + 1, router.layer_number)
        refs.setdefault(key, []).append(_reference(logits, router.topk))

    for chunk in trainer.chunks:
        for module in chunk.modules():
            if isinstance(module, TopKRouter):
                module.register_forward_pre_hook(capture, with_kwargs=True)
    out = io.StringIO()
    try:
        trainer.callbacks = run_callbacks(trainer.cfg, trainer.preemption)
        with contextlib.redirect_stdout(out):
            trainer.train()
    finally:
        trainer.close()
    result = {"refs": refs, "lines": out.getvalue().splitlines(), "train": [], "tb": {}}
    if trainer.rank == 0:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        result["train"] = [r for r in rows if r["split"] == "train"]
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(cfg.logging.tensorboard_path())
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            result["tb"][tag] = {e.step: e.value for e in acc.Scalars(tag)}
    return result


def _expected(ranks: list[dict], name: str) -> dict[int, float]:
    """{iteration: the mean over MoE layers of the mean over the ranks that ran the layer (data
    parallel) of the mean over its micro-batches}: megatron-core's reduction, recomputed."""
    per_layer: dict[int, dict[int, list[float]]] = {}
    for rank in ranks:
        for (iteration, layer), calls in rank["refs"].items():
            mean = sum(c[name] for c in calls) / len(calls)
            per_layer.setdefault(iteration, {}).setdefault(layer, []).append(mean)
    return {
        it: sum(sum(v) / len(v) for v in layers.values()) / len(layers)
        for it, layers in per_layer.items()
    }


def _check_logged(result: dict, expected: dict[int, float], name: str, rel: float) -> None:
    logged = {r["iteration"]: r[name] for r in result["train"]}
    assert sorted(logged) == sorted(expected) == [1, 2, 3]
    for it in expected:
        assert close(logged[it], expected[it], rel=rel), (name, it, logged[it], expected[it])
        assert close(result["tb"][f"train/{name}"][it], expected[it], rel=rel)
    console = {}
    for line in result["lines"]:
        match = re.match(rf"iteration\s+(\d+)/3 \|.* {name} (\S+) \|", line)
        if match:
            console[int(match.group(1))] = float(match.group(2))
    # Megatron-LM's interval mean (iterations 1-2 at --log-interval 2, then the last one),
    # printed with 7 significant digits.
    assert sorted(console) == [2, 3], result["lines"]
    assert close(console[2], (expected[1] + expected[2]) / 2, rel=1e-5)
    assert close(console[3], expected[3], rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_rank_logs_the_routers_losses_of_a_float64_reference(tmp_path, demo_prefix):
    (result,) = run_distributed(_train, 1, str(tmp_path), demo_prefix, MOE)
    assert {layer for _, layer in result["refs"]} == {1, 2}
    assert {len(calls) for calls in result["refs"].values()} == {2}  # two micro-batches
    for name in ("load_balancing_loss", "z_loss"):
        expected = _expected([result], name)
        _check_logged(result, expected, name, rel=1e-6)
    lb = [r["load_balancing_loss"] for r in result["train"]]
    assert all(1.0 <= v < 2.0 for v in lb), lb  # 1 when balanced; not scaled by the coeff


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dense_model_logs_no_router_loss(tmp_path, demo_prefix):
    (result,) = run_distributed(_train, 1, str(tmp_path), demo_prefix, {"train_iters": 1})
    assert result["refs"] == {}
    (record,) = result["train"]
    assert not {"load_balancing_loss", "z_loss"} & set(record)
    assert not any("load_balancing_loss" in line for line in result["lines"])


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"expert_model_parallel_size": 2},
        {"pipeline_model_parallel_size": 2},
    ],
    ids=["dp2", "ep2", "pp2"],
)
def test_two_ranks_log_the_mean_of_each_ranks_reference(tmp_path, demo_prefix, layout):
    """Data parallel (and expert parallel, whose ranks are data-parallel ranks of the router):
    the load-balancing loss is the mean of the ranks' references, ``z_loss`` rank 0's own
    (megatron-core does not reduce it); pipeline parallel: each stage's layers reach rank 0."""
    ranks = run_distributed(_train, 2, str(tmp_path), demo_prefix, {**MOE, **layout})
    name = "load_balancing_loss"
    _check_logged(ranks[0], _expected(ranks, name), name, rel=1e-6)
    pipeline = bool(layout.get("pipeline_model_parallel_size"))
    z_ranks = ranks if pipeline else ranks[:1]
    _check_logged(ranks[0], _expected(z_ranks, "z_loss"), "z_loss", rel=1e-6)
    if not pipeline:
        assert all({layer for _, layer in r["refs"]} == {1, 2} for r in ranks)
        (a, b) = (_expected([r], name) for r in ranks)
        assert a != b  # the ranks' data differ, so the mean is a real reduction


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_dense_first_stage_logs_the_data_parallel_mean(tmp_path, demo_prefix):
    """PP 2 x DP 2 with ``--moe-layer-freq [0,1]``: rank 0's stage has no MoE layer, so its
    tracker entry names no reduce group; the last stage's data-parallel mean still reaches it
    (megatron-core's order, the pipeline sum first, would leave it rank 2's own value)."""
    layout = {"pipeline_model_parallel_size": 2, "moe_layer_freq": "[0,1]", "global_batch_size": 8}
    ranks = run_distributed(_train, 4, str(tmp_path), demo_prefix, {**MOE, **layout})
    assert [sorted({layer for _, layer in r["refs"]}) for r in ranks] == [[], [], [2], [2]]
    name = "load_balancing_loss"
    _check_logged(ranks[0], _expected(ranks, name), name, rel=1e-6)
    assert _expected(ranks[2:3], name) != _expected(ranks[3:], name)
