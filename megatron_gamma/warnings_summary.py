"""Library warnings on the console: megatron-core's import-time warnings about missing
accelerators folded into one line (the ``warnings`` row of :mod:`megatron_gamma.compat`'s
table), its advice to set ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (raised by every tensor- or
sequence-parallel process) folded into one line with the fix on a GPU run and not shown on a CPU
run, and warnings about the libraries' own code that say nothing about the run silenced.
Imports no torch."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import warnings

_ACCELERATOR_WARNING = re.compile(r"(Transformer Engine|Apex) (and Apex )?(is|are) not installed")
# megatron-core's tensor-parallel linear layers, on their first forward pass in each process
# (``tensor_parallel/layers.py``): the variable orders CUDA kernels on one hardware queue, so
# that its communication overlaps compute; a CPU run has no CUDA queue for it to order.
_CUDA_CONNECTIONS_WARNING = re.compile(
    r"recommended to set the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"
)


# Warnings about a library's own definitions or defaults, not about the user's settings:
# pydantic on a model field of a dependency; megatron-core 0.16's TransformerConfig on its own
# default cuda_graph_scope (raised whether or not CUDA graphs are used); torch on the APIs
# megatron-core 0.16's checkpoint loading calls (``load_state_dict``, ``ShardedTensor``), raised
# by every checkpoint read (``pretrain --load``, ``evaluate``, ``analyze``, ``compare``,
# ``export-hf``); and torch (2.13) on the collectives megatron-core's gradient buffers call
# (``all_gather_into_tensor``, ``reduce_scatter_tensor``), raised once per rank by the
# distributed optimizer, expert and sequence parallelism.
_LIBRARY_NOISE = (
    r"The '\w+' attribute with value .* was provided to the `Field\(\)` function",
    r"full scope is deprecated\. Use empty cuda_graph_scope",
    r"`load_state_dict` is deprecated and will be removed in future versions",
    r"Please use DTensor instead and we are deprecating ShardedTensor",
    r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
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


def _folded(message: str) -> str | None:
    """The console line of a warning this module folds, or None where it says nothing about the
    run (the CUDA_DEVICE_MAX_CONNECTIONS advice on a CPU run)."""
    if _ACCELERATOR_WARNING.search(message):
        missing = [
            name
            for name, module in (("Transformer Engine", "transformer_engine"), ("apex", "apex"))
            if importlib.util.find_spec(module) is None
        ]
        return (
            f"megatron-core: {' and '.join(missing) or 'an accelerator'} not installed: "
            "using its torch fallbacks (norms, optimizers, multi-tensor ops)"
        )
    torch = sys.modules.get("torch")  # imported by megatron-core, which warned
    if torch is not None and not torch.cuda.is_available():
        return None
    return (
        f"megatron-core: CUDA_DEVICE_MAX_CONNECTIONS is "
        f"{os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}, not the 1 it recommends for "
        "tensor- and sequence-parallel communication (maximum speedup). Fix: export "
        "CUDA_DEVICE_MAX_CONNECTIONS=1 before the launch (megatron-gamma submit does so under "
        "tensor or sequence parallelism)"
    )


def summarize_accelerator_warnings() -> None:
    """Fold megatron-core's warnings about the accelerator into one line each on stderr, on
    rank 0 only (``RANK`` or ``SLURM_PROCID``): its "Transformer Engine / Apex ... not
    installed" warnings, and its advice to set ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (with the fix;
    not shown on a CPU run, which has no CUDA queue). Every other warning goes to the previous
    ``warnings.showwarning``. Idempotent per hook installed."""
    previous = warnings.showwarning
    shown: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        kinds = (_ACCELERATOR_WARNING, _CUDA_CONNECTIONS_WARNING)
        kind = next((k.pattern for k in kinds if k.search(str(message))), None)
        if kind is None:
            previous(message, category, filename, lineno, file, line)
            return
        rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        folded = _folded(str(message))
        if kind not in shown and rank == "0" and folded:
            print(folded, file=sys.stderr, flush=True)
        shown.add(kind)

    warnings.showwarning = show
