"""Helpers for distributed test bodies: build models under a layout, gather global tensors.

Global tensors are reassembled from megatron-core's own sharding metadata (the ShardedTensors of
``sharded_state_dict()``: global shape, offset, prepended axes, main replica), an independent
reference for our layout-dependent code.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories, is_main_replica

from megatron_gamma import parallel
from megatron_gamma.config import config_from_dict
from megatron_gamma.model.builder import build_model, transformer_config
from megatron_gamma.model.vocab import padded_vocab_size


def make_config(model: dict, par: dict, init: dict | None = None):
    """A Config from section dicts (training seed fixed; micro batch 1 fits any world size)."""
    return config_from_dict(
        {
            "model": model,
            "parallel": par,
            "init": init or {},
            "training": {"seed": 1234, "micro_batch_size": 1},
        }
    )


def build(cfg, vocab: int = 256):
    """Initialize the layout of ``cfg`` (process group kept) and build this rank's chunks."""
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel.initialize(cfg)
    size = padded_vocab_size(vocab, cfg)
    tcfg = transformer_config(cfg, on_gpu=False)
    models, _ = build_model(cfg, tcfg, size)
    return models, size


def gather_global(models, use_grads: bool = False) -> dict[str, torch.Tensor]:
    """{checkpoint key: global tensor} on rank 0 ({} elsewhere); grads instead of weights if
    ``use_grads`` (read from ``param.grad``)."""
    saved = []
    if use_grads:
        for m in models:
            for p in m.parameters():
                saved.append((p, p.data))
                p.data = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
    sd = {f"chunk{i}": m.sharded_state_dict() for i, m in enumerate(models)}
    apply_factories(sd)
    pieces = []
    for st in nested_values(sd):
        if isinstance(st, ShardedTensor) and is_main_replica(st.replica_id):
            if parallel_state.get_data_parallel_rank() == 0 or "expert" in st.key:
                pieces.append((st.key, st.global_shape, st.global_offset, st.data.detach().clone()))
    for p, data in saved:
        p.data = data
    everything = [None] * dist.get_world_size()
    dist.all_gather_object(everything, pieces)
    if dist.get_rank() != 0:
        return {}
    out: dict[str, torch.Tensor] = {}
    filled: dict[str, int] = {}
    for part in everything:
        for key, shape, offset, data in part:
            target = out.setdefault(key, torch.full(shape, float("nan")))
            view = data.reshape((1,) * (len(shape) - data.dim()) + tuple(data.shape))
            index = tuple(slice(o, o + n) for o, n in zip(offset, view.shape, strict=True))
            target[index] = view
            filled[key] = filled.get(key, 0) + view.numel()
    for key, t in out.items():
        assert not torch.isnan(t).any(), f"{key}: shards do not cover the global tensor"
    return out
