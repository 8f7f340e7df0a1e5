"""``report``'s per-seed ``compare`` between claim 8's arm and the baseline (``run_compare``): the
checkpoints are found as every other command finds a run's (``rundir.resolve_checkpoint``), and
a run without one gives the report a named error, not a crash."""

from __future__ import annotations

import os

import pytest

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


def _finished_study(study_dir, edit) -> str:
    """``study_dir`` holding study.json and two finished-looking runs (a checkpoint at
    iteration 10 and its validation), the first run's entry changed by ``edit``."""
    import json

    runs = []
    for arm, gamma in (("baseline", 0.5), ("gamma1", 1.0)):
        key = f"{arm}/s1/seed-1"
        ckpt = study_dir / key / "checkpoints" / "iter_0000010"
        ckpt.mkdir(parents=True)
        (ckpt / "metadata.json").write_text("{}")
        (ckpt.parent / "latest_checkpointed_iteration.txt").write_text("10")
        record = {"iteration": 10, "split": "valid", "loss": 5.0}
        (study_dir / key / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        runs.append(
            {"key": key, "arm": arm, "size": "s1", "seed": 1, "train_iters": 10, "lr": 1e-3,
             "non_embedding": 1000, "init_gamma": gamma, "norm_epsilon": 1e-5,
             "gated_attention": "none", "seq_length": 16, "hidden_size": 32, "num_layers": 1,
             "params": 2000, "tokens": 160, "lr_phase": "shared"}
        )  # fmt: skip
    edit(runs[0])
    manifest = {"name": "t", "baseline": "baseline", "heldout": "h", "runs": runs,
                "study": "s.yaml", "sweep_command": "megatron-gamma sweep s.yaml"}  # fmt: skip
    (study_dir / "study.json").write_text(json.dumps(manifest))
    return str(study_dir / "study.json")


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda e: e.update(seed="1/../../../../escaped"), "seed='1/../../../../escaped'"),
        (lambda e: e.update(seed=True), "seed=True"),
        (lambda e: e.update(arm="../../escaped"), "arm='../../escaped'"),
        (lambda e: e.update(size="/abs"), "size='/abs'"),
        (lambda e: e.update(key="../../../escaped"), "key='../../../escaped'"),
        (lambda e: e.update(key="baseline/s1/../../x/seed-1"), "key='baseline/s1/../../x/seed-1'"),
    ],
)
def test_a_manifest_whose_names_lead_out_of_the_study_is_refused(
    tmp_path, monkeypatch, edit, field
):
    """study.json names the run directories ``report`` reads and, by seed, where ``compare``
    writes (REPORT/compare/seed-S): a manifest from elsewhere must not steer them out of the
    study (a seed ``1/../../../../escaped`` sent compare's output next to the study)."""
    from megatron_gamma.config import ConfigError
    from megatron_gamma.study import report as report_mod

    study_dir = tmp_path / "study"
    path = _finished_study(study_dir, edit)
    started = []

    def run(cmd, **kwargs):  # compare's output directory is recorded; nothing runs
        started.extend(cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--output-dir")
        return report_mod.subprocess.CompletedProcess(cmd, 1, stdout="", stderr="not run")

    monkeypatch.setattr(report_mod.subprocess, "run", run)
    with pytest.raises(ConfigError) as e:
        report_mod.report(str(study_dir))
    assert str(e.value).startswith(f"{path}: runs[0].{field}: ")
    assert "Fix: restore study.json as sweep wrote it" in str(e.value)
    assert started == []
    assert sorted(os.listdir(tmp_path)) == ["study"]
    assert "report" not in os.listdir(study_dir)
