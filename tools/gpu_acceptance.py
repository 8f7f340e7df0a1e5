"""GPU acceptance run: kernels, RMSNorm bandwidth, the counter-based init and 0.1B training speed
on one GPU, in a time budget, with results written after every step
(``bash tools/gpu_acceptance.sh OUT_DIR --wheelhouse DIR``).

Steps, in order, each a subprocess limited to its own budget (:data:`BUDGET_S`, printed; the
whole run: 540 s) and the time left:

1. ``install-wheels``: ``pip install --no-index --no-deps --target OUT_DIR/site`` of the
   wheelhouse made by ``tools/gpu_wheelhouse.sh`` (``DIR/cpXY`` for this Python; no registry is
   needed, the system site is left as it is); ``OUT_DIR/site`` is on every later step's
   ``PYTHONPATH``. Skipped when megatron-core, gigatoken, awkward, nltk, zstandard, orjson, isal
   import.
2. ``build-extension``: ``python setup.py build_ext --inplace`` against the torch that is there,
   with ``MEGATRON_GAMMA_BUILD_EXT=1``, ``TORCH_CUDA_ARCH_LIST`` = this GPU's
   ``torch.cuda.get_device_capability()`` only and ``MAX_JOBS`` = CPUs. Skipped when the
   compiled kernels already have CUDA.
3. ``kernel-tests``: the CUDA cases of the ops tests (``pytest -k cuda``) and the fp16 training
   test with a loss-scaler resume (``tests/test_precision.py``), which needs a GPU.
4. ``bench-rmsnorm``: ``tools/bench_rmsnorm.py`` on CUDA, bf16 and fp32, 4096 x {4096, 8192},
   forward and forward+backward against ``F.rms_norm``, ``torch.compile``, apex and TE when
   installed, each as a fraction of device copy bandwidth.
5. ``init-parity``: the counter-based generator (``model/counter_rng.py``) on the GPU against the
   CPU kernel (the C++ one when built, else the torch implementation on CPU), bit for bit, on a
   few tensors: whole, column- and row-sharded, SwiGLU halves, 1-D, bf16.
6. ``init-time``: the 1.5B recipe's weights (``examples/configs/gpt-1.5b.yaml``, one rank)
   built on the GPU with the gamma rule (megatron-core allocates, ``apply_gamma_init`` draws) and
   with ``--init-method normal`` (megatron-core's own GPU init), and ``apply_gamma_init`` alone.
7. ``gate-cost``: the gate's share of a forward+backward pass of the 0.1B recipe and what fusing
   its rows into the QKV projection saves: our separate gate, no gate and megatron-core's fused
   gate alternated in one process (:func:`probe_gate_cost`).
8. ``data``: the packaged demo corpus preprocessed with the demo tokenizer.
9. ``train-*``: the 0.1B recipe (``examples/configs/gpt-0.1b.yaml``) in bf16 at sequence 2048,
   :data:`TRAIN_ITERS` steps, micro-batch = global batch = :data:`MICRO_BATCH`, for: defaults;
   ``--gated-attention none``; ``MEGATRON_GAMMA_OPS=reference``; megatron-core's stock local
   spec (``--layer-spec local --gated-attention none``); and ``--transformer-impl
   transformer_engine`` with and without the gate, which report "Transformer Engine not
   installed on this machine" where it is not; and ``--deterministic-mode`` (every op of the
   step has a deterministic CUDA kernel, else torch's error names the op; its cost against
   defaults, no target). Reported: tokens/s, TFLOP/s per device and MFU,
   medians over the log intervals after the first (warm-up).

Whether the gate rows are fused into the QKV projection (issue 18: only if the separate
projection costs more than :data:`FUSE_GATE_ABOVE` of the step) is decided by
:func:`gate_decision` from the gate-cost step's measured saving, with its interval; without it
only "do not fuse" (the gate's whole share at or below the threshold) or "inconclusive" can be
said. The decision is printed and written.

Targets (printed next to the figures, not enforced): fused RMSNorm >= 85% of copy bandwidth and
>= 1.2x TE/apex; our additions <= 3% slower than the same model without them (defaults vs
``--gated-attention none``, and ``none`` vs the stock spec); MFU of the 0.1B recipe within 10%
of megatron-core's stock spec.

``--dry-run`` (CPU) exercises every step's code path with tiny shapes, so that the real run
cannot fail at an import or an argument: the wheels are installed (with ``--wheelhouse``; see
``tools/gpu_acceptance.sh`` for the offline rehearsal venv), ``setup.py`` is evaluated with the
install step's environment, the CUDA tests are collected, the RMSNorm bench and both init probes
run on CPU at tiny sizes, the demo corpus is preprocessed, the defaults variant trains a tiny
model for a few steps and its log is parsed, and every other training command's flags are
parsed into a config (its environment's imports checked). ``OUT_DIR/gpu_acceptance.json`` holds
every step's command, budget, status, seconds and figures; ``gpu_acceptance.md`` the same as
tables.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron_gamma.study.fits import Interval

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_ITERS = 50
GATE_ROUNDS = 12
GATE_PASSES = 5
"""The gate-cost step: rounds, and forward+backward passes of each model per round."""
LOG_INTERVAL = 10
INTERVAL_UNIT = f"logged intervals of {LOG_INTERVAL} steps"
"""What one unit of :func:`gate_share`'s interval is."""
MICRO_BATCH = 8
RECIPE = os.path.join(ROOT, "examples", "configs", "gpt-0.1b.yaml")
INIT_RECIPE = os.path.join(ROOT, "examples", "configs", "gpt-1.5b.yaml")
FUSE_GATE_ABOVE = 0.01
"""Fuse the gate rows into the QKV projection only if the gate costs more than this share of
the step (issue 18)."""
TE_MISSING = "Transformer Engine not installed on this machine"
WHEEL_MODULES = (
    "megatron.core", "gigatoken", "awkward", "nltk", "zstandard", "orjson", "isal",
)  # fmt: skip
"""What the wheelhouse brings (tools/gpu_wheelhouse.sh); the lent machine has the rest."""
BUDGET_S = {
    "install-wheels": 30,
    "build-extension": 120,
    "kernel-tests": 90,
    "bench-rmsnorm": 60,
    "init-parity": 20,
    "init-time": 45,
    "gate-cost": 40,
    "data": 20,
    "train": 40,
}
"""Seconds each step may take on the H200 (``train``: each variant); 625 s for the steps that run
without Transformer Engine, capped by the run's ``--budget-s`` (default 540 s; the steps took
258 s in all on the H200 on 2026-12-04, docs/gpu-acceptance.md)."""
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
        "--ffn-hidden-size", "128"]  # fmt: skip
INTERVAL = re.compile(
    r"iteration\s+(\d+)/\d+ .*tokens/s (\d+) .*TFLOP/s/device ([\d.]+)(?: \| MFU ([\d.]+)%)?"
)
TRAIN_VARIANTS = {
    "defaults": ([], {}),
    "gated-attention-none": (["--gated-attention", "none"], {}),
    "ops-reference": ([], {"MEGATRON_GAMMA_OPS": "reference"}),
    "megatron-core-local-spec": (["--layer-spec", "local", "--gated-attention", "none"], {}),
    "transformer-engine": (["--transformer-impl", "transformer_engine"], {}),
    "transformer-engine-gated-attention-none": (
        ["--transformer-impl", "transformer_engine", "--gated-attention", "none"],
        {},
    ),
    "deterministic-mode": (["--deterministic-mode"], {}),
}


@dataclass
class Step:
    """One step: its command, environment additions, budget, dry-run command (run on CPU; None:
    the command's flags are checked instead) and what came of it."""

    name: str
    cmd: list[str]
    env: dict = field(default_factory=dict)
    budget_s: float = 0.0
    dry: list[str] | None = None
    status: str = "pending"
    seconds: float = 0.0
    detail: str = ""
    figures: dict = field(default_factory=dict)
    output: str = ""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "megatron_gamma.cli", *args]


def _python_tag() -> str:
    return f"cp{sys.version_info[0]}{sys.version_info[1]}"


def wheels(wheelhouse: str | None) -> list[str]:
    """The wheels of ``wheelhouse`` for this Python (``DIR/cpXY/*.whl``); [] without one.

    Raises:
        ValueError: a wheelhouse without wheels for this Python.
    """
    if wheelhouse is None:
        return []
    found = sorted(glob.glob(os.path.join(wheelhouse, _python_tag(), "*.whl")))
    if not found:
        raise ValueError(
            f"--wheelhouse {wheelhouse}: no {_python_tag()}/*.whl in it. Fix: bash "
            f"tools/gpu_wheelhouse.sh {wheelhouse} on a machine with the package registry"
        )
    return found


def plan(out: str, wheelhouse: str | None = None) -> list[Step]:
    """Every step's command (module docstring); ``out/site`` takes the wheels.

    Raises:
        ValueError: see :func:`wheels`.
    """
    demo = os.path.join(ROOT, "megatron_gamma", "data", "demo")
    data = os.path.join(out, "data", "demo")
    site = os.path.join(out, "site")
    path = {
        "PYTHONPATH": os.pathsep.join(p for p in (ROOT, site, os.environ.get("PYTHONPATH")) if p)
    }
    me = [sys.executable, os.path.join(ROOT, "tools", "gpu_acceptance.py")]
    whl = wheels(wheelhouse)
    install = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--target", site, *whl]  # fmt: skip
    build = {"MEGATRON_GAMMA_BUILD_EXT": "1", "MAX_JOBS": str(os.cpu_count() or 4)}
    bench = [sys.executable, "tools/bench_rmsnorm.py", "--device", "cuda", "--tokens", "4096",
             "--hidden", "4096", "8192", "--dtypes", "bf16", "fp32", "--repeats", "3",
             "--min-time", "0.1"]  # fmt: skip
    tiny_bench = [*bench[:3], "cpu", "--tokens", "64", "--hidden", "128", "--dtypes", "bf16",
                  "fp32", "--repeats", "1", "--min-time", "0.01", "--no-compile"]  # fmt: skip
    preprocess = _cli("preprocess", "--input", f"{demo}/en.jsonl", f"{demo}/zh.jsonl",
                      "--tokenizer-model", f"{demo}/tokenizer.json", "--output-prefix", data,
                      "--workers", "4", "--no-progress")  # fmt: skip
    steps = [
        Step("install-wheels", install, dict(path), BUDGET_S["install-wheels"],
             install if whl else None),
        Step("build-extension", [sys.executable, "setup.py", "build_ext", "--inplace"],
             {**path, **build}, BUDGET_S["build-extension"],
             [sys.executable, "setup.py", "--version"]),
        Step("kernel-tests", [sys.executable, "-m", "pytest", "tests/test_ops_rmsnorm.py",
             "tests/test_ops_gate.py", "tests/test_precision.py", "-q", "-k",
             "cuda or fp16_trains", "-p", "no:cacheprovider"],
             dict(path), BUDGET_S["kernel-tests"]),
        Step("bench-rmsnorm", bench, dict(path), BUDGET_S["bench-rmsnorm"], tiny_bench),
        *(Step(f"init-{probe}", [*me, "--probe", probe, "--device", "cuda"], dict(path),
               BUDGET_S[f"init-{probe}"], [*me, "--probe", probe, "--device", "cpu", "--tiny"])
          for probe in ("parity", "time")),
        Step("gate-cost", [*me, "--probe", "gate", "--device", "cuda"], dict(path),
             BUDGET_S["gate-cost"], [*me, "--probe", "gate", "--device", "cpu", "--tiny"]),
        Step("data", preprocess, dict(path), BUDGET_S["data"], preprocess),
    ]  # fmt: skip
    for name, (flags, env) in TRAIN_VARIANTS.items():
        cmd = _cli(
            "pretrain", "--config", RECIPE, "--tokenizer-model", f"{demo}/tokenizer.json",
            "--data-path", f"{data}_text_document", "--split", "100,0,0", "--seq-length", "2048",
            "--bf16", "--train-iters", str(TRAIN_ITERS), "--lr-warmup-iters", "5",
            "--micro-batch-size", str(MICRO_BATCH), "--global-batch-size", str(MICRO_BATCH),
            "--eval-interval", str(TRAIN_ITERS), "--eval-iters", "0",
            "--log-interval", str(LOG_INTERVAL), "--save", "", "--load", "",
            "--run-dir", os.path.join(out, "runs", name), *flags,
        )  # fmt: skip
        dry = None
        if name == "defaults":  # every variant's code path; the others' flags and imports checked
            dry = [a for a in cmd if a != "--bf16"] + TINY + [
                "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "2",
                "--train-iters", "4", "--eval-interval", "4", "--log-interval", "2",
                "--run-dir", os.path.join(out, "runs", "dry-run-defaults")]  # fmt: skip
        steps.append(Step(f"train-{name}", cmd, {**path, **env}, BUDGET_S["train"], dry))
    return steps


def _env(step: Step) -> dict:
    return dict(os.environ, **step.env)


def _flags(cmd: list[str]) -> list[str]:
    return [a.split("=")[0] for a in cmd if a.startswith("--")]


def check_command(step: Step) -> str:
    """Dry-run check of the command line of a step without a dry-run command (module
    docstring); returns what was checked.

    Raises:
        RuntimeError: a flag the command does not accept, a bad config value, or a failed import.
    """
    cmd = step.cmd
    if step.name == "install-wheels":
        missing = _missing_modules(step)
        if missing:
            raise RuntimeError(
                f"install-wheels: {missing} not importable and no --wheelhouse. "
                "Fix: bash tools/gpu_wheelhouse.sh DIR, then --wheelhouse DIR"
            )
        return f"no --wheelhouse: {', '.join(WHEEL_MODULES)} import already"
    if "pytest" in cmd:
        collect = [*cmd, "--collect-only"]
        r = subprocess.run(collect, cwd=ROOT, env=_env(step), capture_output=True, text=True)
        found = re.search(r"(\d+)(?:/\d+)? tests? collected|(\d+) tests? selected", r.stdout)
        n = int(next(g for g in found.groups() if g)) if found else 0
        if r.returncode != 0 or n == 0:
            raise RuntimeError(f"{step.name}: `{shlex.join(collect)}` collected no CUDA test:\n"
                               f"{r.stdout[-2000:]}{r.stderr[-2000:]}")  # fmt: skip
        return f"{n} CUDA test cases collected"
    if cmd[1:3] == ["-m", "megatron_gamma.cli"] and cmd[3] == "pretrain":
        from megatron_gamma.cli import build_parser
        from megatron_gamma.config import load_config, overrides_from_args

        if "--transformer-impl" in cmd and "--transformer-impl" not in _help(cmd[:4], step):
            return "skipped on a GPU run: --transformer-impl is not in this checkout"
        try:
            args = build_parser().parse_args(cmd[3:])
        except SystemExit as e:
            raise RuntimeError(f"{step.name}: pretrain refuses `{shlex.join(cmd[3:])}`") from e
        load_config(args.config, overrides_from_args(args))
        extra = {k: v for k, v in step.env.items() if k != "PYTHONPATH"}
        if extra:  # e.g. MEGATRON_GAMMA_OPS: checked when megatron_gamma.ops is imported
            probe = [
                sys.executable,
                "-c",
                "import megatron_gamma.ops, megatron_gamma.training.loop",
            ]
            r = subprocess.run(probe, cwd=ROOT, env=_env(step), capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{step.name}: import with {extra} failed:\n{r.stderr[-2000:]}")
            return f"flags parsed, config built, imports ok with {extra}"
        return "flags parsed and config built"
    help_text = _help(cmd[: 4 if cmd[1] == "-m" else 2], step)
    missing = [f for f in _flags(cmd) if f not in help_text]
    if missing:
        raise RuntimeError(f"{step.name}: {missing} not accepted by `{shlex.join(cmd)}`")
    return f"flags {_flags(cmd)} accepted"


def _help(prefix: list[str], step: Step) -> str:
    r = subprocess.run([*prefix, "--help"], cwd=ROOT, env=_env(step), capture_output=True,
                       text=True)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"`{shlex.join(prefix)} --help` failed:\n{r.stderr[-2000:]}")
    return r.stdout


def _missing_modules(step: Step) -> list[str]:
    """Which of :data:`WHEEL_MODULES` do not import with ``step``'s environment."""
    probe = (
        "import importlib, sys\n"
        f"for m in {WHEEL_MODULES!r}:\n"
        "    try:\n        importlib.import_module(m)\n"
        "    except ImportError:\n        print(m)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd="/", env=_env(step),
                       capture_output=True, text=True)  # fmt: skip
    return r.stdout.split()


def _extension_status(step: Step) -> str:
    probe = "from megatron_gamma import ops; print(ops.extension_status())"
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=_env(step),
                       capture_output=True, text=True)  # fmt: skip
    return r.stdout.strip() if r.returncode == 0 else f"megatron_gamma does not import: {r.stderr}"


def _cuda_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def _train_figures(output: str) -> dict:
    rows = [m.groups() for m in INTERVAL.finditer(output)]
    steady = rows[1:] or rows
    if not steady:
        return {}
    figures = {
        "tokens_per_s": statistics.median(float(r[1]) for r in steady),
        "interval_tokens_per_s": [float(r[1]) for r in steady],
        "tflops_per_device": statistics.median(float(r[2]) for r in steady),
        "intervals": len(steady),
    }
    if all(r[3] for r in steady):
        figures["mfu_percent"] = statistics.median(float(r[3]) for r in steady)
    return figures


def _figures(step: Step) -> dict:
    """What a finished step measured, from its output."""
    if step.name.startswith("train-"):
        return _train_figures(step.output)
    if step.name == "kernel-tests" and (m := re.search(r"(\d+) passed", step.output)):
        return {"passed": int(m.group(1))}
    if step.name.startswith(("init-", "gate-")) and (
        m := re.search(r"^FIGURES (.*)$", step.output, re.M)
    ):
        return json.loads(m.group(1))
    return {}


def _skip_reason(step: Step) -> str:
    if step.name == "install-wheels" and not _missing_modules(step):
        return f"{', '.join(WHEEL_MODULES)} import already"
    if step.name == "build-extension" and "cuda" in (status := _extension_status(step)):
        return f"compiled kernels present: {status}"
    if step.name.startswith("train-transformer-engine"):
        if importlib.util.find_spec("transformer_engine") is None:
            return TE_MISSING
        if "--transformer-impl" not in _help(step.cmd[:4], step):
            return "--transformer-impl is not in this checkout"
    return ""


def _run(step: Step, cmd: list[str], timeout: float) -> None:
    start = time.time()
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=_env(step), capture_output=True, text=True,
                           timeout=timeout)  # fmt: skip
        step.output = (r.stdout + r.stderr)[-20000:]
        step.status = "ok" if r.returncode == 0 else f"failed (exit {r.returncode})"
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"") + (e.stderr or b"")
        step.output = (text.decode(errors="replace") if isinstance(text, bytes) else text)[-20000:]
        step.status = f"timed out ({timeout:.0f} s)"
    step.seconds = round(time.time() - start, 1)
    step.figures = _figures(step)


def run_step(step: Step, deadline: float) -> None:
    """Run ``step`` within its budget and the time left; record status, seconds, output and
    figures."""
    if reason := _skip_reason(step):
        step.status, step.detail = "skipped", reason
        return
    if step.name == "build-extension":
        step.env["TORCH_CUDA_ARCH_LIST"] = _cuda_arch()
        step.detail = f"TORCH_CUDA_ARCH_LIST={step.env['TORCH_CUDA_ARCH_LIST']}"
    left = deadline - time.time()
    if left < 5:
        step.status, step.detail = "not run", "time budget spent"
        return
    _run(step, step.cmd, min(step.budget_s, left))


def dry_run_step(step: Step) -> None:
    """Run ``step``'s dry-run command on CPU, or check its command line (module docstring)."""
    if step.dry is None:
        start = time.time()
        step.detail, step.status = check_command(step), "dry-run ok"
        step.seconds = round(time.time() - start, 1)
        if step.name.startswith("train-transformer-engine") and (
            importlib.util.find_spec("transformer_engine") is None
        ):
            step.detail += f"; the real run here reports: {TE_MISSING}"
        return
    _run(step, step.dry, 600)
    if step.status != "ok":
        raise RuntimeError(f"{step.name}: `{shlex.join(step.dry)}` {step.status}:\n"
                           f"{step.output[-3000:]}")  # fmt: skip
    step.status = "dry-run ok"
    step.detail = f"ran `{shlex.join(step.dry[1:])[:200]}`"
    if step.name == "install-wheels":
        importlib.invalidate_caches()
    if step.name.startswith("train-") and not step.figures:
        raise RuntimeError(f"{step.name}: no training log line parsed:\n{step.output[-3000:]}")


def gate_share(gated: list[float], ungated: list[float]) -> Interval:
    """The gate's share of the step, ``1 - GM(gated) / GM(ungated)`` of the tokens/s of the
    logged intervals (each interval after the warm-up one a unit; one run per variant, so
    run-to-run variation is not in it), with Welch's 95 % interval on the difference of mean
    log tokens/s mapped back (df by Welch-Satterthwaite; NaN with fewer than 2 intervals a side).

    Raises:
        ValueError: no intervals on a side, or tokens/s that are not positive.
    """
    import numpy as np
    from scipy import stats

    from megatron_gamma.study.fits import Interval

    a, b = np.log(np.asarray(gated, float)), np.log(np.asarray(ungated, float))
    if a.size == 0 or b.size == 0 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError(f"tokens/s {gated} and {ungated}: need positive values on both sides")
    diff, n = a.mean() - b.mean(), a.size + b.size
    if min(a.size, b.size) < 2:
        return _share(Interval(diff, math.nan, math.nan, n, 0, INTERVAL_UNIT))
    res = stats.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(0.95)
    return _share(Interval(diff, ci.low, ci.high, n, float(res.df), INTERVAL_UNIT))


def _share(log_ratio: Interval) -> Interval:
    """An interval on a mean log time (or tokens/s) ratio as a share, ``1 - exp(.)`` of the mean
    and of each bound (which swap)."""
    return replace(
        log_ratio,
        mean=1 - math.exp(log_ratio.mean),
        low=1 - math.exp(log_ratio.high),
        high=1 - math.exp(log_ratio.low),
    )


def _interval_text(iv: Interval) -> str:
    if not iv.has_interval:
        return f"{100 * iv.mean:.2f}% ({iv.n} {iv.unit}: no interval)"
    return (f"{100 * iv.mean:.2f}% [{100 * iv.low:.2f}, {100 * iv.high:.2f}] "
            f"(df {iv.df:.1f}, {iv.n} {iv.unit})")  # fmt: skip


def gate_decision(steps: dict[str, Step]) -> str:
    """Whether to fuse the gate rows into the QKV projection: only if that saves more than
    :data:`FUSE_GATE_ABOVE` of the step. From the gate-cost step's ``fusion_saving`` (megatron-
    core's fused gate against our separate projection, paired rounds) when it ran: FUSE when the
    whole interval lies above, do not fuse when it lies at or below, else inconclusive. Without
    it, from the gate's whole share of the step, an upper bound on the saving (on TE when both TE
    variants ran, else the gate-cost step's ``share``, else the local-spec training runs,
    :func:`gate_share`): do not fuse when the whole interval lies at or below, else
    inconclusive. The rows stay unfused (today's layout) unless the verdict is FUSE. '' without
    figures."""

    def intervals(name: str) -> list[float] | None:
        return steps.get(f"train-{name}", Step(name, [])).figures.get("interval_tokens_per_s")

    from megatron_gamma.study.fits import Interval

    at = f"{100 * FUSE_GATE_ABOVE:.0f}%"
    probe = steps.get("gate-cost", Step("gate-cost", [])).figures
    if saving := probe.get("fusion_saving"):
        iv = Interval(**saving)
        head = (f"fusing the gate rows into the QKV projection (megatron-core's "
                f"attention_output_gate) saves {_interval_text(iv)} of a forward+backward pass "
                f"against the separate gate projection")  # fmt: skip
        if iv.has_interval and iv.low > FUSE_GATE_ABOVE:
            return f"{head}: above {at}: FUSE the gate rows into the QKV projection"
        if iv.has_interval and iv.high <= FUSE_GATE_ABOVE:
            return f"{head}: not above {at}: do not fuse the gate rows into the QKV projection"
        return f"{head}: inconclusive, the interval spans {at}: the gate rows stay unfused"
    te = intervals("transformer-engine"), intervals("transformer-engine-gated-attention-none")
    local = intervals("defaults"), intervals("gated-attention-none")
    if all(te):
        on, iv = "Transformer Engine", gate_share(*te)
    elif probe.get("share"):
        on = "the local spec, forward+backward alternated in one process"
        iv = Interval(**probe["share"])
    elif all(local):
        on, iv = "the local spec", gate_share(*local)
    else:
        return ""
    head = f"gate's share of the step on {on}: {_interval_text(iv)}"
    if iv.has_interval and iv.high <= FUSE_GATE_ABOVE:
        return f"{head}: not above {at}: do not fuse the gate rows into the QKV projection"
    return (f"{head}: inconclusive, fusing saves at most the gate's share and the fused layout "
            "was not measured: the gate rows stay unfused")  # fmt: skip


def _comparisons(steps: dict[str, Step]) -> list[str]:
    def fig(name: str, key: str):
        return steps[f"train-{name}"].figures.get(key) if f"train-{name}" in steps else None

    lines = []
    pairs = [
        ("defaults", "gated-attention-none", "tokens_per_s", "gate cost (target <= 3% slower)"),
        ("gated-attention-none", "megatron-core-local-spec", "tokens_per_s",
         "our RMSNorm + SDPA vs stock spec (target <= 3% slower)"),
        ("defaults", "megatron-core-local-spec", "mfu_percent",
         "MFU vs megatron-core stock spec (target within 10%)"),
        ("defaults", "ops-reference", "tokens_per_s", "compiled kernels vs pure-torch ops"),
        ("transformer-engine", "transformer-engine-gated-attention-none", "tokens_per_s",
         "gate cost on TE"),
        ("transformer-engine", "defaults", "tokens_per_s", "TE backend vs local backend"),
        ("deterministic-mode", "defaults", "tokens_per_s",
         "--deterministic-mode's cost (no target)"),
    ]  # fmt: skip
    for a, b, key, what in pairs:
        x, y = fig(a, key), fig(b, key)
        if x and y:
            lines.append(f"- {what}: {a} / {b} = {x / y:.3f} ({key}; medians, one run each)")
    if decision := gate_decision(steps):
        lines.append(f"- decision: {decision}")
    return lines


def write_report(out: str, steps: list[Step], meta: dict) -> None:
    """Write gpu_acceptance.json and .md (temp names, then rename)."""
    from megatron_gamma.atomic import atomic_write_text

    by_name = {s.name: s for s in steps}
    doc = {**meta, "gate_decision": gate_decision(by_name), "steps": [asdict(s) for s in steps]}
    md = [f"# GPU acceptance ({meta['mode']})", ""]
    md += [f"- {k}: {v}" for k, v in meta.items() if k != "mode"] + ["", "## Steps", ""]
    md += ["| step | status | s | budget s | detail |", "|---|---|---|---|---|"]
    md += [f"| {s.name} | {s.status} | {s.seconds} | {s.budget_s:.0f} | {s.detail} |"
           for s in steps]  # fmt: skip
    train = [s for s in steps if s.name.startswith("train-") and s.figures]
    if train:
        md += ["", "## 0.1B recipe, bf16, sequence 2048", "",
               "| variant | tokens/s | TFLOP/s/device | MFU % |", "|---|---|---|---|"]  # fmt: skip
        for s in train:
            f = s.figures
            md.append(
                f"| {s.name[6:]} | {f['tokens_per_s']:.0f} | {f['tflops_per_device']:.1f} | "
                f"{f.get('mfu_percent', '-')} |"
            )
        md += ["", *_comparisons(by_name)]
    for name in ("init-parity", "init-time", "gate-cost"):
        if by_name[name].figures:
            md += ["", f"## {name}", "", "```", json.dumps(by_name[name].figures, indent=1), "```"]
    bench = next((s for s in steps if s.name == "bench-rmsnorm" and s.output), None)
    if bench is not None:
        md += ["", "## RMSNorm (tools/bench_rmsnorm.py)", "", "```", bench.output.strip(), "```"]
    for path, text in ((f"{out}/gpu_acceptance.json", json.dumps(doc, indent=2)),
                       (f"{out}/gpu_acceptance.md", "\n".join(md) + "\n")):  # fmt: skip
        atomic_write_text(path, text)


def probe_init_parity(device: str, tiny: bool) -> dict:
    """The counter-based generator on ``device`` against the CPU (the C++ kernel when built),
    bit for bit, on a few tensors (module docstring, step 5); ``tiny``: 64-wide tensors."""
    import torch

    from megatron_gamma import ops
    from megatron_gamma.model.counter_rng import fill_shard_normal_, stream_key

    n = 64 if tiny else 2048
    cases = [  # label, global shape, partition_dim, parts, rank, halves, dtype
        ("whole", (n, n // 2), None, 1, 0, False, torch.float32),
        ("columns, shard 2 of 4", (n, n), 1, 4, 2, False, torch.float32),
        ("rows, shard 1 of 2", (n, n), 0, 2, 1, False, torch.float32),
        ("swiglu halves, shard 3 of 4", (2 * n, n), 0, 4, 3, True, torch.float32),
        ("1-D, odd length", (3 * n + 1,), None, 1, 0, False, torch.float32),
        ("bf16", (n, n), None, 1, 0, False, torch.bfloat16),
    ]
    rows = []
    for label, shape, dim, parts, rank, halves, dtype in cases:
        local = list(shape)
        if dim is not None:
            local[dim] //= parts
        key = stream_key(1234, f"gpu_acceptance.{label}")
        args = (shape, key, 0.02, dim, parts, rank, halves)
        cpu = fill_shard_normal_(torch.empty(local, dtype=dtype), *args)
        dev = fill_shard_normal_(torch.empty(local, dtype=dtype, device=device), *args).cpu()
        bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
        differ = int((cpu.view(bits) != dev.view(bits)).sum())
        rows.append({"tensor": label, "shape": list(shape), "elements": cpu.numel(),
                     "bits_differ": differ})  # fmt: skip
    return {
        "device": device,
        "cpu_reference": "C++ kernel" if ops.uses_cpu_kernels("cpu") else "torch on CPU",
        "bit_identical": all(r["bits_differ"] == 0 for r in rows),
        "tensors": rows,
    }


def probe_init_time(device: str, tiny: bool) -> dict:
    """Seconds to build the 1.5B recipe's model on ``device`` (one rank) with megatron-core's
    own init (``--init-method normal``) and with the gamma rule, and ``apply_gamma_init`` alone
    (module docstring, step 6); ``tiny``: a 2-layer, 64-wide model of the same recipe."""
    import torch

    from megatron_gamma import parallel
    from megatron_gamma.config import load_config
    from megatron_gamma.model.builder import build_model_chunk, transformer_config
    from megatron_gamma.model.init import apply_gamma_init
    from megatron_gamma.model.vocab import padded_vocab_size

    on_gpu = device == "cuda"
    if on_gpu != parallel.uses_gpu():
        raise ValueError(f"--device {device}: this machine's GPU use is {parallel.uses_gpu()}")
    one_rank = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                "expert_model_parallel_size": 1, "sequence_parallel": False}  # fmt: skip
    if tiny:
        one_rank |= {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                     "ffn_hidden_size": 128, "vocab_size": 1024}  # fmt: skip

    def sync() -> float:
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter()

    recipe = os.path.relpath(INIT_RECIPE, ROOT) + (" (tiny)" if tiny else "")
    figures: dict = {"device": device, "recipe": recipe}
    for label, method in (("warm-up", "normal"), ("mcore_normal", "normal"), ("gamma", "gamma")):
        cfg = load_config(INIT_RECIPE, {"init_method": method, **one_rank})
        if label == "warm-up":
            parallel.initialize(cfg)
        vocab = padded_vocab_size(cfg.model.vocab_size, cfg)
        tcfg = transformer_config(cfg, on_gpu=on_gpu)
        start = sync()
        model, _ = build_model_chunk(cfg, tcfg, vocab)
        figures[f"build_{label}_s"] = round(sync() - start, 3)
        if method == "gamma":
            start = sync()
            apply_gamma_init(model, cfg, vocab)
            figures["gamma_init_only_s"] = round(sync() - start, 3)
        figures["params"] = sum(p.numel() for p in model.parameters())
        del model
    del figures["build_warm-up_s"]
    figures["gamma_over_mcore_build"] = round(
        figures["build_gamma_s"] / figures["build_mcore_normal_s"], 3
    )
    parallel.destroy()
    return figures


GATE_ARMS = {"separate": ("elementwise", False), "none": ("none", False), "fused": ("none", True)}
"""The gate-cost step's models: name -> (``gated_attention``, megatron-core's
``attention_output_gate``): ours (a separate ``linear_gate``, the ``sigmoid_gate`` op), no gate,
and megatron-core's fused elementwise gate (gate rows in ``linear_qkv``, its own sigmoid and
product)."""


def probe_gate_cost(device: str, tiny: bool) -> dict:
    """The gate's share of a forward+backward pass of the 0.1B recipe, and what fusing its rows
    into the QKV projection saves (step 7 of the module docstring): the :data:`GATE_ARMS` built
    side by side in one process (bf16 on the GPU, sequence 2048, micro-batch
    :data:`MICRO_BATCH`, the recipe's vocabulary, random tokens), :data:`GATE_ROUNDS` rounds of
    :data:`GATE_PASSES` passes of each, the order cycling through every permutation. Each round
    gives ``share = 1 - t(none) / t(separate)``, ``fused_share = 1 - t(none) / t(fused)`` and
    ``fusion_saving = 1 - t(fused) / t(separate)``; each interval is Student's over the rounds'
    logarithms (paired rounds, df = rounds - 1). The optimizer step is not timed. ``tiny``: a
    2-layer, 64-wide model at sequence 64, in fp32, for the CPU dry run."""
    import itertools

    import torch

    from megatron_gamma import parallel
    from megatron_gamma.config import load_config
    from megatron_gamma.model.builder import build_model_chunk, transformer_config
    from megatron_gamma.model.vocab import padded_vocab_size
    from megatron_gamma.study.fits import t_interval

    on_gpu = device == "cuda"
    if on_gpu != parallel.uses_gpu():
        raise ValueError(f"--device {device}: this machine's GPU use is {parallel.uses_gpu()}")
    seq, batch = (64, 2) if tiny else (2048, MICRO_BATCH)
    base = {"bf16": on_gpu, "seq_length": seq, "micro_batch_size": batch,
            "global_batch_size": batch}  # fmt: skip
    if tiny:
        base |= {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                 "ffn_hidden_size": 128, "vocab_size": 1024}  # fmt: skip
    models, vocab = {}, 0
    for arm, (gated, fused) in GATE_ARMS.items():
        cfg = load_config(RECIPE, {**base, "gated_attention": gated})
        if not models:
            parallel.initialize(cfg)
        vocab = padded_vocab_size(cfg.model.vocab_size, cfg)
        tcfg = replace(transformer_config(cfg, on_gpu=on_gpu), attention_output_gate=fused)
        models[arm] = build_model_chunk(cfg, tcfg, vocab)[0].to(device)
    gen = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen).to(device)
    position_ids = torch.arange(seq, device=device).expand(batch, seq)

    def passes(model) -> float:
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(GATE_PASSES):
            model.zero_grad(set_to_none=True)
            loss = model(tokens[:, :-1], position_ids, None, labels=tokens[:, 1:])
            loss.float().mean().backward()
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for model in models.values():  # warm-up: allocator, kernels' first launches
        passes(model)
    orders = itertools.cycle(itertools.permutations(GATE_ARMS))
    seconds: dict[str, list[float]] = {arm: [] for arm in GATE_ARMS}
    for _ in range(GATE_ROUNDS):
        for arm in next(orders):
            seconds[arm].append(passes(models[arm]))
    parallel.destroy()

    def paired(slower: str, faster: str) -> dict:
        logs = [math.log(f / s) for s, f in zip(seconds[slower], seconds[faster], strict=True)]
        return _share(t_interval(logs, unit="rounds")).as_dict()

    return {
        "device": device,
        "recipe": os.path.relpath(RECIPE, ROOT) + (" (tiny)" if tiny else ""),
        "tokens_per_pass": batch * seq,
        "ms_per_pass": {
            arm: round(1e3 * statistics.median(t) / GATE_PASSES, 3) for arm, t in seconds.items()
        },  # fmt: skip
        "share": paired("separate", "none"),
        "fused_share": paired("fused", "none"),
        "fusion_saving": paired("separate", "fused"),
        "seconds": seconds,
    }


PROBES = {"parity": probe_init_parity, "time": probe_init_time, "gate": probe_gate_cost}
REHEARSAL = "MEGATRON_GAMMA_REHEARSAL"
"""Set in the rehearsal venv's run (:func:`rehearsal_python`)."""


def _lent_packages(wheelhouse: str) -> set[str]:
    from packaging.utils import canonicalize_name

    path = os.path.join(wheelhouse, "lent-packages.txt")
    if not os.path.exists(path):
        raise ValueError(f"--wheelhouse {wheelhouse}: no lent-packages.txt. Fix: bash "
                         f"tools/gpu_wheelhouse.sh {wheelhouse}")  # fmt: skip
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    return {canonicalize_name(line.split("==")[0]) for line in lines}


def rehearsal_python(out: str, wheelhouse: str) -> str:
    """A fresh venv that models the lent machine; returns its python.

    The venv has no system site-packages; its own site-packages holds symlinks to this
    machine's installed distributions that the lent machine has too (``lent-packages.txt`` of
    the wheelhouse: torch, pip, pytest, ...) and nothing else, so megatron-core, gigatoken,
    awkward, nltk, zstandard, orjson and isal can only come from the wheelhouse.

    Raises:
        ValueError: no ``lent-packages.txt`` in the wheelhouse.
        RuntimeError: a module of :data:`WHEEL_MODULES` imports in the venv before the install
            (a symlinked package holds it), or torch does not.
    """
    import importlib.metadata
    import shutil
    import venv

    from packaging.utils import canonicalize_name

    lent = _lent_packages(wheelhouse)
    home = os.path.join(out, "rehearsal-venv")
    shutil.rmtree(home, ignore_errors=True)
    venv.create(home, with_pip=False, symlinks=True)
    python = os.path.join(home, "bin", "python")
    r = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                       capture_output=True, text=True, check=True, env={})  # fmt: skip
    site = r.stdout.strip()
    linked = set()
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        if name not in lent or name in linked or not dist.files:
            continue
        linked.add(name)
        base = str(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}:
            src, dst = os.path.join(base, top), os.path.join(site, top)
            if os.path.exists(src) and not os.path.lexists(dst):
                os.symlink(src, dst)
    check = (
        "import importlib, sys\n"
        f"for m in {WHEEL_MODULES!r}:\n"
        "    try:\n        importlib.import_module(m)\n        print(m)\n"
        "    except ImportError:\n        pass\n"
        "import torch\n"
    )
    r = subprocess.run([python, "-c", check], capture_output=True, text=True, cwd="/",
                       env={"PATH": os.environ.get("PATH", "")})  # fmt: skip
    if r.returncode != 0 or r.stdout.split():
        raise RuntimeError(
            f"rehearsal venv {home}: imports {r.stdout.split()} before the wheelhouse is "
            f"installed (or torch fails):\n{r.stderr[-2000:]}"
        )
    print(
        f"rehearsal venv {home}: {len(linked)} of the lent machine's packages linked from this "
        f"machine; {', '.join(WHEEL_MODULES)} absent until the wheelhouse is installed"
    )
    return python


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir", nargs="?", help="where gpu_acceptance.{json,md} and the runs go")
    p.add_argument("--dry-run", action="store_true", help="run every step's code path on CPU")
    p.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget, seconds")
    p.add_argument("--wheelhouse", help="tools/gpu_wheelhouse.sh's DIR: the wheels to install")
    p.add_argument("--probe", choices=sorted(PROBES), help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:  # one init-* step, in its own process
        figures = PROBES[args.probe](args.device, args.tiny)
        print("FIGURES " + json.dumps(figures))
        return 0 if figures.get("bit_identical", True) else 1
    if args.out_dir is None:
        p.error("OUT_DIR is required. Fix: bash tools/gpu_acceptance.sh OUT_DIR [--dry-run]")
    if args.budget_s <= 0:
        p.error(f"--budget-s {args.budget_s}: must be > 0. Fix: e.g. 540")
    out = os.path.abspath(args.out_dir)
    wheelhouse = args.wheelhouse and os.path.abspath(args.wheelhouse)
    if args.dry_run and wheelhouse and not os.environ.get(REHEARSAL):
        try:
            wheels(wheelhouse)
            python = rehearsal_python(out, wheelhouse)
        except ValueError as e:
            p.error(str(e))
        keep = ("PATH", "HOME", "LANG", "TMPDIR", "OMP_NUM_THREADS", "TORCHDYNAMO_DISABLE")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.update({REHEARSAL: "1", "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull,
                    "PYTHONNOUSERSITE": "1"})  # fmt: skip
        cmd = [python, os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:])]
        return subprocess.run(cmd, env=env).returncode
    try:
        steps = plan(out, wheelhouse)
    except ValueError as e:
        p.error(str(e))
    os.makedirs(os.path.join(out, "site"), exist_ok=True)
    sys.path[:0] = [ROOT, os.path.join(out, "site")]  # the dry run's in-process config checks
    start = time.time()
    deadline = start + args.budget_s
    meta = {"mode": "dry-run" if args.dry_run else "run", "budget_s": args.budget_s,
            "python": sys.version.split()[0], "wheelhouse": wheelhouse}  # fmt: skip
    import torch

    meta["torch"] = torch.__version__
    if not args.dry_run:
        if not wheelhouse and (missing := _missing_modules(steps[0])):
            p.error(f"{missing} not importable and no --wheelhouse. Fix: bash "
                    "tools/gpu_wheelhouse.sh DIR where the package registry is, carry DIR here, "
                    "and pass --wheelhouse DIR")  # fmt: skip
        if not torch.cuda.is_available():
            p.error("no GPU is visible. Fix: run on a GPU machine, or --dry-run to check on CPU")
        meta["device"] = torch.cuda.get_device_name()
    failed = 0
    for i, step in enumerate(steps, 1):
        print(f"[{time.time() - start:6.1f}s] {i}/{len(steps)} {step.name} "
              f"(budget {step.budget_s:.0f} s) ...", flush=True)  # fmt: skip
        if args.dry_run:
            try:
                dry_run_step(step)
            except Exception as e:  # noqa: BLE001  (report every step, then fail)
                step.detail, step.status = str(e), "dry-run FAILED"
                failed += 1
        else:
            run_step(step, deadline)
            failed += step.status not in ("ok", "skipped")
        print(f"          {step.status} in {step.seconds} s: {step.detail or step.figures}",
              flush=True)  # fmt: skip
        write_report(out, steps, meta | {"elapsed_s": round(time.time() - start, 1)})
    if decision := gate_decision({s.name: s for s in steps}):
        print(decision)
    print(f"wrote {out}/gpu_acceptance.json and .md ({failed} step(s) not ok)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
