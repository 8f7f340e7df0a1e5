"""GPU acceptance run: kernels, RMSNorm bandwidth and 0.1B training speed on one GPU, in a time
budget, with results written after every step (``bash tools/gpu_acceptance.sh OUT_DIR``).

Steps, in order (each a subprocess with the time left as its limit):

1. ``install``: ``pip install --no-build-isolation -e .[test]`` (PyPI only) when
   ``megatron_gamma`` is not importable or its compiled kernels lack CUDA; the CUDA extension
   is built for this GPU's architecture only (``TORCH_CUDA_ARCH_LIST``), ``MAX_JOBS`` = CPUs.
2. ``kernel-tests``: the CUDA cases of the ops tests (``pytest -k cuda``).
3. ``bench-rmsnorm``: ``tools/bench_rmsnorm.py`` on CUDA, bf16 and fp32, 4096 x {4096, 8192},
   forward and forward+backward against ``F.rms_norm``, ``torch.compile``, apex and TE when
   installed, each as a fraction of device copy bandwidth.
4. ``data``: the packaged demo corpus preprocessed with the demo tokenizer.
5. ``train-*``: the 0.1B recipe (``examples/configs/gpt-0.1b.yaml``) in bf16 at sequence 2048,
   :data:`TRAIN_ITERS` steps, micro-batch = global batch = :data:`MICRO_BATCH`, for: defaults;
   ``--gated-attention none``; ``MEGATRON_GAMMA_OPS=reference``; megatron-core's stock local
   spec (``--layer-spec local --gated-attention none``); and ``--transformer-impl
   transformer_engine``, with and without the gate (``--gated-attention none``), when Transformer
   Engine is importable and the flag exists: the gate's share of the TE step decides whether its
   rows are worth fusing into the QKV projection (issue 18: only above 1%). Reported:
   tokens/s, TFLOP/s per device and MFU, medians over the log intervals after the first
   (warm-up).

Targets (printed next to the figures, not enforced): fused RMSNorm >= 85% of copy bandwidth and
>= 1.2x TE/apex; our additions <= 3% slower than the same model without them (defaults vs
``--gated-attention none``, and ``none`` vs the stock spec); MFU of the 0.1B recipe within 10%
of megatron-core's stock spec.

``--dry-run`` (CPU) runs nothing heavy: for every step it checks that each ``--flag`` of its
command is accepted (``--help`` of that command, ``pytest --collect-only`` for the tests, and for
training the config is built from the flags, so bad values fail too) and that the modules it
imports load. ``OUT_DIR/gpu_acceptance.json`` holds every step's command, status, seconds and
figures; ``gpu_acceptance.md`` the same as tables.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_ITERS = 50
MICRO_BATCH = 8
RECIPE = "examples/configs/gpt-0.1b.yaml"
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
}


@dataclass
class Step:
    """One step: its command, environment additions and what came of it."""

    name: str
    cmd: list[str]
    env: dict = field(default_factory=dict)
    status: str = "pending"
    seconds: float = 0.0
    detail: str = ""
    figures: dict = field(default_factory=dict)
    output: str = ""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "megatron_gamma.cli", *args]


def plan(out: str) -> list[Step]:
    """Every step's command (module docstring)."""
    demo = os.path.join(ROOT, "megatron_gamma", "data", "demo")
    data = os.path.join(out, "data", "demo")
    steps = [
        Step(
            "install",
            [sys.executable, "-m", "pip", "install", "--no-build-isolation", "-e", f"{ROOT}[test]"],
            {"MEGATRON_GAMMA_BUILD_EXT": "1", "MAX_JOBS": str(os.cpu_count() or 4)},
        ),
        Step(
            "kernel-tests",
            [
                sys.executable,
                "-m",
                "pytest",
                "tests/test_ops_rmsnorm.py",
                "tests/test_ops_gate.py",
                "-q",
                "-k",
                "cuda",
                "-p",
                "no:cacheprovider",
            ],
        ),  # fmt: skip
        Step(
            "bench-rmsnorm",
            [
                sys.executable,
                "tools/bench_rmsnorm.py",
                "--device",
                "cuda",
                "--tokens",
                "4096",
                "--hidden",
                "4096",
                "8192",
                "--dtypes",
                "bf16",
                "fp32",
                "--repeats",
                "3",
                "--min-time",
                "0.1",
            ],
        ),  # fmt: skip
        Step(
            "data",
            _cli(
                "preprocess",
                "--input",
                demo,
                "--tokenizer-model",
                f"{demo}/tokenizer.json",
                "--output-prefix",
                data,
                "--workers",
                "4",
                "--no-progress",
            ),
        ),  # fmt: skip
    ]
    for name, (flags, env) in TRAIN_VARIANTS.items():
        cmd = _cli(
            "pretrain", "--config", RECIPE, "--tokenizer-model", f"{demo}/tokenizer.json",
            "--data-path", f"{data}_text_document", "--split", "100,0,0", "--seq-length", "2048",
            "--bf16", "--train-iters", str(TRAIN_ITERS), "--lr-warmup-iters", "5",
            "--micro-batch-size", str(MICRO_BATCH), "--global-batch-size", str(MICRO_BATCH),
            "--eval-interval", str(TRAIN_ITERS), "--eval-iters", "0", "--log-interval", "10",
            "--save", "", "--load", "", "--run-dir", os.path.join(out, "runs", name), *flags,
        )  # fmt: skip
        steps.append(Step(f"train-{name}", cmd, dict(env)))
    return steps


def _env(step: Step) -> dict:
    return dict(
        os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **step.env
    )


def _flags(cmd: list[str]) -> list[str]:
    return [a.split("=")[0] for a in cmd if a.startswith("--")]


def check_command(step: Step) -> str:
    """Dry-run check of one step's command line (module docstring); returns what was checked.

    Raises:
        RuntimeError: a flag the command does not accept, a bad config value, or a failed import.
    """
    cmd = step.cmd
    if step.name == "install":
        return "pip command formed (not run in a dry run)"
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

        if "--transformer-impl" in cmd and "--transformer-impl" not in _help(cmd[:4]):
            return "skipped on a GPU run: --transformer-impl is not in this checkout"
        try:
            args = build_parser().parse_args(cmd[3:])
        except SystemExit as e:
            raise RuntimeError(f"{step.name}: pretrain refuses `{shlex.join(cmd[3:])}`") from e
        load_config(args.config, overrides_from_args(args))
        if step.env:  # e.g. MEGATRON_GAMMA_OPS: checked when megatron_gamma.ops is imported
            probe = [
                sys.executable,
                "-c",
                "import megatron_gamma.ops, megatron_gamma.training.loop",
            ]
            r = subprocess.run(probe, cwd=ROOT, env=_env(step), capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(
                    f"{step.name}: import with {step.env} failed:\n{r.stderr[-2000:]}"
                )
            return f"flags parsed, config built, imports ok with {step.env}"
        return "flags parsed and config built"
    help_text = _help(cmd[: 4 if cmd[1] == "-m" else 2])
    missing = [f for f in _flags(cmd) if f not in help_text]
    if missing:
        raise RuntimeError(f"{step.name}: {missing} not accepted by `{shlex.join(cmd)}`")
    return f"flags {_flags(cmd)} accepted"


def _help(prefix: list[str]) -> str:
    r = subprocess.run([*prefix, "--help"], cwd=ROOT, env=_env(Step("help", [])),
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"`{shlex.join(prefix)} --help` failed:\n{r.stderr[-2000:]}")
    return r.stdout


def _needs_install() -> str:
    """Why the install step must run, or '' when megatron_gamma has CUDA kernels and pytest is
    there."""
    probe = "from megatron_gamma import ops; print(ops.extension_status())"
    r = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True)
    if r.returncode != 0:
        return "megatron_gamma is not installed"
    if "cuda" not in r.stdout:
        return f"no CUDA kernels ({r.stdout.strip()})"
    if importlib.util.find_spec("pytest") is None:
        return "pytest is not installed (the test extra)"
    return ""


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
        "tflops_per_device": statistics.median(float(r[2]) for r in steady),
        "intervals": len(steady),
    }
    if all(r[3] for r in steady):
        figures["mfu_percent"] = statistics.median(float(r[3]) for r in steady)
    return figures


def _skip_reason(step: Step) -> str:
    if step.name == "install" and not _needs_install():
        return "megatron_gamma has CUDA kernels and pytest is installed"
    if step.name.startswith("train-transformer-engine"):
        if importlib.util.find_spec("transformer_engine") is None:
            return "transformer_engine is not importable"
        if "--transformer-impl" not in _help(step.cmd[:4]):
            return "--transformer-impl is not in this checkout"
    return ""


def run_step(step: Step, deadline: float) -> None:
    """Run ``step`` with the time left; record status, seconds, output and figures."""
    if reason := _skip_reason(step):
        step.status, step.detail = "skipped", reason
        return
    if step.name == "install":
        step.env["TORCH_CUDA_ARCH_LIST"] = _cuda_arch()
        step.detail = _needs_install()
    left = deadline - time.time()
    if left < 5:
        step.status, step.detail = "not run", "time budget spent"
        return
    start = time.time()
    try:
        r = subprocess.run(step.cmd, cwd=ROOT, env=_env(step), capture_output=True, text=True,
                           timeout=left)  # fmt: skip
        step.output = (r.stdout + r.stderr)[-20000:]
        step.status = "ok" if r.returncode == 0 else f"failed (exit {r.returncode})"
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"") + (e.stderr or b"")
        step.output = (text.decode(errors="replace") if isinstance(text, bytes) else text)[-20000:]
        step.status = "timed out"
    step.seconds = round(time.time() - start, 1)
    if step.name.startswith("train-"):
        step.figures = _train_figures(step.output)
    if step.name == "kernel-tests" and (m := re.search(r"(\d+) passed", step.output)):
        step.figures = {"passed": int(m.group(1))}


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
         "gate cost on TE (fuse the gate rows into QKV only if > 1% slower)"),
        ("transformer-engine", "defaults", "tokens_per_s", "TE backend vs local backend"),
    ]  # fmt: skip
    for a, b, key, what in pairs:
        x, y = fig(a, key), fig(b, key)
        if x and y:
            lines.append(f"- {what}: {a} / {b} = {x / y:.3f} ({key})")
    return lines


def write_report(out: str, steps: list[Step], meta: dict) -> None:
    """Write gpu_acceptance.json and .md (temp names, then rename)."""
    doc = {**meta, "steps": [asdict(s) for s in steps]}
    md = [f"# GPU acceptance ({meta['mode']})", ""]
    md += [f"- {k}: {v}" for k, v in meta.items() if k != "mode"] + ["", "## Steps", ""]
    md += ["| step | status | s | detail |", "|---|---|---|---|"]
    md += [f"| {s.name} | {s.status} | {s.seconds} | {s.detail} |" for s in steps]
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
        md += ["", *_comparisons({s.name: s for s in steps})]
    bench = next((s for s in steps if s.name == "bench-rmsnorm" and s.output), None)
    if bench is not None:
        md += ["", "## RMSNorm (tools/bench_rmsnorm.py)", "", "```", bench.output.strip(), "```"]
    for path, text in ((f"{out}/gpu_acceptance.json", json.dumps(doc, indent=2)),
                       (f"{out}/gpu_acceptance.md", "\n".join(md) + "\n")):  # fmt: skip
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir", help="where gpu_acceptance.{json,md} and the runs go")
    p.add_argument("--dry-run", action="store_true", help="check every step on CPU, run nothing")
    p.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget, seconds")
    args = p.parse_args(argv)
    if args.budget_s <= 0:
        p.error(f"--budget-s {args.budget_s}: must be > 0. Fix: e.g. 480")
    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    start = time.time()
    deadline = start + args.budget_s
    steps = plan(out)
    meta = {"mode": "dry-run" if args.dry_run else "run", "budget_s": args.budget_s}
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            p.error("no GPU is visible. Fix: run on a GPU machine, or --dry-run to check on CPU")
        meta["device"] = torch.cuda.get_device_name()
        meta["torch"] = torch.__version__
    failed = 0
    for i, step in enumerate(steps, 1):
        print(f"[{time.time() - start:6.1f}s] {i}/{len(steps)} {step.name} ...", flush=True)
        if args.dry_run:
            try:
                step.detail, step.status = check_command(step), "dry-run ok"
            except Exception as e:  # noqa: BLE001  (report every step, then fail)
                step.detail, step.status = str(e), "dry-run FAILED"
                failed += 1
        else:
            run_step(step, deadline)
            failed += step.status not in ("ok", "skipped")
        print(f"          {step.status}: {step.detail or step.figures}", flush=True)
        write_report(out, steps, meta | {"elapsed_s": round(time.time() - start, 1)})
    print(f"wrote {out}/gpu_acceptance.json and .md ({failed} step(s) not ok)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
