"""tools/gpu_acceptance.sh on CPU: the dry run runs every step's code path in the offline
rehearsal venv from tools/gpu_wheelhouse.sh's wheelhouse (without one only the install step's
check differs, tested alone); a bad flag or a bad ops backend fails it; the training command
works end to end (shrunk to a tiny model) and its log is parsed into tokens/s and TFLOP/s;
budgets, the TE skip and the gate-fusion decision."""

import glob
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import gpu_acceptance  # noqa: E402

SHRINK = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
          "--ffn-hidden-size", "128", "--seq-length", "128", "--train-iters", "20",
          "--eval-interval", "20", "--micro-batch-size", "2",
          "--global-batch-size", "2"]  # fmt: skip
STEPS = ["install-wheels", "build-extension", "kernel-tests", "bench-rmsnorm", "init-parity",
         "init-time", "gate-cost", "data",
         *(f"train-{v}" for v in gpu_acceptance.TRAIN_VARIANTS)]  # fmt: skip


@pytest.mark.slow
def test_install_step_without_a_wheelhouse_checks_that_the_wheels_modules_import(tmp_path):
    """The one step whose dry run differs without --wheelhouse (the full dry run is the
    rehearsal's, below): it imports every module the wheels bring, and a missing one is refused
    with the fix."""
    step = gpu_acceptance.plan(str(tmp_path))[0]
    assert step.name == "install-wheels" and step.dry is None
    assert gpu_acceptance.check_command(step) == (
        f"no --wheelhouse: {', '.join(gpu_acceptance.WHEEL_MODULES)} import already"
    )
    shadow = tmp_path / "shadow"
    (shadow / "nltk").mkdir(parents=True)
    (shadow / "nltk" / "__init__.py").write_text("raise ImportError('shadowed')\n")
    step.env["PYTHONPATH"] = f"{shadow}{os.pathsep}{step.env['PYTHONPATH']}"
    with pytest.raises(RuntimeError, match=r"\['nltk'\] not importable and no --wheelhouse\. Fix"):
        gpu_acceptance.check_command(step)


@pytest.mark.slow
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


@pytest.mark.slow
def test_rehearsal_installs_from_the_wheelhouse_in_an_offline_venv(tmp_path):
    """The wheelhouse (downloaded here: CI has the registry) is complete: in a venv that sees only
    the lent machine's packages and no index, every step's code path runs."""
    wheelhouse, out = tmp_path / "wheelhouse", tmp_path / "out"
    r = subprocess.run(["bash", "tools/gpu_wheelhouse.sh", str(wheelhouse)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    cp312 = sorted(os.path.basename(w).split("-")[0] for w in glob.glob(f"{wheelhouse}/cp312/*"))
    assert cp312 == ["awkward", "awkward_cpp", "defusedxml", "gigatoken", "isal", "megatron_core",
                     "nltk", "orjson", "zstandard"]  # fmt: skip
    assert "cp312: 9 wheels" in r.stdout and "requirements met" in r.stdout
    r = subprocess.run(
        ["bash", "tools/gpu_acceptance.sh", str(out), "--dry-run", "--wheelhouse", str(wheelhouse)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    wheels = "megatron.core, gigatoken, awkward, nltk, zstandard, orjson, isal"
    assert f"{wheels} absent until" in r.stdout
    doc = json.loads((out / "gpu_acceptance.json").read_text())
    assert [s["name"] for s in doc["steps"]] == STEPS
    assert all(s["status"] == "dry-run ok" for s in doc["steps"]), doc["steps"]
    assert "--no-index --no-deps" in doc["steps"][0]["detail"]
    kernel = doc["steps"][2]["detail"]
    assert int(kernel.split()[0]) > 0 and "CUDA test cases collected" in kernel
    assert "| train-ops-reference | dry-run ok |" in (out / "gpu_acceptance.md").read_text()
    assert glob.glob(f"{out}/site/megatron_core-0.16.1.dist-info")
    venv_site = glob.glob(f"{out}/rehearsal-venv/lib/python3.*/site-packages")[0]
    assert os.path.islink(f"{venv_site}/torch") and not os.path.exists(f"{venv_site}/megatron")
    figures = {s["name"]: s["figures"] for s in doc["steps"]}
    parity = figures["init-parity"]
    assert parity["bit_identical"] and len(parity["tensors"]) == 6
    gate = figures["gate-cost"]
    assert sorted(gate["seconds"]) == sorted(gpu_acceptance.GATE_ARMS)
    rounds = {arm: len(t) for arm, t in gate["seconds"].items()}
    assert set(rounds.values()) == {gpu_acceptance.GATE_ROUNDS}
    t = gate["seconds"]
    for key, slower, faster in (("share", "separate", "none"), ("fused_share", "fused", "none"),
                                ("fusion_saving", "separate", "fused")):  # fmt: skip
        logs = np.log(np.asarray(t[faster]) / np.asarray(t[slower]))
        half = stats.t.ppf(0.975, logs.size - 1) * logs.std(ddof=1) / math.sqrt(logs.size)
        expected = [1 - math.exp(logs.mean() + d) for d in (0, half, -half)]
        got = gate[key]
        assert [got["mean"], got["low"], got["high"]] == pytest.approx(expected, rel=1e-9)
    assert figures["train-defaults"]["tokens_per_s"] > 0  # tiny, parsed


def test_wheelhouse_without_wheels_for_this_python_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"--wheelhouse .*: no cp3\d+/\*\.whl in it. Fix: bash"):
        gpu_acceptance.plan(str(tmp_path / "out"), str(tmp_path))


def test_a_real_run_without_the_wheels_or_a_wheelhouse_is_refused_before_any_step(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(gpu_acceptance, "_missing_modules", lambda step: ["nltk"])
    with pytest.raises(SystemExit):
        gpu_acceptance.main([str(tmp_path)])
    assert "['nltk'] not importable and no --wheelhouse. Fix: bash" in capsys.readouterr().err
    assert not (tmp_path / "gpu_acceptance.json").exists()


def test_a_step_stops_at_its_budget_and_at_the_deadline(tmp_path):
    sleep = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"]
    step = gpu_acceptance.Step("sleep", sleep, budget_s=1.0)
    start = time.time()
    gpu_acceptance.run_step(step, deadline=start + 100)
    assert step.status == "timed out (1 s)" and "started" in step.output
    assert time.time() - start < 10
    step = gpu_acceptance.Step("sleep", sleep, budget_s=50.0)
    gpu_acceptance.run_step(step, deadline=time.time() + 6)
    assert step.status.startswith("timed out (") and step.seconds < 10
    step = gpu_acceptance.Step("sleep", sleep, budget_s=50.0)
    gpu_acceptance.run_step(step, deadline=time.time() + 2)
    assert (step.status, step.detail) == ("not run", "time budget spent")


def test_transformer_engine_steps_report_not_installed(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_acceptance.importlib.util, "find_spec", lambda name: None)
    step = {s.name: s for s in gpu_acceptance.plan(str(tmp_path))}["train-transformer-engine"]
    gpu_acceptance.run_step(step, deadline=time.time() + 100)
    assert (step.status, step.detail) == (
        "skipped",
        "Transformer Engine not installed on this machine",
    )


def _train(name: str, tokens_per_s: list[float]) -> gpu_acceptance.Step:
    step = gpu_acceptance.Step(f"train-{name}", [])
    step.figures = {"interval_tokens_per_s": tokens_per_s}
    return step


def _welch_share(gated: list[float], ungated: list[float]) -> tuple[float, float, float, float]:
    """fp64 Welch interval on mean log tokens/s, written out (not scipy's ttest_ind)."""
    a, b = np.log(gated), np.log(ungated)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    d, half = a.mean() - b.mean(), stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    return 1 - math.exp(d), 1 - math.exp(d + half), 1 - math.exp(d - half), df


def test_gate_share_is_welchs_interval_on_log_tokens_per_s():
    # the H200's second run (docs/gpu-acceptance.md): defaults vs --gated-attention none
    gated, ungated = [258582, 228987, 257744, 224473], [249573, 207758, 218415, 270835]
    iv = gpu_acceptance.gate_share(gated, ungated)
    share, low, high, df = _welch_share(gated, ungated)
    assert (iv.mean, iv.low, iv.high, iv.df) == pytest.approx((share, low, high, df), rel=1e-9)
    assert iv.n == 8 and low < 0 < high
    assert not gpu_acceptance.gate_share([990], [1000]).has_interval
    with pytest.raises(ValueError, match="positive"):
        gpu_acceptance.gate_share([0, 1], [1, 1])


def _probe(**intervals: tuple[float, float, float]) -> gpu_acceptance.Step:
    step = gpu_acceptance.Step("gate-cost", [])
    step.figures = {key: {"mean": m, "low": lo, "high": hi, "n": 12, "df": 11, "unit": "rounds"}
                    for key, (m, lo, hi) in intervals.items()}  # fmt: skip
    return step


def test_gate_fusion_is_decided_by_the_measured_saving_and_never_by_the_share_alone():
    def decide(*steps):
        return gpu_acceptance.gate_decision({s.name: s for s in steps})

    ungated = [1000.0, 1002.0, 998.0, 1001.0]
    assert decide() == ""
    three = [_train("defaults", [x * 0.97 for x in ungated]),
             _train("gated-attention-none", ungated)]  # fmt: skip
    # the gate's share bounds the saving from above: above 1% it cannot decide for fusing
    assert decide(*three).startswith("gate's share of the step on the local spec: 3.00% [")
    assert decide(*three).endswith(
        "inconclusive, fusing saves at most the gate's share and the fused layout was not "
        "measured: the gate rows stay unfused"
    )
    half = [_train("defaults", [x * 0.995 for x in ungated]),
            _train("gated-attention-none", ungated)]  # fmt: skip
    assert decide(*half).endswith("not above 1%: do not fuse the gate rows into the QKV projection")
    single = [_train("defaults", [996.0]), _train("gated-attention-none", [1000.0])]
    assert "(2 logged intervals of 10 steps: no interval): inconclusive" in decide(*single)
    # the gate-cost step's share comes before the training runs', TE's before both
    share_only = _probe(share=(0.10, 0.066, 0.138))
    assert decide(*half, share_only).startswith(
        "gate's share of the step on the local spec, forward+backward alternated in one process: "
        "10.00% [6.60, 13.80] (df 11.0, 12 rounds): inconclusive"
    )
    te = [_train("transformer-engine", [x * 0.995 for x in ungated]),
          _train("transformer-engine-gated-attention-none", ungated)]  # fmt: skip
    assert decide(*three, share_only, *te).startswith(
        "gate's share of the step on Transformer Engine: 0.50% ["
    )
    # the measured saving decides over everything else, on its whole interval
    saving = "fusing the gate rows into the QKV projection (megatron-core's attention_output_gate)"
    fuse = _probe(share=(0.10, 0.07, 0.14), fusion_saving=(0.02, 0.015, 0.025))
    assert decide(*half, *te, fuse) == (
        f"{saving} saves 2.00% [1.50, 2.50] (df 11.0, 12 rounds) of a forward+backward pass "
        "against the separate gate projection: above 1%: FUSE the gate rows into the QKV "
        "projection"
    )
    keep = _probe(share=(0.10, 0.07, 0.14), fusion_saving=(0.002, -0.004, 0.008))
    assert decide(keep).endswith("not above 1%: do not fuse the gate rows into the QKV projection")
    unsure = _probe(share=(0.10, 0.07, 0.14), fusion_saving=(0.01, -0.01, 0.03))
    assert decide(unsure).endswith(
        "inconclusive, the interval spans 1%: the gate rows stay unfused"
    )
