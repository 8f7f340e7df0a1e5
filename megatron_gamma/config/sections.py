"""The config's sections: one frozen dataclass per concern (``model``, ``init``, ``parallel``,
``data``, ``optimizer``, ``training``, ``checkpoint``, ``logging``, ``cluster``), each field
under its Megatron-LM name with a docstring, each section validated in ``__post_init__``."""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Optional

from megatron_gamma.config.choices import (
    AttentionBackend,
    DistCkptStrictness,
    DistributedBackend,
    EmbeddingFanIn,
    Fp8Format,
    Fp8Recipe,
    GatedAttention,
    InitAudit,
    InitMethod,
    LayerSpec,
    LrDecayStyle,
    MoeLoadBalancing,
    MoeRouterDtype,
    MoeScoreFunction,
    Optimizer,
    PositionEmbedding,
    RecomputeGranularity,
    RecomputeMethod,
    TokenDispatcher,
    TokenizerType,
    TransformerImpl,
    WeightDecayIncrStyle,
    WsdDecayStyle,
    check_choices,
)
from megatron_gamma.config.errors import fail, resolve
from megatron_gamma.config.megatron_lm import (
    check_fusions,
    check_megatron_model_flags,
    moe_layer_pattern,
    resolve_megatron_aliases,
)
from megatron_gamma.config.schedule import rampup_train_iters


@dataclass(frozen=True)
class ModelConfig:
    """GPT architecture (megatron-core ``TransformerConfig`` fields under Megatron-LM names)."""

    num_layers: int = 4
    """Number of transformer layers."""
    hidden_size: int = 128
    """Model width d (the residual stream)."""
    ffn_hidden_size: Optional[int] = None
    """MLP inner width (each SwiGLU half has this width); default as Megatron-LM's
    ``arguments.py`` sets it: with ``swiglu``, ``int(4 * hidden_size * 2 / 3 / 64) * 64`` (the
    parameters of a 4 * hidden_size GeLU MLP, in multiples of 64), else 4 * hidden_size."""
    num_attention_heads: int = 4
    """Attention heads; hidden_size must be divisible by it unless kv_channels is set."""
    num_query_groups: Optional[int] = None
    """Key/value groups for grouped-query attention; default = num_attention_heads (MHA)."""
    kv_channels: Optional[int] = None
    """Head dimension; default hidden_size // num_attention_heads."""
    seq_length: int = 128
    """Training sequence length in tokens."""
    max_position_embeddings: Optional[int] = None
    """Longest position the model supports; default seq_length."""
    normalization: str = "RMSNorm"
    """'RMSNorm' (the paper's setting). Our small-eps-safe RMSNorm is used."""
    norm_epsilon: float = 1e-12
    """RMSNorm epsilon. The paper lowers it from 1e-5 to 1e-12 so that the norm still responds
    when sigma^2(h) of small-initialized hidden states falls below 1e-5."""
    swiglu: bool = True
    """SwiGLU MLP (fc1 produces both halves)."""
    gated_attention: GatedAttention = GatedAttention.ELEMENTWISE
    """Sigmoid output gate on attention heads against the attention sink (paper: on)."""
    gate_bias: bool = False
    """Bias in the gate projection."""
    layer_spec: LayerSpec = LayerSpec.GAMMA
    """Transformer layer spec (``tools/gpu_acceptance.sh`` measures our additions against
    'local')."""
    add_bias_linear: bool = False
    """Biases in linear layers."""
    add_qkv_bias: bool = False
    """A bias on the QKV projection only (megatron-core ``add_qkv_bias``; Qwen2's q/k/v biases):
    ``linear_qkv.bias``, rows grouped as its weight's, role 'bias'. No effect with
    add_bias_linear, which gives every linear layer a bias."""
    position_embedding_type: PositionEmbedding = PositionEmbedding.ROPE
    """Position encoding."""
    rotary_base: int = 10000
    """RoPE base."""
    untie_embeddings_and_output_weights: bool = True
    """Separate input embedding and output layer weights."""
    hidden_dropout: float = 0.0
    """Dropout on the residual branches."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities."""
    make_vocab_size_divisible_by: int = 128
    """Pad the tokenizer's vocabulary up to a multiple of this (times the TP size)."""
    vocab_size: Optional[int] = None
    """Tokenizer vocabulary size, for ``estimate`` and meta-device builds that read no tokenizer;
    training pads max(this, the tokenizer's size) to make_vocab_size_divisible_by x TP."""
    num_experts: Optional[int] = None
    """Experts per MoE layer (every layer is MoE when set); None for a dense model."""
    moe_router_topk: int = 2
    """Experts each token is routed to."""
    moe_ffn_hidden_size: Optional[int] = None
    """Each expert's MLP width (default ffn_hidden_size)."""
    moe_aux_loss_coeff: float = 1e-2
    """Load-balancing auxiliary loss coefficient."""
    moe_token_dispatcher_type: TokenDispatcher = TokenDispatcher.ALLGATHER
    """Token dispatch across expert-parallel ranks."""
    group_query_attention: Optional[bool] = None
    """Megatron-LM's switch for grouped-query attention. Given: num_query_groups defaults to 1
    (Megatron-LM's default) instead of num_attention_heads. Not given: num_query_groups is
    honored whenever it is set (Megatron-LM would ignore it without this flag). Given as
    --no-group-query-attention with num_query_groups below num_attention_heads: an error."""
    use_rotary_position_embeddings: bool = False
    """Megatron-LM's older alias of --position-embedding-type rope (our default); sets it, and
    contradicting position_embedding_type='learned_absolute' is an error."""
    rotary_percent: float = 1.0
    """Fraction of each head's channels that RoPE rotates (megatron-core ``rotary_percent``):
    the first int(kv_channels * rotary_percent) channels, in (0, 1]; the rest pass through."""
    disable_bias_linear: bool = False
    """Megatron-LM's switch for linear layers without bias (= add_bias_linear False). Already
    megatron-gamma's default (Megatron-LM's default is bias on); accepted for launch scripts, and
    an error together with --add-bias-linear."""
    qk_layernorm: bool = False
    """RMSNorm (our kernel, eps = norm_epsilon) on each head's query and key after the QKV
    projection (megatron-core ``qk_layernorm``); weights per head channel, role 'norm'."""
    apply_layernorm_1p: bool = False
    """Zero-centered norm weights: y = x_hat * (1 + w) with w initialized to 0 (megatron-core
    ``layernorm_zero_centered_gamma``), on every RMSNorm of the model."""
    transformer_impl: TransformerImpl = TransformerImpl.LOCAL
    """Layer backend. layer_spec then picks our variant ('gamma': gates, our RMSNorm and SDPA on
    local; gates on TE's spec) or megatron-core's spec as shipped ('local'). Megatron-LM's default
    is transformer_engine; ours is local (TE is optional). transformer_engine is refused by name
    where Transformer Engine cannot be imported."""
    attention_backend: AttentionBackend = AttentionBackend.AUTO
    """Core-attention kernel (megatron-core ``attention_backend``); used by TE's attention. On the
    local backend only auto, local and unfused are accepted (all run torch SDPA)."""
    use_mcore_models: bool = False
    """Accepted for Megatron-LM launch scripts and does nothing: megatron-gamma always builds
    megatron-core models (a one-line notice says so)."""
    attention_softmax_in_fp32: bool = False
    """Accepted for Megatron-LM launch scripts and does nothing: the attention softmax always
    runs in fp32 (torch SDPA, megatron-core's unfused path) (a one-line notice says so)."""
    fp8_format: Optional[Fp8Format] = None
    """FP8 GEMMs through Transformer Engine (megatron-core ``fp8``): needs --transformer-impl
    transformer_engine and a GPU with FP8 (compute capability >= 8.9); refused by name otherwise."""
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED
    """FP8 scaling recipe (megatron-core ``fp8_recipe``); counts with --fp8-format."""
    moe_router_load_balancing_type: MoeLoadBalancing = MoeLoadBalancing.AUX_LOSS
    """Router load balancing (Megatron-LM's ``--moe-router-load-balancing-type``, one type)."""
    moe_z_loss_coeff: Optional[float] = None
    """Router z-loss coefficient (ST-MoE; e.g. 1e-3); None: no z-loss."""
    moe_router_score_function: MoeScoreFunction = MoeScoreFunction.SOFTMAX
    """Router score function."""
    moe_shared_expert_intermediate_size: Optional[int] = None
    """Total width of the shared experts every token passes through (number of shared experts
    x each one's width; megatron-core's SharedExpertMLP); None: no shared experts. Their fc1 /
    fc2 are the registry roles shared_fc1 / shared_fc2 (gamma-init like fc1 / fc2)."""
    moe_layer_freq: str = "1"
    """Which layers are MoE (the others dense): an integer N makes every N-th layer MoE,
    starting at layer 0; a Megatron-LM pattern such as '([0]*1+[1]*3)' or '[0,1,1,1]' gives
    one 1 (MoE) or 0 (dense) per layer."""
    moe_expert_capacity_factor: Optional[float] = None
    """Expert capacity as a multiple of the balanced share of tokens; tokens beyond it are
    dropped (megatron-core's token dropping). None: no capacity, no dropping."""
    moe_pad_expert_input_to_capacity: bool = False
    """Pad each expert's input to its capacity (needs moe_expert_capacity_factor)."""
    moe_grouped_gemm: bool = False
    """Megatron-LM's grouped GEMM for the experts: refused (see the README's MoE section)."""
    moe_router_dtype: Optional[MoeRouterDtype] = None
    """Precision of the router's scores and auxiliary losses; None: the model's dtype."""
    masked_softmax_fusion: bool = False
    """megatron-core's fused scale-mask-softmax kernel
    (``TransformerConfig.masked_softmax_fusion``). Always off: attention runs torch SDPA or
    megatron-core's unfused softmax. Megatron-LM's --no-masked-softmax-fusion is accepted (a
    no-effect notice); True is refused."""
    bias_gelu_fusion: bool = False
    """Fused bias + GeLU (``TransformerConfig.bias_activation_fusion`` without --swiglu). Always
    off; Megatron-LM's --no-bias-gelu-fusion is accepted (a no-effect notice); True is refused."""
    bias_swiglu_fusion: bool = False
    """Fused bias + SwiGLU (``TransformerConfig.bias_activation_fusion`` with --swiglu). Always
    off; Megatron-LM's --no-bias-swiglu-fusion is accepted (a no-effect notice); True is refused."""
    bias_dropout_fusion: bool = False
    """Fused bias + dropout + residual add (``TransformerConfig.bias_dropout_fusion``). Always off;
    Megatron-LM's --no-bias-dropout-fusion is accepted (a no-effect notice); True is refused."""
    gradient_accumulation_fusion: bool = False
    """Weight gradients accumulated into main_grad by a fused kernel
    (``TransformerConfig.gradient_accumulation_fusion``, CUDA + APEX/TE). Always off; Megatron-LM's
    --no-gradient-accumulation-fusion is accepted (a no-effect notice); True is refused."""
    rope_fusion: bool = False
    """Fused RoPE kernel (``TransformerConfig.apply_rope_fusion``, Megatron-LM's dest of
    --no-rope-fusion). Always off; --no-rope-fusion is accepted (a no-effect notice); True is
    refused."""
    persist_layer_norm: bool = False
    """Persistent fused LayerNorm kernel (``TransformerConfig.persist_layer_norm``). Always off;
    Megatron-LM's --no-persist-layer-norm is accepted (a no-effect notice); True is refused."""

    def _default_ffn_hidden_size(self) -> None:
        """Megatron-LM's default (the field's docstring); refuses a SwiGLU default of 0, which
        Megatron-LM would build (hidden_size below 24)."""
        if not self.swiglu:
            resolve(self, "ffn_hidden_size", 4 * self.hidden_size)
            return
        width = int((4 * self.hidden_size * 2 / 3) / 64) * 64
        if width < 1:
            fail(
                "ffn_hidden_size",
                None,
                f"Megatron-LM's SwiGLU default int(4 x hidden_size x 2 / 3 / 64) x 64 is 0 for "
                f"hidden_size={self.hidden_size} (below 24)",
                f"set ffn_hidden_size, e.g. 4 x hidden_size = {4 * self.hidden_size}",
            )
        resolve(self, "ffn_hidden_size", width)

    def __post_init__(self) -> None:
        check_choices(self)
        for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "must be a positive integer", f"set {key} >= 1")
        if not self.rotary_base > 0:
            fail(
                "rotary_base",
                self.rotary_base,
                "must be > 0 (RoPE's frequencies are rotary_base^(-2i/d): 0 gives inf and a NaN "
                "loss from the first step)",
                "use e.g. 10000 (the default) or 500000",
            )
        if self.make_vocab_size_divisible_by < 1:
            fail(
                "make_vocab_size_divisible_by",
                self.make_vocab_size_divisible_by,
                "must be >= 1",
                "use 128 (Megatron-LM's default), or 1 for no padding",
            )
        if self.ffn_hidden_size is None:
            self._default_ffn_hidden_size()
        elif self.ffn_hidden_size < 1:
            fail(
                "ffn_hidden_size",
                self.ffn_hidden_size,
                "must be a positive integer",
                f"set ffn_hidden_size >= 1, e.g. 4 x hidden_size = {4 * self.hidden_size}",
            )
        if self.kv_channels is None:
            if self.hidden_size % self.num_attention_heads:
                fail(
                    "hidden_size",
                    self.hidden_size,
                    f"not divisible by num_attention_heads={self.num_attention_heads}",
                    "choose hidden_size as a multiple of num_attention_heads, or set kv_channels",
                )
            resolve(self, "kv_channels", self.hidden_size // self.num_attention_heads)
        resolve_megatron_aliases(self)
        if self.num_query_groups is None:
            resolve(self, "num_query_groups", self.num_attention_heads)
        if self.num_attention_heads % self.num_query_groups:
            fail(
                "num_query_groups",
                self.num_query_groups,
                f"does not divide num_attention_heads={self.num_attention_heads}",
                "use a divisor of num_attention_heads",
            )
        if self.max_position_embeddings is None:
            resolve(self, "max_position_embeddings", self.seq_length)
        if self.normalization != "RMSNorm":
            fail("normalization", self.normalization, "unsupported", "use 'RMSNorm'")
        if not 0.0 < self.norm_epsilon < 1.0:
            fail("norm_epsilon", self.norm_epsilon, "must lie in (0, 1)", "use 1e-12 (paper)")
        if self.layer_spec == "local" and self.gated_attention != "none":
            fail(
                "layer_spec",
                self.layer_spec,
                f"megatron-core's stock local spec has no attention gate (gated_attention="
                f"{self.gated_attention!r})",
                "add --gated-attention none, or use --layer-spec gamma",
            )
        if self.num_experts is not None:
            if self.num_experts < 1:
                fail("num_experts", self.num_experts, "must be >= 1", "or leave it unset (dense)")
            if not 1 <= self.moe_router_topk <= self.num_experts:
                fail(
                    "moe_router_topk",
                    self.moe_router_topk,
                    f"must lie in [1, num_experts={self.num_experts}]",
                    "route each token to fewer experts",
                )
            if self.moe_ffn_hidden_size is None:
                resolve(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
        _check_moe(self)
        for key in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                fail(key, getattr(self, key), "must lie in [0, 1)", f"set {key} to e.g. 0.0")
        check_megatron_model_flags(self)
        check_fusions(self)


def _check_moe(m: ModelConfig) -> None:
    """The MoE fields of ``m`` (validation step of ModelConfig)."""
    moe_keys = (
        "moe_z_loss_coeff",
        "moe_shared_expert_intermediate_size",
        "moe_expert_capacity_factor",
        "moe_router_dtype",
    )
    if m.moe_grouped_gemm:
        fail(
            "moe_grouped_gemm",
            True,
            "megatron-core's grouped-GEMM experts (GroupedMLP / TEGroupedMLP) need CUDA with the "
            "grouped_gemm package or Transformer Engine, and store all experts in one transposed "
            "weight that the gamma-init's role registry has no rows for",
            "drop --moe-grouped-gemm: experts run as megatron-core's SequentialMLP",
        )
    if m.num_experts is None:
        given = [k for k in moe_keys if getattr(m, k) is not None]
        given += ["moe_layer_freq"] if m.moe_layer_freq != "1" else []
        if given:
            fail(given[0], getattr(m, given[0]), "needs an MoE model", "add --num-experts")
        return
    moe_layer_pattern(m.moe_layer_freq, m.num_layers)
    for key in ("moe_z_loss_coeff", "moe_expert_capacity_factor"):
        if getattr(m, key) is not None and not getattr(m, key) > 0:
            fail(key, getattr(m, key), "must be > 0", "or leave it unset")
    size = m.moe_shared_expert_intermediate_size
    if size is not None and size < 1:
        fail("moe_shared_expert_intermediate_size", size, "must be >= 1", "or leave it unset")
    if m.moe_expert_capacity_factor is not None and m.moe_router_load_balancing_type == "sinkhorn":
        fail(
            "moe_expert_capacity_factor",
            m.moe_expert_capacity_factor,
            "megatron-core drops tokens only with aux_loss, seq_aux_loss, global_aux_loss or none "
            "load balancing",
            "change --moe-router-load-balancing-type or drop the capacity factor",
        )
    if m.moe_pad_expert_input_to_capacity and m.moe_expert_capacity_factor is None:
        fail(
            "moe_pad_expert_input_to_capacity",
            True,
            "padding to capacity needs a capacity",
            "add --moe-expert-capacity-factor (e.g. 1.0)",
        )


def parse_env(items: Any) -> dict[str, str]:
    """Environment variables from ``KEY=VALUE`` strings or a ``{KEY: VALUE}`` mapping, in order.

    Only the first ``=`` splits, so values may hold ``=`` and ``,`` (``NCCL_SOCKET_IFNAME=a,b``).

    Raises:
        ConfigError: an item without ``=``, or a name that is not a shell variable name.
    """
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = []
        for item in [items] if isinstance(items, str) else items or ():
            name, sep, value = str(item).partition("=")
            if not sep:  # shown cut: a value pasted without its name may be a secret
                shown = f"{str(item)[:3]}... ({len(str(item))} characters)"
                fail(
                    "env", shown, "expected KEY=VALUE (the item is cut here: a value given "
                    "without its name may be a secret)", "e.g. --env NCCL_IB_TIMEOUT=22",
                )  # fmt: skip
            pairs.append((name, value))
    for name, _ in pairs:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            fail("env", name, "not a shell variable name", "use letters, digits and _ only")
    return {str(k): str(v) for k, v in pairs}


def _parse_overrides(text: str) -> dict:
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        role, sep, value = item.partition("=")
        try:
            out[role.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            fail("init_gamma_overrides", item, "expected ROLE=GAMMA", "e.g. 'fc2=0.75,attn_out=1'")
    return out


@dataclass(frozen=True)
class InitConfig:
    """Weight initialization (paper: W ~ N(0, sigma^2), sigma = fan_in^-gamma)."""

    init_method: InitMethod = InitMethod.GAMMA
    """Initialization rule (see megatron_gamma.model.init)."""
    init_gamma: float = 1.0
    """gamma of sigma = fan_in^-gamma. 0.5 is Xavier-like, 1.0 the paper's recommendation."""
    init_method_std: float = 0.02
    """Standard deviation for init_method='normal'."""
    init_gamma_overrides: dict = field(default_factory=dict)
    """Per-role gamma, e.g. 'attn_out=1.0,fc2=0.75,embedding=0.5' (roles: the matrix roles of
    the registry megatron_gamma.model.roles; the same names the init audit and the diagnostics
    report)."""
    embedding_fan_in: EmbeddingFanIn = EmbeddingFanIn.HIDDEN
    """Fan-in policy for the input embedding ('hidden' is the convention under which the
    paper's residual-flow balance d^(1-gamma) holds)."""
    init_audit: InitAudit = InitAudit.FULL
    """Start-up audit of expected vs. measured sigma per parameter, written to
    run_dir/init_audit.json ('summary' or 'off' on large models: see InitAudit)."""

    def __post_init__(self) -> None:
        check_choices(self)
        if not self.init_gamma > 0:
            fail(
                "init_gamma",
                self.init_gamma,
                "gamma must be > 0 (sigma = fan_in^-gamma would not shrink with width)",
                "use 1.0 (paper default) or 0.5 (Xavier-like baseline)",
            )
        if not self.init_method_std > 0:
            fail("init_method_std", self.init_method_std, "must be > 0", "use e.g. 0.02")
        if isinstance(self.init_gamma_overrides, list):  # repeated flag
            resolve(self, "init_gamma_overrides", ",".join(self.init_gamma_overrides))
        if isinstance(self.init_gamma_overrides, str):
            resolve(self, "init_gamma_overrides", _parse_overrides(self.init_gamma_overrides))
        from megatron_gamma.model.roles import MATRIX_ROLES

        for role, gamma in self.init_gamma_overrides.items():
            if role not in MATRIX_ROLES:
                fail(
                    "init_gamma_overrides",
                    role,
                    "unknown role",
                    f"use one of {', '.join(MATRIX_ROLES)}",
                )
            if not float(gamma) > 0:
                fail("init_gamma_overrides", f"{role}={gamma}", "gamma must be > 0", "use > 0")
        resolve(
            self,
            "init_gamma_overrides",
            {k: float(v) for k, v in self.init_gamma_overrides.items()},
        )


@dataclass(frozen=True)
class ParallelConfig:
    """Parallel layout (megatron-core ``parallel_state`` and DDP)."""

    tensor_model_parallel_size: int = 1
    """Tensor-parallel group size."""
    pipeline_model_parallel_size: int = 1
    """Pipeline stages."""
    num_layers_per_virtual_pipeline_stage: Optional[int] = None
    """Layers per virtual pipeline chunk (interleaved 1F1B); None disables virtual stages."""
    expert_model_parallel_size: int = 1
    """Expert-parallel group size (MoE)."""
    expert_tensor_parallel_size: Optional[int] = None
    """Tensor-parallel size of each expert (megatron-core's expert TP group, MoE); default
    tensor_model_parallel_size (as in Megatron-LM). 1 keeps every expert whole on its rank,
    which needs expert_model_parallel_size > 1 when TP > 1."""
    sequence_parallel: bool = False
    """Shard norms/dropout activations along the sequence over the TP group."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state over data-parallel ranks (megatron-core DistributedOptimizer)."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduction with the backward pass."""
    virtual_pipeline_model_parallel_size: Optional[int] = None
    """Virtual pipeline chunks per pipeline rank (interleaved 1F1B; megatron-core
    ``parallel_state.initialize_model_parallel(virtual_pipeline_model_parallel_size=...)``, the
    value Megatron-LM derives from --num-layers-per-virtual-pipeline-stage). The other way to
    ask for the same layout: give either; when both are given they must agree (num_layers /
    pipeline_model_parallel_size = this x num_layers_per_virtual_pipeline_stage).
    :func:`virtual_stages` resolves the pair."""
    overlap_param_gather: bool = False
    """Overlap the distributed optimizer's parameter all-gather with the next forward pass
    (megatron-core ``DistributedDataParallelConfig.overlap_param_gather``); needs
    use_distributed_optimizer and overlap_grad_reduce (Megatron-LM's requirements)."""
    distributed_timeout_minutes: int = 10
    """Timeout of torch.distributed collectives in minutes (``init_process_group(timeout=...)``
    and megatron-core's model-parallel groups); Megatron-LM's default 10."""
    distributed_backend: DistributedBackend = DistributedBackend.NCCL
    """Accepted for Megatron-LM launch scripts and does nothing: the backend follows the device,
    NCCL for GPU tensors and gloo for CPU ones (a one-line notice says so)."""
    context_parallel_size: int = 1
    """Context-parallel group size (megatron-core CP, sequence split over ranks). Only 1:
    megatron-core implements CP in Transformer Engine's attention only
    (``TEDotProductAttention``), and megatron-gamma's layer specs use local attention
    (``DotProductAttention`` / ``SDPACoreAttention``, which assert CP = 1)."""
    num_virtual_stages_per_pipeline_rank: Optional[int] = None
    """Current Megatron-LM's name for virtual_pipeline_model_parallel_size: sets it (an error
    when both are given and differ)."""

    def __post_init__(self) -> None:
        check_choices(self)
        for key in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "expert_model_parallel_size",
        ):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "must be >= 1", f"set {key} to 1 or more")
        if self.expert_tensor_parallel_size is None:
            resolve(self, "expert_tensor_parallel_size", self.tensor_model_parallel_size)
        if self.expert_tensor_parallel_size < 1:
            fail(
                "expert_tensor_parallel_size",
                self.expert_tensor_parallel_size,
                "must be >= 1",
                "leave it unset (= tensor_model_parallel_size) or set 1 or more",
            )
        vpp = self.num_layers_per_virtual_pipeline_stage
        if vpp is not None and vpp < 1:
            fail("num_layers_per_virtual_pipeline_stage", vpp, "must be >= 1", "or unset it")
        if vpp is not None and self.pipeline_model_parallel_size == 1:
            fail(
                "num_layers_per_virtual_pipeline_stage",
                vpp,
                "virtual stages need pipeline_model_parallel_size > 1",
                "unset it or raise --pipeline-model-parallel-size",
            )
        alias = self.num_virtual_stages_per_pipeline_rank
        if alias is not None:
            if self.virtual_pipeline_model_parallel_size not in (None, alias):
                fail(
                    "num_virtual_stages_per_pipeline_rank",
                    alias,
                    "contradicts virtual_pipeline_model_parallel_size="
                    f"{self.virtual_pipeline_model_parallel_size} (two names of one setting)",
                    "give only one of them",
                )
            resolve(self, "virtual_pipeline_model_parallel_size", alias)
        chunks = self.virtual_pipeline_model_parallel_size
        if chunks is not None and chunks < 1:
            fail("virtual_pipeline_model_parallel_size", chunks, "must be >= 1", "or unset it")
        if chunks is not None and chunks > 1 and self.pipeline_model_parallel_size == 1:
            fail(
                "virtual_pipeline_model_parallel_size",
                chunks,
                "virtual stages need pipeline_model_parallel_size > 1",
                "unset it or raise --pipeline-model-parallel-size",
            )
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            fail(
                "overlap_param_gather",
                True,
                "the parameter all-gather exists only with the distributed optimizer",
                "add --use-distributed-optimizer, or drop --overlap-param-gather",
            )
        if self.overlap_param_gather and not self.overlap_grad_reduce:
            fail(
                "overlap_param_gather",
                True,
                "Megatron-LM overlaps the parameter all-gather only together with the gradient "
                "reduce-scatter",
                "add --overlap-grad-reduce, or drop --overlap-param-gather",
            )
        if self.distributed_timeout_minutes < 1:
            fail(
                "distributed_timeout_minutes",
                self.distributed_timeout_minutes,
                "must be >= 1",
                "use e.g. 10 (Megatron-LM's default)",
            )
        if self.context_parallel_size < 1:
            fail("context_parallel_size", self.context_parallel_size, "must be >= 1", "use 1")
        if self.context_parallel_size > 1:
            fail(
                "context_parallel_size",
                self.context_parallel_size,
                "megatron-core implements context parallelism only in Transformer Engine's "
                "attention (TEDotProductAttention); megatron-gamma's layer specs use local "
                "attention (DotProductAttention / SDPACoreAttention), which has none",
                "use --context-parallel-size 1 and split the work with tensor, pipeline or data "
                "parallelism",
            )


_SPLIT_KEYS = ("train_data_path", "valid_data_path", "test_data_path")

DATASETS_LISTED = 5
"""How many of a folder's datasets a missing --data-path prefix's fix names."""


@dataclass(frozen=True)
class DataConfig:
    """Indexed datasets and tokenizer."""

    data_path: list = field(default_factory=list)
    """Megatron blend: 'PREFIX' or 'W1 PREFIX1 W2 PREFIX2 ...' (prefix without .bin/.idx)."""
    train_data_path: list = field(default_factory=list)
    """Per-split blend for training (Megatron-LM's --train-data-path; replaces data_path and
    split, megatron-core's ``blend_per_split``)."""
    valid_data_path: list = field(default_factory=list)
    """Per-split blend for validation (--valid-data-path); none: no validation."""
    test_data_path: list = field(default_factory=list)
    """Per-split blend for testing (--test-data-path)."""
    split: str = "949,50,1"
    """train,valid,test proportions of the documents (with data_path only); missing ones are 0,
    as megatron-core reads it ('90,10' is 90% train, 10% valid, no test)."""
    tokenizer_model: Optional[str] = None
    """Path to a HF tokenizer.json, or a directory holding one (default: the packaged demo
    tokenizer)."""
    data_cache_path: Optional[str] = None
    """Where GPTDataset caches its index files (default: <run_dir>/data_cache)."""
    num_workers: int = 0
    """torch DataLoader worker processes reading the micro-batches (Megatron-LM's
    --num-workers; its default is 2, ours 0: read in the training process). The sample order
    and so the resume position do not depend on it."""
    reset_position_ids: bool = False
    """Restart position ids at 0 after every EOD token (megatron-core ``GPTDatasetConfig``).
    Only the learned absolute position embedding reads position ids: megatron-core's RoPE
    rotates by the index in the sequence (a warning says so under rope)."""
    reset_attention_mask: bool = False
    """Tokens attend only within their own document: the causal mask is cut after every EOD
    (megatron-core ``GPTDatasetConfig``; the (s, s) mask travels with each sample and reaches
    the core attention)."""
    eod_mask_loss: bool = False
    """Exclude the EOD positions from the loss (megatron-core ``GPTDatasetConfig``)."""
    mock_data: bool = False
    """Train on megatron-core's ``MockGPTDataset`` (synthetic token sequences) instead of a
    dataset, for smoke runs: no --data-path needed (and none allowed)."""
    tokenizer_type: Optional[TokenizerType] = None
    """Tokenizer kind (Megatron-LM's --tokenizer-type); see
    :mod:`megatron_gamma.data.tokenizer_types`. Default: GPT2BPETokenizer when --vocab-file or
    --merge-file is given (as Megatron-LM's GPT-3 example scripts assume), else
    HuggingFaceTokenizer."""
    vocab_file: Optional[str] = None
    """GPT-2 BPE vocab.json (with tokenizer_type GPT2BPETokenizer)."""
    merge_file: Optional[str] = None
    """GPT-2 BPE merges.txt (with tokenizer_type GPT2BPETokenizer)."""
    mmap_bin_files: bool = True
    """Memory-map the .bin token files (megatron-core ``GPTDatasetConfig.mmap_bin_files``);
    ``--no-mmap-bin-files`` reads each sample with a file read instead (Megatron-LM's flag, for
    filesystems where mmap is slow)."""
    num_dataset_builder_threads: int = 1
    """Threads per rank that build the datasets' indices (megatron-core
    ``GPTDatasetConfig.num_dataset_builder_threads``); the samples do not depend on it."""
    create_attention_mask_in_dataloader: bool = False
    """Megatron-LM's switch (default on there) for a causal mask built by the data loader. Here
    the causal mask is implicit in the attention kernel and a mask is built only for
    reset_attention_mask, so either value trains the same model: accepted for launch scripts,
    with a no-effect notice."""

    def __post_init__(self) -> None:
        check_choices(self)
        for key in ("data_path", *_SPLIT_KEYS):
            value = getattr(self, key)
            if isinstance(value, str):
                value = _split_blend_string(key, value)
            resolve(self, key, [str(p) for p in value])
        given = [k for k in _SPLIT_KEYS if getattr(self, k)]
        if self.data_path and given:
            fail(
                given[0],
                getattr(self, given[0]),
                "data_path and per-split paths exclude each other (megatron-core takes a blend "
                "with a split, or one blend per split)",
                "give either data_path (with split) or train_data_path/valid_data_path/"
                "test_data_path, in the YAML file or as flags, not both",
            )
        if given and not self.train_data_path:
            fail(
                "train_data_path",
                self.train_data_path,
                "per-split paths need a training blend",
                "add --train-data-path PREFIX (or W1 P1 W2 P2 ...)",
            )
        split_shares(self.split)
        if self.num_dataset_builder_threads < 1:
            fail(
                "num_dataset_builder_threads",
                self.num_dataset_builder_threads,
                "must be >= 1",
                "use 1 (Megatron-LM's default) or more",
            )
        if self.num_workers < 0:
            fail("num_workers", self.num_workers, "must be >= 0", "use 0 (no worker) or more")
        if self.mock_data and (self.data_path or given):
            key = "data_path" if self.data_path else given[0]
            fail(
                "mock_data",
                True,
                f"synthetic data and {key}={getattr(self, key)} exclude each other",
                f"remove mock_data to train on the dataset, or remove {key}",
                keys=("mock_data", key),
            )
        if self.tokenizer_type is None:
            gpt2 = self.vocab_file or self.merge_file
            resolve(self, "tokenizer_type", "GPT2BPETokenizer" if gpt2 else "HuggingFaceTokenizer")
        if self.tokenizer_type == "GPT2BPETokenizer":
            missing = [k for k in ("vocab_file", "merge_file") if not getattr(self, k)]
            if missing:
                fail(
                    missing[0],
                    None,
                    "tokenizer_type='GPT2BPETokenizer' reads vocab.json and merges.txt",
                    "pass --vocab-file vocab.json --merge-file merges.txt",
                )
            if self.tokenizer_model:
                fail(
                    "tokenizer_model",
                    self.tokenizer_model,
                    "tokenizer_type='GPT2BPETokenizer' reads --vocab-file/--merge-file instead",
                    "drop --tokenizer-model, or use --tokenizer-type HuggingFaceTokenizer",
                )
        else:
            for key in ("vocab_file", "merge_file"):
                if getattr(self, key):
                    fail(
                        key,
                        getattr(self, key),
                        f"only read with tokenizer_type='GPT2BPETokenizer' (this run: "
                        f"{self.tokenizer_type!r} reads --tokenizer-model)",
                        "add --tokenizer-type GPT2BPETokenizer, or drop it",
                    )

    def blend(
        self, recorded: Optional[RecordedPaths] = None
    ) -> tuple[list[str], Optional[list[float]]]:
        """Return (prefixes, weights) parsed from ``data_path``; weights None for one prefix.

        With per-split paths instead, check all of them (:meth:`blend_per_split`) and return the
        training blend, so that one call validates whichever form the run uses.

        Args:
            recorded: for the config of a run a read command loaded, where its relative paths
                were looked for: the error of a relative prefix without .bin/.idx names them.

        Raises:
            ConfigError: empty path, odd weight/prefix list, or a prefix without .bin/.idx.
        """
        per_split = self.blend_per_split(recorded)
        if per_split is not None:
            return per_split[0]
        if not self.data_path:
            fail(
                "data_path",
                self.data_path,
                "no dataset given",
                "pass --data-path PREFIX (made by `megatron-gamma preprocess`)",
            )
        return _parse_blend("data_path", self.data_path, recorded)

    def blend_per_split(
        self, recorded: Optional[RecordedPaths] = None
    ) -> Optional[list[Optional[tuple[list[str], Optional[list[float]]]]]]:
        """megatron-core's ``blend_per_split``: [train, valid, test] blends (None where not
        given), or None when no per-split path is set (then :meth:`blend` applies).

        Raises:
            ConfigError: as :meth:`blend` (``recorded`` as there), naming the per-split key.
        """
        if not self.train_data_path:
            return None
        return [
            _parse_blend(k, getattr(self, k), recorded) if getattr(self, k) else None
            for k in _SPLIT_KEYS
        ]


@dataclass(frozen=True)
class RecordedPaths:
    """Where a read command (``evaluate``, ``analyze``, ...) looked for the relative input paths
    that the config of a run records as the user gave them (the run read them from the
    directory it was launched from): the text of the error of one found under none."""

    source: str
    """The file that records them: ``RUN/config.yaml``."""
    dirs: tuple[str, ...]
    """The directories they were looked for under, in order
    (:func:`megatron_gamma.rundir.paths.launch_dirs`)."""

    def where(self, value: str) -> str:
        """Why the relative ``value`` was not found: where it is recorded and the directories
        tried, the last of which is the current directory (``launch_dirs`` gives it last)."""
        tried = [f"{d} (where the run was launched from, by its run_dir)" for d in self.dirs[:-1]]
        tried.append(f"{self.dirs[-1]} (the current directory)")
        return (
            f"{value!r} is relative, as {self.source} records it, and no directory tried holds "
            f"it: {', '.join(tried)}"
        )


def split_shares(split: str) -> list[float]:
    """The train, valid, test weights of ``--split`` as megatron-core's
    ``parse_and_normalize_split`` reads them before normalizing: one to three numbers separated
    by ``,`` or ``/``, the missing ones 0 (``'90,10'`` is ``[90, 10, 0]``). The string itself
    goes to megatron-core's ``GPTDatasetConfig(split=...)`` unchanged.

    Raises:
        ConfigError: a part that is not a non-negative number, more than three parts, or all 0
            (megatron-core would read a minus sign or a stray character as a separator).
    """
    parts = str(split).replace("/", ",").split(",")
    values = []
    # digits and a point only: the characters megatron-core reads as one number
    if all(re.fullmatch(r"\s*[0-9.]+\s*", p) for p in parts):
        try:
            values = [float(p) for p in parts]
        except ValueError:  # two points
            values = []
    if not values or len(values) > 3 or min(values) < 0 or sum(values) <= 0:
        fail(
            "split",
            split,
            "needs one to three non-negative numbers (train,valid,test; missing ones are 0), "
            "not all 0",
            "use e.g. '98,2,0' (train, valid, no test) or '949,50,1' (Megatron-LM's default, "
            "whose 0.1% test split is empty below 501 documents)",
        )
    return values + [0.0] * (3 - len(values))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _split_blend_string(key: str, value: str) -> list[str]:
    """A blend given as one string (a YAML scalar): split on whitespace, as Megatron-LM reads
    'PREFIX' or 'W1 P1 W2 P2 ...'.

    Raises:
        ConfigError: the pieces are no blend (an odd count, or a weight that is not a
            number): a path holding spaces, whose fix is a YAML list.
    """
    items = value.split()
    if len(items) < 2 or (len(items) % 2 == 0 and all(map(_is_number, items[0::2]))):
        return items
    fail(
        key,
        value,
        f"a string is split on whitespace into Megatron's blend 'W1 P1 W2 P2 ...', and its "
        f"{len(items)} pieces are none",
        f"a path holding spaces goes in a YAML list ({key}: [{value!r}]), or on the command "
        f"line quoted (--{key.replace('_', '-')} '{value}')",
    )


def _parse_blend(
    key: str, items: list[str], recorded: Optional[RecordedPaths] = None
) -> tuple[list[str], Optional[list[float]]]:
    """Megatron's blend list 'PREFIX' or 'W1 P1 W2 P2 ...' -> (prefixes, weights or None);
    ``recorded``: :meth:`DataConfig.blend`'s."""
    if len(items) == 1:
        prefixes, weights = items, None
    else:
        if len(items) % 2:
            fail(key, items, "weights and prefixes must alternate", "W1 P1 W2 P2 ...")
        try:
            weights = [float(w) for w in items[0::2]]
        except ValueError:
            fail(key, items, "weights and prefixes must alternate", "W1 P1 W2 P2 ...")
        if min(weights) < 0 or sum(weights) <= 0:
            fail(key, items, "weights must be >= 0 and not all 0", "e.g. 0.3 P1 0.7 P2")
        prefixes = items[1::2]
    for p in prefixes:
        for ext in (".bin", ".idx"):
            if os.path.isfile(p + ext):
                continue
            if recorded is not None and not os.path.isabs(p):
                fail(
                    key,
                    p,
                    f"{p + ext} does not exist: {recorded.where(p)}",
                    "run this command from the directory the run was launched from, or pass "
                    "--data-path PREFIX (a path from the current directory)",
                )
            fail(key, p, f"{p + ext} does not exist", _dataset_fix(key, p))
    return prefixes, weights


def is_dataset(prefix: str) -> bool:
    """Whether the indexed dataset ``prefix`` exists: ``PREFIX.bin`` and ``PREFIX.idx``."""
    return os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")


def _dataset_fix(key: str, prefix: str) -> str:
    """The fix for a blend entry without its .bin/.idx: the prefix without the extension it was
    given with, or the datasets ``preprocess --output-prefix PREFIX`` wrote (``PREFIX_*``)."""
    flag = f"--{key.replace('_', '-')}"
    stem, ext = os.path.splitext(prefix)
    if ext in (".bin", ".idx") and is_dataset(stem):
        return f"drop the extension: {flag} {shlex.quote(stem)}"
    found = sorted(
        p[: -len(".idx")]
        for p in glob.glob(glob.escape(prefix) + "_*.idx")
        if is_dataset(p[: -len(".idx")])
    )
    made = f"what `megatron-gamma preprocess --output-prefix {shlex.quote(prefix)}` wrote"
    if len(found) == 1:
        return f"{flag} {shlex.quote(found[0])}, {made}"
    if found:
        stats = f"{prefix}.stats.json"
        blend = f"; or their blend, the data_path in {stats}" if os.path.isfile(stats) else ""
        return f"one of {', '.join(map(shlex.quote, found))}, {made}{blend}"
    folder = os.path.dirname(prefix) or "."
    near = sorted(
        p[: -len(".idx")]
        for p in glob.glob(os.path.join(glob.escape(folder), "*.idx"))
        if is_dataset(p[: -len(".idx")])
    )
    if near:
        listed = ", ".join(shlex.quote(p) for p in near[:DATASETS_LISTED])
        more = f" and {len(near) - DATASETS_LISTED} more" if len(near) > DATASETS_LISTED else ""
        return (
            f"{flag} one of the datasets in {folder}: {listed}{more} (preprocess names them "
            "PREFIX_KEY_document after its --json-keys, e.g. _text_document or _content_document)"
        )
    return "give the prefix written by `megatron-gamma preprocess` (no extension)"


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW and its learning-rate schedule (megatron-core OptimizerConfig and
    OptimizerParamScheduler)."""

    optimizer: Optimizer = Optimizer.ADAM
    """Optimizer."""
    lr: float = 3e-3
    """Peak learning rate."""
    min_lr: float = 3e-4
    """Learning rate at the end of the decay."""
    lr_decay_style: LrDecayStyle = LrDecayStyle.COSINE
    """Decay of the learning rate after warmup."""
    lr_warmup_iters: int = 0
    """Linear warmup iterations."""
    lr_decay_iters: Optional[int] = None
    """Iterations of decay (default train_iters)."""
    weight_decay: float = 0.1
    """Decoupled weight decay."""
    adam_beta1: float = 0.9
    """Adam's first-moment decay (beta1)."""
    adam_beta2: float = 0.95
    """Adam's second-moment decay (beta2)."""
    adam_eps: float = 1e-8
    """Adam's epsilon, added to the square root of the second moment in the denominator."""
    sgd_momentum: float = 0.9
    """Momentum of --optimizer sgd (megatron-core ``OptimizerConfig.sgd_momentum``; Megatron-LM's
    default 0.9)."""
    clip_grad: float = 1.0
    """Gradient clipping by global norm (0 disables)."""
    override_opt_param_scheduler: bool = False
    """On resume, train on with this config's schedule (lr, min_lr, warmup, decay iterations and
    style, weight decay) from the checkpoint's iteration, where it differs from the checkpoint's
    (a difference is an error without this flag or use_checkpoint_opt_param_scheduler)."""
    use_checkpoint_opt_param_scheduler: bool = False
    """On resume, keep the checkpoint's schedule where this config's differs (config.yaml then
    records the checkpoint's values)."""
    lr_warmup_fraction: Optional[float] = None
    """Warmup as a fraction of the decay span (lr_decay_iters, or lr_decay_samples with
    train_samples), Megatron-LM's ``--lr-warmup-fraction``; excludes lr_warmup_iters and
    lr_warmup_samples."""
    lr_warmup_samples: int = 0
    """Linear warmup in samples, for sample-based training (train_samples)."""
    lr_decay_samples: Optional[int] = None
    """Samples of decay for sample-based training (default train_samples)."""
    lr_warmup_init: float = 0.0
    """Learning rate at the start of the warmup (megatron-core ``init_lr``)."""
    lr_wsd_decay_style: WsdDecayStyle = WsdDecayStyle.EXPONENTIAL
    """Shape of the annealing phase of lr_decay_style='WSD'."""
    lr_wsd_decay_iters: Optional[int] = None
    """Iterations of WSD annealing at the end of the decay span (iteration-based training)."""
    lr_wsd_decay_samples: Optional[int] = None
    """Samples of WSD annealing at the end of the decay span (sample-based training)."""
    start_weight_decay: Optional[float] = None
    """Weight decay at the start of training, with a linear or cosine weight_decay_incr_style
    (then weight_decay is not used)."""
    end_weight_decay: Optional[float] = None
    """Weight decay at the end of training (train_iters or train_samples), with a linear or
    cosine weight_decay_incr_style; megatron-core requires end >= start."""
    weight_decay_incr_style: WeightDecayIncrStyle = WeightDecayIncrStyle.CONSTANT
    """Weight decay schedule over training."""
    loss_scale: Optional[float] = None
    """Static loss scale for fp16 (megatron-core ConstantGradScaler); None: dynamic loss
    scaling (DynamicGradScaler) under fp16."""
    initial_loss_scale: float = 2.0**32
    """Initial dynamic loss scale (fp16)."""
    min_loss_scale: float = 1.0
    """Floor of the dynamic loss scale (fp16)."""
    loss_scale_window: int = 1000
    """Iterations without overflow after which the dynamic loss scale doubles (fp16)."""
    hysteresis: int = 2
    """Overflowing iterations tolerated before the dynamic loss scale is halved (fp16)."""

    def __post_init__(self) -> None:
        check_choices(self)
        if not self.lr > 0:
            fail("lr", self.lr, "must be > 0", "use e.g. 3e-4")
        if not 0 <= self.min_lr <= self.lr:
            fail("min_lr", self.min_lr, f"must lie in [0, lr={self.lr}]", "lower min_lr")
        if not 0 <= self.sgd_momentum < 1:
            fail("sgd_momentum", self.sgd_momentum, "must lie in [0, 1)", "use e.g. 0.9")
        for key, usual in (("adam_beta1", 0.9), ("adam_beta2", 0.95)):
            if not 0 <= getattr(self, key) < 1:
                fail(key, getattr(self, key), "must lie in [0, 1)", f"use e.g. {usual}")
        if not self.adam_eps > 0:
            fail(
                "adam_eps",
                self.adam_eps,
                "must be > 0 (Adam divides by sqrt(v) + adam_eps: 0 gives NaN where a gradient "
                "is 0)",
                "use e.g. 1e-8",
            )
        if not self.weight_decay >= 0:
            fail("weight_decay", self.weight_decay, "must be >= 0", "use e.g. 0.1, or 0 for none")
        for key in ("lr_warmup_iters", "lr_warmup_samples"):
            if getattr(self, key) < 0:
                fail(key, getattr(self, key), "must be >= 0", "use 0 or more")
        for key in (
            "lr_decay_iters",
            "lr_decay_samples",
            "lr_wsd_decay_iters",
            "lr_wsd_decay_samples",
        ):
            value = getattr(self, key)
            if value is not None and value < 1:
                fail(key, value, "must be >= 1", f"set {key} to 1 or more, or leave it unset")
        self._check_warmup()
        if not 0 <= self.lr_warmup_init <= self.lr:
            fail(
                "lr_warmup_init",
                self.lr_warmup_init,
                f"must lie in [0, lr={self.lr}] (megatron-core asserts init_lr <= max_lr)",
                "lower lr_warmup_init",
            )
        if self.lr_decay_style == "WSD" and (
            self.lr_wsd_decay_iters is None and self.lr_wsd_decay_samples is None
        ):
            fail(
                "lr_decay_style",
                "WSD",
                "needs the length of the annealing phase",
                "add --lr-wsd-decay-iters N (or --lr-wsd-decay-samples N with --train-samples)",
            )
        self._check_weight_decay()
        for key in ("initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis"):
            if not getattr(self, key) > 0:
                fail(key, getattr(self, key), "must be > 0", "use megatron-core's default")
        if self.loss_scale is not None and not self.loss_scale > 0:
            fail("loss_scale", self.loss_scale, "must be > 0", "use a power of 2, or unset it")
        if self.min_loss_scale > self.initial_loss_scale:
            fail(
                "min_loss_scale",
                self.min_loss_scale,
                f"exceeds initial_loss_scale={self.initial_loss_scale}",
                "lower min_loss_scale",
            )

    def _check_warmup(self) -> None:
        """Megatron-LM's exclusions: one warmup length, given one way."""
        fraction = self.lr_warmup_fraction
        if fraction is None:
            if self.lr_warmup_iters and self.lr_warmup_samples:
                fail(
                    "lr_warmup_samples",
                    self.lr_warmup_samples,
                    f"excludes lr_warmup_iters={self.lr_warmup_iters} (sample-based and "
                    "iteration-based warmup)",
                    "give --lr-warmup-iters with --train-iters, or --lr-warmup-samples with "
                    "--train-samples",
                )
            return
        if not 0.0 <= fraction < 1.0:
            fail("lr_warmup_fraction", fraction, "must lie in [0, 1)", "use e.g. 0.01")
        for key in ("lr_warmup_iters", "lr_warmup_samples"):
            if getattr(self, key):
                fail(
                    "lr_warmup_fraction",
                    fraction,
                    f"can only specify one of lr_warmup_fraction and {key} "
                    f"(Megatron-LM), got {key}={getattr(self, key)}",
                    f"drop --{key.replace('_', '-')} or --lr-warmup-fraction",
                )

    def _check_weight_decay(self) -> None:
        """Megatron-LM: constant weight decay takes weight_decay; linear and cosine take
        start_weight_decay and end_weight_decay."""
        given = [
            k for k in ("start_weight_decay", "end_weight_decay") if getattr(self, k) is not None
        ]
        if self.weight_decay_incr_style == "constant":
            if given:
                fail(
                    given[0],
                    getattr(self, given[0]),
                    "needs weight_decay_incr_style linear or cosine (constant weight decay is "
                    "weight_decay)",
                    "add --weight-decay-incr-style linear, or use --weight-decay",
                )
            return
        if len(given) < 2:
            fail(
                "weight_decay_incr_style",
                self.weight_decay_incr_style,
                "needs both start_weight_decay and end_weight_decay",
                "add --start-weight-decay and --end-weight-decay",
            )
        if not 0.0 <= self.start_weight_decay <= self.end_weight_decay:
            fail(
                "end_weight_decay",
                self.end_weight_decay,
                f"must be >= start_weight_decay={self.start_weight_decay} >= 0 (megatron-core "
                "only increases weight decay)",
                "give 0 <= --start-weight-decay <= --end-weight-decay",
            )


@dataclass(frozen=True)
class TrainingConfig:
    """Batching, iteration counts, precision and evaluation."""

    micro_batch_size: int = 4
    """Sequences per micro-batch per data-parallel rank."""
    global_batch_size: int = 8
    """Sequences per optimizer step over all data-parallel ranks."""
    train_iters: Optional[int] = None
    """Optimizer steps (default 40; derived from train_samples when that is given)."""
    seed: int = 1234
    """Seed for initialization, data order and dropout."""
    bf16: bool = False
    """bf16 mixed precision (GPU)."""
    eval_interval: int = 20
    """Validation every this many iterations (and at the end)."""
    eval_iters: int = 2
    """Validation global batches per evaluation; 0 turns validation off (Megatron-LM)."""
    exit_interval: Optional[int] = None
    """Stop after this iteration (for tests and staged runs); the schedule keeps train_iters."""
    recompute_granularity: Optional[RecomputeGranularity] = None
    """Activation recompute; None: off."""
    recompute_method: RecomputeMethod = RecomputeMethod.UNIFORM
    """With full recompute: how layers are picked."""
    recompute_num_layers: int = 1
    """With full recompute: layers per recompute unit (uniform) or recomputed layers (block)."""
    exit_duration_in_mins: Optional[float] = None
    """Wall-clock budget in minutes (fractions allowed): when it runs out, save a checkpoint at
    the end of the iteration and exit cleanly; rerunning with --load resumes there."""
    exit_signal_handler: bool = True
    """On SIGTERM (``scancel``, a node drain, torchrun's shutdown) save a checkpoint at the end
    of the current iteration and exit cleanly, as on SIGUSR1 (Megatron-LM's
    ``--exit-signal-handler``, on by default here); ``--no-exit-signal-handler`` leaves SIGTERM
    to Python's default (the process dies at once)."""
    check_for_nan_in_loss_and_grad: bool = True
    """Stop the run at the first training iteration whose loss or gradient norm is NaN or inf,
    before it is logged or saved, with exit status 1 (Megatron-LM's default);
    ``--no-check-for-nan-in-loss-and-grad`` trains on to the end (``sweep`` runs so: a study
    records such a run as diverged)."""
    train_samples: Optional[int] = None
    """Train on this many samples (Megatron-LM's sample-based training): train_iters is derived
    (train_samples // global_batch_size, or Megatron-LM's count through the batch-size ramp-up)
    and the schedule takes lr_warmup_samples, lr_decay_samples and lr_wsd_decay_samples
    instead of their _iters forms."""
    rampup_batch_size: Optional[list] = None
    """START INCR SAMPLES: ramp the global batch size from START up to global_batch_size in
    steps of INCR, spread evenly over SAMPLES samples (megatron-core's
    RampupBatchsizeNumMicroBatchesCalculator); needs train_samples, as in Megatron-LM."""
    fp16: bool = False
    """fp16 mixed precision with loss scaling (megatron-core's
    Float16OptimizerWithFloat16Params; dynamic scaling unless loss_scale). Needs CUDA:
    megatron-core's grad scalers allocate CUDA tensors."""
    accumulate_allreduce_grads_in_fp32: bool = False
    """Accumulate and all-reduce gradients in fp32 under fp16 (megatron-core DDP
    ``grad_reduce_in_fp32``). bf16 always does (Megatron-LM forces it on for bf16); fp32
    gradients are fp32 anyway."""
    recompute_activations: bool = False
    """Megatron-LM's ``--recompute-activations``: sets recompute_granularity='selective' (an
    error together with recompute_granularity='full')."""
    recompute_modules: Optional[list] = None
    """With selective recompute: the submodules whose activations are recomputed in the
    backward pass (megatron-core ``recompute_modules``): any of core_attn, layernorm, mlp (dense
    layers), moe (MoE layers), shared_experts; default megatron-core's ['core_attn']. moe_act
    and mla_up_proj are refused (they need --moe-grouped-gemm or multi-latent attention), and
    layernorm without Transformer Engine (megatron-core 0.16 needs it there)."""
    grad_reduce_in_bf16: bool = False
    """With bf16: accumulate and all-reduce gradients in bf16 (Megatron-LM's
    ``--grad-reduce-in-bf16``; megatron-core DDP ``grad_reduce_in_fp32=False``) instead of fp32."""
    manual_gc: bool = False
    """Disable Python's automatic garbage collector during training and collect at fixed points
    instead (Megatron-LM's ``--manual-gc``: every manual_gc_interval iterations and, with
    manual_gc_eval, after each evaluation), so that collections do not stall ranks at random."""
    manual_gc_interval: int = 0
    """With manual_gc: collect every this many iterations; 0 only at the start (and after
    evaluations with manual_gc_eval)."""
    manual_gc_eval: bool = True
    """With manual_gc: collect after each evaluation."""
    deterministic_mode: bool = False
    """Bit-exact reruns (Megatron-LM's ``--deterministic-mode``): before torch.distributed
    starts, ``torch.use_deterministic_algorithms(True)`` and, where unset, ``NCCL_ALGO=Ring``,
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` (a value set
    otherwise that is not deterministic is refused before the run starts); megatron-core's
    ``TransformerConfig.deterministic_mode`` (:mod:`megatron_gamma.determinism`)."""

    def __post_init__(self) -> None:
        check_choices(self)
        _check_recompute(self)
        self._resolve_train_iters()
        if self.manual_gc_interval < 0:
            fail("manual_gc_interval", self.manual_gc_interval, "must be >= 0", "use 0 or more")
        if self.eval_iters < 0:
            fail("eval_iters", self.eval_iters, "must be >= 0", "use 0 (no validation) or more")
        for key in ("micro_batch_size", "global_batch_size", "train_iters", "eval_interval"):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "must be >= 1", f"set {key} to 1 or more")
        if not 0 <= self.seed <= 2**32 - 1:
            fail(
                "seed",
                self.seed,
                "must lie in [0, 2**32 - 1] (numpy's seed range, which the data order uses)",
                "use e.g. 1234",
            )
        if self.fp16 and self.bf16:
            fail("fp16", True, "excludes bf16=True", "choose one of --fp16 and --bf16")
        if self.exit_duration_in_mins is not None and not self.exit_duration_in_mins > 0:
            fail(
                "exit_duration_in_mins",
                self.exit_duration_in_mins,
                "must be > 0",
                "give the budget in minutes, or leave it unset",
            )
        if self.global_batch_size % self.micro_batch_size:
            fail(
                "global_batch_size",
                self.global_batch_size,
                f"not divisible by micro_batch_size={self.micro_batch_size}",
                "make global_batch_size a multiple of micro_batch_size x data-parallel size",
            )

    def _resolve_train_iters(self) -> None:
        """train_iters from train_samples (Megatron-LM's ``update_train_iters``), or 40."""
        if self.rampup_batch_size is not None:
            self._check_rampup()
        if self.train_samples is None:
            if self.train_iters is None:
                resolve(self, "train_iters", 40)
            return
        if self.train_samples < 1:
            fail("train_samples", self.train_samples, "must be >= 1", "set it to 1 or more")
        derived = rampup_train_iters(
            self.train_samples, self.global_batch_size, self.rampup_batch_size
        )
        if self.train_iters is not None and self.train_iters != derived:
            fail(
                "train_iters",
                self.train_iters,
                f"excludes train_samples={self.train_samples} (which gives {derived} "
                "iterations): Megatron-LM trains either iteration-based or sample-based",
                "give only one of --train-iters and --train-samples",
            )
        resolve(self, "train_iters", derived)

    def _check_rampup(self) -> None:
        items = self.rampup_batch_size
        try:
            start, incr, samples = (int(v) for v in items)
        except (TypeError, ValueError):
            fail(
                "rampup_batch_size",
                items,
                "expected three integers START INCR SAMPLES",
                "e.g. --rampup-batch-size 16 16 5859375",
            )
        resolve(self, "rampup_batch_size", [start, incr, samples])
        if self.train_samples is None:
            fail(
                "rampup_batch_size",
                items,
                "needs sample-based training (Megatron-LM: no batch-size ramp-up for "
                "iteration-based training)",
                "replace --train-iters with --train-samples",
            )
        if start < 1 or incr < 1 or samples < 1:
            fail(
                "rampup_batch_size",
                items,
                "needs START >= 1, INCR >= 1, SAMPLES >= 1 (megatron-core divides by SAMPLES)",
                "e.g. --rampup-batch-size 16 16 5859375",
            )
        if start > self.global_batch_size or (self.global_batch_size - start) % incr:
            fail(
                "rampup_batch_size",
                items,
                f"START must reach global_batch_size={self.global_batch_size} in whole steps "
                "of INCR",
                "choose START <= global_batch_size with global_batch_size - START a multiple of "
                "INCR",
            )
        if start == self.global_batch_size:
            fail(
                "rampup_batch_size",
                items,
                "START equals global_batch_size: nothing to ramp",
                "drop --rampup-batch-size or lower START",
            )
        if self.train_samples is not None and samples > self.train_samples:
            fail(
                "rampup_batch_size",
                items,
                f"ramps over more samples than train_samples={self.train_samples}",
                "lower SAMPLES or raise --train-samples",
            )
        for size in range(start, self.global_batch_size + 1, incr):
            if size % self.micro_batch_size:
                fail(
                    "rampup_batch_size",
                    items,
                    f"the ramp's global batch size {size} is not divisible by "
                    f"micro_batch_size={self.micro_batch_size}",
                    "make START and INCR multiples of micro_batch_size x data-parallel size",
                )


RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "shared_experts")
"""megatron-core 0.16's selective-recompute modules that this model's layer spec has."""


def _check_recompute(t: TrainingConfig) -> None:
    """Resolve ``recompute_activations`` and check ``recompute_modules`` (validation step)."""
    if t.recompute_activations:
        if t.recompute_granularity == "full":
            fail(
                "recompute_activations",
                True,
                "sets recompute_granularity='selective', but recompute_granularity='full' is "
                "given too",
                "drop one of --recompute-activations and --recompute-granularity full",
            )
        resolve(t, "recompute_granularity", "selective")
    modules = t.recompute_modules
    if modules is None:
        return
    modules = modules.replace(",", " ").split() if isinstance(modules, str) else modules
    resolve(t, "recompute_modules", [str(m) for m in modules])
    if t.recompute_granularity != "selective":
        fail(
            "recompute_modules",
            t.recompute_modules,
            f"megatron-core reads it only with selective recompute (recompute_granularity="
            f"{t.recompute_granularity!r})",
            "add --recompute-granularity selective (or --recompute-activations), or drop it",
        )
    unknown = [m for m in t.recompute_modules if m not in RECOMPUTE_MODULES]
    if unknown:
        fail(
            "recompute_modules",
            unknown[0],
            "not a module of this model that megatron-core can recompute (moe_act needs "
            "--moe-grouped-gemm, mla_up_proj multi-latent attention)",
            f"use any of {', '.join(RECOMPUTE_MODULES)}",
        )
    if (
        "layernorm" in t.recompute_modules
        and importlib.util.find_spec("transformer_engine") is None
    ):
        fail(
            "recompute_modules",
            "layernorm",
            "megatron-core 0.16 recomputes norms through CheckpointWithoutOutput, which calls "
            "Transformer Engine's FP8GlobalStateManager even without fp8 (Transformer Engine is "
            "not installed)",
            "drop layernorm from --recompute-modules, or install transformer-engine",
        )


@dataclass(frozen=True)
class CheckpointConfig:
    """megatron-core dist_checkpointing."""

    save: Optional[str] = None
    """Checkpoint directory to save into; no checkpoints without it."""
    load: Optional[str] = None
    """Checkpoint directory to resume from (its latest complete checkpoint)."""
    save_interval: Optional[int] = None
    """Save every this many iterations; with ``save`` a final checkpoint is always written."""
    finetune: bool = False
    """Load only the model weights from ``load`` (Megatron-LM's ``--finetune``): iteration 0,
    a fresh optimizer and LR schedule, no RNG state; the data order starts from sample 0."""
    pretrained_checkpoint: Optional[str] = None
    """Checkpoint directory to start from weights-only (as ``--finetune``) when ``load`` holds
    no checkpoint yet (Megatron-LM's ``--pretrained-checkpoint``); once the run has saved, a
    requeue resumes from ``load`` instead. Also reads ``megatron-gamma import-hf`` output."""
    load_optim: bool = True
    """Restore the optimizer state from ``load``; ``--no-load-optim`` (Megatron-LM) keeps the
    checkpoint's iteration, schedule and data position but starts a fresh optimizer."""
    load_rng: bool = True
    """Restore the per-rank RNG states from ``load``; ``--no-load-rng`` (Megatron-LM) keeps the
    freshly seeded ones."""
    save_optim: bool = True
    """Write the optimizer state into checkpoints; ``--no-save-optim`` (Megatron-LM) writes
    weights, schedule, progress and RNG only (a resume from them needs ``--no-load-optim``)."""
    save_retain_last: Optional[int] = None
    """Keep only the newest K checkpoints under ``save`` (plus those kept by
    ``save_retain_interval``); older ones are deleted after a newer one is complete. None: keep
    all."""
    save_retain_interval: Optional[int] = None
    """With ``save_retain_last``: also keep every checkpoint whose iteration is a multiple of
    this (e.g. one per 10000 iterations for later analysis)."""
    async_save: bool = False
    """Megatron-LM's ``--async-save`` (megatron-core's asynchronous torch_dist writer): refused,
    see the README's Checkpoints section."""
    ckpt_format: str = "torch_dist"
    """Checkpoint format (Megatron-LM's ``--ckpt-format``): megatron-core dist_checkpointing's
    torch_dist, the only one written and read; any other value is refused."""
    dist_ckpt_strictness: DistCkptStrictness = DistCkptStrictness.ASSUME_OK_UNEXPECTED
    """What a load from ``load`` or ``pretrained_checkpoint`` does when the checkpoint's keys
    and the run's do not match (Megatron-LM's ``--dist-ckpt-strictness``; each member of
    :class:`~megatron_gamma.config.choices.DistCkptStrictness` says what it does);
    return_unexpected and return_all are refused."""
    overwrite: bool = False
    """Let a run without ``load`` start in a ``save`` directory that already holds checkpoints
    (an earlier run's): they are deleted when the run starts. Without it such a run is refused,
    as its saves would mix with those checkpoints and its retention delete them. Also lets a
    run that does not resume from ``run_dir``'s checkpoints start afresh in a ``run_dir`` that
    holds an earlier run's config.yaml and records, a checkpoint or an iteration in metrics.jsonl
    (refused without it; a run that never finished an iteration needs no ``overwrite``): its
    metrics.jsonl, TensorBoard directory, init_audit.json and analysis/ are moved aside to
    ``*.superseded-N``. ``submit``: also lets it replace an earlier submission's frozen
    ``RUN/slurm/config.yaml`` that holds other settings (refused without it)."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.ckpt_format != "torch_dist":
            fail(
                "ckpt_format",
                self.ckpt_format,
                "megatron-gamma writes and reads megatron-core dist_checkpointing's torch_dist "
                "format only (iter_N directories, resharding on load)",
                "use --ckpt-format torch_dist, or drop the flag",
            )
        for key in ("save_retain_last", "save_retain_interval", "save_interval"):
            value = getattr(self, key)
            if value is not None and value < 1:
                fail(key, value, "must be >= 1", f"set {key} to 1 or more, or leave it unset")
        if self.finetune and not self.load:
            fail(
                "finetune",
                True,
                "needs load, the checkpoint to take the weights from",
                "add --load DIR, or use --pretrained-checkpoint DIR alone",
            )
        if self.async_save:
            fail(
                "async_save",
                True,
                "megatron-core 0.16's asynchronous checkpoint writer needs CUDA (its workers "
                "all-reduce CUDA tensors and call torch.cuda.synchronize), and megatron-gamma "
                "does not yet run its finalize step (rename to iter_N, tracker, retention) after "
                "an asynchronous save",
                "drop --async-save: checkpoints are saved synchronously",
            )


@dataclass(frozen=True)
class LoggingConfig:
    """Run directory, console, TensorBoard."""

    run_dir: str = "runs/demo"
    """Where the run writes its config.yaml, metrics.jsonl, TensorBoard events (unless
    tensorboard_dir) and init audit. Checkpoints go to ``save`` (e.g. ``--save
    RUN_DIR/checkpoints``, or anywhere), which config.yaml records: evaluate, export-hf and
    analyze find them from RUN_DIR. One live run per directory (RUN_DIR/.run.lock); a run that
    does not resume from its checkpoints is refused in a directory holding another run's
    records unless ``--overwrite``."""
    log_interval: int = 5
    """One summary line every this many iterations."""
    tensorboard_dir: Optional[str] = None
    """TensorBoard event directory (default: <run_dir>/tensorboard)."""
    progress_bar: bool = True
    """tqdm progress bar on rank 0."""
    log_diagnostics_interval: int = 100
    """Every this many iterations, log the paper's diagnostics (stable rank, condensation,
    attention-sink share, RMSNorm saturation, gate statistics) to TensorBoard and metrics.jsonl;
    0 disables them (see megatron_gamma.diagnostics)."""
    tensorboard_log_interval: int = 1
    """Write the per-iteration training scalars to TensorBoard (and W&B) every this many
    iterations; metrics.jsonl keeps every iteration."""
    log_throughput: bool = True
    """Log tokens/s, ms/iter, TFLOP/s per device and MFU per log interval (console, TensorBoard
    ``throughput/*``; metrics.jsonl holds each iteration's tokens_per_s);
    on by default here, ``--no-log-throughput`` drops them (Megatron-LM: off by default)."""
    log_memory_to_tensorboard: bool = True
    """Log memory (allocated and reserved on GPU, RSS on CPU) to TensorBoard and metrics.jsonl;
    on by default here, ``--no-log-memory-to-tensorboard`` drops it."""
    log_params_norm: bool = False
    """Log the global L2 norm of the parameters (all model-parallel shards counted once) every
    iteration; costs one all-reduce per iteration."""
    log_num_zeros_in_grad: bool = False
    """Log the number of zero entries in the gradients (megatron-core OptimizerConfig
    ``log_num_zeros_in_grad``: ``optimizer.step()`` counts them over all ranks)."""
    log_validation_ppl_to_tensorboard: bool = True
    """Write the validation perplexity to TensorBoard as ``valid/ppl`` (the console and
    metrics.jsonl always have it); on by default here."""
    wandb_project: Optional[str] = None
    """Weights & Biases project: log the TensorBoard scalars to W&B too (``pip install
    --no-build-isolation -e ".[wandb]"``; ``WANDB_MODE=offline`` writes the run locally); None:
    no W&B."""
    wandb_exp_name: Optional[str] = None
    """W&B run name (default: the run_dir's last component)."""
    wandb_save_dir: Optional[str] = None
    """Where W&B writes its run files (default: <run_dir>/wandb)."""
    profile: bool = False
    """Profile iterations profile_step_start to profile_step_end (needs
    --use-pytorch-profiler on CPU; without it Megatron-LM brackets the window with
    cudaProfilerStart/Stop for an external nsys)."""
    profile_step_start: int = 10
    """First profiled iteration (counted from 0, as Megatron-LM)."""
    profile_step_end: int = 12
    """Iteration at which profiling stops (exclusive)."""
    profile_ranks: list = field(default_factory=lambda: [0])
    """Global ranks that profile."""
    use_pytorch_profiler: bool = False
    """Profile with torch.profiler and write a trace per profiling rank into tensorboard_dir
    (TensorBoard's profile plugin and Perfetto open it)."""
    log_timers_to_tensorboard: bool = False
    """Accepted for Megatron-LM launch scripts and does nothing: megatron-gamma keeps no
    per-phase timers; each log interval's ms/iter and throughput go to the console and
    TensorBoard (``throughput/*``, unless --no-log-throughput) (a one-line
    notice says so)."""
    timing_log_level: int = 0
    """Accepted for Megatron-LM launch scripts (0, 1 or 2, as there) and does nothing, as
    log_timers_to_tensorboard."""

    def __post_init__(self) -> None:
        if self.log_interval < 1:
            fail("log_interval", self.log_interval, "must be >= 1", "use e.g. 10")
        if self.timing_log_level not in (0, 1, 2):
            fail("timing_log_level", self.timing_log_level, "must be 0, 1 or 2", "drop the flag")
        _check_logging(self)
        if self.log_diagnostics_interval < 0:
            fail(
                "log_diagnostics_interval",
                self.log_diagnostics_interval,
                "must be >= 0",
                "use e.g. 100, or 0 to disable the diagnostics",
            )

    def tensorboard_path(self) -> str:
        """TensorBoard event directory: ``tensorboard_dir``, else ``<run_dir>/tensorboard``."""
        return self.tensorboard_dir or os.path.join(self.run_dir, "tensorboard")


def _check_logging(lg: LoggingConfig) -> None:
    """The TensorBoard interval and profiling fields (validation step; what needs the machine,
    W&B installed or CUDA for --profile alone, is checked in
    :func:`megatron_gamma.training.telemetry.check_telemetry`)."""
    if lg.tensorboard_log_interval < 1:
        fail("tensorboard_log_interval", lg.tensorboard_log_interval, "must be >= 1", "use 1")
    ranks = lg.profile_ranks
    ranks = ranks.replace(",", " ").split() if isinstance(ranks, str) else ranks
    try:
        resolve(lg, "profile_ranks", [int(r) for r in ranks])
    except (TypeError, ValueError):
        fail("profile_ranks", ranks, "expected global rank numbers", "e.g. --profile-ranks 0 1")
    if not 0 <= lg.profile_step_start < lg.profile_step_end:
        fail(
            "profile_step_end",
            lg.profile_step_end,
            f"the window [profile_step_start={lg.profile_step_start}, profile_step_end) is empty",
            "choose 0 <= --profile-step-start < --profile-step-end",
        )


@dataclass(frozen=True)
class ClusterConfig:
    """The SLURM shape a recipe is written for (``estimate`` derives the data-parallel size from
    it; ``submit`` takes its own --nodes/--gpus-per-node)."""

    slurm_nodes: Optional[int] = None
    """Nodes of the suggested allocation."""
    slurm_gpus_per_node: int = 8
    """GPUs per node (8 x 80 GB in the recipes)."""
    gpu_memory_gb: float = 80.0
    """Memory per GPU (GiB) that ``estimate`` checks the layout against."""
    env: dict = field(default_factory=dict)
    """Environment variables ``submit`` exports in the job (``KEY: VALUE`` in YAML; the flag
    ``--env KEY=VALUE`` may be repeated and overrides these), after its defaults
    ``PYTHONFAULTHANDLER=1`` and ``NCCL_DEBUG=WARN``."""

    def __post_init__(self) -> None:
        resolve(self, "env", parse_env(self.env))
        if self.slurm_nodes is not None and self.slurm_nodes < 1:
            fail("slurm_nodes", self.slurm_nodes, "must be >= 1", "set it to 1 or more")
        if self.slurm_gpus_per_node < 1:
            fail("slurm_gpus_per_node", self.slurm_gpus_per_node, "must be >= 1", "use e.g. 8")

    def world_size(self) -> Optional[int]:
        """slurm_nodes x slurm_gpus_per_node, or None without slurm_nodes."""
        if self.slurm_nodes is None:
            return None
        return self.slurm_nodes * self.slurm_gpus_per_node
