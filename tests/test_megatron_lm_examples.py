"""Megatron-LM's own GPT-3 and Llama-3 launch scripts, with only the entry point swapped.

The flags are text fixtures copied from Megatron-LM's examples (``tests/megatron_lm_examples``:
sizes shrunk to CPU scale, paths pointed at the demo corpus). Each script either trains for a
few iterations, or stops before any work naming each flag it refuses and why. The test runs the
script, removes the refused flags it named (the whole fixture line), and repeats until the run
trains: the flags it had to remove must be exactly the ones this machine cannot honour (listed
per script below, with the reason), and the rest must train, evaluate and save.
"""

import json
import os
import shlex
import string
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_gamma.data import demo_dir

ROOT = Path(__file__).parents[1]
EXAMPLES = Path(__file__).parent / "megatron_lm_examples"


def _lines(name: str) -> list[str]:
    text = (EXAMPLES / name).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()[:1] not in ("", "#")]


def _refusals(stderr: str, lines: list[str]) -> dict[str, str]:
    """{fixture flag: the stderr line that refuses it}: ``--flag: refused: ...``, or a config
    error ``error: key=value: ...`` whose key is the flag's field."""
    flags = {line.split()[0] for line in lines}
    return {
        flag: line
        for line in stderr.splitlines()
        for flag in flags
        if f"{flag}: refused: " in line or f"error: {flag[2:].replace('-', '_')}=" in line
    }


def _write_gpt2_files(directory: Path) -> tuple[str, str]:
    """GPT-2-format vocab.json and merges.txt holding the demo tokenizer's byte-level BPE (so
    that the demo dataset's ids are this tokenizer's)."""
    model = json.loads((Path(demo_dir()) / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    vocab, merges = directory / "gpt2-vocab.json", directory / "gpt2-merges.txt"
    vocab.write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
    pairs = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    merges.write_text("#version: 0.2\n" + "\n".join(pairs) + "\n", encoding="utf-8")
    return str(vocab), str(merges)


def _run(lines: list[str], variables: dict, cwd: Path) -> subprocess.CompletedProcess:
    """``python tools/pretrain_gpt.py FLAGS`` (Megatron-LM's entry point name) in ``cwd``."""
    argv = shlex.split(string.Template(" ".join(lines)).substitute(variables))
    cmd = [sys.executable, str(ROOT / "tools" / "pretrain_gpt.py"), *argv]
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1", OMP_NUM_THREADS="1")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


# The flags each script names as refused on a machine without CUDA and Transformer Engine.
RAMPUP = "--rampup-batch-size"  # Megatron-LM too refuses a ramp-up with --train-iters
NO_CUDA = {
    "gpt3_175b.args": {RAMPUP, "--fp16"},
    "llama3_8b_bf16.args": {
        "--attention-backend",  # fused: Transformer Engine
        "--decoupled-lr",
        "--decoupled-min-lr",
        "--cross-entropy-loss-fusion",
        "--calculate-per-token-loss",
        "--empty-unused-memory-level",
        "--profile",  # without --use-pytorch-profiler: nsys's CUDA profiler API
    },
}
NO_CUDA["llama3_8b_fp8.args"] = NO_CUDA["llama3_8b_bf16.args"] | {
    "--fp8-format",
    "--fp8-amax-history-len",
    "--fp8-amax-compute-algo",
    "--fp8-param-gather",
}


@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory) -> dict:
    """GPT-2 vocab and merges files holding the demo tokenizer, and the demo corpus
    preprocessed with them (``megatron-gamma preprocess --tokenizer-type GPT2BPETokenizer``)."""
    from helpers import DEMO_INPUTS

    from megatron_gamma.data.preprocess import preprocess

    directory = tmp_path_factory.mktemp("gpt2")
    vocab, merges = _write_gpt2_files(directory)
    prefix = preprocess(
        DEMO_INPUTS,
        None,
        str(directory / "demo"),
        progress=False,
        tokenizer_type="GPT2BPETokenizer",
        vocab_file=vocab,
        merge_file=merges,
    ).prefix
    return {"VOCAB_FILE": vocab, "MERGE_FILE": merges, "DATA_PATH": prefix}


def _train_or_refuse(name: str, variables: dict, cwd: Path) -> tuple[list[str], list[str]]:
    """Run the script; while it stops naming refused flags, drop those lines and run again.
    Returns (the flags dropped, in order; the lines of the run that trained)."""
    lines, dropped = _lines(name), []
    while True:
        proc = _run(lines, variables, cwd)
        if proc.returncode == 0:
            return dropped, lines
        refusals = _refusals(proc.stderr, lines)
        assert proc.returncode == 2 and refusals, proc.stdout[-2000:] + proc.stderr[-4000:]
        assert all("Fix:" in line for line in refusals.values()), proc.stderr[-4000:]
        flags = sorted(refusals)
        dropped += flags
        lines = [line for line in lines if line.split()[0] not in flags]


def _metrics(cwd: Path) -> list[dict]:
    path = cwd / "runs" / "demo" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NO_CUDA))
def test_megatron_lm_example_trains_or_names_each_refused_flag(
    name, demo_prefix, gpt2_files, tmp_path, monkeypatch
):
    import torch

    variables = {
        **gpt2_files,
        "CHECKPOINT_PATH": str(tmp_path / "checkpoints"),
        "TENSORBOARD_LOGS_PATH": str(tmp_path / "tensorboard"),
        "DATA_CACHE_PATH": str(tmp_path / "cache"),
        "TOKENIZER_MODEL": str(Path(demo_dir()) / "tokenizer.json"),
    }
    if name.startswith("llama"):
        variables["DATA_PATH"] = demo_prefix
    monkeypatch.setenv("WANDB_MODE", "offline")
    dropped, lines = _train_or_refuse(name, variables, tmp_path)
    if torch.cuda.is_available():
        assert set(dropped) <= NO_CUDA[name]
    else:
        assert sorted(dropped) == sorted(NO_CUDA[name])
    train = [r for r in _metrics(tmp_path) if r["split"] == "train"]
    valid = [r for r in _metrics(tmp_path) if r["split"] == "valid"]
    assert [r["iteration"] for r in train] == list(range(1, 7))
    assert all(0 < r["loss"] < 9 for r in train) and valid
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("iter_*"))
    assert checkpoints == ["iter_0000003", "iter_0000006"]
    if "--wandb-project" in " ".join(lines):
        assert list((tmp_path / "checkpoints" / "wandb").rglob("*.wandb"))
