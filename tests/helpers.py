"""What the tests share: tiny model sizes, the one CLI launcher, run-directory readers, the ops
helpers, the loader of ``tools/`` scripts, the guard that keeps multi-process tests in the
``slow`` tier, and the import walker (``runtime_imports``, ``import_graph``, ``cycles``) that reads
the package's imports with ``ast``.

Training runs go through the real CLI in a fresh process (``python -m megatron_gamma.cli`` or
``torchrun``), as a user runs them: megatron-core's process-wide state and our CPU shims never
leak into the test process.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import megatron_gamma
from megatron_gamma import ops
from megatron_gamma.data import demo_dir
from megatron_gamma.rundir import layout

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_TOKENIZER = os.path.join(demo_dir(), "tokenizer.json")
DEMO_INPUTS = [os.path.join(demo_dir(), "zh.jsonl"), os.path.join(demo_dir(), "en.jsonl")]

TINY = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=256)
"""A two-layer model for tests that build one in-process (config override keys)."""

TINY_MODEL = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--ffn-hidden-size", "256", "--seq-length", "64", "--micro-batch-size", "4",
    "--global-batch-size", "8", "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "2",
    "--eval-iters", "2", "--split", "95,5,0", "--no-progress-bar",
]  # fmt: skip
"""The same-sized model for CLI runs on the demo corpus (flags)."""

OVERFLOW = ["--init-method", "normal", "--init-method-std", "1e20"]
"""Flags whose first training loss is NaN whatever the data: N(0, (1e20)^2) weights overflow fp32
in the first matmuls (1e20 x 1e20 > 3.4e38), so a run stops at its first step
(``--check-for-nan-in-loss-and-grad``, on by default)."""

HAVE_WANDB = importlib.util.find_spec("wandb") is not None
"""Whether W&B is installed (the ``[test]`` extra pins it), for the tests of ``--wandb-project``."""

_in_slow_test = True


def demo_texts() -> list[str]:
    """The texts of the demo corpus (:data:`DEMO_INPUTS`), zh then en, in file order."""
    texts = []
    for path in DEMO_INPUTS:
        with open(path, encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def load_tool(name: str):
    """``tools/{name}.py`` imported as a module (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def set_slow_test(slow: bool) -> None:
    """Set by ``conftest.py`` before each test: True only for tests marked ``slow``."""
    global _in_slow_test
    _in_slow_test = slow


def check_nproc(nproc: int) -> None:
    """Fail a test that launches several processes without the ``slow`` mark, so that
    ``pytest -m "not slow"`` stays the fast tier.

    Raises:
        AssertionError: ``nproc`` > 1 in a test (or a fixture it uses) not marked slow.
    """
    assert nproc <= 1 or _in_slow_test, (
        f"nproc={nproc}: multi-process tests belong to the slow tier. Fix: mark the test (and "
        "every test using its fixture) @pytest.mark.slow"
    )


def check_pretrain_launch(args: list[str]) -> None:
    """Fail a test that runs ``pretrain`` through the CLI launcher without the ``slow`` mark:
    each such run is a fresh process that imports megatron-core and builds a model (10-30 s on
    2 CPU cores, even when it stops at a config error), so the fast tier trains in process or
    not at all.

    Raises:
        AssertionError: ``args`` starts with ``pretrain`` in a test (or a fixture it uses) not
            marked slow.
    """
    assert args[:1] != ["pretrain"] or _in_slow_test, (
        f"{' '.join(args[:3])} ...: a pretrain process belongs to the slow tier. Fix: mark the "
        "test (and every test using its fixture) @pytest.mark.slow"
    )


def cli_env() -> dict[str, str]:
    """The environment of a CLI run: no inherited launcher variables (in-process loads set
    MASTER_ADDR/PORT; a fresh run needs a fresh port), one thread per rank, Hugging Face
    offline, this checkout first on the path."""
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1", OMP_NUM_THREADS="1")
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


def run_with_stand_in_wandb(tmp_path, code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (``env``, default this one's) that finds an empty
    stand-in ``wandb`` module first on its path, this checkout next; returns the JSON object its
    last line prints, with ``fake``: the stand-in's path (what a later ``import wandb`` should
    load)."""
    fake = tmp_path / "site"
    fake.mkdir(exist_ok=True)
    (fake / "wandb.py").write_text("")
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(fake), REPO, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.rstrip("\n").split("\n")[-1]), fake=str(fake / "wandb.py"))


def cli_command(args: list[str], nproc: int = 1) -> list[str]:
    """``megatron-gamma ARGS`` as a command line (torchrun ``--standalone`` when nproc > 1:
    a free port; torch 2.13 hangs with ``--master-port=0``)."""
    check_nproc(nproc)
    check_pretrain_launch(args)
    launch = [sys.executable]
    if nproc > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [*launch, "-m", "megatron_gamma.cli", *args]


def run_cli(
    args: list[str], nproc: int = 1, timeout: int = 600, **kwargs
) -> subprocess.CompletedProcess:
    """Run ``megatron-gamma ARGS`` in a fresh process (torchrun when nproc > 1), output
    captured as text; ``kwargs`` go to ``subprocess.run`` (``cwd``, ``input``)."""
    return subprocess.run(
        cli_command(args, nproc),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def pretrain(run_dir, data_prefix: str, *flags: str, nproc: int = 1) -> dict:
    """Train a tiny model on ``data_prefix`` into ``run_dir``; return its metrics."""
    args = ["pretrain", "--data-path", data_prefix, "--run-dir", str(run_dir), *TINY_MODEL]
    proc = run_cli([*args, *flags], nproc=nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return read_metrics(run_dir)


def read_metrics(run_dir) -> dict[str, dict[int, float]]:
    """{'train': {iteration: loss}, 'valid': {iteration: loss}, 'grad_norm': {iteration: norm}}
    from a run's metrics.jsonl (diagnostics records are read by :func:`read_diagnostics`)."""
    out: dict[str, dict[int, float]] = {"train": {}, "valid": {}, "grad_norm": {}}
    for rec in layout.read_metrics(str(run_dir)):
        if rec["split"] == "diagnostics":
            continue
        out[rec["split"]][rec["iteration"]] = rec["loss"]
        if "grad_norm" in rec:
            out["grad_norm"][rec["iteration"]] = rec["grad_norm"]
    return out


def read_diagnostics(run_dir) -> dict[int, dict]:
    """{iteration: the live diagnostics record} from a run's metrics.jsonl."""
    return {
        rec["iteration"]: rec
        for rec in layout.read_metrics(str(run_dir))
        if rec["split"] == "diagnostics"
    }


def close(a: float, b: float, rel: float = 1e-4, abs_: float = 1e-6) -> bool:
    """|a - b| within ``rel`` of the larger magnitude, or within ``abs_``."""
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))


def backend(name: str, device: str):
    """Context selecting an ops backend; skips when the extension is not built for device."""
    if name == "extension":
        with ops.use_backend("auto"):
            if ops.backend(device) != "extension":
                pytest.skip(f"extension not built for {device}: {ops.extension_status()}")
    return ops.use_backend(name)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, in float64."""
    return float((out.double() - ref).abs().max() / ref.abs().max())


PACKAGE = Path(megatron_gamma.__file__).parent


def module_name(path: Path) -> str:
    """The dotted name of a source file of the package (``.../training/__init__.py`` ->
    ``megatron_gamma.training``)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    """Every module of the package (dotted name -> source file)."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def _module_names() -> frozenset[str]:
    return frozenset(package_modules())


@dataclass(frozen=True)
class Import:
    """One import of a package module: ``target`` (dotted name), the ``line`` of the import
    statement, and ``deferred`` (inside a function: it runs when the function is called, not
    when the importing module is imported)."""

    target: str
    line: int
    deferred: bool


def runtime_imports(path: Path) -> list[Import]:
    """The package modules ``path`` imports when run, at module level and inside functions, not
    under ``if TYPE_CHECKING:``. ``from a.b import c`` imports ``a.b``, and ``a.b.c`` when that
    is a module; parent packages are modules of their own (their imports are theirs)."""
    modules = _module_names()
    tree = ast.parse(path.read_text())
    skipped, deferred = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            deferred.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        found += [Import(n, node.lineno, id(node) in deferred) for n in names if n in modules]
    return found


def import_graph(deferred: bool = True) -> dict[str, set[str]]:
    """Module -> the package modules it imports at run time (``deferred=False``: only those
    imported at module level, i.e. while the module itself is imported)."""
    return {
        m: {i.target for i in runtime_imports(p) if deferred or not i.deferred}
        for m, p in package_modules().items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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


def megatron_core_dataset(texts: list[str], prefix: str) -> str:
    """The reference for preprocessing outputs: megatron-core's per-document path (one encode
    with the demo tokenizer, one ``IndexedDatasetBuilder.add_document`` per document, EOD
    appended). Returns ``prefix``."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    from megatron_gamma.data.tokenizer import BilingualTokenizer

    tok = BilingualTokenizer(DEMO_TOKENIZER)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(tok.vocab_size))
    for text in texts:
        ids = tok.tokenize(text) + [tok.eod]
        builder.add_document(np.array(ids, dtype=np.int64), [len(ids)])
    builder.finalize(prefix + ".idx")
    return prefix


def read_dataset(prefix: str) -> tuple[bytes, bytes]:
    """The bytes of ``prefix.bin`` and ``prefix.idx``."""
    with open(prefix + ".bin", "rb") as b, open(prefix + ".idx", "rb") as i:
        return b.read(), i.read()
