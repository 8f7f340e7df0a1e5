"""Progress counters across a resume at another ``--seq-length`` (trial 12: ``consumed_tokens``
counted every sample at the new length). Reference: the closed form, steps x global batch size
x the sequence length each step trained at."""

import json
import os

import pytest
import torch
from helpers import TINY_MODEL, pretrain

from megatron_gamma.rundir import layout

FLAGS = ["--train-iters", "8", "--eval-interval", "100", "--log-interval", "1"]
FLAGS += ["--max-position-embeddings", "64"]
GBS, SEQ = 8, 64
assert TINY_MODEL[TINY_MODEL.index("--global-batch-size") + 1] == str(GBS)
assert TINY_MODEL[TINY_MODEL.index("--seq-length") + 1] == str(SEQ)


def _tokens(run_dir) -> dict[int, int]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {r["iteration"]: r["consumed_tokens"] for r in rows if r["split"] == "train"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_consumed_tokens_keep_the_steps_before_a_resume_at_another_seq_length(
    tmp_path, demo_prefix
):
    ckpt = str(tmp_path / "ckpt")
    pretrain(tmp_path / "first", demo_prefix, *FLAGS, "--exit-interval", "4", "--save", ckpt)
    assert _tokens(tmp_path / "first") == {it: it * GBS * SEQ for it in range(1, 5)}

    pretrain(tmp_path / "shorter", demo_prefix, *FLAGS, "--load", ckpt, "--seq-length", "32")
    expected = {it: 4 * GBS * SEQ + (it - 4) * GBS * 32 for it in range(5, 9)}
    assert _tokens(tmp_path / "shorter") == expected

    # A checkpoint of an older version, without the count: samples x its recorded seq_length.
    common = os.path.join(layout.checkpoint_dir(ckpt, 4), "common.pt")
    state = torch.load(common, weights_only=True)
    assert state.pop("consumed_tokens") == 4 * GBS * SEQ
    torch.save(state, common)
    pretrain(tmp_path / "older", demo_prefix, *FLAGS, "--load", ckpt)
    assert _tokens(tmp_path / "older") == {it: it * GBS * SEQ for it in range(5, 9)}
