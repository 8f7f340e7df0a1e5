"""The callback interface stands alone: no import cycle through training, and the run's logger
belongs to the trainer, so a callback may log from any position in the list."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest
from distributed import run_distributed

import megatron_gamma

PACKAGE = Path(megatron_gamma.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path) -> set[str]:
    """megatron_gamma modules ``path`` imports when run: module level and inside functions,
    not under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n.startswith("megatron_gamma")}


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: _runtime_imports(p) & modules.keys() for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_hook_table_lists_the_interfaces_hooks_in_call_order():
    from megatron_gamma.training import callback

    table = re.findall(r"^``(on_\w+)``", callback.__doc__, re.M)
    hooks = [k for k in vars(callback.Callback) if k.startswith("on_")]
    assert table == hooks == ["on_train_start", "on_step_end", "on_eval", "on_save", "on_train_end"]


def test_callback_interface_imports_nothing_of_the_package():
    assert _runtime_imports(PACKAGE / "training" / "callback.py") == set()


def test_no_runtime_import_cycle_through_training_diagnostics_or_telemetry():
    graph = _import_graph()
    assert graph["megatron_gamma.training.loop"] >= {
        "megatron_gamma.training.callback",
        "megatron_gamma.diagnostics.callback",
    }
    cycles = [
        c
        for c in _cycles(graph)
        if any(m.startswith(("megatron_gamma.training", "megatron_gamma.diagnostics")) for m in c)
    ]
    assert cycles == []


def _train_with_a_logging_callback_first(run_dir: str, prefix: str) -> list[str]:
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
    overrides.update(eval_iters=1, progress_bar=False, log_diagnostics_interval=0)
    trainer = Trainer(load_config(None, overrides))
    try:
        trainer.callbacks = [Probe(), *run_callbacks(trainer.cfg, trainer.preemption)]
        trainer.train()
    finally:
        trainer.close()
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [line for line in f]


@pytest.mark.timeout(300)
def test_a_callback_before_the_metrics_callback_can_log(tmp_path, demo_prefix):
    (lines,) = run_distributed(_train_with_a_logging_callback_first, 1, str(tmp_path), demo_prefix)
    rows = [json.loads(line) for line in lines]
    train = {r["iteration"]: r["loss"] for r in rows if r["split"] == "train"}
    probe = {r["iteration"]: r["twice_loss"] for r in rows if r["split"] == "probe"}
    assert sorted(train) == [1, 2]
    assert probe == {i: 2 * loss for i, loss in train.items()}
    assert [r["iteration"] for r in rows if r["split"] == "valid"] == [2]
