"""Core attention on ``torch.nn.functional.scaled_dot_product_attention``.

megatron-core's local ``DotProductAttention`` allocates its buffer on
``torch.cuda.current_device()``; this module has the same constructor and forward signature, runs
on any device, and uses PyTorch's fused SDPA kernels (flash / memory-efficient) on GPU.
"""

from __future__ import annotations

from typing import Optional

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide


class SDPACoreAttention(MegatronModule):
    """softmax(q k^T * scale + causal mask) v per head, local heads of this TP rank.

    Shapes: query (sq, b, np, hn), key/value (sk, b, ng, hn) -> context (sq, b, np * hn), where
    np/ng are the query heads / key-value groups on this tensor-parallel rank.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection=None,
    ):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPACoreAttention does not support context parallelism")
        if pg_collection is not None:
            tp = pg_collection.tp.size()
        else:
            tp = parallel_state.get_tensor_model_parallel_world_size()
        self.heads = divide(config.num_attention_heads, tp)
        self.groups = divide(config.num_query_groups, tp)
        self.attn_mask_type = attn_mask_type
        self.softmax_scale = softmax_scale
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias=None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if attention_bias is not None or packed_seq_params is not None:
            raise ValueError("SDPACoreAttention supports neither attention_bias nor packed seqs")
        # (s, b, n, h) -> (b, n, s, h)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if attention_mask is None:
            mask, causal = None, mask_type == AttnMaskType.causal and q.size(2) > 1
        else:
            mask, causal = ~attention_mask, False  # megatron: True means "masked out"
        p = self.dropout if self.training else 0.0
        kwargs = dict(
            attn_mask=mask,
            is_causal=causal,
            dropout_p=p,
            scale=self.softmax_scale,
            enable_gqa=self.heads != self.groups,
        )
        if p > 0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        else:
            ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        # (b, n, s, h) -> (s, b, n * h)
        ctx = ctx.permute(2, 0, 1, 3).contiguous()
        return ctx.view(ctx.size(0), ctx.size(1), -1)
