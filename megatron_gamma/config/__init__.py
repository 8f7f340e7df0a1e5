"""One validated configuration tree for every knob of megatron-gamma.

A run is described by a YAML file with one mapping per section (``model``, ``init``,
``parallel``, ``data``, ``optimizer``, ``training``, ``checkpoint``, ``logging``) and overridden
by Megatron-LM-named command-line flags: each field ``foo_bar`` of any section is the flag
``--foo-bar`` (booleans also accept ``--no-foo-bar``). Field names are unique across sections so a
flag never needs its section.

Every check raises :class:`ConfigError` naming the key, the bad value and the fix, before any
process group, model or dataset is built. Validated configs are frozen: a changed config is
rebuilt through the same checks with :meth:`Config.replace` (the one way), never edited in
place. Checks that need the world size (batch and parallel divisibility) live in
:func:`validate_layout`, called by :mod:`megatron_gamma.parallel`.

One module per concern, bottom-up (each imports only those above it):

- :mod:`~megatron_gamma.config.errors`: :class:`ConfigError` and the validation steps
  ``fail`` / ``resolve``;
- :mod:`~megatron_gamma.config.choices`: the :class:`Choice` enums and the refused values;
- :mod:`~megatron_gamma.config.megatron_lm`: Megatron-LM translation (alias flags, model-flag
  checks, ``--moe-layer-freq``, the refused-flag table);
- :mod:`~megatron_gamma.config.schedule`: schedule arithmetic (iterations from samples, the
  samples consumed, one unit per schedule length);
- :mod:`~megatron_gamma.config.sections`: the section dataclasses and their checks;
- :mod:`~megatron_gamma.config.loading`: :class:`Config`, ``config_from_dict``, ``load_config``,
  ``Config.replace``, ``save_config``;
- :mod:`~megatron_gamma.config.flags`: argparse flags generated from the fields;
- :mod:`~megatron_gamma.config.layout`: ``validate_layout`` and ``virtual_stages``;
- :mod:`~megatron_gamma.config.effects`: given settings that have no effect under the others.

This package re-exports the public names that ``megatron_gamma.config`` has always offered;
the refused-flag table and the no-effect rules are imported from their modules.
"""

from megatron_gamma.config.choices import (
    REFUSED_CHOICES,
    REFUSED_TOKENIZER_TYPES,
    AttentionBackend,
    Choice,
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
)
from megatron_gamma.config.errors import ConfigError
from megatron_gamma.config.flags import add_config_flags, field_docs, overrides_from_args
from megatron_gamma.config.layout import check_moe_training, validate_layout, virtual_stages
from megatron_gamma.config.loading import (
    REDACTED,
    Config,
    changed_fields,
    check_load_origin,
    check_run_dir_outputs,
    config_from_dict,
    load_config,
    merge,
    own_output_path,
    redacted_dict,
    save_config,
)
from megatron_gamma.config.megatron_lm import moe_layer_pattern
from megatron_gamma.config.schedule import UNIT_ALTERNATIVES, rampup_train_iters, trained_samples
from megatron_gamma.config.sections import (
    RECOMPUTE_MODULES,
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    InitConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    RecordedPaths,
    TrainingConfig,
    parse_env,
)

__all__ = [
    "RECOMPUTE_MODULES",
    "REDACTED",
    "REFUSED_CHOICES",
    "REFUSED_TOKENIZER_TYPES",
    "UNIT_ALTERNATIVES",
    "AttentionBackend",
    "CheckpointConfig",
    "Choice",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EmbeddingFanIn",
    "Fp8Format",
    "Fp8Recipe",
    "GatedAttention",
    "InitAudit",
    "InitConfig",
    "InitMethod",
    "LayerSpec",
    "LoggingConfig",
    "LrDecayStyle",
    "ModelConfig",
    "MoeLoadBalancing",
    "MoeRouterDtype",
    "MoeScoreFunction",
    "Optimizer",
    "OptimizerConfig",
    "ParallelConfig",
    "PositionEmbedding",
    "RecomputeGranularity",
    "RecomputeMethod",
    "RecordedPaths",
    "TokenDispatcher",
    "TokenizerType",
    "TrainingConfig",
    "TransformerImpl",
    "WeightDecayIncrStyle",
    "WsdDecayStyle",
    "add_config_flags",
    "changed_fields",
    "check_load_origin",
    "check_run_dir_outputs",
    "check_moe_training",
    "config_from_dict",
    "field_docs",
    "load_config",
    "merge",
    "moe_layer_pattern",
    "overrides_from_args",
    "own_output_path",
    "parse_env",
    "rampup_train_iters",
    "redacted_dict",
    "save_config",
    "trained_samples",
    "validate_layout",
    "virtual_stages",
]
