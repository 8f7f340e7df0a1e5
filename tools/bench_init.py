"""Benchmark the gamma-init and the init audit against megatron-core's normal CPU init.

For each recipe, four runs, each in its own process (so that each peak RSS is its own), in the
same invocation and on the same thread count:

- ``gamma TP=1``: :func:`~megatron_gamma.model.builder.build_model_chunk` with the gamma rule
  (megatron-core allocates the local shard, :func:`~megatron_gamma.model.init.apply_gamma_init`
  draws it with the counter-based generator: on CPU the C++ kernel of ``csrc/init_cpu.cpp``),
  then ``apply_gamma_init`` alone again (the init time), then the init audit, ``full`` and
  ``summary``;
- ``gamma TP=8 (1 rank)``: one rank's work at TP = 8, simulated in one process: every
  parameter allocated at its TP = 8 shard shape (rank 0) and drawn with the counter-based
  generator (parts = 8), then drawn again (the init time, pages already touched, as the
  ``gamma TP=1`` init time), then its streamed audit sums;
- ``mcore TP=1``: ``build_model_chunk`` with ``--init-method normal`` (megatron-core's CPU
  initialization, ``use_cpu_initialization=True``);
- ``mcore TP=8 (1 rank)``: what megatron-core's CPU initialization does on each rank at TP = 8:
  draw the global tensor with ``torch.randn``, keep the shard.

Columns: CPU seconds of the process (``time.process_time``, robust on a shared machine) and
wall seconds; ``audit full / init`` (the issue's target: at most 10%); ``peak RSS`` of the
process (``ru_maxrss``, including the Python/torch baseline shown in the ``idle`` row) next to
its target, the idle baseline plus the parameters plus the largest single shard; ``x mcore`` =
megatron-core's CPU init time (same TP) / the row's time. The 70B projection scales each
TP = 8 rank's measured draw rate (parameters per CPU second) to 70e9 / 8 parameters per rank
(the gamma rule) and 70e9 per rank (megatron-core CPU init draws every global tensor), on one
thread.

Example::

    python tools/bench_init.py                                   # 0.1B and 1.5B
    python tools/bench_init.py --recipes examples/configs/gpt-0.1b.yaml --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Optional

import torch

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "configs")
RECIPES = [os.path.join(CONFIGS, "gpt-0.1b.yaml"), os.path.join(CONFIGS, "gpt-1.5b.yaml")]
MODES = ("idle", "gamma", "gamma-tp8", "mcore", "mcore-tp8")
TP = 8
PARAMS_70B = 70e9


def _clock() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def _since(start: tuple[float, float]) -> dict:
    cpu, wall = _clock()
    return {"cpu": cpu - start[0], "wall": wall - start[1]}


def _setup(recipe: str, method: str):
    from megatron.core import parallel_state

    from megatron_gamma import parallel
    from megatron_gamma.config import load_config
    from megatron_gamma.model.builder import transformer_config
    from megatron_gamma.model.vocab import padded_vocab_size

    one_rank = {
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "expert_model_parallel_size": 1,
        "sequence_parallel": False,
    }
    cfg = load_config(recipe, {"init_method": method, **one_rank})
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel.initialize(cfg)
    vocab = padded_vocab_size(cfg.model.vocab_size, cfg)
    return cfg, transformer_config(cfg, on_gpu=False), vocab


def _shards(cfg, tcfg, vocab):
    """(global name, global shape, dtype, role, ParamInit) of every parameter, from a meta build."""
    from megatron_gamma.model.builder import build_model_chunk
    from megatron_gamma.model.init import global_name, param_init
    from megatron_gamma.model.roles import role_of

    with torch.device("meta"):
        model, _ = build_model_chunk(cfg, tcfg, vocab)
    out = []
    for name, p in model.named_parameters():
        gname = global_name(name, model)
        out.append((gname, tuple(p.shape), p.dtype, role_of(name), param_init(gname, cfg, vocab)))
    return out


def _shard_shape(shape: tuple, role) -> tuple:
    if role.partition_dim is None:
        return shape
    shape = list(shape)
    shape[role.partition_dim] //= TP
    return tuple(shape)


def _draw_tp8(local, shape, seed, gname, role, init, cfg) -> None:
    """Rank 0's shard at TP = 8, drawn by the counter-based generator."""
    from megatron_gamma.model.counter_rng import fill_shard_normal_, stream_key

    halves = cfg.model.swiglu and role.glu
    key = stream_key(seed, gname)
    fill_shard_normal_(local, shape, key, init.sigma, role.partition_dim, TP, 0, halves=halves)


def worker(recipe: str, mode: str) -> dict:
    """One measurement in this process; returns its JSON row."""
    from megatron_gamma.model.builder import build_model_chunk
    from megatron_gamma.model.init import apply_gamma_init
    from megatron_gamma.training.init_audit import audit_init, shard_sums

    row: dict = {"recipe": os.path.basename(recipe), "mode": mode}
    if mode in ("gamma", "mcore"):
        cfg, tcfg, vocab = _setup(recipe, "gamma" if mode == "gamma" else "normal")
        start = _clock()
        model, _ = build_model_chunk(cfg, tcfg, vocab)
        row["build_init"] = _since(start)
        row["params"] = sum(p.numel() for p in model.parameters())
        row["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        row["largest_bytes"] = max(p.numel() * p.element_size() for p in model.parameters())
        if mode == "gamma":
            start = _clock()
            apply_gamma_init(model, cfg, vocab)
            row["init"] = _since(start)
            for scope in ("full", "summary"):
                start = _clock()
                audit_init([model], cfg, vocab, scope=scope)
                row[f"audit_{scope}"] = _since(start)
    elif mode in ("gamma-tp8", "mcore-tp8"):
        cfg, tcfg, vocab = _setup(recipe, "normal")
        shards = _shards(cfg, tcfg, vocab)
        seed, kept, std = cfg.training.seed, [], cfg.init.init_method_std
        start = _clock()
        for gname, shape, dtype, role, init in shards:
            local = torch.empty(_shard_shape(shape, role), dtype=dtype)
            if init.constant is not None:
                local.fill_(init.constant)
            elif mode == "gamma-tp8":
                _draw_tp8(local, shape, seed, gname, role, init, cfg)
            else:
                full = torch.randn(shape, dtype=torch.float32).mul_(std)
                if role.partition_dim is not None:
                    full = full.chunk(TP, dim=role.partition_dim)[0]
                local.copy_(full)
                del full
            kept.append(local)
        row["build_init"] = _since(start)
        row["params"] = sum(t.numel() for t in kept)
        row["param_bytes"] = sum(t.numel() * t.element_size() for t in kept)
        row["largest_bytes"] = max(t.numel() * t.element_size() for t in kept)
        if mode == "gamma-tp8":
            start = _clock()
            for local, (gname, shape, _, role, init) in zip(kept, shards, strict=True):
                if init.constant is None:
                    _draw_tp8(local, shape, seed, gname, role, init, cfg)
            row["init"] = _since(start)
            start = _clock()
            for local in kept:
                shard_sums(local)
            row["audit_full"] = _since(start)
    row["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return row


def _run(recipe: str, mode: str, threads: int) -> dict:
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", recipe, mode]
    cmd += ["--threads", str(threads)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{recipe} {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt(t: Optional[dict]) -> str:
    return f"{t['cpu']:8.2f} {t['wall']:8.2f}" if t else f"{'-':>8} {'-':>8}"


def report(rows: list[dict]) -> str:
    """The table and the 70B projection (markdown)."""
    lines = [
        "| recipe | run | params | build+init CPU s / wall s | init CPU / wall | "
        "audit full | audit summary | audit full / init | x mcore (build+init, CPU) | "
        "peak RSS GiB | idle + params + largest shard GiB |",
        "|---|---|---:|---|---|---|---|---:|---:|---:|---:|",
    ]
    by = {(r["recipe"], r["mode"]): r for r in rows}
    idle = by.get(("-", "idle"), {"peak_rss_gib": 0.0})["peak_rss_gib"]
    for r in rows:
        base = by.get((r["recipe"], "mcore-tp8" if r["mode"].endswith("tp8") else "mcore"))
        ratio = share = bound = ""
        if "build_init" in r and base and r["mode"].startswith("gamma"):
            ratio = f"{base['build_init']['cpu'] / r['build_init']['cpu']:.2f}"
        if "init" in r:
            share = f"{100 * r['audit_full']['cpu'] / r['init']['cpu']:.1f}%"
        if "param_bytes" in r:
            bound = f"{idle + (r['param_bytes'] + r['largest_bytes']) / 2**30:.2f}"
        lines.append(
            f"| {r['recipe']} | {r['mode']} | {r.get('params', 0) / 1e6:.1f}M | "
            f"{_fmt(r.get('build_init'))} | {_fmt(r.get('init'))} | {_fmt(r.get('audit_full'))} "
            f"| {_fmt(r.get('audit_summary'))} | {share} | {ratio} | {r['peak_rss_gib']:.2f} "
            f"| {bound} |"
        )
    for recipe in sorted({r["recipe"] for r in rows}):
        g, m = by.get((recipe, "gamma-tp8")), by.get((recipe, "mcore-tp8"))
        if not (g and m):
            continue
        one = by.get((recipe, "gamma"))
        if one and "init" in g:
            lines.append(
                f"\n{recipe}: gamma init alone, TP=1 / one TP={TP} rank = "
                f"{one['init']['cpu'] / g['init']['cpu']:.2f} (target {TP}); build + init "
                f"{one['build_init']['cpu'] / g['build_init']['cpu']:.2f}."
            )
        g_rate = g["params"] / g["build_init"]["cpu"]
        m_rate = by[(recipe, "mcore")]["params"] / m["build_init"]["cpu"]
        lines.append(
            f"\n70B projection from {recipe} (one thread per rank, TP={TP}): gamma-init "
            f"{PARAMS_70B / TP / g_rate / 60:.1f} min per rank ({g_rate / 1e6:.1f}M params/CPU-s "
            f"on {PARAMS_70B / TP / 1e9:.2f}B), megatron-core CPU init "
            f"{PARAMS_70B / m_rate / 60:.1f} min per rank ({m_rate / 1e6:.1f}M global params/"
            f"CPU-s on all {PARAMS_70B / 1e9:.0f}B)."
        )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--recipes", nargs="+", default=RECIPES)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    p.add_argument("--worker", nargs=2, metavar=("RECIPE", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error(f"--threads={args.threads}: must be >= 1")
    torch.set_num_threads(args.threads)
    if args.worker:
        recipe, mode = args.worker
        row = worker(recipe, mode) if mode != "idle" else {"recipe": "-", "mode": "idle"}
        if mode == "idle":
            row["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(json.dumps(row))
        return
    for recipe in args.recipes:
        if not os.path.isfile(recipe):
            p.error(f"--recipes {recipe}: no such file")
    rows = [_run(args.recipes[0], "idle", args.threads)]
    for recipe in args.recipes:
        for mode in MODES[1:]:
            rows.append(_run(recipe, mode, args.threads))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(report(rows))


if __name__ == "__main__":
    main()
