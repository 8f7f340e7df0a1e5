"""Library warnings on the console: megatron-core's import-time warnings about missing
accelerators folded into one line (the ``warnings`` row of :mod:`megatron_gamma.compat`'s
table), and warnings about the libraries' own code that say nothing about the run silenced.
Imports no torch."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import warnings

_ACCELERATOR_WARNING = re.compile(r"(Transformer Engine|Apex) (and Apex )?(is|are) not installed")


# Warnings about a library's own definitions or defaults, not about the user's settings:
# pydantic on a model field of a dependency; megatron-core 0.16's TransformerConfig on its own
# default cuda_graph_scope (raised whether or not CUDA graphs are used); and torch on the APIs
# megatron-core 0.16's checkpoint loading calls (``load_state_dict``, ``ShardedTensor``), raised
# by every checkpoint read (``pretrain --load``, ``evaluate``, ``analyze``, ``compare``,
# ``export-hf``).
_LIBRARY_NOISE = (
    r"The '\w+' attribute with value .* was provided to the `Field\(\)` function",
    r"full scope is deprecated\. Use empty cuda_graph_scope",
    r"`load_state_dict` is deprecated and will be removed in future versions",
    r"Please use DTensor instead and we are deprecating ShardedTensor",
)


@contextlib.contextmanager
def accelerator_warnings_ignored():
    """For the block (megatron-core imported by a data command, which builds no model and no
    optimizer), megatron-core's warnings about missing accelerators are not shown: its torch
    fallbacks for norms and optimizers say nothing about writing or reading a dataset."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*" + _ACCELERATOR_WARNING.pattern)
        yield


def silence_library_noise() -> None:
    """Ignore the warnings of :data:`_LIBRARY_NOISE` (``warnings.filterwarnings``)."""
    for pattern in _LIBRARY_NOISE:
        warnings.filterwarnings("ignore", message=pattern)


def summarize_accelerator_warnings() -> None:
    """Show megatron-core's "Transformer Engine / Apex ... not installed" warnings as one line
    on stderr, on rank 0 only (``RANK`` or ``SLURM_PROCID``), and pass every other warning to
    the previous ``warnings.showwarning``. Idempotent per hook installed."""
    previous = warnings.showwarning
    shown = False

    def show(message, category, filename, lineno, file=None, line=None):
        nonlocal shown
        if not _ACCELERATOR_WARNING.search(str(message)):
            previous(message, category, filename, lineno, file, line)
            return
        rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        if not shown and rank == "0":
            missing = [
                name
                for name, module in (("Transformer Engine", "transformer_engine"), ("apex", "apex"))
                if importlib.util.find_spec(module) is None
            ]
            print(
                f"megatron-core: {' and '.join(missing) or 'an accelerator'} not installed: "
                "using its torch fallbacks (norms, optimizers, multi-tensor ops)",
                file=sys.stderr,
                flush=True,
            )
        shown = True

    warnings.showwarning = show
