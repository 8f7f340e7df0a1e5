"""Cluster launch against a real SLURM: slurmctld plus two ``slurmd -N nodeN`` on this host.

The session fixture starts the cluster (tests/slurm/local_slurm.py) and stops exactly the daemons
it started. Jobs run real CPU pretraining of a tiny model with gloo across both emulated nodes
through ``megatron-gamma submit`` (the same sbatch script users get); the references are
independent runs outside SLURM: a single process with the same global batch, and one local
preprocessing run. Needs root and Debian's ``slurmctld slurmd slurm-client munge`` (``.ci/run``
installs them); skipped otherwise.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest
from local_slurm import LocalSlurm, job_field, missing_binaries, wait_job

from megatron_gamma.data import demo_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_ITERS = 40

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(missing_binaries()) or os.geteuid() != 0,
        reason="needs root and SLURM: apt-get install slurmctld slurmd slurm-client munge",
    ),
]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A running two-node cluster; yields the environment for SLURM clients and jobs."""
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), nodes=2, gpus_per_node=2)
    env = cluster.start()
    # Jobs inherit the submitting environment (sbatch --export=ALL): this interpreter and
    # checkout, CPU-friendly settings.
    env.update(
        PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
        TORCHDYNAMO_DISABLE="1",
        OMP_NUM_THREADS="1",
    )
    try:
        yield env
    finally:
        cluster.stop()


def _cli(args: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "megatron_gamma.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def _train_losses(run_dir) -> dict[int, float]:
    losses = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec["split"] == "train":
                assert rec["iteration"] not in losses, f"iteration {rec['iteration']} logged twice"
                losses[rec["iteration"]] = rec["loss"]
    return losses


DEMO_CONFIG = os.path.join(REPO, "examples", "configs", "demo.yaml")


@pytest.fixture(scope="module")
def tiny(demo_prefix) -> list[str]:
    """Flags that shrink the demo config to a CPU-sized model (2 layers, hidden 64, seq 64) on
    the demo corpus; global batch 8."""
    return [
        "--config", DEMO_CONFIG, "--data-path", demo_prefix, "--num-layers", "2",
        "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "256",
        "--seq-length", "64", "--micro-batch-size", "4", "--global-batch-size", "8",
        "--lr-warmup-iters", "2", "--train-iters", str(TRAIN_ITERS), "--eval-interval", "1000",
        "--eval-iters", "1", "--no-progress-bar",
    ]  # fmt: skip


def _submit(env, tiny: list[str], run_dir, launcher: str) -> tuple[str, str]:
    """``megatron-gamma submit`` of the tiny demo on 2 nodes x 1 (fake) GPU; (job id, log)."""
    proc = _cli(
        [
            "submit", *tiny, "--run-dir", str(run_dir), "--nodes", "2", "--gpus-per-node", "1",
            "--launcher", launcher, "--time", "00:10:00",
        ],
        env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"submitted job (\d+), log: (\S+)", proc.stdout)
    assert match, proc.stdout
    return match.group(1), match.group(2)


def _log(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


@pytest.fixture(scope="module")
def two_node_run(slurm, tiny, tmp_path_factory):
    """The demo config submitted on 2 nodes (torchrun launcher) and, meanwhile, the single-process
    reference run of the same global batch outside SLURM."""
    root = tmp_path_factory.mktemp("two_node")
    reference = subprocess.Popen(
        [
            sys.executable, "-m", "megatron_gamma.cli", "pretrain", *tiny,
            "--run-dir", str(root / "single"),
        ],
        env=slurm, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    job_id, log = _submit(slurm, tiny, root / "job", "torchrun")
    state = wait_job(job_id, slurm, timeout=150)
    out, _ = reference.communicate(timeout=150)
    assert reference.returncode == 0, out[-3000:]
    return {"dir": root / "job", "state": state, "log": log, "single": root / "single"}


@pytest.mark.timeout(240)
def test_two_node_job_trains_with_gloo_on_both_nodes(two_node_run):
    log = _log(two_node_run["log"])
    assert two_node_run["state"] == "COMPLETED", log[-3000:]
    assert "[launch] node1: torchrun node rank 0 of 2" in log, log[-3000:]
    assert "[launch] node2: torchrun node rank 1 of 2" in log, log[-3000:]
    assert "training finished with exit code 0" in log
    ckpt = two_node_run["dir"] / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(TRAIN_ITERS)
    assert (ckpt / f"iter_{TRAIN_ITERS:07d}" / "metadata.json").is_file()
    losses = _train_losses(two_node_run["dir"])
    assert sorted(losses) == list(range(1, TRAIN_ITERS + 1))
    single = _train_losses(two_node_run["single"])
    # DP=2 (one micro-batch of 4 per rank) vs one process (two micro-batches of 4): same samples
    assert abs(losses[TRAIN_ITERS] - single[TRAIN_ITERS]) <= 1e-5
    assert losses[TRAIN_ITERS] < losses[1] - 0.5  # it trained


@pytest.mark.timeout(240)
def test_usr1_checkpoints_requeues_and_resumes_to_the_same_loss(
    slurm, tiny, two_node_run, tmp_path
):
    run_dir = tmp_path / "preempted"
    job_id, log = _submit(slurm, tiny, run_dir, "srun")
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert time.monotonic() < deadline, _log(log)[-3000:] if os.path.exists(log) else "no log"
        time.sleep(0.1)
    # what SLURM sends before the time limit with --signal=B:USR1@..., to the batch shell
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm, check=True)
    state = wait_job(job_id, slurm, timeout=180)
    text = _log(log)
    assert state == "COMPLETED", text[-3000:]
    assert job_field(job_id, slurm, "Restarts") == "1"
    stopped = re.search(r"stopping at iteration (\d+) \(SIGUSR1\)", text)
    assert stopped, text[-3000:]
    k = int(stopped.group(1))
    assert 3 <= k < TRAIN_ITERS
    assert f"requeueing job {job_id}" in text
    assert f"resumed at iteration {k}" in text
    assert "[launch] node2: rank 1 of 2, local rank 0" in text
    ckpt = run_dir / "checkpoints"
    assert sorted(os.listdir(ckpt)) == [
        f"iter_{k:07d}",
        f"iter_{TRAIN_ITERS:07d}",
        "latest_checkpointed_iteration.txt",
    ]
    losses = _train_losses(run_dir)  # the resumed run appends iterations k+1..40
    assert sorted(losses) == list(range(1, TRAIN_ITERS + 1))
    uninterrupted = _train_losses(two_node_run["dir"])
    assert abs(losses[TRAIN_ITERS] - uninterrupted[TRAIN_ITERS]) <= 1e-5


def _has_sharded_preprocess() -> bool:
    """True once `preprocess` has --shard-index/--num-shards and `merge` exists."""
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    helps = [
        subprocess.run(
            [sys.executable, "-m", "megatron_gamma.cli", cmd, "--help"],
            env=env, capture_output=True, text=True, cwd=REPO,
        ).stdout
        for cmd in ("preprocess", "merge")
    ]  # fmt: skip
    return "--shard-index" in helps[0] and "--output-prefix" in helps[1]


def _corpus_files(folder) -> list[str]:
    """The demo corpus split into 4 jsonl files (zh then en): shards split the file list."""
    files = []
    for lang in ("zh", "en"):
        with open(os.path.join(demo_dir(), f"{lang}.jsonl"), encoding="utf-8") as f:
            lines = f.readlines()
        half = len(lines) // 2
        for i, part in enumerate((lines[:half], lines[half:])):
            path = os.path.join(folder, f"{lang}-{i}.jsonl")
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(part)
            files.append(path)
    return files


@pytest.mark.timeout(240)
@pytest.mark.skipif(
    not _has_sharded_preprocess(),
    reason="`megatron-gamma preprocess --shard-index` and `megatron-gamma merge` not available yet",
)
def test_preprocess_array_and_merge_equal_one_local_run(slurm, tmp_path):
    files = _corpus_files(tmp_path)
    tokenizer = os.path.join(demo_dir(), "tokenizer.json")
    local = _cli(
        [
            "preprocess", "--input", *files, "--tokenizer-model", tokenizer,
            "--output-prefix", str(tmp_path / "local" / "demo"), "--no-progress",
        ],
        slurm,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    proc = _cli(
        [
            "submit-preprocess", "--input", *files, "--tokenizer-model", tokenizer,
            "--output-prefix", str(tmp_path / "merged" / "demo"), "--num-shards", "3",
        ],
        slurm,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    array_id, merge_id = re.findall(r"submitted job (\d+)", proc.stdout)
    assert wait_job(array_id, slurm, timeout=120) == "COMPLETED"
    assert wait_job(merge_id, slurm, timeout=120) == "COMPLETED"
    assert job_field(merge_id, slurm, "Dependency") == "(null)"  # satisfied
    shards = sorted(glob.glob(str(tmp_path / "merged" / "demo-shard*-of-00003_text_document.idx")))
    assert len(shards) == 3
    for ext in ("_text_document.bin", "_text_document.idx"):
        with open(tmp_path / "local" / f"demo{ext}", "rb") as a:
            with open(tmp_path / "merged" / f"demo{ext}", "rb") as b:
                assert a.read() == b.read(), ext
    stats = [(tmp_path / d / "demo.stats.json").read_text() for d in ("local", "merged")]
    assert stats[0].replace(str(tmp_path / "local"), str(tmp_path / "merged")) == stats[1]


@pytest.mark.timeout(60)
def test_sbatch_rejection_is_reported(slurm, tiny, tmp_path):
    """A partition the cluster does not have: our checks pass, sbatch refuses, and its reason
    reaches the user."""
    proc = _cli(
        [
            "submit", *tiny, "--run-dir", str(tmp_path / "r"),
            "--nodes", "2", "--gpus-per-node", "1", "--partition", "nosuch",
        ],
        slurm,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "sbatch" in proc.stderr and "invalid partition" in proc.stderr.lower(), proc.stderr
    queued = subprocess.run(["squeue", "-h"], env=slurm, capture_output=True, text=True).stdout
    assert "mg-r" not in queued
