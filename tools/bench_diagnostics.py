"""Overhead of the live diagnostics (``--log-diagnostics-interval``) on training time.

Trains the same run twice per repeat in this process, without diagnostics and with them at
the given interval (default: the config default, 100), alternating the order, and prints the
training-time ratio plus the cost of one diagnostics call against one iteration::

    python tools/bench_diagnostics.py                       # demo model, 200 iterations
    python tools/bench_diagnostics.py --train-iters 400 --repeats 2 --num-layers 8

Any pretraining flag (``--hidden-size``, ``--seq-length``, ...) overrides the config. Without
``--data-path`` the packaged demo corpus is preprocessed into a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_gamma.config import (  # noqa: E402
    LoggingConfig,
    add_config_flags,
    load_config,
    overrides_from_args,
)
from megatron_gamma.data import demo_dir  # noqa: E402
from megatron_gamma.rundir.layout import read_metrics  # noqa: E402
from megatron_gamma.training.loop import Trainer, run_callbacks  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo_data(tmp: str) -> str:
    from megatron_gamma.data.preprocess import preprocess

    prefix = os.path.join(tmp, "data", "demo")
    inputs = [os.path.join(demo_dir(), f) for f in ("zh.jsonl", "en.jsonl")]
    stats = preprocess(inputs, os.path.join(demo_dir(), "tokenizer.json"), prefix, progress=False)
    return stats.prefix


def _train(cfg_path: str, overrides: dict, run_dir: str, interval: int) -> tuple[float, list]:
    """Train once; return (seconds in Trainer.train, diagnostics_seconds of each call)."""
    cfg = load_config(
        cfg_path,
        {
            **overrides,
            "run_dir": run_dir,
            "log_diagnostics_interval": interval,
            "progress_bar": False,
        },
    )
    trainer = Trainer(cfg)
    trainer.callbacks = run_callbacks(trainer.cfg, trainer.preemption)
    try:
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    finally:
        trainer.close()
    calls = [
        rec["diagnostics_seconds"] for rec in read_metrics(run_dir) if rec["split"] == "diagnostics"
    ]
    return seconds, calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--config", default=os.path.join(REPO, "examples", "configs", "demo.yaml"))
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs (min is reported)")
    add_config_flags(parser)
    args = parser.parse_args(argv)
    interval = args.log_diagnostics_interval or LoggingConfig().log_diagnostics_interval
    overrides = {
        k: v for k, v in overrides_from_args(args).items() if k != "log_diagnostics_interval"
    }
    overrides.setdefault("train_iters", 200)
    overrides.setdefault("eval_interval", 10**9)
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        if "data_path" not in overrides:
            overrides["data_path"] = [_demo_data(tmp)]
        plain, with_diag, calls = [], [], []
        for r in range(args.repeats):
            order = (0, interval) if r % 2 == 0 else (interval, 0)
            for iv in order:
                seconds, c = _train(args.config, overrides, os.path.join(tmp, f"run{r}_{iv}"), iv)
                (with_diag if iv else plain).append(seconds)
                calls += c
    iters = overrides["train_iters"]
    base, diag = min(plain), min(with_diag)
    per_iter = base / iters
    per_call = statistics.median(calls) if calls else 0.0
    print(f"train_iters {iters}, diagnostics every {interval} iterations ({len(calls)} calls)")
    print(f"training time without diagnostics: {base:.2f} s ({1000 * per_iter:.1f} ms/iter)")
    print(f"training time with diagnostics:    {diag:.2f} s")
    print(f"ratio with/without: {diag / base:.4f}  (overhead {100 * (diag / base - 1):+.2f}%)")
    print(
        f"one diagnostics call: {1000 * per_call:.1f} ms = {per_call / per_iter:.2f} iterations; "
        f"expected overhead at interval {interval}: {100 * per_call / (interval * per_iter):.2f}%"
    )


if __name__ == "__main__":
    main()
