"""Shared fixtures: the preprocessed demo corpus and a subprocess launcher for pretraining runs.

Training runs go through the real CLI in a fresh process (``python -m megatron_gamma.cli`` or
``torchrun``), as a user runs them: megatron-core's process-wide state and our CPU shims never
leak into the test process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from megatron_gamma.data import demo_dir
from megatron_gamma.rundir import layout

DEMO_TOKENIZER = os.path.join(demo_dir(), "tokenizer.json")
DEMO_INPUTS = [os.path.join(demo_dir(), "zh.jsonl"), os.path.join(demo_dir(), "en.jsonl")]

TINY_MODEL = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--ffn-hidden-size",
    "256",
    "--seq-length",
    "64",
    "--micro-batch-size",
    "4",
    "--global-batch-size",
    "8",
    "--lr",
    "3e-3",
    "--min-lr",
    "3e-4",
    "--lr-warmup-iters",
    "2",
    "--eval-iters",
    "2",
    "--split",
    "95,5,0",
    "--no-progress-bar",
]


@pytest.fixture(scope="session")
def demo_prefix(tmp_path_factory) -> str:
    """The packaged demo corpus as a Megatron dataset prefix (zh then en, one doc per line)."""
    from megatron_gamma.data.preprocess import preprocess

    out = tmp_path_factory.mktemp("demo_data") / "demo"
    return preprocess(DEMO_INPUTS, DEMO_TOKENIZER, str(out), workers=1, progress=False).prefix


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


def run_cli(args: list[str], nproc: int = 1, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``megatron-gamma ARGS`` in a fresh process (torchrun when nproc > 1)."""
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1", OMP_NUM_THREADS="1")
    if nproc == 1:
        cmd = [sys.executable, "-m", "megatron_gamma.cli", *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            "--standalone",
            "-m",
            "megatron_gamma.cli",
            *args,
        ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def pretrain(run_dir, data_prefix: str, *flags: str, nproc: int = 1) -> dict:
    """Train a tiny model on ``data_prefix`` into ``run_dir``; return its metrics."""
    args = [
        "pretrain",
        "--data-path",
        data_prefix,
        "--run-dir",
        str(run_dir),
        *TINY_MODEL,
        *flags,
    ]
    proc = run_cli(args, nproc=nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return read_metrics(run_dir)
