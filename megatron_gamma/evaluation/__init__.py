"""Evaluation of trained checkpoints: held-out loss (``evaluate``) and lm-evaluation-harness
benchmarks with paired-bootstrap comparisons (``evaluate --tasks``).

Importing this package, or computing the held-out loss, does not import ``transformers`` (no
``[eval]`` extra needed); the benchmarks export through :mod:`megatron_gamma.hf`, which does.
"""
