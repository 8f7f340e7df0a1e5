"""The single-rank loader: a checkpoint's run config, rebuilt for one process, and its weights
in a freshly built model.

Checkpoints are megatron-core ``dist_checkpointing`` (torch_dist) directories whose tensors are
keyed by global names and shapes, so a checkpoint written under any TP/PP/EP layout loads into
a model built for one rank (TP = PP = EP = 1): that is how ``analyze``, ``compare``,
``evaluate``, ``export-hf`` and ``import-hf`` read them, and :func:`load_model_weights` also
serves training's weights-only loads (``--pretrained-checkpoint``, ``--finetune``) into the
training layout.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Optional

import torch
import yaml

from megatron_gamma import parallel
from megatron_gamma.config import (
    Config,
    ConfigError,
    RecordedPaths,
    config_from_dict,
    load_config,
)
from megatron_gamma.config.sections import is_dataset
from megatron_gamma.data import demo_dir
from megatron_gamma.model.vocab import model_vocab_size
from megatron_gamma.rundir import layout, paths


def single_rank_config(cfg: Config) -> Config:
    """``cfg`` rebuilt (through the validated constructor) for one process: TP = expert TP =
    PP = EP = 1, no virtual pipeline stages, no sequence parallelism, no distributed optimizer or
    overlapped gradient reduction or parameter gather. Any run's checkpoint loads into the model
    it builds."""
    return cfg.replace(
        tensor_model_parallel_size=1,
        expert_tensor_parallel_size=1,
        pipeline_model_parallel_size=1,
        num_layers_per_virtual_pipeline_stage=None,
        virtual_pipeline_model_parallel_size=None,
        num_virtual_stages_per_pipeline_rank=None,
        expert_model_parallel_size=1,
        sequence_parallel=False,
        use_distributed_optimizer=False,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
    )


SAMPLE_LENGTHS = ("lr_decay_samples", "lr_warmup_samples", "lr_wsd_decay_samples")
"""The sample-based LR schedule lengths, each with its ``_iters`` twin."""


def fp32_single_rank(cfg: Config) -> Config:
    """:func:`single_rank_config` with fp32 weights (``bf16 = fp16 = False``), iteration-based
    without a batch-size ramp-up (``train_iters`` keeps its value), so evaluation may change the
    batch sizes; rebuilt through :meth:`Config.replace`, so every check runs again.

    A sample-based run's LR schedule lengths become iterations (``lr_decay_samples`` →
    ``lr_decay_iters`` = ⌈samples / global_batch_size⌉, and so on; approximate under a ramp-up,
    which evaluation and loading never use: they do not step the optimizer)."""
    gbs = cfg.training.global_batch_size
    defaults = {f.name: f.default for f in dataclasses.fields(cfg.optimizer)}
    lengths = {}
    for key in SAMPLE_LENGTHS:
        samples = getattr(cfg.optimizer, key)
        if samples:
            lengths[key] = defaults[key]
            lengths[key.replace("_samples", "_iters")] = -(-samples // gbs)
    return single_rank_config(cfg).replace(
        bf16=False, fp16=False, train_samples=None, rampup_batch_size=None, **lengths
    )


_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")


@contextlib.contextmanager
def single_process(cfg: Config) -> Iterator[None]:
    """Initialize a one-process torch.distributed group and megatron-core parallel state
    (TP = PP = 1, via :func:`megatron_gamma.parallel.initialize`), and tear them down after.

    The launcher variables are hidden meanwhile and the environment is restored after, so the
    ``MASTER_ADDR``/``MASTER_PORT`` picked here are not inherited by processes started later
    (whose rendezvous would find the port still in TIME_WAIT)."""
    saved = {k: os.environ.get(k) for k in (*_LAUNCH_VARS, "MASTER_ADDR", "MASTER_PORT")}
    for var in _LAUNCH_VARS:
        os.environ.pop(var, None)
    try:
        parallel.initialize(single_rank_config(cfg))
        try:
            yield
        finally:
            parallel.destroy()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_config(path: str, config: Optional[str] = None, run_dir: Optional[str] = None) -> Config:
    """The config of the run that wrote ``path`` (a checkpoint, a checkpoint root or a run
    directory), from the first of:

    1. ``config``: a config.yaml given explicitly (``--config``, the override);
    2. the config carried by the newest checkpoint at ``path`` (:func:`layout.describe`);
    3. the ``config.yaml`` in ``path`` or up to three levels above it (checkpoints written
       before they carried their config).

    The input paths of 2 and 3 that are relative (data prefixes, ``tokenizer_model``,
    ``vocab_file``, ``merge_file``) are read as the run read them, from the directory it was
    launched from (:func:`resolve_recorded`); ``config``'s, like any file's given here, from
    the current directory.

    Args:
        path: where the run's checkpoints lie.
        config: the run's config.yaml, overriding the checkpoint's own.
        run_dir: where the run directory lies now (default: the directory of the config.yaml
            read, or the run directory the checkpoint was saved from).

    Raises:
        ConfigError: none of the three (names the fix), or an invalid config.
    """
    if config is not None:
        return load_config(config).replace(
            run_dir=run_dir or os.path.dirname(os.path.abspath(config))
        )
    try:
        ckpt = layout.resolve_checkpoint(path)
    except ConfigError:
        ckpt = None
    saved = layout.saved_description(ckpt)[0] if ckpt else None
    if saved is not None:
        cfg = resolve_recorded(config_from_dict(saved), recorded_paths(path))
        return cfg.replace(run_dir=run_dir) if run_dir else cfg
    found = layout.find_run_config(path)
    if found is None:
        raise ConfigError(
            f"path={path!r}: its checkpoint does not carry the run's config (saved before "
            f"checkpoints did) and there is no {layout.CONFIG} in it or its parents. Fix: pass "
            "the run's config.yaml with --config"
        )
    cfg = resolve_recorded(load_config(found), recorded_paths(path))
    return cfg.replace(run_dir=run_dir or os.path.dirname(found))


_BLENDS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")
_INPUT_FILES = ("tokenizer_model", "vocab_file", "merge_file")


def recorded_paths(path: str) -> Optional[RecordedPaths]:
    """Where the relative input paths of the run that wrote ``path`` (a run directory or a
    checkpoint in it) are looked for: its ``config.yaml`` (:func:`layout.find_run_config`) and
    the directories it may have been launched from (:func:`paths.launch_dirs`, from the
    ``run_dir`` that file records). None without that file: the current directory alone, as
    for any path.
    """
    found = layout.find_run_config(path)
    if found is None:
        return None
    try:
        with open(found, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        raw = None  # the launch directory stays unknown; the checkpoint carries the config
    return RecordedPaths(found, tuple(paths.launch_dirs(os.path.dirname(found), raw)))


def resolve_recorded(cfg: Config, recorded: Optional[RecordedPaths]) -> Config:
    """``cfg`` with each relative input path it records (the prefixes of ``data_path`` and the
    per-split blends, ``tokenizer_model``, ``vocab_file``, ``merge_file``) read from the first
    of ``recorded.dirs`` that holds it (a dataset: its ``.bin`` and ``.idx``): unchanged where
    that is the current directory, else the path there. One found under none stays as
    recorded, so that its read fails naming it (:meth:`DataConfig.blend` with ``recorded``).
    ``data_cache_path`` is left alone: the read commands never use the run's (a scratch
    directory, or ``--data-cache-path``). Nothing is written.

    Args:
        cfg: a run's config, as it records its paths.
        recorded: where to look (:func:`recorded_paths`); None: ``cfg`` unchanged.
    """
    if recorded is None:
        return cfg

    def find(value: Optional[str], exists: Callable[[str], bool]) -> Optional[str]:
        if not value or os.path.isabs(value):
            return value
        for base in recorded.dirs:
            if exists(os.path.join(base, value)):
                return value if base == os.getcwd() else os.path.join(base, value)
        return value

    d, changes = cfg.data, {}
    for key in _BLENDS:
        items = list(getattr(d, key))
        if len(items) == 1 or len(items) % 2 == 0:  # 'PREFIX' or 'W1 P1 W2 P2 ...'
            first = 1 if len(items) > 1 else 0
            for i in range(first, len(items), 2):
                items[i] = find(items[i], is_dataset)
        if items != getattr(d, key):
            changes[key] = items
    for key in _INPUT_FILES:
        value = find(getattr(d, key), os.path.exists)
        if value != getattr(d, key):
            changes[key] = value
    return cfg.replace(**changes) if changes else cfg


_SCRATCH: list[str] = []


def scratch_dir() -> str:
    """A directory of this process, removed when it exits, for the files a read of a run makes:
    the tokenizer.json of a ``GPT2BPETokenizer`` run. Not the run directory the config records,
    which for a config read from a checkpoint is the training host's, or wherever the
    checkpoint's author pointed it: reading a checkpoint writes nothing there."""
    if not _SCRATCH:
        path = tempfile.mkdtemp(prefix="megatron-gamma-read-")
        atexit.register(shutil.rmtree, path, True)
        _SCRATCH.append(path)
    return _SCRATCH[0]


def tokenizer_path(cfg: Config) -> str:
    """The run's tokenizer.json (the packaged demo tokenizer by default; the tokenizer.json in
    it for a ``tokenizer_model`` directory; for ``--tokenizer-type GPT2BPETokenizer`` the one
    made from its vocab and merges files, in :func:`scratch_dir`,
    :mod:`megatron_gamma.data.tokenizer_types`)."""
    if cfg.data.tokenizer_type == "GPT2BPETokenizer":
        return run_tokenizer(cfg).path
    path = cfg.data.tokenizer_model or os.path.join(demo_dir(), "tokenizer.json")
    return os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path


def run_tokenizer(cfg: Config):
    """The run's :class:`~megatron_gamma.data.tokenizer.BilingualTokenizer`, as training builds
    it (:func:`megatron_gamma.data.tokenizer_types.load_tokenizer`; a GPT-2 BPE's tokenizer.json
    in :func:`scratch_dir`): its EOD, PAD and BOS and its identity are training's."""
    from megatron_gamma.data.tokenizer_types import load_tokenizer

    return load_tokenizer(cfg.data, scratch_dir())


def check_tokenizer(
    ckpt: str, cfg: Config, fix: str, common: Optional[dict] = None
) -> Optional[str]:
    """Check that checkpoint ``ckpt`` was trained with ``cfg``'s tokenizer: the fingerprint in
    its common state (:func:`layout.describe`) must name the tokenizer ``cfg`` selects
    (:func:`megatron_gamma.data.tokenizer_types.load_tokenizer`, as training builds it; a GPT-2
    BPE's tokenizer.json in :func:`scratch_dir`): the same SHA-256, or the same canonical one
    where the checkpoint records it (a tokenizer.json saved again by ``transformers``:
    :func:`megatron_gamma.data.tokenizer_fingerprint.same_tokenizer`).
    Token ids of another tokenizer would silently mean other text.

    Args:
        ckpt: an ``iter_N`` checkpoint directory.
        cfg: the config whose tokenizer will read or write the checkpoint's token ids.
        fix: what the caller's user does to pass the checkpoint's tokenizer; ``{flags}`` in it
            is replaced with the flags that select it
            (:func:`megatron_gamma.data.tokenizer_fingerprint.tokenizer_flags`).
        common: ``ckpt``'s common state where the caller has read it already
            (:func:`layout.read_common`); None: read here.

    Returns:
        A warning line when the checkpoint carries no fingerprint (saved before checkpoints
        carried one, or written by ``import-hf`` from a tokenizer without an EOD token:
        :class:`~megatron_gamma.data.tokenizer.BilingualTokenizer`): it loads unchecked. None
        when the tokenizers match.

    Raises:
        ConfigError: the checkpoint was trained with another tokenizer (both named, with
            ``fix``), or with the files at the same path before they changed (both digests
            named); ``cfg``'s tokenizer files are missing.
    """
    from megatron_gamma.data.tokenizer_fingerprint import (
        changed_files,
        describe,
        fingerprint,
        same_files,
        same_tokenizer,
        tokenizer_flags,
    )

    saved = layout.description(layout.read_common(ckpt) if common is None else common)[1]
    if saved is None:
        return (
            f"WARNING: checkpoint {ckpt} carries no tokenizer fingerprint (saved before "
            "checkpoints did, or imported from a tokenizer without an EOD token it finds); "
            "cannot check that it was trained with this run's tokenizer"
        )
    mine = fingerprint(run_tokenizer(cfg))
    if not same_tokenizer(saved, mine) and same_files(saved, mine):
        files, noun = changed_files(saved, mine)
        raise ConfigError(
            f"checkpoint={ckpt!r}: the tokenizer at {files} changed since the "
            f"checkpoint was trained (sha256 {saved['sha256'][:12]} then, {mine['sha256'][:12]} "
            f"now). Fix: restore the original tokenizer {noun} there (passing the same path again "
            "cannot help)"
        )
    if not same_tokenizer(saved, mine):
        raise ConfigError(
            f"checkpoint={ckpt!r}: trained with tokenizer {describe(saved)}, but the config's "
            f"tokenizer is {describe(mine)}. Fix: {fix.replace('{flags}', tokenizer_flags(saved))}"
        )
    return None


def tokenizer_digest(cfg: Config) -> str:
    """The canonical SHA-256 of the run's tokenizer (its
    :attr:`~megatron_gamma.data.tokenizer.BilingualTokenizer.canonical_sha256`; equal digests:
    same token ids and EOD, also for a tokenizer.json that transformers saved again)."""
    return run_tokenizer(cfg).canonical_sha256


def checkpoint_vocab_size(ckpt: str) -> Optional[int]:
    """Padded vocabulary size stored in a checkpoint (global embedding/output rows)."""
    meta = layout.read_tensors_metadata(ckpt)
    for key in (
        "embedding.word_embeddings.weight",
        "output_layer.weight",
    ):
        if key in meta:
            return int(meta[key].global_shape[0])
    return None


def build_model(cfg: Config, vocab_size: int) -> torch.nn.Module:
    """A single-rank GPTModel for ``cfg`` (initialized by the run's rule and seed), eval mode.

    Must run inside :func:`single_process`.
    """
    from megatron_gamma.model.builder import build_model_chunk, transformer_config

    one = single_rank_config(cfg)
    model, _ = build_model_chunk(
        one, transformer_config(one, on_gpu=parallel.uses_gpu()), vocab_size
    )
    if parallel.uses_gpu():
        model.cuda()
    return model.eval()


READ_FIX = (
    "pass the config.yaml of the run that wrote the checkpoint (drop --config: the checkpoint "
    "carries its own)"
)
"""The fix of a read of a checkpoint's weights alone (``evaluate``, ``export-hf``, ``analyze``,
``compare``) that the model built from the config given does not take whole."""


def load_model_weights(
    models: Sequence[torch.nn.Module],
    ckpt: str,
    strict: str = "assume_ok_unexpected",
    fix: Optional[str] = None,
) -> int:
    """Load the model weights of checkpoint ``ckpt`` (any saved layout, resharded by
    dist_checkpointing) into ``models``: one GPTModel, or this rank's virtual-pipeline chunks
    in order (keys ``model`` / ``model0``, ``model1``, ... as the checkpoint was saved); key
    mismatches of the read handled as ``strict`` says (``--dist-ckpt-strictness``: the
    checkpoint's optimizer and RNG states are left unread on purpose, not mismatches; ``fix``:
    :func:`~megatron_gamma.rundir.layout.read_state`'s), the load into the models strict.

    Returns:
        The checkpoint's iteration.

    Raises:
        Whatever megatron-core raises for a checkpoint that does not fit the models (shapes,
        missing keys) or damaged files; :func:`load_weights` names it.
    """
    keys = ["model"] if len(models) == 1 else [f"model{i}" for i in range(len(models))]
    sharded = {key: m.sharded_state_dict() for key, m in zip(keys, models, strict=True)}
    not_loaded = (layout.NOT_LOADED_OPTIMIZER, layout.NOT_LOADED_RNG)
    loaded = layout.read_state(sharded, ckpt, strict, not_loaded, fix)
    for key, m in zip(keys, models, strict=True):
        m.load_state_dict(loaded[key], strict=True)
    return int(loaded["iteration"])


def load_weights(model: torch.nn.Module, ckpt: str) -> int:
    """Load the model weights of checkpoint ``ckpt`` (any saved layout) into the single-rank
    ``model`` (:func:`load_model_weights`).

    Returns:
        The checkpoint's iteration.

    Raises:
        CheckpointError: a pickled part references a class no megatron-core checkpoint holds
            (:mod:`megatron_gamma.checkpoint_trust`).
        ConfigError: the checkpoint does not match the model (different architecture).
    """
    try:
        return load_model_weights([model], ckpt, "raise_all", READ_FIX)
    except ConfigError:  # named already: a CheckpointError, or a model the checkpoint does not fit
        raise
    except Exception as e:  # megatron-core raises several types for shape/key mismatches
        raise ConfigError(
            f"checkpoint={ckpt!r} does not fit the model built from the run's config ({e}). "
            "Fix: pass the config.yaml of the run that wrote this checkpoint"
        ) from e


def model_for_run(cfg: Config, ckpt: Optional[str]) -> torch.nn.Module:
    """Build the run's model with the vocabulary size of ``ckpt`` (else of the tokenizer)."""
    vocab = checkpoint_vocab_size(ckpt) if ckpt else None
    if vocab is None:
        vocab = model_vocab_size(cfg, run_tokenizer(cfg).vocab_size)
    return build_model(cfg, vocab)
