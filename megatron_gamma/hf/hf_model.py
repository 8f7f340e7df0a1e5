"""A ``transformers`` model class for megatron-gamma GPTs that no stock class expresses.

Gated attention (Y' = Y ⊙ sigmoid(X W_g) on every head's output, before the output projection;
"Small Initialization Matters for Large Language Models", Methodology, *Architectural
Interventions* 2) and megatron-core MoE layers (top-k router, softmax over the k chosen logits,
dropless) export as :class:`GammaGPTForCausalLM`. Everything else is Llama's: pre-norm RMSNorm,
RoPE (rotate-half layout, megatron-core ``rotary_interleaved=False``), grouped-query attention
with scale head_dim^-1/2, SwiGLU MLP, no biases.

The numerics follow megatron-gamma's kernels (``megatron_gamma/ops/reference.py``): RMSNorm
rescales each row by a power of two before squaring, so that ε = 1e-12 (the paper's) is exact,
and the gate is computed in fp32. This file imports nothing from ``megatron_gamma``: ``export-hf``
copies it into the model directory for ``trust_remote_code=True``.

Shapes: B batch, T query tokens, S key tokens (past + T), H hidden, n heads, g key-value groups,
d head_dim, V vocabulary.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

GATES = ("none", "elementwise", "headwise")


class GammaGPTConfig(PretrainedConfig):
    """Hyperparameters of :class:`GammaGPTForCausalLM` (Llama names where Llama has the field).

    Args:
        vocab_size: embedding rows V (megatron-gamma's padded vocabulary).
        hidden_size: H.
        intermediate_size: dense SwiGLU width (each half).
        num_hidden_layers: layers.
        num_attention_heads: n.
        num_key_value_heads: g (grouped-query attention); default n.
        head_dim: d; default H // n.
        max_position_embeddings: longest trained sequence.
        rms_norm_eps: RMSNorm ε (paper: 1e-12).
        rope_theta: RoPE base.
        gated_attention: 'none', 'elementwise' (one gate per head channel) or 'headwise'.
        gate_bias: bias on the gate projection.
        num_experts: experts per MoE layer; None for dense MLPs.
        num_experts_per_tok: router top-k.
        moe_intermediate_size: each expert's SwiGLU width.
        tie_word_embeddings: output layer shares the input embedding.

    Raises:
        ValueError: unknown gated_attention, or heads not divisible by key-value groups.
    """

    model_type = "gamma_gpt"

    def __init__(
        self,
        vocab_size: int = 4096,
        hidden_size: int = 128,
        intermediate_size: int = 512,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        num_key_value_heads: Optional[int] = None,
        head_dim: Optional[int] = None,
        max_position_embeddings: int = 128,
        rms_norm_eps: float = 1e-12,
        rope_theta: float = 10000.0,
        gated_attention: str = "elementwise",
        gate_bias: bool = False,
        num_experts: Optional[int] = None,
        num_experts_per_tok: int = 2,
        moe_intermediate_size: Optional[int] = None,
        tie_word_embeddings: bool = False,
        **kwargs,
    ):
        if gated_attention not in GATES:
            raise ValueError(f"gated_attention={gated_attention!r}: use one of {GATES}")
        num_key_value_heads = num_key_value_heads or num_attention_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads={num_key_value_heads}: must divide "
                f"num_attention_heads={num_attention_heads}"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.gated_attention = gated_attention
        self.gate_bias = gate_bias
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size or intermediate_size
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


class GammaRMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + ε) · w, accumulated in fp32 with each row first scaled by a power
    of two (so ε = 1e-12 is not lost to rounding). (..., H) -> same shape and dtype."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(acc)
        eps = torch.tensor(self.eps, dtype=acc, device=x.device)
        m = torch.maximum(xf.abs().amax(dim=-1, keepdim=True), eps.sqrt())
        _, exponent = torch.frexp(torch.where(torch.isfinite(m), m, torch.ones_like(m)))
        s = torch.ldexp(torch.ones_like(m), -exponent)
        x_hat = xf * s
        r_hat = 1.0 / torch.sqrt(x_hat.square().mean(dim=-1, keepdim=True) + eps * s * s)
        return (x_hat * r_hat * self.weight.to(acc)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class GammaRotary(nn.Module):
    """cos, sin (B, T, d) of RoPE for position_ids (B, T): θ_i = base^(-2i/d), fp32.

    The frequencies are computed in every call, not kept as a buffer: ``from_pretrained``
    builds modules on the meta device and leaves non-persistent buffers uninitialized."""

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        self.head_dim, self.base = head_dim, base

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.head_dim
        exponent = torch.arange(0, d, 2, dtype=torch.float32, device=position_ids.device) / d
        inv_freq = 1.0 / (self.base**exponent)
        freqs = position_ids.float().unsqueeze(-1) * inv_freq  # (B, T, d/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class GammaAttention(nn.Module):
    """Causal GQA self-attention with RoPE and an optional sigmoid output gate per head."""

    def __init__(self, config: GammaGPTConfig, layer_idx: int):
        super().__init__()
        c = config
        self.layer_idx = layer_idx
        self.n, self.g, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.n * self.d, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.g * self.d, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.g * self.d, bias=False)
        self.o_proj = nn.Linear(self.n * self.d, c.hidden_size, bias=False)
        self.gated = c.gated_attention
        if self.gated != "none":
            per_head = self.d if self.gated == "elementwise" else 1
            self.gate_proj = nn.Linear(c.hidden_size, self.n * per_head, bias=c.gate_bias)

    def forward(self, x, cos, sin, mask, cache):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n, self.d).transpose(1, 2)  # (B, n, T, d)
        k = self.k_proj(x).view(b, t, self.g, self.d).transpose(1, 2)  # (B, g, T, d)
        v = self.v_proj(x).view(b, t, self.g, self.d).transpose(1, 2)
        cos, sin = cos.unsqueeze(1).to(q.dtype), sin.unsqueeze(1).to(q.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, g, S, d)
        causal = mask is None and t > 1
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=self.n != self.g
        )
        o = o.transpose(1, 2)  # (B, T, n, d)
        if self.gated != "none":
            gate = self.gate_proj(x).view(b, t, self.n, -1)  # (B, T, n, d) or (B, T, n, 1)
            acc = torch.float64 if o.dtype == torch.float64 else torch.float32
            o = (o.to(acc) * torch.sigmoid(gate.to(acc))).to(o.dtype)
        return self.o_proj(o.reshape(b, t, self.n * self.d))


class GammaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class GammaMoE(nn.Module):
    """megatron-core's MoE layer at inference: top-k of the router logits, softmax over those k
    (in fp32), Σ_k p_k · expert_k(x); every token is served (dropless)."""

    def __init__(self, config: GammaGPTConfig):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(
            GammaMLP(config.hidden_size, config.moe_intermediate_size)
            for _ in range(config.num_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, H)
        top, idx = torch.topk(self.router(flat), self.top_k, dim=-1)  # (N, k)
        probs = torch.softmax(top, dim=-1, dtype=torch.float32).to(flat.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(idx == e, as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, expert(flat[rows]) * probs[rows, slot, None])
        return out.view(shape)


class GammaDecoderLayer(nn.Module):
    """h = x + attn(norm(x)); y = h + mlp(norm(h))."""

    def __init__(self, config: GammaGPTConfig, layer_idx: int):
        super().__init__()
        c = config
        self.input_layernorm = GammaRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = GammaAttention(c, layer_idx)
        self.post_attention_layernorm = GammaRMSNorm(c.hidden_size, c.rms_norm_eps)
        if c.num_experts:
            self.mlp = GammaMoE(c)
        else:
            self.mlp = GammaMLP(c.hidden_size, c.intermediate_size)

    def forward(self, x, cos, sin, mask, cache):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class GammaGPTPreTrainedModel(PreTrainedModel):
    """Base class: config class and weight-init hook (weights come from a checkpoint)."""

    config_class = GammaGPTConfig
    base_model_prefix = "model"
    _no_split_modules = ["GammaDecoderLayer"]
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, GammaRMSNorm):
            nn.init.ones_(module.weight)


class GammaGPTModel(GammaGPTPreTrainedModel):
    """Embedding, decoder layers, final RMSNorm: (B, T) token ids -> (B, T, H) hidden states."""

    def __init__(self, config: GammaGPTConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            GammaDecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = GammaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = GammaRotary(config.head_dim, config.rope_theta)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None):
        b, t = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            if attention_mask is not None:
                full = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
                position_ids = full[:, -t:]
            else:
                position_ids = torch.arange(past, past + t, device=input_ids.device).expand(b, t)
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()) or (past and t > 1):
            s = past + t
            keys = torch.arange(s, device=input_ids.device)
            queries = torch.arange(past, s, device=input_ids.device)
            mask = (keys[None, :] <= queries[:, None])[None, None]  # (1, 1, T, S)
            if attention_mask is not None:
                mask = mask & attention_mask[:, None, None, -s:].bool()
        cos, sin = self.rotary(position_ids)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, cache)
        return self.norm(x)


class GammaGPTForCausalLM(GammaGPTPreTrainedModel, GenerationMixin):
    """:class:`GammaGPTModel` plus the output layer: (B, T) ids -> logits (B, T, V) fp32 when the
    weights are fp32. ``labels`` give the mean next-token cross-entropy (Hugging Face
    convention: labels are the inputs, shifted inside)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: GammaGPTConfig):
        super().__init__(config)
        self.model = GammaGPTModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        cache: Optional[DynamicCache] = None,
        labels: Optional[torch.Tensor] = None,
        use_cache: Optional[bool] = None,
        logits_to_keep: int = 0,
        **_,
    ) -> CausalLMOutputWithPast:
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        hidden = self.model(input_ids, attention_mask, position_ids, cache)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1)
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)
