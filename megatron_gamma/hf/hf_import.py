"""``megatron-gamma import-hf HF_DIR RUN_DIR``: a Hugging Face model back into a megatron-gamma run.

Reads ``config.json`` and the safetensors weights (one file or a sharded index) of a
``LlamaForCausalLM``, ``Qwen2ForCausalLM`` (q/k/v biases: ``add_qkv_bias``),
``Qwen3ForCausalLM`` (q/k norms: ``qk_layernorm``) or
:class:`~megatron_gamma.hf.hf_model.GammaGPTForCausalLM` (``model_type`` in
:data:`~megatron_gamma.hf.mapping.IMPORT_TYPES`), maps them onto megatron-core's GPTModel
(:func:`megatron_gamma.hf.mapping.from_hf`) and writes a run directory::

    RUN_DIR/config.yaml                       the run config (tokenizer_model -> RUN_DIR)
    RUN_DIR/tokenizer.json                    copied from HF_DIR
    RUN_DIR/tokenizer_config.json             copied from HF_DIR when there (its eos_token: EOD)
    RUN_DIR/special_tokens_map.json           likewise (an older file, read as transformers does)
    RUN_DIR/checkpoints/iter_N/               torch_dist checkpoint (weights, iteration, config)
    RUN_DIR/checkpoints/latest_checkpointed_iteration.txt

The run config and iteration come from ``megatron_gamma.json`` when HF_DIR was written by
``export-hf`` (so the round trip is exact; its model section must agree with ``config.json``);
otherwise the model section is derived from ``config.json`` (``seq_length`` =
``max_position_embeddings``) and the iteration is 0. A ``megatron_gamma.json`` that names a path
(a field ``export-hf`` records at its default: ``tensorboard_dir``, ``data_cache_path``, ...) is
refused: the imported run would read or write where the model's author chose. So is a file
outside HF_DIR (:func:`model_file`): a shard that ``model.safetensors.index.json`` names by an
absolute path or with ``..``, or a file reached through a link that leads out of HF_DIR. The
checkpoint holds model weights only (no optimizer or scheduler state): ``evaluate``,
``export-hf``, ``analyze`` and ``compare`` read it. The directory is assembled under a temporary
name and renamed when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Optional

import torch
from megatron.core import dist_checkpointing

from megatron_gamma.atomic import atomic_dir
from megatron_gamma.checkpoint_trust import CheckpointError
from megatron_gamma.compat import patch_save_results_queue
from megatron_gamma.config import Config, config_from_dict, save_config
from megatron_gamma.data.tokenizer import (
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    BilingualTokenizer,
    copy_loader_file,
)
from megatron_gamma.data.tokenizer_fingerprint import fingerprint
from megatron_gamma.hf import mapping
from megatron_gamma.hf.hf_export import HOST_PATH_FIELDS, META_FILE
from megatron_gamma.rundir import layout, loader
from megatron_gamma.rundir.checkpoint import TokenizerNotFoundError
from megatron_gamma.rundir.layout import CHECKPOINTS, CONFIG, TRACKER, checkpoint_dir
from megatron_gamma.rundir.paths import check_new_dir, missing_hf_dir

INDEX_FILE = "model.safetensors.index.json"
"""The index of a sharded safetensors model: its ``weight_map`` names each tensor's shard."""


def _model_roots(root: str) -> list[str]:
    """The directories the model directory ``root`` (a real path) may read from: itself, and for
    a hub cache snapshot (``.../snapshots/REVISION``) its repository's ``blobs``."""
    snapshots = os.path.dirname(root)
    if os.path.basename(snapshots) != "snapshots":
        return [root]
    return [root, os.path.join(os.path.dirname(snapshots), "blobs")]


def model_file(hf_dir: str, name: str, entry: Optional[str] = None) -> str:
    """The real path of file ``name`` of the model directory ``hf_dir``, refused where it lies
    outside it: a model directory from elsewhere names files (its shard index) and may hold
    links, and ``import-hf`` must read (and copy into the run) nothing but the model's own files.
    A snapshot of the Hugging Face hub cache (``models--ORG--NAME/snapshots/REVISION``, whose
    files are links to ``../../blobs/SHA``) may also read its own repository's ``blobs``
    directory (huggingface_hub's cache layout).

    Args:
        hf_dir: the model directory.
        name: a path relative to ``hf_dir``.
        entry: what named ``name``, for the message (``"model.safetensors.index.json:
            weight_map['lm_head.weight']"``); None for a file of a fixed name (``config.json``).

    Returns:
        ``name`` resolved (``os.path.realpath``): a path inside ``realpath(hf_dir)``.

    Raises:
        CheckpointError: ``name`` is not a string, is absolute or has a ``..`` component, or
            resolves (through a link) outside ``hf_dir`` (and a snapshot's ``blobs``); the
            message names ``entry``, the path and the fix.
    """
    label = name if entry is None else f"{entry}={name!r}"
    if not isinstance(name, str):
        why = "not a file name"
    elif os.path.isabs(name):
        why = "an absolute path"
    elif ".." in name.split("/"):
        why = "a path with a '..' component"
    else:
        root = os.path.realpath(hf_dir)
        real = os.path.realpath(os.path.join(root, name))
        if any(os.path.commonpath([r, real]) == r for r in _model_roots(root)):
            return real
        raise CheckpointError(
            f"{label}: resolves through a link to {real!r}, outside hf_dir={hf_dir!r}; import-hf "
            "reads only the files in the model directory. Fix: import a copy of the directory "
            "with its files in it: cp -rL HF_DIR COPY (each link replaced by the file it points "
            "to), or huggingface-cli download MODEL --local-dir COPY"
        )
    raise CheckpointError(
        f"{label}: {why}; import-hf reads only the files in hf_dir={hf_dir!r}. Fix: name each "
        "shard by its path inside the model directory, e.g. 'model-00001-of-00002.safetensors', "
        "and put the file there"
    )


def weight_files(hf_dir: str) -> list[str]:
    """The real paths of the safetensors files of ``hf_dir``: the shards its
    :data:`INDEX_FILE` names, else ``model.safetensors``; each checked by :func:`model_file`.
    No tensor is read.

    Raises:
        CheckpointError: an index that is not JSON or has no ``weight_map`` object, or a shard
            name or link that leads outside ``hf_dir`` (:func:`model_file`).
    """
    index = os.path.join(hf_dir, INDEX_FILE)
    if not os.path.isfile(index):
        return [model_file(hf_dir, "model.safetensors")]
    with open(model_file(hf_dir, INDEX_FILE)) as f:
        try:
            index_doc = json.load(f)
        except ValueError:
            index_doc = None
    weight_map = index_doc.get("weight_map") if isinstance(index_doc, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(
            f"hf_dir={hf_dir!r}: {INDEX_FILE} holds no weight_map object (tensor name -> shard "
            "file). Fix: restore the index save_pretrained wrote, or remove it beside a single "
            "model.safetensors"
        )
    entry = f"{INDEX_FILE}: weight_map"
    return sorted(
        {model_file(hf_dir, name, f"{entry}[{key!r}]") for key, name in weight_map.items()}
    )


def read_safetensors(hf_dir: str) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards listed in its index
    (:func:`weight_files`, every file checked before the first is read).

    Raises:
        CheckpointError: no weights file, or an unreadable one; a shard name or link that leads
            outside ``hf_dir`` (:func:`model_file`).
    """
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in weight_files(hf_dir):
        try:
            out.update(load_file(path))
        except Exception as e:  # missing file, truncated header, bad offsets
            raise CheckpointError(
                f"hf_dir={hf_dir!r}: cannot read {path} ({type(e).__name__}: {e}). Fix: pass a "
                "complete Hugging Face model directory with safetensors weights"
            ) from e
    return out


def _check_portable(raw: dict) -> None:
    """Refuse a ``megatron_gamma.json`` run config that names paths: ``export-hf`` records
    every field of :data:`~megatron_gamma.hf.hf_export.HOST_PATH_FIELDS` at its default
    (:func:`~megatron_gamma.hf.hf_export.portable_config`), and a model directory from elsewhere
    that sets one (``tensorboard_dir``, ``data_cache_path``, ``pretrained_checkpoint``, ...)
    would have the imported run's config.yaml, and its checkpoint's, write or read there.

    Raises:
        CheckpointError: naming the first such field, its value and the fix.
    """
    defaults = Config().to_dict()
    for section, keys in HOST_PATH_FIELDS.items():
        values = raw.get(section) or {}
        for key in keys:
            if values.get(key, defaults[section][key]) != defaults[section][key]:
                raise CheckpointError(
                    f"{META_FILE}: {section}.{key}={values[key]!r}: a path of the host that "
                    "wrote it (export-hf records none, and import-hf sets the run's own data, "
                    "tokenizer and checkpoint paths); the imported run would read or write there. "
                    f"Fix: remove {META_FILE} to import from config.json alone, or set "
                    f"{section}.{key} to {defaults[section][key]!r} in it"
                )


def _run_config(hf_dir: str, run_dir: str) -> tuple[dict, int, dict]:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"hf_dir={hf_dir!r}: no config.json. Fix: pass a model directory")
    with open(model_file(hf_dir, "config.json")) as f:
        hf = json.load(f)
    section = mapping.model_section_from_hf(hf)
    meta_path = os.path.join(hf_dir, META_FILE)
    if os.path.isfile(meta_path):
        with open(model_file(hf_dir, META_FILE)) as f:
            meta = json.load(f)
        raw, iteration = meta["config"], int(meta["iteration"])
        _check_portable(raw)
        differ = {
            k: (raw["model"].get(k), v)
            for k, v in section.items()
            if k not in ("seq_length", "max_position_embeddings") and raw["model"].get(k) != v
        }
        if differ:
            raise CheckpointError(
                f"{META_FILE}: its model config differs from config.json in {differ} "
                f"(run config, config.json). Fix: remove {META_FILE} to import from config.json "
                "alone, or restore the exported config.json"
            )
    else:
        raw, iteration = {"model": section}, 0
    raw.setdefault("data", {})["tokenizer_model"] = os.path.join(run_dir, "tokenizer.json")
    raw["data"].update(data_path=[], train_data_path=[], valid_data_path=[], test_data_path=[])
    raw.setdefault("logging", {})["run_dir"] = run_dir
    raw.setdefault("checkpoint", {}).update(
        save=os.path.join(run_dir, "checkpoints"), load=os.path.join(run_dir, "checkpoints")
    )
    return raw, iteration, hf


def _run_tokenizer(built: str) -> BilingualTokenizer | None:
    """The new run's tokenizer: its tokenizer.json with the loader files beside it
    (:class:`~megatron_gamma.data.tokenizer.BilingualTokenizer`), read from ``built``, the
    temporary directory the run is assembled in. None for one without an EOD token (no
    ``<|endoftext|>`` and no ``eos_token`` in a loader file; a tokenizer from elsewhere: the
    checkpoint then records no fingerprint)."""
    try:
        return BilingualTokenizer(os.path.join(built, "tokenizer.json"))
    except ValueError:
        return None


def _tokenizer_fingerprint(tok: BilingualTokenizer | None, built: str, final: str) -> dict | None:
    """The fingerprint of :func:`_run_tokenizer` ``tok`` with its files named where the run will
    have them, under ``final`` instead of ``built``; None for None."""
    if tok is None:
        return None
    doc = fingerprint(tok)
    doc["source"] = [os.path.join(final, os.path.relpath(p, built)) for p in doc["source"]]
    return doc


def eos_mismatch(hf: dict, tok: BilingualTokenizer | None) -> str | None:
    """Why ``config.json``'s ``eos_token_id`` (an id or a list of ids; ``hf``) does not hold the
    EOD of the run's tokenizer ``tok``, or None where it does (or either is unknown): the model
    was then trained to end a document with another token than the one preprocessing appends."""
    ids = hf.get("eos_token_id")
    ids = ids if isinstance(ids, list) else [ids]
    if tok is None or not ids or not all(isinstance(i, int) for i in ids) or tok.eod in ids:
        return None
    named = os.path.basename(tok.named_in.get("eod", TOKENIZER_CONFIG))
    return (
        f"config.json: eos_token_id {hf['eos_token_id']} does not hold {tok.eod} "
        f"({tok.eos_token!r}), the run's EOD (the eos_token of {TOKENIZER_CONFIG} or "
        f"{SPECIAL_TOKENS_MAP}, or <|endoftext|> where none names one): data preprocessed with "
        f"this tokenizer ends each document in {tok.eod}, while the model was trained to stop "
        f"at {hf['eos_token_id']}. Fix: set eos_token in the model directory's {named} to the "
        "model's end-of-document token and import again"
    )


def import_hf(hf_dir: str, run_dir: str) -> dict:
    """Convert a Hugging Face model directory into a megatron-gamma run directory.

    Args:
        hf_dir: directory with config.json, safetensors weights and tokenizer.json.
        run_dir: new or empty directory to create.

    Returns:
        {'run_dir', 'checkpoint', 'iteration', 'warnings'}: ``warnings``, lines for the user
        that do not stop the import (:func:`eos_mismatch`).

    Raises:
        CheckpointError: ``hf_dir`` does not exist or is not a directory, missing config.json
            or unreadable weights, weights that are not those config.json describes (a tensor
            missing, or one the mapping has no place for: :func:`~.mapping.from_hf`), a
            ``megatron_gamma.json`` that names a path (:func:`_check_portable`), or a file
            outside ``hf_dir``: a shard the index names by an absolute path or with ``..``, or
            any file read through a link leading out (:func:`model_file`; checked before the
            file, or any weight, is read).
        TokenizerNotFoundError: no tokenizer.json in ``hf_dir``.
        UnmappableArchitectureError: a model type or option megatron-gamma does not build.
        ConfigError: ``run_dir`` exists and is not an empty directory, or cannot be made
            (:func:`~megatron_gamma.rundir.paths.check_new_dir`).
    """
    missing = missing_hf_dir(hf_dir)
    if missing:
        raise CheckpointError(missing)
    run_dir = os.path.abspath(run_dir)
    check_new_dir(run_dir, "run_dir", "choose a new run directory")
    snapshots = os.path.join(hf_dir, "snapshots")
    if os.path.isdir(snapshots) and not os.path.exists(os.path.join(hf_dir, "config.json")):
        revisions = sorted(os.listdir(snapshots))
        raise CheckpointError(
            f"hf_dir={hf_dir!r}: a Hugging Face hub cache repository, not a model directory. "
            f"Fix: pass one of its snapshots, e.g. {os.path.join(snapshots, '<REVISION>')} "
            f"(here: {', '.join(revisions[:4]) or 'none'})"
        )
    if not os.path.lexists(os.path.join(hf_dir, "config.json")):
        run = os.path.isfile(os.path.join(hf_dir, CONFIG))
        what = (
            f"it holds a {CONFIG}, so it is a megatron-gamma run directory: evaluate, analyze and "
            "export-hf read it as it is, with no import"
            if run
            else "pass a model directory (config.json, *.safetensors, tokenizer.json)"
        )
        raise CheckpointError(
            f"hf_dir={hf_dir!r}: no config.json, so not a Hugging Face model directory. Fix: "
            + what
        )
    tokenizer = os.path.join(hf_dir, "tokenizer.json")
    if not os.path.isfile(tokenizer):
        raise TokenizerNotFoundError(
            f"tokenizer={tokenizer!r}: not found. Fix: put the model's tokenizer.json (Hugging "
            "Face tokenizers format) into the model directory"
        )
    tokenizer = model_file(hf_dir, "tokenizer.json")
    loader_files = {  # their eos_token names the EOD
        name: model_file(hf_dir, name)
        for name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP)
        if os.path.lexists(os.path.join(hf_dir, name))
    }
    raw, iteration, hf = _run_config(hf_dir, run_dir)
    cfg = config_from_dict(raw)
    hf_sd = read_safetensors(hf_dir)
    if not cfg.model.untie_embeddings_and_output_weights:
        hf_sd.pop("lm_head.weight", None)
    try:
        mc_sd = mapping.from_hf(hf_sd, cfg)
    except mapping.WeightsMismatchError as e:
        raise CheckpointError(
            f"hf_dir={hf_dir!r}: its safetensors weights are not those of the "
            f"model_type={hf.get('model_type')!r} model its config.json describes ({e}). Fix: "
            "pass the config.json that came with these weights"
        ) from None
    vocab = int(mc_sd["embedding.word_embeddings.weight"].shape[0])
    with atomic_dir(run_dir) as tmp:
        shutil.copyfile(tokenizer, os.path.join(tmp, "tokenizer.json"))
        for name, path in loader_files.items():
            if os.path.isfile(path) and (note := copy_loader_file(path, os.path.join(tmp, name))):
                print(f"import-hf: {note}", file=sys.stderr)
        tok = _run_tokenizer(tmp)
        one = loader.fp32_single_rank(cfg)
        with loader.single_process(one):
            model = loader.build_model(one, vocab)
            dtype = mc_sd["embedding.word_embeddings.weight"].dtype
            model.to(dtype)
            missing, unexpected = model.load_state_dict(mc_sd, strict=False)
            missing = [k for k in missing if not k.endswith("_extra_state")]
            if missing or unexpected:
                raise CheckpointError(
                    f"hf_dir={hf_dir!r}: weights do not match config.json (missing {missing}, "
                    f"unexpected {unexpected}). Fix: pass an unmodified exported directory"
                )
            root = os.path.join(tmp, CHECKPOINTS)
            final = checkpoint_dir(root, iteration)
            os.makedirs(final)
            state = {"model": model.sharded_state_dict(), "iteration": iteration}
            state.update(layout.describe(cfg, _tokenizer_fingerprint(tok, tmp, run_dir)))
            patch_save_results_queue()
            dist_checkpointing.save(state, final)
        with open(os.path.join(root, TRACKER), "w") as f:
            f.write(str(iteration))
        save_config(cfg, os.path.join(tmp, CONFIG))
    ckpt = checkpoint_dir(os.path.join(run_dir, CHECKPOINTS), iteration)
    warnings = [w for w in (eos_mismatch(hf, tok),) if w]
    return {"run_dir": run_dir, "checkpoint": ckpt, "iteration": iteration, "warnings": warnings}
