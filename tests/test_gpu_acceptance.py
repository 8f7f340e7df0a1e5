"""tools/gpu_acceptance.sh on CPU: the dry run checks every step's command line; a bad flag or a
bad ops backend fails it; the training command works end to end (shrunk to a tiny model) and its
log is parsed into tokens/s and TFLOP/s."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import gpu_acceptance  # noqa: E402

SHRINK = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
          "--ffn-hidden-size", "128", "--seq-length", "128", "--train-iters", "20",
          "--eval-interval", "20", "--micro-batch-size", "2",
          "--global-batch-size", "2"]  # fmt: skip


@pytest.mark.slow
def test_dry_run_checks_every_step_and_writes_the_report(tmp_path):
    r = subprocess.run(
        ["bash", "tools/gpu_acceptance.sh", str(tmp_path), "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "gpu_acceptance.json").read_text())
    names = [s["name"] for s in doc["steps"]]
    assert names == ["install", "kernel-tests", "bench-rmsnorm", "data"] + [
        f"train-{v}" for v in gpu_acceptance.TRAIN_VARIANTS
    ]
    assert all(s["status"] == "dry-run ok" for s in doc["steps"]), doc["steps"]
    kernel = doc["steps"][1]["detail"]
    assert int(kernel.split()[0]) > 0 and "CUDA test cases collected" in kernel
    assert "| train-ops-reference | dry-run ok |" in (tmp_path / "gpu_acceptance.md").read_text()


def test_dry_run_refuses_a_bad_flag_and_a_bad_ops_backend(tmp_path):
    steps = {s.name: s for s in gpu_acceptance.plan(str(tmp_path))}
    bench = steps["bench-rmsnorm"]
    bench.cmd = [*bench.cmd, "--no-such-flag"]
    with pytest.raises(RuntimeError, match=r"\['--no-such-flag'\] not accepted"):
        gpu_acceptance.check_command(bench)
    train = steps["train-defaults"]
    cmd = train.cmd
    train.cmd = [*cmd, "--gated-attention", "sideways"]  # not a choice: argparse refuses it
    with pytest.raises(RuntimeError, match="train-defaults: pretrain refuses"):
        gpu_acceptance.check_command(train)
    train.cmd = [*cmd, "--init-gamma", "-1"]  # parses; the config's check refuses it
    with pytest.raises(ValueError, match="init_gamma=-1.0"):
        gpu_acceptance.check_command(train)
    ops = steps["train-ops-reference"]
    ops.env = {"MEGATRON_GAMMA_OPS": "fastest"}
    with pytest.raises(RuntimeError, match="import with .*fastest.* failed"):
        gpu_acceptance.check_command(ops)


@pytest.mark.slow
def test_training_command_runs_shrunk_on_cpu_and_its_log_parses(tmp_path):
    steps = {s.name: s for s in gpu_acceptance.plan(str(tmp_path))}
    data = steps["data"]
    subprocess.run(data.cmd, cwd=ROOT, env=gpu_acceptance._env(data), check=True, timeout=120)
    train = steps["train-megatron-core-local-spec"]
    cmd = [a for a in train.cmd if a != "--bf16"] + SHRINK + ["--vocab-size", "4096"]
    env = dict(gpu_acceptance._env(train), TORCHDYNAMO_DISABLE="1")
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    figures = gpu_acceptance._train_figures(r.stdout)
    lines = [line for line in r.stdout.splitlines() if line.startswith("iteration")]
    last = lines[-1]
    assert figures["intervals"] == 1 and figures["tokens_per_s"] == float(
        last.split("tokens/s ")[1].split()[0]
    )
    assert figures["tflops_per_device"] == float(last.split("TFLOP/s/device ")[1].split()[0])
    assert "mfu_percent" not in figures  # no GPU, no peak
    assert not os.path.exists(tmp_path / "runs" / "megatron-core-local-spec" / "checkpoints")
