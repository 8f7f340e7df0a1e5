"""``megatron-gamma`` command line: thin wrappers over the library.

    megatron-gamma train-tokenizer --input a.jsonl b.jsonl --vocab-size 4096 --output tok.json
    megatron-gamma preprocess --input a.jsonl --tokenizer-model tok.json --output-prefix data/x
    megatron-gamma merge --output-prefix data/x --num-shards 8
    megatron-gamma pretrain --config examples/configs/demo.yaml [--num-layers 8 ...]
    megatron-gamma submit --config FILE.yaml --nodes 2 --gpus-per-node 8 [--dry-run]
    megatron-gamma submit-preprocess --input a.jsonl --tokenizer-model tok.json \
        --output-prefix data/x --num-shards 8 [--dry-run]

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
    from megatron_gamma.parallel import read_dist_env
    from megatron_gamma.training.loop import pretrain

    cfg = load_config(args.config, overrides_from_args(args))
    result = pretrain(cfg)
    if result.valid_losses and read_dist_env().rank == 0:
        last = max(result.valid_losses)
        print(
            f"done: iteration {result.iteration}, validation loss {result.valid_losses[last]:.4f}"
        )


def _cluster_options(args: argparse.Namespace) -> dict:
    return {
        "partition": args.partition,
        "time": args.time,
        "container_image": args.container_image,
        "container_mounts": args.container_mounts,
    }


def _print_submission(result, dry_run: bool) -> None:
    if dry_run:
        print(result.script, end="")
        return
    print(f"script: {result.script_path}")
    for job_id, log in zip(result.job_ids, result.logs, strict=True):
        print(f"submitted job {job_id}, log: {log}")


def _submit(args: argparse.Namespace) -> None:
    from megatron_gamma.config import overrides_from_args
    from megatron_gamma.launch.slurm import PretrainJob, submit_pretrain

    job = PretrainJob(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        launcher=args.launcher,
        warning_seconds=args.warning_seconds,
        **_cluster_options(args),
    )
    result = submit_pretrain(args.config, overrides_from_args(args), job, dry_run=args.dry_run)
    _print_submission(result, args.dry_run)


def _submit_preprocess(args: argparse.Namespace) -> None:
    from megatron_gamma.launch.slurm import PreprocessJob, submit_preprocess

    job = PreprocessJob(
        inputs=args.input,
        tokenizer_model=args.tokenizer_model,
        output_prefix=args.output_prefix,
        num_shards=args.num_shards,
        workers=args.workers,
        **_cluster_options(args),
    )
    _print_submission(submit_preprocess(job, dry_run=args.dry_run), args.dry_run)


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--partition", help="SLURM partition (default: the cluster's)")
    p.add_argument("--time", help="time limit, e.g. 04:00:00 (default: the partition's)")
    p.add_argument("--container-image", help="pyxis/enroot image or .sqsh file")
    p.add_argument("--container-mounts", help="pyxis mounts, host:container[,...]")
    p.add_argument("--dry-run", action="store_true", help="print the script; submit nothing")



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

    p = sub.add_parser("submit", help="render an sbatch script from a config and submit it")
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--nodes", type=int, required=True, help="nodes to allocate")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs (processes) per node")
    p.add_argument(
        "--launcher",
        choices=["srun", "torchrun"],
        default="srun",
        help="srun: one task per GPU; torchrun: one torchrun per node",
    )
    p.add_argument(
        "--warning-seconds",
        type=int,
        default=300,
        help="SIGUSR1 this long before the time limit: checkpoint, then requeue",
    )
    _add_cluster_flags(p)
    add_config_flags(p)
    p.set_defaults(func=_submit)

    p = sub.add_parser("submit-preprocess", help="preprocess as a SLURM array + merge job")
    p.add_argument("--input", nargs="+", required=True, help="jsonl files")
    p.add_argument("--tokenizer-model", required=True, help="tokenizer.json")
    p.add_argument("--output-prefix", required=True, help="prefix of the merged dataset")
    p.add_argument("--num-shards", type=int, required=True, help="array tasks")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes per task")
    _add_cluster_flags(p)
    p.set_defaults(func=_submit_preprocess)
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
