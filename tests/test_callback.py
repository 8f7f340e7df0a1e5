"""The callback interface stands alone: no import cycle through training, and the run's logger
belongs to the trainer, so a callback may log from any position in the list."""

from __future__ import annotations

import json
import os
import re

import pytest
from distributed import run_distributed
from helpers import PACKAGE, cycles, import_graph, runtime_imports


def test_hook_table_lists_the_interfaces_hooks_in_call_order():
    from megatron_gamma.training import callback

    table = re.findall(r"^``(on_\w+)``", callback.__doc__, re.M)
    hooks = [k for k in vars(callback.Callback) if k.startswith("on_")]
    assert table == hooks == ["on_train_start", "on_step_end", "on_eval", "on_save", "on_train_end"]


def test_callback_interface_imports_nothing_of_the_package():
    assert runtime_imports(PACKAGE / "training" / "callback.py") == []


def test_no_runtime_import_cycle_through_training_diagnostics_or_telemetry():
    graph = import_graph()
    assert graph["megatron_gamma.training.loop"] >= {
        "megatron_gamma.training.callback",
        "megatron_gamma.diagnostics.callback",
    }
    through = [
        c
        for c in cycles(graph)
        if any(m.startswith(("megatron_gamma.training", "megatron_gamma.diagnostics")) for m in c)
    ]
    assert through == []


def _train_with_a_logging_callback_first(
    run_dir: str, prefix: str, eval_iters: int = 1
) -> list[str]:
    from megatron_gamma.config import load_config
    from megatron_gamma.training.callback import Callback
    from megatron_gamma.training.loop import Trainer, run_callbacks

    class Probe(Callback):
        def on_train_start(self, trainer):
            trainer.log.message("probe: start")

        def on_step_end(self, trainer, step):
            trainer.log.scalars(step.iteration, {"twice_loss": 2 * step.loss}, split="probe")

    overrides = {"data_path": [prefix], "run_dir": run_dir, "num_layers": 1, "hidden_size": 32}
    overrides.update(num_attention_heads=2, seq_length=16, micro_batch_size=2)
    overrides.update(global_batch_size=2, train_iters=2, split="95,5,0", init_audit="off")
    overrides.update(eval_iters=eval_iters, progress_bar=False, log_diagnostics_interval=0)
    trainer = Trainer(load_config(None, overrides))
    try:
        trainer.callbacks = [Probe(), *run_callbacks(trainer.cfg, trainer.preemption)]
        trainer.train()
    finally:
        trainer.close()
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [line for line in f]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_callback_before_the_metrics_callback_can_log(tmp_path, demo_prefix):
    (lines,) = run_distributed(_train_with_a_logging_callback_first, 1, str(tmp_path), demo_prefix)
    rows = [json.loads(line) for line in lines]
    train = {r["iteration"]: r["loss"] for r in rows if r["split"] == "train"}
    probe = {r["iteration"]: r["twice_loss"] for r in rows if r["split"] == "probe"}
    assert sorted(train) == [1, 2]
    assert probe == {i: 2 * loss for i, loss in train.items()}
    assert [r["iteration"] for r in rows if r["split"] == "valid"] == [2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_eval_iters_zero_evaluates_nothing(tmp_path, demo_prefix):
    """Megatron-LM's ``--eval-iters 0``: no validation, even with a validation split (it once
    divided by zero when the evaluation fell due at the last iteration)."""
    (lines,) = run_distributed(
        _train_with_a_logging_callback_first, 1, str(tmp_path), demo_prefix, 0
    )
    rows = [json.loads(line) for line in lines]
    assert sorted(r["iteration"] for r in rows if r["split"] == "train") == [1, 2]
    assert [r for r in rows if r["split"] == "valid"] == []


def test_the_done_line_says_what_the_run_trained():
    from megatron_gamma.cli import done_line
    from megatron_gamma.training.loop import TrainResult

    trained = TrainResult({3: 8.1, 4: 8.0}, {2: 8.31, 4: 8.2049}, 4)
    assert done_line(trained) == "done: iteration 4, validation loss 8.2049 (2 iterations trained)"
    assert done_line(TrainResult({1: 9.0}, {}, 1)) == "done: iteration 1 (1 iteration trained)"
    stopped = TrainResult({3: 8.1, 4: 8.0, 5: 7.9}, {2: 8.31, 4: 8.2049}, 5)  # by a SIGTERM
    assert done_line(stopped) == (
        "done: iteration 5, validation loss 8.2049 at iteration 4 (3 iterations trained)"
    )
    assert done_line(TrainResult({}, {}, 6)) == (
        "done: iteration 6 (nothing trained: the run was already at --train-iters or "
        "--exit-interval)"
    )
    assert done_line(TrainResult({1: 9.0}, {}, 1), saved=False) == (
        "done: iteration 1 (1 iteration trained); no checkpoint written (no --save)"
    )
