"""megatron-gamma: megatron-core pretraining with the small-initialization recipe of "Small
Initialization Matters for Large Language Models" (gamma-init, RMSNorm eps = 1e-12, gated
attention)."""

__version__ = "0.1.0"
