"""``megatron-gamma`` command line: thin wrappers over the library.

    megatron-gamma train-tokenizer --input a.jsonl b.jsonl --vocab-size 4096 --output tok.json
    megatron-gamma preprocess --input a.jsonl --tokenizer-model tok.json --output-prefix data/x
    megatron-gamma pretrain --config examples/configs/demo.yaml [--num-layers 8 ...]
    megatron-gamma analyze runs/demo [runs/other ...] [--output-dir DIR]
    megatron-gamma compare RUN_A/checkpoints/iter_0000200 RUN_B --data-path data/x --output-dir D

``pretrain`` is launched once per process (``torchrun --nproc-per-node N megatron-gamma
pretrain ...`` or ``srun``); a plain call trains on one process.
"""

from __future__ import annotations

import argparse
import os
import sys

from megatron_gamma.config import ConfigError


def _train_tokenizer(args: argparse.Namespace) -> None:
    from megatron_gamma.data.tokenizer import iter_jsonl_texts, train_bpe

    _require_files(args.input)
    tok = train_bpe(iter_jsonl_texts(args.input, args.json_key), args.vocab_size, args.output)
    print(f"wrote {args.output} ({tok.get_vocab_size()} tokens)")


def _preprocess(args: argparse.Namespace) -> None:
    from megatron_gamma.data.preprocess import preprocess

    stats = preprocess(
        args.input,
        args.tokenizer_model,
        args.output_prefix,
        workers=args.workers,
        json_key=args.json_key,
        progress=not args.no_progress,
    )
    print(
        f"wrote {stats.prefix}.bin/.idx: {stats.documents} documents, {stats.tokens} tokens, "
        f"{stats.characters} characters in {stats.seconds:.1f}s "
        f"({stats.tokens / max(stats.seconds, 1e-9):.0f} tokens/s)"
    )


def _pretrain(args: argparse.Namespace) -> None:
    from megatron_gamma.config import load_config, overrides_from_args
    from megatron_gamma.training.loop import pretrain

    cfg = load_config(args.config, overrides_from_args(args))
    result = pretrain(cfg)
    if result.valid_losses and int(os.environ.get("RANK", "0")) == 0:
        last = max(result.valid_losses)
        print(
            f"done: iteration {result.iteration}, validation loss {result.valid_losses[last]:.4f}"
        )


def _analyze(args: argparse.Namespace) -> None:
    from megatron_gamma.diagnostics.analyze import analyze

    written = analyze(
        args.run_dirs,
        args.output_dir,
        data_path=args.data_path,
        include_init=not args.no_init,
        heatmaps=args.heatmaps,
        heatmap_iterations=args.heatmap_iterations,
        heatmap_rows=args.heatmap_rows,
        condensation_rows=args.condensation_rows,
        progress=not args.no_progress,
    )
    for name, path in written.items():
        print(f"wrote {name}: {path}")


def _compare(args: argparse.Namespace) -> None:
    from megatron_gamma.diagnostics.compare import compare

    out = compare(
        args.ckpt_a,
        args.ckpt_b,
        args.data_path,
        args.output_dir,
        config_a=args.config_a,
        config_b=args.config_b,
        num_sequences=args.num_sequences,
        seq_length=args.seq_length,
        batch_size=args.micro_batch_size,
        num_bins=args.num_bins,
        progress=not args.no_progress,
    )
    print(
        f"{out['tokens']} tokens: loss A {out['a']['mean_loss']:.4f}, loss B "
        f"{out['b']['mean_loss']:.4f}, mean delta_sym {out['mean_delta_sym']:+.4f}"
    )
    for name, path in out["files"].items():
        print(f"wrote {name}: {path}")


def _require_files(paths: list[str]) -> None:
    for path in paths:
        if not os.path.isfile(path):
            raise ConfigError(f"input={path!r}: file not found. Fix: check the path")


def build_parser() -> argparse.ArgumentParser:
    """The ``megatron-gamma`` argument parser with all subcommands."""
    from megatron_gamma.config import add_config_flags

    parser = argparse.ArgumentParser(prog="megatron-gamma", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train-tokenizer", help="train a byte-level BPE on zh + en jsonl")
    p.add_argument("--input", nargs="+", required=True, help="jsonl files")
    p.add_argument("--json-key", default="text")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--output", required=True, help="tokenizer.json to write")
    p.set_defaults(func=_train_tokenizer)

    p = sub.add_parser("preprocess", help="jsonl -> Megatron .bin/.idx")
    p.add_argument("--input", nargs="+", required=True, help="jsonl files")
    p.add_argument("--tokenizer-model", required=True, help="tokenizer.json")
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--json-key", default="text")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_preprocess)

    p = sub.add_parser("pretrain", help="pretrain a GPT model (YAML config + Megatron flags)")
    p.add_argument("--config", help="YAML config file")
    add_config_flags(p)
    p.set_defaults(func=_pretrain)

    p = sub.add_parser("analyze", help="diagnostics plots + numbers from a run's checkpoints")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    p.add_argument("--output-dir", help="default RUN_DIR/analysis (required for several runs)")
    p.add_argument("--data-path", nargs="+", help="dataset blend for activations (default: run's)")
    p.add_argument("--heatmaps", nargs="+", metavar="ROLE/layer_LL", help="e.g. attn_q/layer_00")
    p.add_argument("--heatmap-iterations", nargs="+", type=int, help="checkpoint iterations")
    p.add_argument("--heatmap-rows", type=int, default=256, help="rows sampled per heatmap")
    p.add_argument("--condensation-rows", type=int, default=512, help="rows per score")
    p.add_argument("--no-init", action="store_true", help="skip iteration 0 (initialization)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_analyze)

    p = sub.add_parser("compare", help="per-token delta_sym of two checkpoints by difficulty")
    p.add_argument("ckpt_a", metavar="CKPT_A", help="checkpoint, checkpoint dir or run dir")
    p.add_argument("ckpt_b", metavar="CKPT_B")
    p.add_argument("--data-path", required=True, help="indexed dataset prefix to score")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--config-a", help="A's config.yaml (default: found beside the checkpoint)")
    p.add_argument("--config-b")
    p.add_argument("--num-sequences", type=int, default=64)
    p.add_argument("--seq-length", type=int, help="default: the shorter model seq_length")
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--num-bins", type=int, default=10)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for configuration errors)."""
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"megatron-gamma {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
