"""Stored reference loss trajectories: a numerics change that moves every layout alike (init,
norm, gate, loss, optimizer defaults) shows here, and must update these files knowingly.

Each JSON file in ``tests/reference_losses/`` holds a tiny fp32 CPU run on the packaged demo
corpus (one process, ``OMP_NUM_THREADS=1``): the flags, the training losses per iteration, the
versions it was made with, and the command that made it. Regenerate after an intended change
with ``python tests/test_reference_losses.py`` (all of them) or ``... NAME``, and say why in
the commit.

Tolerance: a run is deterministic for one thread count, so the same machine reproduces it
bit for bit; another CPU or BLAS build may order reductions differently. Measured here, the
same runs at ``OMP_NUM_THREADS=2`` (another reduction order) differ from the stored
``OMP_NUM_THREADS=1`` ones by at most 5.9e-8 relative over the 8 iterations (dense 5.75e-8, MoE
5.87e-8, gated 5.82e-8); ``REL_TOL`` = 1e-6 sits 17 times above that and 10 times below the
smallest difference between two of the stored runs at any iteration (1.05e-5).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest
import torch
from helpers import TINY_MODEL, pretrain

import megatron_gamma

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_losses")
REL_TOL = 1e-6
FLAGS = {
    "dense": ["--gated-attention", "none"],
    "moe": [
        "--gated-attention", "none", "--num-experts", "4", "--moe-ffn-hidden-size", "64",
        "--moe-router-topk", "2", "--moe-layer-freq", "[0,1]",
    ],
    "gated": ["--gated-attention", "elementwise"],
}  # fmt: skip
COMMON = ["--train-iters", "8", "--eval-interval", "1000", "--eval-iters", "1", "--seed", "1234"]


def _flags(name: str) -> list[str]:
    """Every flag of the run (``pretrain`` adds the data and run directory)."""
    return [*TINY_MODEL, *COMMON, *FLAGS[name]]


def _run(name: str, prefix: str, run_dir: str) -> dict[int, float]:
    return pretrain(run_dir, prefix, *COMMON, *FLAGS[name])["train"]


def _stored(name: str) -> dict:
    with open(os.path.join(HERE, f"{name}.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("name", list(FLAGS))
def test_stored_reference_was_made_with_the_flags_of_its_run(name):
    ref = _stored(name)
    assert ref["flags"] == _flags(name), "the flags changed: regenerate the reference"
    assert ref["command"] == f"python tests/test_reference_losses.py {name}"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(FLAGS))
def test_loss_trajectory_equals_the_stored_reference(name, demo_prefix, tmp_path):
    ref = _stored(name)
    got = _run(name, demo_prefix, str(tmp_path))
    want = {int(k): v for k, v in ref["losses"].items()}
    assert sorted(got) == sorted(want)
    for it in sorted(want):
        assert got[it] == pytest.approx(want[it], rel=REL_TOL), (
            f"{name} iteration {it}: {got[it]!r} vs stored {want[it]!r}. If the change is "
            f"intended, regenerate: {ref['command']}"
        )


def main(names: list[str]) -> None:
    from megatron.core import __version__ as mcore_version

    from megatron_gamma.data import demo_dir
    from megatron_gamma.data.preprocess import preprocess

    with tempfile.TemporaryDirectory() as tmp:
        inputs = [os.path.join(demo_dir(), "zh.jsonl"), os.path.join(demo_dir(), "en.jsonl")]
        tokenizer = os.path.join(demo_dir(), "tokenizer.json")
        prefix = preprocess(inputs, tokenizer, f"{tmp}/demo", workers=1, progress=False).prefix
        for name in names:
            losses = _run(name, prefix, f"{tmp}/{name}")
            record = {
                "command": f"python tests/test_reference_losses.py {name}",
                "flags": _flags(name),
                "versions": {
                    "torch": torch.__version__,
                    "megatron_core": mcore_version,
                    "megatron_gamma": megatron_gamma.__version__,
                },
                "losses": {str(k): v for k, v in sorted(losses.items())},
            }
            with open(os.path.join(HERE, f"{name}.json"), "w") as f:
                json.dump(record, f, indent=2)
                f.write("\n")
            print(name, record["losses"])


if __name__ == "__main__":
    main(sys.argv[1:] or list(FLAGS))
