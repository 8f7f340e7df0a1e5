"""The documented string choices of the config (:class:`Choice` enums, one docstring per member),
the values of Megatron-LM's that are known but refused, and the validation step that checks a
section's choice fields."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from enum import Enum
from typing import Any

from megatron_gamma.config.errors import fail, resolve


class Choice(str, Enum):
    """A documented string choice: each member is its string value (it compares, hashes,
    formats and serializes as that string) and carries its own docstring, ``member.doc``."""

    def __new__(cls, value: str, doc: str = ""):
        member = str.__new__(cls, value)
        member._value_ = value
        member.doc = doc
        return member

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def help(cls) -> str:
        """``'a': doc; 'b': doc`` for every member."""
        return "; ".join(f"'{m.value}': {m.doc}" for m in cls)


class GatedAttention(Choice):
    """Granularity of the sigmoid output gate on attention heads (paper: gated attention)."""

    NONE = "none", "megatron-core's plain attention"
    ELEMENTWISE = "elementwise", "one gate per head channel (default; Qiu et al. 2025's best)"
    HEADWISE = "headwise", "one scalar gate per head"


class LayerSpec(Choice):
    """Which megatron-core layer spec builds the transformer layers."""

    GAMMA = (
        "gamma",
        "megatron-core's local spec with our RMSNorm kernel, SDPA and gates (with "
        "--transformer-impl transformer_engine: its TE spec with our gates)",
    )
    LOCAL = (
        "local",
        "megatron-core's get_gpt_layer_local_spec as shipped (torch RMSNorm, "
        "DotProductAttention, no gate; with --transformer-impl transformer_engine its TE spec as "
        "shipped): the baseline for speed comparisons",
    )


class PositionEmbedding(Choice):
    """Position encoding (megatron-core ``position_embedding_type``)."""

    ROPE = "rope", "rotary position embedding"
    LEARNED_ABSOLUTE = "learned_absolute", "a learned embedding per position"


class TransformerImpl(Choice):
    """Backend of the transformer layers (Megatron-LM ``--transformer-impl``)."""

    LOCAL = "local", "megatron-core's local modules (no Transformer Engine; our default)"
    TRANSFORMER_ENGINE = (
        "transformer_engine",
        "megatron-core's Transformer Engine layer spec (fused LayerNorm-Linear, TE attention); "
        "needs the transformer_engine package",
    )


class AttentionBackend(Choice):
    """Core-attention kernel choice (megatron-core ``AttnBackend``, ``--attention-backend``)."""

    AUTO = "auto", "let the backend choose (TE: its own heuristics; local: torch SDPA)"
    FLASH = "flash", "TE's flash-attention kernel (needs --transformer-impl transformer_engine)"
    FUSED = "fused", "TE's cuDNN fused attention (needs --transformer-impl transformer_engine)"
    UNFUSED = "unfused", "TE's unfused attention; on the local backend torch SDPA"
    LOCAL = "local", "megatron-core's local attention; on the local backend torch SDPA"


class Fp8Format(Choice):
    """FP8 number format of Transformer Engine GEMMs (Megatron-LM ``--fp8-format``)."""

    E4M3 = "e4m3", "E4M3 in forward and backward"
    HYBRID = "hybrid", "E4M3 in forward, E5M2 for gradients"


class Fp8Recipe(Choice):
    """FP8 scaling recipe (Megatron-LM ``--fp8-recipe``)."""

    TENSORWISE = "tensorwise", "per-tensor current scaling"
    DELAYED = "delayed", "per-tensor delayed scaling from an amax history (Megatron's default)"
    MXFP8 = "mxfp8", "MX block scaling (Blackwell GPUs)"
    BLOCKWISE = "blockwise", "sub-channel block scaling"


class TokenDispatcher(Choice):
    """MoE token dispatch across expert-parallel ranks (``moe_token_dispatcher_type``)."""

    ALLGATHER = "allgather", "all-gather the tokens, each rank keeps its experts' tokens"
    ALLTOALL = "alltoall", "all-to-all exchange of routed tokens"


class MoeLoadBalancing(Choice):
    """MoE router load balancing (megatron-core ``moe_router_load_balancing_type``)."""

    AUX_LOSS = "aux_loss", "GShard/Switch auxiliary loss over each micro-batch"
    SEQ_AUX_LOSS = "seq_aux_loss", "the auxiliary loss per sequence (DeepSeek-V2)"
    GLOBAL_AUX_LOSS = "global_aux_loss", "the auxiliary loss over the global batch"
    SINKHORN = "sinkhorn", "Sinkhorn routing (S-BASE), no auxiliary loss"
    NONE = "none", "no load balancing"


class MoeScoreFunction(Choice):
    """Router score function (megatron-core ``moe_router_score_function``)."""

    SOFTMAX = "softmax", "softmax over the experts' logits"
    SIGMOID = "sigmoid", "independent sigmoid per expert (DeepSeek-V3)"


class MoeRouterDtype(Choice):
    """Precision of the router's softmax/sigmoid and auxiliary losses
    (megatron-core ``moe_router_dtype``)."""

    FP32 = "fp32", "float32"
    FP64 = "fp64", "float64"


class DistributedBackend(Choice):
    """Megatron-LM's ``--distributed-backend``; megatron-gamma picks the backend by device."""

    NCCL = "nccl", "NCCL (what megatron-gamma runs GPU collectives on)"
    GLOO = "gloo", "gloo (what megatron-gamma runs CPU collectives on)"


class InitMethod(Choice):
    """Weight initialization rule."""

    GAMMA = "gamma", "the paper's sigma = fan_in^-gamma on each matrix's true fan-in"
    NORMAL = "normal", "megatron-core's N(0, init_method_std), output layers depth-scaled"


class EmbeddingFanIn(Choice):
    """Fan-in policy of the input embedding under the gamma rule."""

    HIDDEN = "hidden", "sigma = hidden^-gamma (the paper's residual-flow convention)"
    VOCAB = "vocab", "sigma = vocab^-gamma (the literal one-hot fan-in)"


class InitAudit(Choice):
    """Scope of the start-up init audit (megatron_gamma.training.init_audit)."""

    FULL = "full", "measure every parameter; print one line per role, write every parameter"
    SUMMARY = "summary", "measure all but the middle decoder layers (every role still shows)"
    OFF = "off", "no audit (no init_audit.json; a fresh start moves an earlier run's aside)"


class Optimizer(Choice):
    """megatron-core optimizer."""

    ADAM = "adam", "AdamW (decoupled weight decay)"
    SGD = "sgd", "SGD with momentum"


class LrDecayStyle(Choice):
    """Learning-rate decay after warmup (megatron-core OptimizerParamScheduler)."""

    COSINE = "cosine", "half cosine from lr to min_lr"
    LINEAR = "linear", "straight line from lr to min_lr"
    CONSTANT = "constant", "stay at lr"
    INVERSE_SQUARE_ROOT = (
        "inverse-square-root",
        "lr * sqrt(warmup steps / steps) after warmup, floored at min_lr",
    )
    WSD = (
        "WSD",
        "warmup-stable-decay: lr until the last lr_wsd_decay_iters (or _samples) of the decay, "
        "then lr_wsd_decay_style down to min_lr",
    )


class WsdDecayStyle(Choice):
    """The annealing phase of the WSD schedule (megatron-core ``lr_wsd_decay_style``)."""

    EXPONENTIAL = "exponential", "coefficient 2 * 0.5^ratio - 1"
    LINEAR = "linear", "coefficient 1 - ratio"
    COSINE = "cosine", "coefficient (cos(pi * ratio) + 1) / 2"
    MINUS_SQRT = "minus_sqrt", "coefficient 1 - sqrt(ratio)"


class WeightDecayIncrStyle(Choice):
    """Weight decay from start_weight_decay to end_weight_decay over training (megatron-core
    ``wd_incr_style``)."""

    CONSTANT = "constant", "weight_decay throughout"
    LINEAR = "linear", "straight line from start_weight_decay to end_weight_decay"
    COSINE = "cosine", "half cosine from start_weight_decay up to end_weight_decay"


class DistCkptStrictness(Choice):
    """What a checkpoint load does when the keys do not match (Megatron-LM
    ``--dist-ckpt-strictness``, megatron-core ``dist_checkpointing.StrictHandling``). In
    megatron-core's words, "unexpected" keys are those this run's model and optimizer ask for and
    the checkpoint lacks; "missing" keys are those the checkpoint holds and this run does not ask
    for (a checkpoint with gates loaded into a model without them). Keys the checkpoint lacks,
    and tensors of other shapes, stop every load before the read, whatever the value, naming them
    (:func:`megatron_gamma.rundir.layout.check_loadable`): the loaded weights go into the model
    strictly, so no value could load such a checkpoint. The values differ in what they do with
    the keys only the checkpoint holds."""

    ASSUME_OK_UNEXPECTED = (
        "assume_ok_unexpected",
        "keys only the checkpoint holds are not read, and not reported (default, as Megatron-LM's)",
    )
    LOG_UNEXPECTED = (
        "log_unexpected",
        "as assume_ok_unexpected: the keys the checkpoint lacks, which megatron-core would log, "
        "have already stopped the load",
    )
    LOG_ALL = (
        "log_all",
        "log (warning) the keys only the checkpoint holds, less the optimizer and RNG states the "
        "load leaves unread on purpose (every rank exchanges its keys first), and go on",
    )
    RAISE_UNEXPECTED = (
        "raise_unexpected",
        "as assume_ok_unexpected: the keys the checkpoint lacks, on which megatron-core would "
        "stop, have already stopped the load",
    )
    RAISE_ALL = (
        "raise_all",
        "stop on the keys only the checkpoint holds, naming them, once the checkpoint is read "
        "(megatron-core's own check, before the read, would count the optimizer and RNG states "
        "a weights-only load leaves unread)",
    )
    IGNORE_ALL = "ignore_all", "as assume_ok_unexpected: drop the keys only the checkpoint holds"


# Megatron-LM --dist-ckpt-strictness values megatron-gamma does not take: value -> (why, fix).
REFUSED_DIST_CKPT_STRICTNESS: dict[str, tuple[str, str]] = {
    name: (
        "megatron-core returns the mismatched keys to the caller of dist_checkpointing.load; a "
        "training run has no caller to hand them to",
        "log_all to see the keys only the checkpoint holds, or raise_all to stop on them (keys "
        "it lacks stop every load)",
    )
    for name in ("return_unexpected", "return_all")
}


class TokenizerType(Choice):
    """Tokenizer kind (Megatron-LM ``--tokenizer-type``; megatron_gamma.data.tokenizer_types)."""

    HUGGING_FACE = (
        "HuggingFaceTokenizer",
        "a HF tokenizers tokenizer.json, or a directory holding one, from --tokenizer-model "
        "(default: the packaged demo tokenizer); EOD: the eos_token of the tokenizer_config.json "
        "beside it, else <|endoftext|>",
    )
    GPT2_BPE = "GPT2BPETokenizer", "GPT-2 byte-level BPE from --vocab-file and --merge-file"


_TO_TOKENIZER_JSON = (
    "convert it once to a Hugging Face tokenizer.json (pip install transformers sentencepiece; "
    "AutoTokenizer.from_pretrained(MODEL_DIR).save_pretrained(OUT) writes OUT/tokenizer.json "
    "and OUT/tokenizer_config.json, whose eos_token becomes the EOD), then pass --tokenizer-type "
    "HuggingFaceTokenizer --tokenizer-model OUT"
)
_GPT_TOKENIZER = (
    "use a GPT tokenizer: a tokenizer.json (megatron-gamma train-tokenizer makes one) or GPT-2's "
    "files with --tokenizer-type GPT2BPETokenizer"
)

# Megatron-LM --tokenizer-type values megatron-gamma does not build: value -> (why, fix).
REFUSED_TOKENIZER_TYPES: dict[str, tuple[str, str]] = {
    **{
        name: (
            "a SentencePiece .model; megatron-gamma tokenizes (preprocessing workers, gigatoken, "
            "training, export) from a tokenizer.json",
            _TO_TOKENIZER_JSON,
        )
        for name in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")
    },
    "TikTokenizer": (
        "a tiktoken vocabulary; megatron-gamma tokenizes from a tokenizer.json",
        _TO_TOKENIZER_JSON,
    ),
    **{
        name: ("BERT's WordPiece vocabulary; megatron-gamma trains GPT models", _GPT_TOKENIZER)
        for name in ("BertWordPieceLowerCase", "BertWordPieceCase")
    },
    **{
        name: (
            "multimodal and SFT tokenizers; megatron-gamma pretrains text GPT models",
            _GPT_TOKENIZER,
        )
        for name in ("MultimodalTokenizer", "NullMultimodalTokenizer", "SFTTokenizer")
    },
    "NullTokenizer": (
        "ids without a tokenizer; megatron-gamma needs one for EOD, the vocabulary size and "
        "export, also with --mock-data",
        "drop --tokenizer-type: the packaged demo tokenizer serves --mock-data",
    ),
}

# Values of a Choice that are known (Megatron-LM's) but refused, with why and the fix.
REFUSED_CHOICES: dict[type, dict[str, tuple[str, str]]] = {
    TokenizerType: REFUSED_TOKENIZER_TYPES,
    DistCkptStrictness: REFUSED_DIST_CKPT_STRICTNESS,
}


class RecomputeGranularity(Choice):
    """Activation recomputation (megatron-core ``recompute_granularity``)."""

    FULL = "full", "recompute whole transformer layers"
    SELECTIVE = "selective", "recompute the submodules named by recompute_modules"


class RecomputeMethod(Choice):
    """How full recomputation picks layers (megatron-core ``recompute_method``)."""

    UNIFORM = "uniform", "every recompute_num_layers layers form one recomputed unit"
    BLOCK = "block", "the first recompute_num_layers layers of each stage are recomputed"


def check_choices(section: Any) -> None:
    """Check every :class:`Choice` field and store its member's plain string value (validation
    step): the enum documents and validates, while checkpoints (megatron-core pickles e.g. the
    scheduler's ``lr_decay_style``), YAML and megatron-core only ever see ``str``.

    Raises:
        ConfigError: a value that is no member, naming the members and what each does (and,
            for a value of :data:`REFUSED_CHOICES`, why it is refused and the fix).
    """
    hints = type_hints(type(section))
    for f in dataclasses.fields(section):
        kind = base_type(hints[f.name])
        value = getattr(section, f.name)
        if not (isinstance(kind, type) and issubclass(kind, Choice)) or value is None:
            continue
        try:
            resolve(section, f.name, kind(value).value)
        except ValueError:
            refused = REFUSED_CHOICES.get(kind, {}).get(value)
            if refused is None:
                fail(f.name, value, "unknown", f"use one of {kind.help()}", (f.name,))
            why, fix = refused
            fail(f.name, value, why, f"{fix} (built: {', '.join(m.value for m in kind)})")


@functools.cache
def type_hints(cls: type) -> types.MappingProxyType:
    """``typing.get_type_hints(cls)``, read-only, computed once per class: the config classes do
    not change, and resolving their string annotations for every section took ~6 ms, which a
    ``pretrain`` process asked for once per parsed flag (0.95 CPU-s, before this cache)."""
    return types.MappingProxyType(typing.get_type_hints(cls))


def base_type(tp: Any) -> Any:
    """Unwrap Optional[X] to X."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp
