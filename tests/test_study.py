"""``megatron-gamma sweep`` + ``report`` on examples/studies/smoke.yaml (real pretrain runs).

The uninterrupted sweep is the reference: a sweep killed mid-run and rerun must skip the runs it
finished and end with the same final losses; a changed study over the directory must be refused.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from megatron_gamma.study import rundir
from megatron_gamma.study.spec import StudyChangedError, StudyError, load_study, plan
from megatron_gamma.study.sweep import sweep
from megatron_gamma.study.verdicts import (
    INCONCLUSIVE,
    NOT_MEASURABLE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "examples", "studies", "smoke.yaml")
ENV = {**os.environ, "PYTHONPATH": ROOT, "TORCHDYNAMO_DISABLE": "1"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "megatron_gamma.cli", *args],
        env=ENV,
        capture_output=True,
        text=True,
        **kw,
    )


def _final_losses(study_dir: str, study: str = SMOKE) -> dict[str, float]:
    runs = plan(load_study(study), study_dir)
    return {r.key: rundir.read_run(os.path.join(study_dir, r.key)).final_valid_loss() for r in runs}


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("smoke") / "study")
    proc = _cli("sweep", SMOKE, "--output-dir", out, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _changed_study(tmp_path, edit) -> str:
    """smoke.yaml with absolute paths and ``edit`` applied, written under tmp_path."""
    with open(SMOKE, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    base = os.path.dirname(SMOKE)
    raw["config"] = [os.path.normpath(os.path.join(base, p)) for p in raw["config"]]
    raw["data"]["inputs"] = [os.path.normpath(os.path.join(base, p)) for p in raw["data"]["inputs"]]
    raw["data"]["tokenizer_model"] = os.path.normpath(
        os.path.join(base, raw["data"]["tokenizer_model"])
    )
    edit(raw)
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path)


def test_study_file_errors_name_the_key(tmp_path):
    def bad_size(raw):
        raw["sizes"]["d32"]["widht"] = 3

    with pytest.raises(StudyError, match=r"sizes\.d32\.widht"):
        load_study(_changed_study(tmp_path, bad_size))

    def bad_arm_field(raw):
        raw["arms"]["baseline"]["init_gama"] = 0.5

    # a misspelt factor is refused with the arm's other keys, before any run is planned
    with pytest.raises(StudyError, match=r"^arms\.baseline=\{'init_gama': 0\.5\}: .*\(init_gama\)"):
        load_study(_changed_study(tmp_path, bad_arm_field))


@pytest.mark.slow
def test_dry_run_prints_plan_and_writes_nothing(tmp_path):
    out = tmp_path / "plan"
    proc = _cli("sweep", SMOKE, "--output-dir", str(out), "--dry-run", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if "/seed-" in ln]
    assert len(lines) == 4 and all(ln.endswith("to run") for ln in lines)
    # d64 at 16 iterations x 8 x 64 tokens; params from the estimator (vocab 4096)
    (d64,) = [ln for ln in lines if ln.startswith("baseline/d64/seed-1 ")]
    assert "8,192" in d64 and "655,680" in d64
    assert "estimated time left" in proc.stdout
    assert "runs left: 4\n" in proc.stdout  # no LR grid: no word of confirm runs
    assert not out.exists()
    proc = _cli("sweep", SMOKE, "--output-dir", str(out), "--slurm", "--dry-run", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    script = proc.stdout
    assert "#SBATCH --array=0-3" in script and script.count("/seed-1\n") == 4
    assert '--config "$2/study-config.yaml"' in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not out.exists()
    proc = _cli("sweep", SMOKE, "--output-dir", str(out), "--partition", "gpu", timeout=300)
    assert proc.returncode == 2 and "only used with --slurm" in proc.stderr


@pytest.mark.slow
def test_smoke_sweep_run_directories_complete(smoke_dir):
    runs = plan(load_study(SMOKE), smoke_dir)
    assert len(runs) == 4
    for run in runs:
        d = os.path.join(smoke_dir, run.key)
        for name in ("config.yaml", "metrics.jsonl", "init_audit.json", "study-run.json"):
            assert os.path.isfile(os.path.join(d, name)), (run.key, name)
        rec = rundir.read_run(d)
        assert rec.checkpoint == run.train_iters == 16
        assert 4.0 < rec.final_valid_loss() < 9.0
        assert rec.series("stable_rank") and rec.series("sink_share")
        with open(os.path.join(d, "config.yaml"), encoding="utf-8") as f:
            cfg = yaml.safe_load(f)
        assert cfg["init"]["init_gamma"] == (0.5 if run.arm == "baseline" else 1.0)
        with open(os.path.join(d, "pretrain.log"), encoding="utf-8") as f:
            warned = [line for line in f if "no effect" in line]
        assert warned == [  # trial 9: 104 lines, one per default the resolved config records
            "megatron-gamma pretrain: warning: split='95,5,0': no effect under these settings; "
            "it counts with --data-path (not per-split paths, not --mock-data)\n"
        ]


@pytest.mark.slow
def test_killed_sweep_resumes_without_redoing_finished_runs(smoke_dir, tmp_path):
    """The smoke study's two d32 runs (half its cost): the second killed after its first
    checkpoint, then the sweep rerun; the final losses are the uninterrupted sweep's."""

    def d32_only(raw):
        del raw["sizes"]["d64"]

    study = _changed_study(tmp_path, d32_only)
    out = str(tmp_path / "study")
    runs = plan(load_study(study), out)
    assert len(runs) == 2
    second = os.path.join(out, runs[1].key, rundir.CHECKPOINTS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "megatron_gamma.cli", "sweep", study, "--output-dir", out],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        it = rundir.latest_iteration(second) if os.path.isdir(second) else None
        if it is not None:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = rundir.latest_iteration(second)
    assert killed_at is not None and killed_at < runs[1].train_iters, killed_at
    first = os.path.join(out, runs[0].key, rundir.METRICS)
    before = (os.stat(first).st_mtime_ns, open(first, encoding="utf-8").read())
    done = _cli("sweep", study, "--output-dir", out, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{runs[0].key}: finished, skipped" in done.stdout
    assert (os.stat(first).st_mtime_ns, open(first, encoding="utf-8").read()) == before
    with open(os.path.join(out, runs[1].key, "pretrain.log"), encoding="utf-8") as f:
        assert f.read().count("$ ") == 2  # started, killed, resumed
    uninterrupted = _final_losses(smoke_dir)
    assert _final_losses(out, study) == {r.key: uninterrupted[r.key] for r in runs}


@pytest.mark.slow
def test_changed_study_is_refused(smoke_dir, tmp_path):
    def arm(raw):
        raw["arms"]["baseline"]["init_gamma"] = 0.6

    with pytest.raises(StudyChangedError, match=r"init_gamma: 0\.5 -> 0\.6"):
        sweep(_changed_study(tmp_path, arm), smoke_dir)

    def budget(raw):
        raw["sizes"]["d64"]["tokens"] = 16384

    with pytest.raises(StudyChangedError, match=r"baseline/d64/seed-1.*train_iters: 16 -> 32"):
        sweep(_changed_study(tmp_path, budget), smoke_dir)
    proc = _cli("sweep", _changed_study(tmp_path, arm), "--output-dir", smoke_dir, timeout=300)
    assert proc.returncode == 2 and "the study changed this existing run" in proc.stderr


@pytest.mark.slow
def test_report_on_smoke_study(smoke_dir):
    proc = _cli("report", smoke_dir, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = os.path.join(smoke_dir, "report")
    with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
        summary = json.load(f)
    verdicts = summary["verdicts"]
    assert len(verdicts) == 12
    listed = proc.stdout.split("verdicts (the numbers and rules: ", 1)[1].splitlines()[1:]
    assert listed == [
        f"- {v['claim']} [{v['lr']}]: {v['verdict']}" + (f": {v['reason']}" if v["reason"] else "")
        for v in verdicts
    ]
    assert listed[1].endswith("[best LR]: inconclusive: not measured: this study has no LR grid, "
                              "so each arm's own best LR is unknown and a difference at one "
                              "shared LR may be the arms' different best LRs (add lr_grid to the "
                              "study file)")  # fmt: skip
    for v in verdicts:
        assert v["verdict"] in (
            REPRODUCED,
            NOT_REPRODUCED,
            INCONCLUSIVE,
            NOT_MEASURABLE,
            NOT_MEASURED,
        )
        assert v["numbers"] and v["rule"], v
        if v["verdict"] != INCONCLUSIVE:
            assert any(ch.isdigit() for ch in v["numbers"]), v
    # two arms, one seed: no γ = 1 arm without fixes and no interval, so claims 1-3 stay open,
    # at the shared LR and at the best LR (not measured: no LR grid)
    assert [v["verdict"] for v in verdicts[:6]] == [INCONCLUSIVE] * 6
    assert [v["lr"] for v in verdicts[:6]] == ["shared LR", "best LR"] * 3
    assert "no γ = 1 arm with the baseline's ε and gate" in verdicts[0]["numbers"]
    assert verdicts[1]["numbers"].startswith("not measured: this study has no LR grid")
    # Δsym: the compared checkpoints must have learned (their held-out loss δ below the token
    # frequencies'), and the profile needs >= 2 seeds
    with open(os.path.join(out, "compare", "seed-1", "compare.json"), encoding="utf-8") as f:
        scored = json.load(f)
    bar = summary["unigram_loss"] - 0.01
    if max(scored["a"]["mean_loss"], scored["b"]["mean_loss"]) >= bar:
        assert verdicts[-1]["verdict"] == NOT_MEASURED
        assert "not learned: the compared checkpoints' mean loss" in verdicts[-1]["numbers"]
    else:
        assert "1 seed" in verdicts[-1]["numbers"]
    losses = _final_losses(smoke_dir)
    table = {(r["arm"], r["size"]): r for r in summary["losses"]}
    gate = table[("gamma1+eps+gate", "d64")]
    assert gate["mean"] == losses["gamma1+eps+gate/d64/seed-1"]
    assert gate["diff"] == pytest.approx(
        losses["gamma1+eps+gate/d64/seed-1"] - losses["baseline/d64/seed-1"], abs=1e-12
    )
    # the trajectories start at initialization (diagnostics logged at iteration 0)
    for mech in summary["mechanisms"].values():
        assert min(int(it) for it in mech["series"]["stable_rank"]) == 0
    # the Δsym row comes from `compare` between γ = 1 + both fixes and the baseline, per seed
    assert summary["compare"]["arm"] == "gamma1+eps+gate"
    with open(os.path.join(out, "compare", "seed-1", "compare.json"), encoding="utf-8") as f:
        cmp = json.load(f)
    assert sum(b["count"] for b in cmp["bins"]) == cmp["tokens"] > 0
    for name in ("loss_vs_size", "saturation", "sink_share", "stable_rank"):
        with open(os.path.join(out, f"{name}.png"), "rb") as f:
            head = f.read()
        assert head.startswith(PNG_MAGIC) and len(head) > 5000, name
    with open(os.path.join(smoke_dir, "report.md"), encoding="utf-8") as f:
        md = f.read()
    assert md.count("| **") == 12 and "megatron-gamma sweep" in md
    assert "The table has 12 rows and decides none of them" in md
    assert (
        "k = 12 rows (12 ways) the chance of a false 'reproduced' is at most 12 · 2.5%, 30%" in md
        and "adjustment for multiplicity" in md
    )
    assert 0 < summary["unigram_loss"] < math.log(summary["vocab_size"])
    assert (
        f"below {summary['unigram_loss'] - 0.01:.4f} nats, δ = 0.01 nats below the held-out loss "
        f"of the train split's token frequencies, {summary['unigram_loss']:.4f} nats" in md
    )
    assert "- code: megatron-gamma commit " in md and "No LR grid in this study" in md
    # the per-seed Δsym table: each bin's interval with its df (Bell–McCaffrey, of the bin's
    # tokens per document, one decimal)
    for b in cmp["bins"]:
        if b.get("low") is not None:
            row = f"| {b['count']} ({b['documents']}) | {b['mean_delta']:+.4f} [{b['low']:+.4f}, "
            assert 1 <= b["df"] <= b["documents"] - 1 + 1e-9
            assert f"{row}{b['high']:+.4f}] (df {b['df']:.1f}) |" in md
    assert "(over these tokens, not those of the final validation loss above)" in md


def test_report_replaces_only_an_earlier_report(tmp_path):
    """report --output PATH overwrote any file there (a pretrain config, with a folder of plots
    made beside it); it replaces only a report it wrote, and refuses the rest before the study
    directory is read (it does not exist here)."""
    from megatron_gamma.config import ConfigError
    from megatron_gamma.study.report import check_report_output, report

    config = tmp_path / "demo.yaml"
    config.write_text("model: {num_layers: 2}\n")
    with pytest.raises(ConfigError) as e:
        report(str(tmp_path / "no-study"), output=str(config))
    assert str(e.value) == (
        f"output={str(config)!r}: exists and is not a report `megatron-gamma report` wrote (its "
        "first line: 'model: {num_layers: 2}'); report replaces only an earlier report. Fix: "
        "pass another --output (a new .md path), or remove it"
    )
    assert config.read_text() == "model: {num_layers: 2}\n" and not (tmp_path / "demo").exists()
    with pytest.raises(ConfigError, match="a directory, not a report file"):
        check_report_output(str(tmp_path))
    earlier = tmp_path / "report.md"
    earlier.write_text("# Study `smoke`: measured reproduction report\n\nold\n")
    check_report_output(str(earlier))
    (tmp_path / "report").write_text("not a folder")
    with pytest.raises(ConfigError, match="its plots folder .* exists and is not a directory"):
        check_report_output(str(earlier))
