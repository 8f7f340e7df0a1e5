"""``megatron-gamma`` command line: thin wrappers over the library.

    megatron-gamma train-tokenizer --input a.jsonl b.jsonl --vocab-size 4096 --output tok.json
    megatron-gamma preprocess --input a.jsonl --tokenizer-model tok.json --output-prefix data/x
    megatron-gamma merge --output-prefix data/x --num-shards 8
    megatron-gamma pretrain --config examples/configs/demo.yaml [--num-layers 8 ...]
    megatron-gamma submit --config FILE.yaml --nodes 2 --gpus-per-node 8 [--dry-run]
    megatron-gamma submit-preprocess --input a.jsonl --tokenizer-model tok.json \
        --output-prefix data/x --num-shards 8 [--dry-run]
    megatron-gamma analyze runs/demo [runs/other ...] [--output-dir DIR]
    megatron-gamma compare RUN_A/checkpoints/iter_0000200 RUN_B --data-path data/x --output-dir D
    megatron-gamma evaluate RUN --data-path data/heldout [--eval-tokens 65536]
    megatron-gamma evaluate RUN --tasks hellaswag,gsm8k [--compare OTHER_RUN] --output-dir D
    megatron-gamma export-hf RUN/checkpoints/iter_0000200 hf/model
    megatron-gamma import-hf hf/model runs/imported
    megatron-gamma sweep examples/studies/smoke.yaml --output-dir runs/smoke [--dry-run] [--slurm]
    megatron-gamma report runs/smoke

The data commands are defined in :mod:`megatron_gamma.data.commands`.

``pretrain`` is launched once per process (``torchrun --nproc-per-node N megatron-gamma
pretrain ...`` or ``srun``); a plain call trains on one process.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import shlex
import sys
import time

from megatron_gamma.config import ConfigError
from megatron_gamma.config.megatron_lm import (
    PREPROCESS_REFUSED,
    REFUSED,
    no_effect_flags,
    refused_flags,
)
from megatron_gamma.dist_env import read_dist_env
from megatron_gamma.mcore_import import megatron_core_without_wandb
from megatron_gamma.warnings_summary import silence_library_noise, summarize_accelerator_warnings


def _pretrain(args: argparse.Namespace) -> None:
    from megatron_gamma.config import (
        check_load_origin,
        check_moe_training,
        check_run_dir_outputs,
        load_config,
        overrides_from_args,
        validate_layout,
    )
    from megatron_gamma.config.effects import given_keys, no_effect_warnings

    overrides = overrides_from_args(args)
    cfg = load_config(args.config, overrides)  # a config error before torch and megatron-core
    check_load_origin(cfg, args.config, overrides)  # a reused config.yaml's load, likewise
    check_run_dir_outputs(cfg, args.config, overrides)  # and its paths under a new --run-dir
    check_moe_training(cfg)
    validate_layout(cfg, read_dist_env().world_size)  # so is a layout the world cannot hold
    if cfg.training.deterministic_mode:
        from megatron_gamma.determinism import check_determinism_env

        check_determinism_env(os.environ)
    if read_dist_env().rank == 0:
        for line in no_effect_warnings(cfg, given_keys(args.config, overrides)):
            print(f"megatron-gamma pretrain: warning: {line}", file=sys.stderr, flush=True)
        if cfg.checkpoint.save is None:
            print(f"megatron-gamma pretrain: warning: {NO_SAVE}", file=sys.stderr, flush=True)
    if not cfg.data.mock_data:
        cfg.data.blend()  # and a dataset prefix without its .bin/.idx, before the imports
    from megatron_gamma.data.tokenizer_types import tokenizer_vocab_size
    from megatron_gamma.rundir.paths import check_save_dir, check_takeover

    tokenizer_vocab_size(cfg.data)  # and a missing tokenizer
    ck = cfg.checkpoint
    check_save_dir(ck.save, ck.load, ck.overwrite)  # and another run's checkpoints in --save
    if not ck.overwrite:
        # and another run's directory; claim_run_dir checks again under the run-directory lock
        check_takeover(cfg.logging.run_dir, ck.load)
    if cfg.logging.wandb_project is not None:
        with contextlib.suppress(ImportError):  # not installed: pretrain's check says so
            import wandb  # noqa: F401  (before megatron-core, whose import then takes it: main())
    try:
        from megatron_gamma.training.loop import pretrain

        result = pretrain(cfg)
    except KeyboardInterrupt:
        stop = "SIGUSR1 or SIGTERM" if cfg.training.exit_signal_handler else "SIGUSR1"
        raise KeyboardInterrupt(pretrain_interrupted(cfg.checkpoint.save, stop)) from None
    if read_dist_env().rank == 0:
        print(done_line(result, saved=cfg.checkpoint.save is not None))


NO_SAVE = (
    "save=None: no checkpoint will be written, so evaluate, analyze, export-hf and a resume "
    "will find nothing of this run. Fix: pass --save DIR (e.g. RUN_DIR/checkpoints)"
)
"""pretrain's warning at start-up when the run has no ``checkpoint.save``."""


def pretrain_interrupted(save: str | None, stop: str) -> str:
    """What follows 'interrupted' when pretrain is stopped by Ctrl-C: that it saved nothing
    (``stop``, the signals that save first: 'SIGUSR1 or SIGTERM'), and the newest complete
    checkpoint that ``save``'s tracker names, with how to go on from it. Reads the tracker and
    nothing else (no module that imports torch: the interrupt may have left one half imported).
    """
    from megatron_gamma.rundir.paths import TRACKER, checkpoint_dir

    said = f"; Ctrl-C saves nothing ({stop} saves a checkpoint first, then stops)"
    if save is None:
        return f"{said}, and this run has no --save: nothing of it can be resumed"
    try:
        with open(os.path.join(save, TRACKER), encoding="utf-8") as f:
            text = f.read().strip()
    except OSError:
        text = ""
    if not text.isdigit() or not os.path.isdir(checkpoint_dir(save, int(text))):
        return f"{said}; {save} holds no complete checkpoint yet, so there is nothing to resume"
    return (
        f"{said}; the newest complete checkpoint is {checkpoint_dir(save, int(text))} (iteration "
        f"{int(text)}: what was trained after it is lost). Fix: to go on from it, rerun with "
        f"--load {shlex.quote(save)}"
    )


def done_line(result, saved: bool = True) -> str:
    """The run's last line: ``done: iteration N``, the last validation loss where there was
    one (with its iteration where that is not N: a run stopped between validations, trial 13),
    what the run trained (none: it resumed at or past its end), and, where ``saved`` is False
    (no ``--save``), that it wrote no checkpoint."""
    line = f"done: iteration {result.iteration}"
    if result.valid_losses:
        last = max(result.valid_losses)
        line += f", validation loss {result.valid_losses[last]:.4f}"
        line += f" at iteration {last}" if last != result.iteration else ""
    steps = len(result.train_losses)
    line += (
        f" ({steps} iteration{'s' if steps > 1 else ''} trained)"
        if steps
        else " (nothing trained: the run was already at --train-iters or --exit-interval)"
    )
    return line if saved else f"{line}; no checkpoint written (no --save)"


def _analyze(args: argparse.Namespace) -> None:
    import json

    from megatron_gamma.rundir.paths import analysis_dir, check_output_dir

    # the checks that read no checkpoint, before torch and megatron-core are imported
    analysis_dir(args.run_dirs, args.output_dir, args.heatmap_rows, args.condensation_rows)
    if args.data_cache_path is not None:
        check_output_dir(args.data_cache_path, "--data-cache-path")
    from megatron_gamma.diagnostics.analyze import analyze, headline_lines

    written = analyze(
        args.run_dirs,
        args.output_dir,
        data_path=args.data_path,
        data_cache_path=args.data_cache_path,
        include_init=not args.no_init,
        heatmaps=args.heatmaps,
        heatmap_iterations=args.heatmap_iterations,
        heatmap_rows=args.heatmap_rows,
        condensation_rows=args.condensation_rows,
        progress=not args.no_progress,
    )
    for name, path in written.items():
        print(f"wrote {name}: {path}")
    with open(written["json"], encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    print("\n".join(headline_lines(runs)))


def _check_checkpoints(checkpoints: dict, configs: dict) -> None:
    """Refuse checkpoints and config files that do not exist, before torch and megatron-core
    are imported (``export-hf``, ``compare``; ``evaluate`` has its own).

    Args:
        checkpoints: {name for the message: path} of checkpoints, checkpoint roots or run
            directories (:func:`~megatron_gamma.rundir.paths.missing_checkpoint`).
        configs: {flag: path or None} of config.yaml files that replace a checkpoint's own.

    Raises:
        ConfigError: naming the value and the fix.
    """
    from megatron_gamma.rundir.paths import missing_checkpoint

    for name, ckpt in checkpoints.items():
        missing = missing_checkpoint(ckpt, name)
        if missing:
            raise ConfigError(missing)
    for flag, path in configs.items():
        if path is not None and not os.path.isfile(path):
            raise ConfigError(
                f"{flag}={path!r}: no such file. Fix: pass the run's config.yaml, or drop {flag} "
                "for the config the checkpoint carries"
            )


def _compare(args: argparse.Namespace) -> None:
    from megatron_gamma.config import load_config
    from megatron_gamma.rundir.paths import check_output_dir, check_replaced_dir

    _check_checkpoints(
        {"CKPT_A": args.ckpt_a, "CKPT_B": args.ckpt_b},
        {"--config-a": args.config_a, "--config-b": args.config_b},
    )
    load_config(None, {"data_path": [args.data_path]}).data.blend()
    check_output_dir(args.output_dir, "--output-dir")
    check_replaced_dir(args.output_dir, "compare")
    from megatron_gamma.diagnostics.compare import compare, summary_lines

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
    print("\n".join(summary_lines(out)))
    for name, path in out["files"].items():
        print(f"wrote {name}: {path}")


def _estimate(args: argparse.Namespace) -> None:
    from megatron_gamma.config import load_config, overrides_from_args
    from megatron_gamma.data.tokenizer_types import tokenizer_vocab_size
    from megatron_gamma.estimate import ESTIMATE_WORLD, report
    from megatron_gamma.model.vocab import model_vocab_size

    if args.world_size is not None and args.world_size < 1:
        raise ConfigError(
            f"world_size={args.world_size}: must be >= 1. Fix: pass --world-size N, the GPUs in "
            "the job"
        )
    cfg = load_config(args.config, overrides_from_args(args))
    world = args.world_size or cfg.cluster.world_size()
    if world is None:
        raise ConfigError(
            "world_size=None: no GPU count (no --world-size, and the config sets no "
            f"cluster.slurm_nodes). Fix: pass {ESTIMATE_WORLD} (G defaults to 8)"
        )
    try:  # as pretrain: the larger of the tokenizer's size and --vocab-size
        tokenizer_vocab = tokenizer_vocab_size(cfg.data)
    except ConfigError as e:
        if cfg.model.vocab_size is None:
            raise ConfigError(
                f"{e}; without the tokenizer, estimate needs the vocabulary size: --vocab-size N"
            ) from None
        tokenizer_vocab = 0  # the tokenizer lives on the cluster: --vocab-size alone
    vocab = model_vocab_size(cfg, tokenizer_vocab)
    print(_vocabulary_line(cfg, tokenizer_vocab, vocab))
    print(report(cfg, vocab, world, cfg.cluster.gpu_memory_gb))


def _vocabulary_line(cfg, tokenizer_vocab: int, padded: int) -> str:
    """Which vocabulary size ``estimate`` used, and where it came from (the tokenizer, named,
    or --vocab-size)."""
    d = cfg.data
    note = ""
    if d.tokenizer_type == "GPT2BPETokenizer":
        source = (
            f"the GPT-2 BPE of --vocab-file {shlex.quote(d.vocab_file)} and --merge-file "
            f"{shlex.quote(d.merge_file)}"
        )
    elif d.tokenizer_model is None:
        source = "the packaged demo tokenizer"
        note = "; no --tokenizer-model given: pass yours for its vocabulary"
    else:
        source = f"--tokenizer-model {shlex.quote(d.tokenizer_model)}"
    flag = cfg.model.vocab_size or 0
    if not tokenizer_vocab:
        used = f"--vocab-size {flag:,} (the tokenizer cannot be read here)"
    elif flag > tokenizer_vocab:
        used = f"--vocab-size {flag:,} (more than the {tokenizer_vocab:,} tokens of {source})"
    else:
        used = f"{tokenizer_vocab:,} tokens of {source}"
    return f"vocabulary: {used}, padded to {padded:,}{note}"


_KEPT = "; finished outputs are kept, nothing half-written: rerun the same command to go on"
INTERRUPTED = {"preprocess": _KEPT, "merge": _KEPT}
"""What an interrupted (Ctrl-C) command leaves, where it says more than 'interrupted' (pretrain
says it with the interrupt it raises again: :func:`pretrain_interrupted`)."""

EVAL_EXTRA_MODULES = ("transformers", "safetensors", "lm_eval", "accelerate")
"""Import names of setup.py's ``eval`` extra (``EVAL_REQUIRES``): ``export-hf``, ``import-hf``
and ``evaluate --tasks`` need them; the default install leaves them out."""
_LOSS_FLAGS = ("data_path", "eval_tokens", "seq_length", "micro_batch_size", "data_cache_path")
_TASK_FLAGS = (
    "compare",
    "compare_config",
    "include_path",
    "trust_task_code",
    "num_fewshot",
    "limit",
    "batch_size",
    "device",
    "bootstrap_samples",
)


def _reject_inactive(args: argparse.Namespace, names: tuple[str, ...], why: str) -> None:
    for name in names:
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag}={getattr(args, name)!r}: {why}. Fix: drop {flag}")


def _evaluate_loss(args: argparse.Namespace) -> None:
    import json

    from megatron_gamma.evaluation.evaluate import evaluate

    out = evaluate(
        args.checkpoint,
        args.data_path,
        config=args.config,
        eval_tokens=args.eval_tokens,
        seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size,
        data_cache_path=args.data_cache_path,
    )
    if read_dist_env().rank != 0:
        return
    print(
        f"{out['checkpoint']} (iteration {out['iteration']}): loss {out['loss']:.6f}, "
        f"perplexity {out['perplexity']:.4f} on {out['tokens']} tokens of {out['scored']}"
    )
    if args.output_dir:
        from megatron_gamma.rundir.paths import replaced_dir

        with replaced_dir(args.output_dir, "evaluate") as tmp:
            with open(os.path.join(tmp, "eval_loss.json"), "w", encoding="utf-8") as f:
                json.dump(out, f, indent=2)
        print(f"wrote {os.path.join(args.output_dir, 'eval_loss.json')}")


def _check_evaluate_values(args: argparse.Namespace) -> None:
    """Refuse out-of-range ``evaluate`` counts before any checkpoint is read.

    lm-eval reads ``--limit`` below 1 as a fraction of each task's items (rounded up) and from 1
    on as a count (``int(limit)``, which would drop a fractional part silently).

    Raises:
        ConfigError: a count below 1 (``--num-fewshot`` below 0), or a ``--limit`` that is
            neither a fraction in (0, 1) nor a whole number >= 1; the message names the flag and
            the fix.
    """
    counts = ("eval_tokens", "seq_length", "micro_batch_size", "batch_size", "bootstrap_samples")
    for name in counts:
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{flag}={value}: must be >= 1. Fix: pass a positive count, or drop {flag} for "
                "its default"
            )
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise ConfigError(
            f"--num-fewshot={args.num_fewshot}: must be >= 0. Fix: pass 0 for zero-shot, or drop "
            "it for each task's default"
        )
    limit = args.limit
    if limit is not None and not (0 < limit < 1 or (limit >= 1 and limit.is_integer())):
        raise ConfigError(
            f"--limit={limit!r}: lm-eval reads a value below 1 as a fraction of each task's items "
            "and one from 1 on as a whole number of items. Fix: pass a fraction in (0, 1), e.g. "
            "--limit 0.1, or a whole number >= 1, e.g. --limit 100"
        )


def _check_evaluate_paths(args: argparse.Namespace) -> None:
    """Refuse ``evaluate``'s paths that cannot serve, before any checkpoint is read.

    Raises:
        ConfigError: a checkpoint (CKPT, ``--compare``) that does not exist
            (:func:`~megatron_gamma.rundir.paths.missing_checkpoint`), a ``--config`` or
            ``--compare-config`` that is not a file, an ``--include-path`` that is not a
            directory or whose task files would run Python code without ``--trust-task-code``
            (:func:`~megatron_gamma.evaluation.task_code.check_task_code`) or whose task files
            for ``--tasks`` name local data files that do not exist
            (:func:`~megatron_gamma.evaluation.task_data.check_task_data`), a ``--data-path``
            blend that is malformed or names a prefix without its files
            (:meth:`~megatron_gamma.config.DataConfig.blend`), an ``--output-dir`` (with
            ``--tasks`` its default ``./eval`` too) that holds files evaluate does not write
            (:func:`~megatron_gamma.rundir.paths.check_replaced_dir`), or an ``--output-dir`` or
            ``--data-cache-path`` that cannot be made or written
            (:func:`~megatron_gamma.rundir.paths.check_output_dir`);
            the message names the flag, the value and the fix.
    """
    from megatron_gamma.config import load_config
    from megatron_gamma.evaluation.task_code import check_task_code
    from megatron_gamma.evaluation.task_data import check_task_data
    from megatron_gamma.rundir.paths import check_output_dir, check_replaced_dir

    checkpoints = {"checkpoint": args.checkpoint, "--compare": args.compare}
    _check_checkpoints(
        {name: ckpt for name, ckpt in checkpoints.items() if ckpt is not None},
        {"--config": args.config, "--compare-config": args.compare_config},
    )
    if args.include_path is not None and not os.path.isdir(args.include_path):
        raise ConfigError(
            f"--include-path={args.include_path!r}: not a directory (lm-eval would skip it "
            "without a word). Fix: pass the directory that holds your task YAML files"
        )
    if args.trust_task_code is not None and args.include_path is None:
        raise ConfigError(
            "--trust-task-code: acts only on the task files of --include-path (lm-eval's own "
            "tasks come with the installed package). Fix: drop --trust-task-code"
        )
    check_task_code(args.include_path, bool(args.trust_task_code))
    if args.tasks is not None:
        check_task_data(args.include_path, [t for t in args.tasks.split(",") if t])
    if args.data_path:
        load_config(None, {"data_path": args.data_path}).data.blend()
    output_dir = args.output_dir if args.tasks is None else args.output_dir or "eval"
    if output_dir is not None:
        check_output_dir(output_dir, "--output-dir")
        check_replaced_dir(output_dir, "evaluate")
    if args.data_cache_path is not None:
        check_output_dir(args.data_cache_path, "--data-cache-path")


def _check_evaluate_windows(args: argparse.Namespace) -> None:
    """Refuse the held-out loss's counts that cannot be scored, before torch and megatron-core,
    where the flags decide them: with ``--data-path`` the windows are cut from its prefixes (not
    from the run's split), of ``--seq-length`` tokens, else of the ``seq_length`` of ``--config``
    (the run's config then); without either the run's seq_length is in its checkpoint, read
    with torch, and :func:`~megatron_gamma.evaluation.evaluate.evaluate` checks them there.

    Raises:
        ConfigError: ``--data-cache-path`` with ``--data-path``, a window longer than the
            positions of ``--config``'s model, fewer than one window in ``--eval-tokens``, or a
            prefix whose ``.idx`` holds fewer tokens than one window or than its share
            (:mod:`~megatron_gamma.evaluation.windows`, the checks ``evaluate`` makes).
    """
    if args.tasks is not None or not args.data_path:
        return
    from megatron_gamma.config import load_config
    from megatron_gamma.evaluation.windows import (
        check_data_cache_path,
        evaluation_blend,
        window_count,
        window_shares,
    )

    check_data_cache_path(args.data_cache_path, args.data_path)
    cfg = load_config(args.config)  # the run's config where --config gives it
    model = cfg.model if args.config is not None else None
    seq = args.seq_length if args.seq_length is not None else getattr(model, "seq_length", None)
    if seq is None:
        return
    window_count(args.eval_tokens, seq, getattr(model, "max_position_embeddings", None))
    window_shares(args.eval_tokens, seq, *evaluation_blend(cfg, args.data_path))


def _evaluate(args: argparse.Namespace) -> None:
    # every check that needs no model, before torch (the device check aside) and megatron-core
    # are imported: a refusal takes a fraction of a second instead of those imports' seconds
    _check_evaluate_values(args)
    if args.tasks is None:
        _reject_inactive(args, _TASK_FLAGS, "acts only with --tasks")
    else:
        _reject_inactive(
            args, _LOSS_FLAGS, "acts only on the held-out loss (evaluate without --tasks)"
        )
        if args.compare is None:
            _reject_inactive(
                args, ("compare_config", "bootstrap_samples"), "acts only with --compare"
            )
    _check_evaluate_paths(args)
    _check_evaluate_windows(args)
    if args.tasks is None:
        _evaluate_loss(args)
        return
    if args.device is not None:
        from megatron_gamma.evaluation.device import lm_eval_device

        lm_eval_device(args.device)  # imports torch: after the checks that need none
    from megatron_gamma.evaluation.benchmarks import benchmark

    if args.limit is not None and args.limit >= 1:
        args.limit = int(args.limit)
    report = benchmark(
        args.checkpoint,
        [t for t in args.tasks.split(",") if t],
        args.output_dir or "eval",
        compare=args.compare,
        config=args.config,
        compare_config=args.compare_config,
        include_path=args.include_path,
        trust_task_code=bool(args.trust_task_code),
        num_fewshot=args.num_fewshot,
        limit=args.limit,
        batch_size=1 if args.batch_size is None else args.batch_size,
        device=args.device or "cpu",
        bootstrap_samples=10000 if args.bootstrap_samples is None else args.bootstrap_samples,
    )
    with open(report["files"]["markdown"], encoding="utf-8") as f:
        print(f.read(), end="")
    print(f"wrote {report['files']['json']}")


def _export_hf(args: argparse.Namespace) -> None:
    from megatron_gamma.rundir.paths import check_new_dir

    _check_checkpoints({"checkpoint": args.checkpoint}, {"--config": args.config})
    check_new_dir(args.out_dir, "out_dir", "choose a new directory")
    from megatron_gamma.hf.hf_export import export_hf

    out = export_hf(
        args.checkpoint,
        args.out_dir,
        config=args.config,
        hf_format=args.hf_format,
        max_shard_size=args.max_shard_size,
    )
    print(f"exported iteration {out['iteration']} as {out['model_type']}: {out['out_dir']}")


def _shard_size(value: str) -> int | str:
    """``--max-shard-size``: bytes as an integer, or a string that ``save_pretrained`` reads
    (checked by the function it hands the value to, huggingface_hub's
    ``split_torch_state_dict_into_shards``, on no tensors: before any loading)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    try:
        return int(value)
    except ValueError:
        pass
    try:
        split_torch_state_dict_into_shards({}, max_shard_size=value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r}: not a size save_pretrained reads (bytes as an integer, "
            "or a number with the unit TB, GB, MB or KB). Fix: pass e.g. --max-shard-size 5GB "
            "(the default), 500MB or 2000000000"
        ) from None
    return value


def _import_hf(args: argparse.Namespace) -> None:
    from megatron_gamma.rundir.paths import check_new_dir, missing_hf_dir

    missing = missing_hf_dir(args.hf_dir)
    if missing:
        raise ConfigError(missing)
    check_new_dir(os.path.abspath(args.run_dir), "run_dir", "choose a new run directory")
    from megatron_gamma.hf.hf_import import import_hf

    out = import_hf(args.hf_dir, args.run_dir)
    print(f"imported iteration {out['iteration']}: {out['checkpoint']}")
    for warning in out["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)


def _cluster_options(args: argparse.Namespace) -> dict:
    return {
        "account": args.account,
        "qos": args.qos,
        "partition": args.partition,
        "time": args.time,
        "dependency": args.dependency,
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

    overrides = overrides_from_args(args)
    for flag, config_flag in (("nodes", "slurm_nodes"), ("gpus_per_node", "slurm_gpus_per_node")):
        given, other = getattr(args, flag), overrides.get(config_flag)
        if given is not None and other is not None and given != other:
            dash = "--" + flag.replace("_", "-")
            raise ConfigError(
                f"{dash} {given} and --{config_flag.replace('_', '-')} {other}: two counts for "
                f"the same job. Fix: give one ({dash} sets the job's; the frozen config records it)"
            )
    job = PretrainJob(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        launcher=args.launcher,
        warning_seconds=args.warning_seconds,
        env=overrides.pop("env", None) or {},  # --env adds to the config's cluster.env
        **_cluster_options(args),
    )
    result = submit_pretrain(args.config, overrides, job, dry_run=args.dry_run)
    _print_submission(result, args.dry_run)


def _submit_preprocess(args: argparse.Namespace) -> None:
    from megatron_gamma.data.commands import check_submit_preprocess, task_flags
    from megatron_gamma.launch.slurm import PreprocessJob, submit_preprocess

    job = PreprocessJob(
        inputs=args.input,
        options=task_flags(args),
        output_prefix=args.output_prefix,
        num_shards=args.num_shards,
        workers=args.workers,
        env=args.env or {},
        **_cluster_options(args),
    )
    check_submit_preprocess(args, container=bool(args.container_image))
    _print_submission(submit_preprocess(job, dry_run=args.dry_run), args.dry_run)
    if not args.dry_run:
        prefix, n = os.path.abspath(args.output_prefix), args.num_shards
        print(
            f"outputs, as preprocess --num-shards {n} writes them: {prefix}_*.bin/.idx and "
            f"{prefix}.stats.json, whose data_path is the blend for --data-path (the "
            f"{'merge job' if n > 1 else 'array task'}'s log prints it)"
        )


def _sweep(args: argparse.Namespace) -> None:
    slurm_only = {**_cluster_options(args), "gpus_per_node": args.gpus_per_node != 1}
    slurm_only["warning_seconds"] = args.warning_seconds != 300
    given = [k for k, v in slurm_only.items() if v]
    if args.slurm and args.jobs != 1:
        raise ConfigError(
            f"jobs={args.jobs}: runs on this machine only. Fix: drop --jobs with --slurm (the "
            "array runs every task at once)"
        )
    if given and not args.slurm:
        raise ConfigError(
            f"{given[0]}={getattr(args, given[0])!r}: only used with --slurm. Fix: add --slurm "
            "or drop the flag"
        )
    if args.slurm:
        from megatron_gamma.launch.slurm import ClusterOptions
        from megatron_gamma.study.slurm import submit_study

        result = submit_study(
            args.study,
            args.output_dir,
            ClusterOptions(**_cluster_options(args)),
            gpus_per_node=args.gpus_per_node,
            warning_seconds=args.warning_seconds,
            dry_run=args.dry_run,
        )
        _print_submission(result, args.dry_run)
        return
    from megatron_gamma.study.sweep import dry_run, sweep

    if args.dry_run:
        print(dry_run(args.study, args.output_dir, jobs=args.jobs))
        return
    runs = sweep(args.study, args.output_dir, jobs=args.jobs)
    print(f"sweep: {len(runs)} runs finished in {args.output_dir}")


def _report(args: argparse.Namespace) -> None:
    import json

    from megatron_gamma.study.spec import manifest_path

    manifest_path(args.study_dir)  # before the imports of the report's statistics and plots
    from megatron_gamma.study.report import report
    from megatron_gamma.study.verdicts import Verdict

    command = "megatron-gamma " + shlex.join(sys.argv[1:])
    written = report(args.study_dir, output=args.output, command=command, note=args.note)
    for name, path in written.items():
        print(f"wrote {name}: {path}")
    with open(written["json"], encoding="utf-8") as f:
        rows = json.load(f)["verdicts"]
    print(f"verdicts (the numbers and rules: {written['report']}):")
    for row in (Verdict(**r) for r in rows):
        print(row.console_line())


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--account", help="SLURM account to charge (default: the user's)")
    p.add_argument("--qos", help="SLURM quality of service (default: the account's)")
    p.add_argument("--partition", help="SLURM partition (default: the cluster's)")
    p.add_argument("--time", help="time limit, e.g. 04:00:00 (default: the partition's)")
    p.add_argument(
        "--dependency",
        help="sbatch --dependency, e.g. 'singleton' (one job of this name at a time) or "
        "'afterok:JOBID'",
    )
    p.add_argument("--container-image", help="pyxis/enroot image or .sqsh file")
    p.add_argument("--container-mounts", help="pyxis mounts, host:container[,...]")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="submit nothing: print the sbatch script (submit also writes the resolved config "
        "it references; sweep without --slurm prints its plan of runs instead)",
    )


_CHECKPOINT_TRUST = (
    "Checkpoints are read through a restricted unpickler (megatron_gamma.checkpoint_trust): "
    "one whose pickles reference a class no megatron-core checkpoint holds is refused with a "
    "CheckpointError before it can run code. Load only checkpoints written by megatron-gamma / "
    "megatron-core; third-party weights enter as safetensors through import-hf."
)


class _Parser(argparse.ArgumentParser):
    """argparse without prefix abbreviations (``--save-int 7`` is an error, not
    ``--save-interval 7``); subcommand parsers inherit the class."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """Exit 2 with ``PROG: error: MESSAGE`` and a pointer to ``--help`` (the full usage of
        ``pretrain`` is a hundred lines that would bury the message): a command's lists its
        flags, the top level's the commands."""
        what = "every command" if self.prog == "megatron-gamma" else "every flag"
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists {what})\n")


def _stem(flag: str) -> str:
    """A flag without ``--`` and a ``no-`` prefix: ``--no-load-optim`` -> ``load-optim``."""
    name = flag[2:]
    return name[3:] if name.startswith("no-") else name


def _did_you_mean(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """'unrecognized arguments: --lr-warmup 5 (did you mean --lr-warmup-iters?)'. A suggestion
    must also be close without the shared ``--`` / ``--no-`` prefix (ratio >= 0.75), which alone
    made ``--no-bias-gelu-fusion`` look like ``--no-add-bias-linear``."""
    known = [o for o in parser._option_string_actions if o.startswith("--")]
    hints = []
    for arg in unknown:
        flag = arg.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=3) if flag.startswith("--") else []
        close = [
            k for k in close if difflib.SequenceMatcher(None, _stem(flag), _stem(k)).ratio() >= 0.75
        ]
        if close:
            hints.append(f"{flag}: did you mean {close[0]}?")
    message = f"unrecognized arguments: {' '.join(unknown)}"
    return f"{message} ({'; '.join(hints)})" if hints else message


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line; an unknown command (:func:`_check_command`) or flag exits 2
    naming the closest known one, and a Megatron-LM flag megatron-gamma refuses
    (:data:`~megatron_gamma.config.megatron_lm.REFUSED`, for ``preprocess`` and
    ``submit-preprocess`` ``PREPROCESS_REFUSED``) exits 2 with one line per such flag: why,
    and the fix. ``preprocess`` and ``submit-preprocess`` take a flag of
    ``PREPROCESS_NO_EFFECT`` at its no-effect value (``--partitions 1``) with a warning."""
    parser = build_parser()
    _check_command(parser, sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    preprocess = args.command in ("preprocess", "submit-preprocess")
    if unknown and preprocess:
        unknown, notes = no_effect_flags(unknown)
        for note in notes:
            print(f"megatron-gamma {args.command}: warning: {note}", file=sys.stderr, flush=True)
    if unknown:
        command = parser._subparsers._group_actions[0].choices[args.command]
        table = PREPROCESS_REFUSED if preprocess else REFUSED
        refused = refused_flags(unknown, table)
        if refused:
            others = [a for a in unknown if a.startswith("-") and a.split("=")[0] not in table]
            if others:
                refused.append(_did_you_mean(command, others))
            command.error("Megatron-LM flags megatron-gamma refuses:\n  " + "\n  ".join(refused))
        command.error(_did_you_mean(command, unknown))
    return args


COMMAND_HINTS = {
    "study": "sweep (it runs a study; report then judges it)",
    "train": "pretrain",
    "eval": "evaluate",
}
"""Commands a user may try for one of ours, by the field's or another tool's name."""


def _check_command(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Exit 2 where the first argument is no command, naming the nearest (``COMMAND_HINTS``,
    else the closest by spelling): argparse lists all of them and suggests none (trial 13:
    ``megatron-gamma study`` for ``sweep``)."""
    if not argv or argv[0].startswith("-"):
        return
    commands = parser._subparsers._group_actions[0].choices
    if argv[0] in commands:
        return
    close = difflib.get_close_matches(argv[0], list(commands), n=1, cutoff=0.6)
    hint = COMMAND_HINTS.get(argv[0]) or (close[0] if close else None)
    parser.error(
        f"argument command: invalid choice: {argv[0]!r}"
        + (f" (did you mean {hint}?)" if hint else f" (choose from {', '.join(commands)})")
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``megatron-gamma`` argument parser with all subcommands."""
    from megatron_gamma.config import add_config_flags
    from megatron_gamma.data.commands import add_data_commands, add_preprocess_flags

    parser = _Parser(prog="megatron-gamma", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    add_data_commands(sub)

    p = sub.add_parser(
        "pretrain",
        help="pretrain a GPT model (YAML config + Megatron flags)",
        epilog=_CHECKPOINT_TRUST,
    )
    p.add_argument(
        "--config",
        action="append",
        help="YAML config file; repeat to layer files (a recipe, then an ablation override)",
    )
    add_config_flags(p)
    p.set_defaults(func=_pretrain)

    p = sub.add_parser(
        "estimate", help="parameters, FLOPs and per-GPU memory of a config or of flags alone"
    )
    p.add_argument(
        "--config",
        action="append",
        help="YAML config file(s); optional, as for pretrain: flags alone size a model too",
    )
    p.add_argument(
        "--world-size", type=int, help="GPUs in the job (default: the config's SLURM shape)"
    )
    add_config_flags(p)
    p.set_defaults(func=_estimate)

    p = sub.add_parser("submit", help="render an sbatch script from a config and submit it")
    p.add_argument(
        "--config",
        action="append",
        required=True,
        help="YAML config file; repeat to layer files (a recipe, then an ablation override)",
    )
    p.add_argument(
        "--nodes", type=int, help="nodes to allocate (default: the config's cluster.slurm_nodes)"
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        help="GPUs (processes) per node (default: the config's cluster.slurm_gpus_per_node)",
    )
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

    p = sub.add_parser(
        "submit-preprocess",
        help="preprocess as a SLURM array + merge job",
        description="`preprocess --num-shards N` as a SLURM job array (task i: --shard-index i) "
        "and a merge job, writing what the local run writes. It takes preprocess's flags (but "
        "--shard-index and --no-progress) and passes them to every task.",
    )
    add_preprocess_flags(p)
    p.add_argument("--num-shards", type=int, required=True, help="array tasks (shards)")
    p.add_argument(
        "--env",
        action="append",
        metavar="KEY=VALUE",
        help="export KEY=VALUE in the job (repeatable)",
    )
    _add_cluster_flags(p)
    p.set_defaults(func=_submit_preprocess)
    p = sub.add_parser(
        "analyze",
        help="diagnostics plots + numbers from a run's checkpoints",
        epilog=_CHECKPOINT_TRUST,
    )
    p.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run directories or checkpoint (--save) dirs"
    )
    p.add_argument(
        "--output-dir",
        help="default RUN_DIR/analysis (required for several runs); written whole, an earlier "
        "analysis there moved aside to DIR.superseded-N",
    )
    p.add_argument("--data-path", nargs="+", help="dataset blend for activations (default: run's)")
    p.add_argument(
        "--data-cache-path",
        help="megatron-core's dataset index caches (default RUN_DIR/data_cache; never the "
        "checkpoint's recorded path)",
    )
    p.add_argument("--heatmaps", nargs="+", metavar="ROLE/layer_LL", help="e.g. qkv.q/layer_00")
    p.add_argument("--heatmap-iterations", nargs="+", type=int, help="checkpoint iterations")
    p.add_argument("--heatmap-rows", type=int, default=256, help="rows sampled per heatmap")
    p.add_argument(
        "--condensation-rows",
        type=int,
        help="rows sampled per condensation score (default 128, the sample pretrain's live "
        "diagnostics take, so a tag has one value in metrics.jsonl and analysis.csv)",
    )
    p.add_argument("--no-init", action="store_true", help="skip iteration 0 (initialization)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_analyze)

    p = sub.add_parser(
        "compare",
        help="per-token delta_sym of two checkpoints by difficulty",
        epilog=_CHECKPOINT_TRUST,
    )
    p.add_argument("ckpt_a", metavar="CKPT_A", help="checkpoint, checkpoint dir or run dir")
    p.add_argument("ckpt_b", metavar="CKPT_B", help="the other model, in the same forms")
    p.add_argument(
        "--data-path",
        required=True,
        help="(required) one indexed dataset prefix of held-out text, scored by both models",
    )
    p.add_argument(
        "--output-dir",
        required=True,
        help="(required) where compare.json, tokens.npz, delta_sym_by_difficulty.csv and .png "
        "go; written whole, an earlier compare there moved aside to DIR.superseded-N",
    )
    p.add_argument("--config-a", help="A's config.yaml (default: the checkpoint's own)")
    p.add_argument("--config-b", help="B's config.yaml (default: the checkpoint's own)")
    p.add_argument(
        "--num-sequences", type=int, default=64, help="token windows scored (default 64)"
    )
    p.add_argument(
        "--seq-length", type=int, help="window length (default: the shorter model seq_length)"
    )
    p.add_argument(
        "--micro-batch-size", type=int, default=4, help="windows per forward pass (default 4)"
    )
    p.add_argument(
        "--num-bins", type=int, default=10, help="equal-count difficulty bins (default 10)"
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_compare)

    p = sub.add_parser(
        "evaluate",
        help="held-out loss, or lm-eval benchmarks, of a checkpoint",
        epilog=_CHECKPOINT_TRUST,
    )
    p.add_argument("checkpoint", metavar="CKPT", help="checkpoint, checkpoint dir or run dir")
    p.add_argument("--config", help="the run's config.yaml (default: the checkpoint's own)")
    p.add_argument(
        "--data-path",
        nargs="+",
        help="prefix or blend W1 P1 ... to score (replaces the run's data). Default: the run's "
        "valid_data_path, else its own validation split (data_path + --split): the "
        "eval_iters x global_batch_size samples pretrain's validation scored, so the loss of "
        "the checkpoint of iteration N is the validation loss pretrain logged at N",
    )
    p.add_argument(
        "--eval-tokens",
        type=int,
        help="tokens scored for the loss (default 65536); refused on the run's validation "
        "split, which is scored with pretrain's samples (--eval-iters x --global-batch-size)",
    )
    p.add_argument(
        "--seq-length",
        type=int,
        help="window length (default: the run's); refused on the run's validation split",
    )
    p.add_argument(
        "--micro-batch-size",
        type=int,
        help="windows per forward pass (default 4; on the run's validation split the run's "
        "micro-batch size, and the loss is averaged over the run's micro-batches either way)",
    )
    p.add_argument(
        "--data-cache-path",
        help="on the run's validation split: megatron-core's index caches, read or built there "
        "and kept (e.g. RUN/data_cache, pretrain's default; default: a scratch directory, "
        "removed at exit, so each call builds them again)",
    )
    p.add_argument("--tasks", help="comma-separated lm-eval tasks, e.g. hellaswag,gsm8k")
    p.add_argument(
        "--compare",
        metavar="OTHER_CKPT",
        help="with --tasks: a second checkpoint scored on the same items, with paired-bootstrap "
        "intervals of the difference (for two held-out losses, run evaluate on each)",
    )
    p.add_argument("--compare-config", help="OTHER_CKPT's config.yaml")
    p.add_argument("--include-path", help="directory of extra lm-eval task YAML files")
    p.add_argument(
        "--trust-task-code",
        action="store_true",
        default=None,
        help="let the task files of --include-path run their Python code (lm-eval's !function "
        "tag imports the module beside the file); refused without this flag",
    )
    p.add_argument("--num-fewshot", type=int, help="few-shot examples (default: each task's)")
    p.add_argument("--limit", type=float, help="items per task (whole) or fraction in (0, 1)")
    p.add_argument("--batch-size", type=int, help="lm-eval batch size (default 1)")
    p.add_argument("--device", help="lm-eval device, with --tasks: cpu (default), cuda or cuda:N")
    p.add_argument("--bootstrap-samples", type=int, help="paired bootstrap draws (default 10000)")
    p.add_argument(
        "--output-dir",
        help="eval.json/eval.md (tasks; default ./eval) or eval_loss.json; written whole, an "
        "earlier evaluate there moved aside to DIR.superseded-N",
    )
    p.set_defaults(func=_evaluate)

    p = sub.add_parser(
        "export-hf", help="checkpoint -> Hugging Face model directory", epilog=_CHECKPOINT_TRUST
    )
    p.add_argument("checkpoint", metavar="CKPT", help="checkpoint, checkpoint dir or run dir")
    p.add_argument("out_dir", metavar="OUT_DIR", help="new or empty directory")
    p.add_argument("--config", help="the run's config.yaml (default: the checkpoint's own)")
    p.add_argument(
        "--hf-format",
        choices=["auto", "llama", "gamma_gpt"],
        default="auto",
        help="auto: stock Llama when it fits exactly, else GammaGPT (trust_remote_code)",
    )
    p.add_argument(
        "--max-shard-size",
        type=_shard_size,
        default="5GB",
        help="largest safetensors file: bytes (e.g. 2000000000) or a number with TB, GB, MB or KB "
        "(e.g. 5GB, 500MB; default 5GB); a larger model is sharded with an index",
    )
    p.set_defaults(func=_export_hf)

    p = sub.add_parser(
        "import-hf",
        help="Hugging Face model directory -> run directory (model_type 'llama', 'qwen2', "
        "'qwen3', or 'gamma_gpt' as export-hf writes it)",
    )
    p.add_argument(
        "hf_dir",
        metavar="HF_DIR",
        help="a Llama (LlamaForCausalLM: RoPE, SwiGLU, RMSNorm, no linear biases), a Qwen2 "
        "(Qwen2ForCausalLM: Llama plus q/k/v biases, imported as --add-qkv-bias), a Qwen3 "
        "(Qwen3ForCausalLM: Llama plus per-head q/k RMSNorm, imported as --qk-layernorm), or an "
        "export-hf directory; other model types (Mistral, qwen2_moe, qwen3_moe, ...) and "
        "sliding-window attention are refused by name",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="new or empty run directory")
    p.set_defaults(func=_import_hf)
    p = sub.add_parser("sweep", help="run a study: every (arm, size, seed) as a pretrain run")
    p.add_argument("study", metavar="STUDY.yaml", help="study file (examples/studies/)")
    p.add_argument("--output-dir", required=True, help="study directory: DIR/ARM/SIZE/seed-S")
    p.add_argument("--slurm", action="store_true", help="submit one SLURM array (a task per run)")
    p.add_argument("--gpus-per-node", type=int, default=1, help="with --slurm: GPUs per run")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once on this machine, each single-threaded when > 1 (every arm of one "
        "size and seed finishes together)",
    )
    p.add_argument(
        "--warning-seconds", type=int, default=300, help="with --slurm: SIGUSR1 lead time"
    )
    _add_cluster_flags(p)
    p.set_defaults(func=_sweep)

    p = sub.add_parser(
        "report",
        help="fits, mechanisms and verdicts of a finished study (runs compare)",
        epilog=_CHECKPOINT_TRUST,
    )
    p.add_argument("study_dir", metavar="DIR", help="the sweep's --output-dir")
    p.add_argument("--output", help="report path (default DIR/report.md; plots in DIR/report/)")
    p.add_argument("--note", help="a line for the report's header, e.g. how the machine was shared")
    p.set_defaults(func=_report)
    return parser


PEER_GRACE_S = 5.0
"""How long a process other than its node's first waits, on a configuration error, for the
first to print it and exit (the launcher then stops the rest) before it prints its own."""


def _config_error(command: str, error: ConfigError) -> None:
    """Print a configuration error once per node: the node's first process (local rank 0) at
    once; any other only after :data:`PEER_GRACE_S`, prefixed with its local rank, if it is
    still running. Its exit must not come first: torchrun (and ``srun --kill-on-bad-exit``)
    stops the other processes at the first exit, and half the time it stopped the first one
    before it printed (trial 13: 4 of 8 launches showed no message)."""
    local_rank = read_dist_env().local_rank
    if local_rank == 0:
        print(f"megatron-gamma {command}: error: {error}", file=sys.stderr)
        return
    time.sleep(PEER_GRACE_S)
    print(f"megatron-gamma {command}: error on local rank {local_rank}: {error}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code: 2 for configuration errors, 1 for a dead worker
    process, a training loss that is not finite (``--check-for-nan-in-loss-and-grad``) or a
    standard output closed early (``| head``), 130 for Ctrl-C (each with its
    message, or none for the closed output, and no traceback). A configuration error
    (:class:`~megatron_gamma.config.ConfigError`), the same in every process of a launched job,
    is printed by the first process of each node (local rank 0), not once per process
    (:func:`_config_error`)."""
    args = parse_args(argv)
    summarize_accelerator_warnings()
    silence_library_noise()
    try:
        with megatron_core_without_wandb():  # ~1 CPU-s and 42 MiB less per process
            args.func(args)
        sys.stdout.flush()  # a reader that left (| head) is met here, not at interpreter exit
    except BrokenPipeError:
        # Python's documented recipe: the rest of the output goes nowhere, exit status 1
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except ConfigError as e:
        _config_error(args.command, e)
        return 2
    except (FileNotFoundError, ValueError) as e:
        print(f"megatron-gamma {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        note = e.args[0] if e.args else INTERRUPTED.get(args.command, "")
        print(f"megatron-gamma {args.command}: interrupted{note}", file=sys.stderr)
        return 130
    except RuntimeError as e:
        from megatron_gamma.data.workers import WorkerDied
        from megatron_gamma.training.errors import NonFiniteLossError

        if not isinstance(e, (WorkerDied, NonFiniteLossError)):
            raise
        print(f"megatron-gamma {args.command}: error: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in EVAL_EXTRA_MODULES:
            raise
        print(
            f"megatron-gamma {args.command}: error: {e.name} is not installed, and "
            f"{args.command} needs it (the eval extra). Fix: pip install --no-build-isolation "
            '-e ".[eval]"',
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
