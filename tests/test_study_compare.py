"""``report``'s per-seed ``compare`` between claim 8's arm and the baseline (``run_compare``): the
checkpoints are found as every other command finds a run's (``rundir.resolve_checkpoint``), and
a run without one gives the report a named error, not a crash."""

from __future__ import annotations

import os

from megatron_gamma.study.analysis import StudyData
from megatron_gamma.study.report import run_compare
from megatron_gamma.study.rundir import RunRecord


def _study(study_dir: str) -> StudyData:
    runs = [
        {
            "key": f"{arm}/s1/seed-1",
            "arm": arm,
            "size": "s1",
            "seed": 1,
            "train_iters": 10,
            "non_embedding": 1000,
            "finished": True,
            "loss": loss,
            "record": RunRecord(),
            "init_gamma": gamma,
            "norm_epsilon": 1e-5,
            "gated_attention": "none",
        }
        for arm, loss, gamma in (("baseline", 5.0, 0.5), ("gamma1", 4.8, 1.0))
    ]
    return StudyData({"name": "t", "baseline": "baseline", "heldout": "h"}, runs, study_dir)


def test_a_run_without_a_checkpoint_is_a_named_error_in_the_report(tmp_path):
    for arm in ("baseline", "gamma1"):
        os.makedirs(tmp_path / arm / "s1" / "seed-1")
    result = run_compare(_study(str(tmp_path)), str(tmp_path / "report"))
    assert result["arm"] == "gamma1" and result["size"] == "s1"
    assert result["error"].startswith(f"checkpoint={str(tmp_path / 'gamma1' / 's1' / 'seed-1')!r}")
    assert "no complete checkpoint found" in result["error"]
