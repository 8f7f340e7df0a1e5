"""``megatron-gamma export-hf CKPT OUT_DIR``: a checkpoint as a Hugging Face model directory.

Writes ``config.json``, ``model.safetensors`` (sharded with an index above ``max_shard_size``),
``generation_config.json``, the run's ``tokenizer.json`` with ``tokenizer_config.json`` /
``special_tokens_map.json`` (their ``eos_token`` is the run's EOD, whose id is the
``eos_token_id`` of ``config.json``; the ``tokenizer_config.json`` or ``special_tokens_map.json``
whose ``eos_token`` made the run's EOD is copied as it is, so that ``import-hf`` gives the
tokenizer the same identity), and
``megatron_gamma.json`` (the run's config and the iteration, so that ``import-hf`` restores the
run exactly; :func:`portable_config`: no path of this host and no ``cluster.env`` value leaves
with the model). An ungated dense model becomes a stock ``LlamaForCausalLM`` (no custom code);
gated attention or MoE become
:class:`~megatron_gamma.hf.hf_model.GammaGPTForCausalLM`, whose source is copied in as
``modeling_gamma_gpt.py`` for ``trust_remote_code=True``. Weights are written in fp32 (the
checkpoint is loaded into an fp32 model; a bf16 run's weights upcast exactly).

Everything is written into a temporary sibling directory that is renamed to ``OUT_DIR`` only
when complete: a failed export leaves nothing under ``OUT_DIR``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Optional

import torch

from megatron_gamma.atomic import atomic_dir, new_file_mode
from megatron_gamma.config import Config, redacted_dict
from megatron_gamma.data.tokenizer import copy_loader_file
from megatron_gamma.hf import bars_only_on_a_terminal, mapping, register_auto_classes
from megatron_gamma.hf.hf_model import GammaGPTConfig, GammaGPTForCausalLM
from megatron_gamma.rundir import checkpoint, loader
from megatron_gamma.rundir.paths import check_new_dir

register_auto_classes()

META_FILE = "megatron_gamma.json"
MODELING_FILE = "modeling_gamma_gpt.py"
# Config fields holding paths of the exporting host, by section: the export records their
# defaults (``import-hf`` sets its run's own data, tokenizer and checkpoint paths).
HOST_PATH_FIELDS = {
    "data": (
        "data_path",
        "train_data_path",
        "valid_data_path",
        "test_data_path",
        "tokenizer_model",
        "data_cache_path",
        "vocab_file",
        "merge_file",
    ),
    "checkpoint": ("save", "load", "pretrained_checkpoint"),
    "logging": ("run_dir", "tensorboard_dir", "wandb_save_dir"),
}


def portable_config(cfg: Config) -> dict:
    """The run's config as ``megatron_gamma.json`` records it: ``cluster.env`` values redacted
    (:func:`~megatron_gamma.config.redacted_dict`; the names are kept) and the fields of
    :data:`HOST_PATH_FIELDS` at their defaults."""
    raw, defaults = redacted_dict(cfg), Config().to_dict()
    for section, keys in HOST_PATH_FIELDS.items():
        raw[section].update({key: defaults[section][key] for key in keys})
    return raw


def _hf_model(hf_sd: dict, cfg, vocab: int, model_type: str, tok) -> torch.nn.Module:
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    dtype = next(iter(hf_sd.values())).dtype
    kwargs = mapping.hf_config_kwargs(cfg, vocab, model_type)
    kwargs.update(bos_token_id=tok.bos, eos_token_id=tok.eod, pad_token_id=tok.pad)
    kwargs.update(dtype=str(dtype).removeprefix("torch."))
    if model_type == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kwargs))
    else:
        hf_cfg = GammaGPTConfig(**kwargs)
        hf_cfg.auto_map = {
            "AutoConfig": f"{MODELING_FILE[:-3]}.GammaGPTConfig",
            "AutoModelForCausalLM": f"{MODELING_FILE[:-3]}.GammaGPTForCausalLM",
        }
        model = GammaGPTForCausalLM(hf_cfg)
    model.to(dtype)
    missing, unexpected = model.load_state_dict(hf_sd, strict=False)
    tied = {"lm_head.weight"} if not cfg.model.untie_embeddings_and_output_weights else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"weight mapping mismatch: missing {missing}, unexpected {unexpected}")
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos, eos_token_id=tok.eod, pad_token_id=tok.pad, do_sample=False
    )
    return model.eval()


def export_hf(
    ckpt: str,
    out_dir: str,
    *,
    config: Optional[str] = None,
    hf_format: str = "auto",
    max_shard_size: int | str = "5GB",
) -> dict:
    """Export one checkpoint as a Hugging Face model directory (module docstring).

    Args:
        ckpt: ``SAVE/iter_N``, a checkpoint root or a run directory (newest checkpoint).
        out_dir: new or empty directory to create.
        config: a config.yaml that overrides the checkpoint's own config (needed only for a
            checkpoint saved before checkpoints carried their config, outside its run
            directory).
        hf_format: 'auto', 'llama' (stock class only; error if it cannot express the model) or
            'gamma_gpt' (always megatron-gamma's class).
        max_shard_size: safetensors shard limit, bytes or e.g. '5GB' (``save_pretrained``).

    Returns:
        {'out_dir', 'model_type', 'iteration', 'checkpoint'}.

    Raises:
        CheckpointError, TokenizerNotFoundError, UnmappableArchitectureError: see
            :func:`megatron_gamma.rundir.checkpoint.resolve` and
            :func:`megatron_gamma.hf.mapping.check_mappable`; raised before anything is written.
        ConfigError: ``out_dir`` exists and is not an empty directory, or cannot be made
            (:func:`~megatron_gamma.rundir.paths.check_new_dir`).
    """
    from megatron_gamma.data.tokenizer import write_metadata

    check_new_dir(out_dir, "out_dir", "choose a new directory")
    run = checkpoint.resolve(ckpt, config)
    model_type = mapping.check_mappable(run.cfg, hf_format)
    tok = loader.run_tokenizer(run.cfg)
    with loader.single_process(run.cfg):
        model, iteration = checkpoint.load_model(run)
        mc_sd = {k: v.detach().cpu() for k, v in model.state_dict().items() if "_extra" not in k}
    vocab = int(mc_sd["embedding.word_embeddings.weight"].shape[0])
    hf = _hf_model(mapping.to_hf(mc_sd, run.cfg), run.cfg, vocab, model_type, tok)
    with atomic_dir(out_dir) as tmp:
        with bars_only_on_a_terminal():
            hf.save_pretrained(tmp, max_shard_size=max_shard_size)
        for name in os.listdir(tmp):  # safetensors writes its files owner-only (0600)
            if name.endswith(".safetensors"):
                os.chmod(os.path.join(tmp, name), new_file_mode())
        shutil.copyfile(tok.path, os.path.join(tmp, "tokenizer.json"))
        write_metadata(
            os.path.join(tmp, "tokenizer.json"), tok.eos_token, tok.pad_token, tok.bos_token
        )
        named = tok.named_in.get("eod")
        if named in tok.source:  # it made the EOD: part of the tokenizer's identity
            note = copy_loader_file(named, os.path.join(tmp, os.path.basename(named)))
            if note:
                print(f"export-hf: {note}", file=sys.stderr)
        if model_type == "gamma_gpt":
            from megatron_gamma.hf import hf_model

            shutil.copyfile(hf_model.__file__, os.path.join(tmp, MODELING_FILE))
        meta = {
            "iteration": iteration,
            "checkpoint": os.path.basename(run.path),
            "config": portable_config(run.original),
        }
        with open(os.path.join(tmp, META_FILE), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
    return {
        "out_dir": out_dir,
        "model_type": model_type,
        "iteration": iteration,
        "checkpoint": run.path,
    }
