"""Benchmark RMSNorm kernels: forward and forward+backward time per (tokens x hidden, dtype).

Implementations, all measured in the same run on the same tensors:

- ``megatron_gamma``: :func:`megatron_gamma.ops.rms_norm` on the compiled extension (if built),
- ``reference``: its pure-torch fallback (:mod:`megatron_gamma.ops.reference`), eager,
- ``reference+compile``: the fallback under ``torch.compile`` (unless ``--no-compile`` or
  ``TORCHDYNAMO_DISABLE=1``),
- ``F.rms_norm``: ``torch.nn.functional.rms_norm`` (the baseline of the ratio column),
- ``apex``: ``apex.normalization.FusedRMSNorm`` and ``TE``: ``transformer_engine.pytorch.RMSNorm``,
  when importable (CUDA only).

Columns: median milliseconds per call; ``xF`` = time of F.rms_norm / time of the row (above 1
is faster); ``bw`` = achieved bandwidth as a fraction of ``torch.Tensor.copy_`` moving the same
bytes in the same run (``x.clone()``, which allocates its output as every kernel here does;
forward: read x + write y = one copy of x; forward+backward: x, y, x, dy, dx = 2.5 copies),
i.e. how close a kernel gets to the memory-bound limit; ``err`` = forward
max |y - y_fp64| / max |y_fp64| at the input scale ``--scale`` (try 1e20: x^2 overflows fp32).

Example::

    python tools/bench_rmsnorm.py --device cuda                      # 4096 x {1k, 2k, 4k, 8k}
    python tools/bench_rmsnorm.py --tokens 1024 --hidden 1024 4096   # a quick CPU run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Optional

import torch
import torch.nn.functional as F
from tqdm import tqdm

from megatron_gamma import ops
from megatron_gamma.ops.reference import rms_norm_reference

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int, default=4096, help="rows (tokens)")
    p.add_argument("--hidden", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp16", "fp32"], choices=list(DTYPES))
    p.add_argument("--eps", type=float, default=1e-12)
    p.add_argument("--scale", type=float, default=1.0, help="std of the random input")
    p.add_argument("--min-time", type=float, default=0.2, help="seconds per timing repeat")
    p.add_argument("--repeats", type=int, default=5, help="timing repeats (median reported)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile(reference)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    p.add_argument(
        "--clock",
        choices=["wall", "process"],
        default="wall",
        help="'process': CPU time of this process (CPU only; with --threads 1 it is robust to "
        "other jobs sharing the cores)",
    )
    args = p.parse_args(argv)
    if args.tokens < 1 or min(args.hidden) < 1:
        p.error(f"--tokens {args.tokens} and --hidden {args.hidden} must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but no GPU is visible. Fix: --device cpu")
    if args.device.startswith("cuda") and args.clock == "process":
        p.error("--clock process measures CPU time. Fix: --clock wall on CUDA")
    return args


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, args) -> float:
    """Median over ``repeats`` of the mean time per call, each repeat >= ``min_time``."""
    clock = time.process_time if args.clock == "process" else time.perf_counter
    for _ in range(3):  # warm-up (and compilation)
        fn()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    calls = max(1, int(args.min_time / max(time.perf_counter() - start, 1e-7)))
    times = []
    for _ in range(args.repeats):
        synchronize(device)
        start = clock()
        for _ in range(calls):
            fn()
        synchronize(device)
        times.append((clock() - start) / calls)
    return statistics.median(times)


def implementations(device: torch.device, hidden: int, dtype: torch.dtype, args) -> dict:
    """name -> forward callable f(x, w) (or a status string when unavailable)."""
    eps = args.eps
    impls: dict[str, object] = {}
    with ops.use_backend("auto"):
        built = ops.backend(device) == "extension"

    def fused(x, w):
        with ops.use_backend("extension"):
            return ops.rms_norm(x, w, eps)

    impls["megatron_gamma"] = fused if built else f"not built: {ops.extension_status()}"
    impls["reference"] = lambda x, w: rms_norm_reference(x, w, eps)
    if args.no_compile or os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        impls["reference+compile"] = "skipped (--no-compile or TORCHDYNAMO_DISABLE=1)"
    else:
        torch._dynamo.reset()  # fresh, shape-specialized graphs for every case
        compiled = torch.compile(rms_norm_reference, dynamic=False)
        impls["reference+compile"] = lambda x, w: compiled(x, w, eps)
    impls["F.rms_norm"] = lambda x, w: F.rms_norm(x, (hidden,), w, eps)
    if device.type == "cuda":
        try:
            from apex.normalization import FusedRMSNorm

            apex_norm = FusedRMSNorm(hidden, eps=eps).to(device=device, dtype=dtype)
            impls["apex"] = lambda x, w: apex_norm(x)
        except ImportError as e:
            impls["apex"] = f"not importable ({e})"
        try:
            import transformer_engine.pytorch as te

            te_norm = te.RMSNorm(hidden, eps=eps, params_dtype=dtype, device=device)
            impls["TE"] = lambda x, w: te_norm(x)
        except ImportError as e:
            impls["TE"] = f"not importable ({e})"
    return impls


def bench_case(tokens: int, hidden: int, dtype: torch.dtype, device: torch.device, args):
    """Rows of (name, fwd_s, fwdbwd_s, err) or (name, status) plus the copy time."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(tokens, hidden, generator=gen) * args.scale).to(device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device=device, dtype=dtype)
    dy = torch.randn(tokens, hidden, generator=gen).to(device=device, dtype=dtype)
    x64 = x.double()
    y64 = x64 / torch.sqrt(x64.square().mean(-1, keepdim=True) + args.eps) * w.double()
    t_copy = median_seconds(x.clone, device, args)
    xg = x.detach().requires_grad_()
    wg = w.detach().requires_grad_()
    rows = []
    for name, fn in implementations(device, hidden, dtype, args).items():
        if isinstance(fn, str):
            rows.append((name, fn))
            continue
        with torch.no_grad():
            y = fn(x, w)
        err = float((y.double() - y64).abs().max() / y64.abs().max())
        with torch.no_grad():
            t_fwd = median_seconds(lambda fn=fn: fn(x, w), device, args)
        trainable = [xg] if name in ("apex", "TE") else [xg, wg]

        def fwd_bwd(fn=fn, trainable=trainable):
            return torch.autograd.grad(fn(xg, wg), trainable, dy)

        t_fb = median_seconds(fwd_bwd, device, args)
        rows.append((name, t_fwd, t_fb, err))
        del y
    return t_copy, rows


def format_case(tokens, hidden, dtype_name, t_copy, rows) -> list[str]:
    base = {r[0]: r for r in rows if len(r) == 4}.get("F.rms_norm")
    lines = [
        f"\n{tokens} x {hidden} {dtype_name}: copy of x {1e3 * t_copy:.3f} ms "
        f"({2 * tokens * hidden * DTYPES[dtype_name].itemsize / t_copy / 1e9:.1f} GB/s)",
        f"  {'impl':<18}{'fwd ms':>9}{'xF':>7}{'bw':>6}{'fwd+bwd ms':>12}{'xF':>7}{'bw':>6}"
        f"{'err':>10}",
    ]
    for row in rows:
        if len(row) == 2:
            lines.append(f"  {row[0]:<18}{row[1]}")
            continue
        name, t_fwd, t_fb, err = row
        ratio_f = f"{base[1] / t_fwd:7.2f}" if base else f"{'-':>7}"
        ratio_b = f"{base[2] / t_fb:7.2f}" if base else f"{'-':>7}"
        lines.append(
            f"  {name:<18}{1e3 * t_fwd:9.3f}{ratio_f}{t_copy / t_fwd:6.2f}"
            f"{1e3 * t_fb:12.3f}{ratio_b}{2.5 * t_copy / t_fb:6.2f}{err:10.1e}"
        )
    return lines


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    print(
        f"bench_rmsnorm: torch {torch.__version__} on {where}; eps={args.eps:g}, "
        f"input scale {args.scale:g}, {args.clock} clock; {ops.extension_status()}"
    )
    cases = [(h, d) for h in args.hidden for d in args.dtypes]
    for hidden, dtype_name in tqdm(cases, desc="shapes", file=sys.stderr, disable=None):
        t_copy, rows = bench_case(args.tokens, hidden, DTYPES[dtype_name], device, args)
        tqdm.write("\n".join(format_case(args.tokens, hidden, dtype_name, t_copy, rows)))


if __name__ == "__main__":
    main()
