"""``megatron-gamma`` command line: thin wrappers over the library.

    megatron-gamma train-tokenizer --input a.jsonl b.jsonl --vocab-size 4096 --output tok.json
    megatron-gamma preprocess --input a.jsonl --tokenizer-model tok.json --output-prefix data/x
    megatron-gamma merge --output-prefix data/x --num-shards 8
    megatron-gamma pretrain --config examples/configs/demo.yaml [--num-layers 8 ...]

The data commands are defined in :mod:`megatron_gamma.data.commands`.

``pretrain`` is launched once per process (``torchrun --nproc-per-node N megatron-gamma
pretrain ...`` or ``srun``); a plain call trains on one process.
"""

from __future__ import annotations

import argparse
import os
import sys

from megatron_gamma.config import ConfigError


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


def build_parser() -> argparse.ArgumentParser:
    """The ``megatron-gamma`` argument parser with all subcommands."""
    from megatron_gamma.config import add_config_flags
    from megatron_gamma.data.commands import add_data_commands

    parser = argparse.ArgumentParser(prog="megatron-gamma", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    add_data_commands(sub)

    p = sub.add_parser("pretrain", help="pretrain a GPT model (YAML config + Megatron flags)")
    p.add_argument("--config", help="YAML config file")
    add_config_flags(p)
    p.set_defaults(func=_pretrain)
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
