"""Every process-wide patch of megatron-core, in one place: the CPU compatibility layer for its
hard-coded CUDA calls, one load fix for its distributed optimizer, the checkpoint writer's
results queue kept in the saving process, the dataset index-cache load and the checkpoint reader
that run no code from a file.

megatron-core 0.16 assumes a GPU on its training path (about 229 lines touch ``torch.cuda``), so
on a CPU-only machine :func:`apply_cpu_compat` installs six process-wide shims, once, before any
model is built. :mod:`megatron_gamma.parallel` calls it only when no GPU is present; with a GPU
nothing here runs. Measured sufficient for megatron-core 0.16.1 with gloo on 1-4 processes
(TP, PP with virtual stages, EP, DP, distributed optimizer, dist_checkpointing).

=========  ================================================  ===================================
shim       what                                              why
=========  ================================================  ===================================
device     ``torch.cuda.current_device()`` -> ``cpu``        ~175 allocations use it as
                                                             ``device=``
rng        ``torch.cuda`` RNG get/set/seed and megatron's    the tensor-parallel RNG tracker
           ``_get/_set_cuda_rng_state`` -> CPU generator     (dropout, recompute) forks CUDA RNG
devicemap  a ``TorchFunctionMode`` turning ``device="cuda"`` ~54 hard-coded "cuda" strings;
           into cpu, ``Tensor.cuda()`` into a no-op, and     ``.type()`` asserts in grad
           ``Tensor.type()`` reporting ``torch.cuda.*``;     clipping and the distributed
           torch's warning on reading ``.grad`` of a non-    optimizer; the distributed
           leaf tensor, which the mode's call site would     optimizer's ``zero_grad`` reads
           take as its own, is ignored where it is           ``.grad`` of its shard views
           attributed to this module                         (megatron-core's
                                                             ``_zero_grad_group_helper``), a
                                                             harmless read that torch then
                                                             attributed to this file
stream     no-op ``torch.cuda.Stream/Event/stream/           MoE alltoall dispatcher and the
           current_stream/synchronize``                      async checkpoint writer
moe        ``moe_utils.te_general_gemm = None``; CPU split   a NameError without Transformer
           sizes as numpy for all-to-all                     Engine; gloo needs list split sizes
l2norm     grad-norm fallback                                ``torch.norm`` of a large fp32 CPU
           (``local_multi_tensor_l2_norm``) accumulates      tensor is off by up to 6e-5
           each tensor's squares in fp64                     relative (measured), so the logged
                                                             grad norm and clipping changed with
                                                             the layout
=========  ================================================  ===================================

One more patch applies on every machine, installed by
:func:`~megatron_gamma.training.checkpointing.load_checkpoint` before a load
(:func:`patch_distributed_optimizer_load`):

=========  ================================================  ===================================
patch      what                                              why
=========  ================================================  ===================================
distopt    ``DistributedOptimizer._set_main_param_and_       without apex / Transformer Engine a
           optimizer_states`` skips the per-parameter Adam   ``fully_reshardable`` load fails
           ``step`` and gives each parameter its own copy    with KeyError 'step', and a shared
                                                             step tensor is incremented once per
                                                             parameter (wrong bias correction)
=========  ================================================  ===================================

One before every dataset build, installed by
:func:`~megatron_gamma.data.datasets.build_datasets` (:func:`patch_index_cache_load`):

=========  ================================================  ===================================
patch      what                                              why
=========  ================================================  ===================================
npycache   megatron-core's GPTDataset and BlendedDataset     they load their ``.npy`` index
           read their index caches with ``numpy.load``       caches with ``allow_pickle=True``,
           with ``allow_pickle=False`` (a pickled file is    where numpy unpickles a file that
           refused with the fix: rebuild the cache)          is a pickle: a crafted cache in a
                                                             run directory ran code on read
=========  ================================================  ===================================

And one before every checkpoint save, installed by
:func:`~megatron_gamma.training.checkpointing.save_checkpoint` and ``import-hf``
(:func:`patch_save_results_queue`):

=========  ================================================  ===================================
patch      what                                              why
=========  ================================================  ===================================
savequeue  megatron-core 0.16's torch_dist writer passes     its queue is a ``multiprocessing``
           each save's write results back through a          Manager queue of the ``spawn``
           ``queue.Queue`` of this process instead of the    context: a server process that
           Manager queue it makes on first use (saves here   imports torch and torch DCP to
           are synchronous, ``--async-save`` is refused, so  unpickle the results, ~5-6 CPU-s
           megatron-core puts and takes them in the saving   and as many seconds of waiting in
           process); left alone on other versions            every process that saves (2 cores)
=========  ================================================  ===================================

And one before every checkpoint read, installed by :mod:`megatron_gamma.checkpoint_trust`'s read
functions (:func:`patch_checkpoint_reader`):

=========  ================================================  ===================================
patch      what                                              why
=========  ================================================  ===================================
reader     megatron-core's torch_dist strategy reads with    torch's reader unpickles
           :class:`~megatron_gamma.checkpoint_trust.         ``.metadata`` with a plain
           TrustedFileSystemReader` (restricted unpickler    ``pickle.load`` and the objects in
           for ``.metadata``, weights-only check of the      ``*.distcp`` with
           pickled objects); its common strategy's           ``weights_only=False``: a crafted
           ``torch.load`` reads weights only                 checkpoint ran code on load; the
                                                             common strategy's ``torch.load``
                                                             followed
                                                             ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``
=========  ================================================  ===================================

The command line also folds megatron-core's import-time warnings about missing accelerators
into one line (:func:`megatron_gamma.warnings_summary.summarize_accelerator_warnings`, a
torch-free module so that the CLI starts without importing torch):

=========  ================================================  ===================================
patch      what                                              why
=========  ================================================  ===================================
warnings   ``warnings.showwarning`` prints the first         megatron-core warns once per module
           "Transformer Engine / Apex ... not installed"     (six or more lines per process, on
           warning as one line on rank 0 and drops the       every rank) that it falls back to
           rest; other warnings pass through                 its torch implementations
=========  ================================================  ===================================

The same hook folds megatron-core's advice to set ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (raised by the
first tensor- or sequence-parallel forward pass of every process) into one line on rank 0, with
the fix, on a GPU run, and drops it on a CPU run, where the variable orders no CUDA queue.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import types
import warnings

import numpy
import torch
from torch.overrides import TorchFunctionMode

from megatron_gamma.config import ConfigError

_APPLIED = False


class _NoOpEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def wait(self, *args, **kwargs):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


class _NoOpStream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or _NoOpEvent()

    def synchronize(self):
        pass

    def query(self):
        return True


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


class CudaToCpuMode(TorchFunctionMode):
    """The ``devicemap`` shim: redirect hard-coded CUDA placements to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu") + tuple(args[2:])
        return func(*args, **kwargs)


def _shim_device() -> None:
    torch.cuda.current_device = lambda: torch.device("cpu")


def _shim_rng() -> None:
    import megatron.core.tensor_parallel.random as mrandom

    gen = torch.default_generator

    def get_rng_state(device="cuda", clone=False, graph_safe=False):
        return gen.get_state()

    def set_rng_state(state, device=-1, graph_safe=False):
        gen.set_state(state)

    def manual_seed(seed):
        gen.manual_seed(int(seed))

    torch.cuda.get_rng_state = get_rng_state
    torch.cuda.set_rng_state = set_rng_state
    torch.cuda.random.get_rng_state = get_rng_state
    torch.cuda.manual_seed = manual_seed
    torch.cuda.manual_seed_all = manual_seed
    mrandom._get_cuda_rng_state = get_rng_state
    mrandom._set_cuda_rng_state = set_rng_state


def _shim_stream() -> None:
    default = _NoOpStream()
    torch.cuda.Stream = _NoOpStream
    torch.cuda.Event = _NoOpEvent
    torch.cuda.current_stream = lambda device=None: default
    torch.cuda.default_stream = lambda device=None: default
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.cuda.synchronize = lambda device=None: None


def _shim_moe() -> None:
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as token_dispatcher

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    upstream = moe_utils.maybe_move_tensor_to_cpu

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if torch.is_tensor(tensor) and not tensor.is_cuda and as_numpy:
            return tensor.numpy()
        return upstream(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu


def _shim_l2norm() -> None:
    import megatron.core.optimizer.clip_grads as clip_grads

    def l2_norm_fp64(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
        total = sum(t.double().square().sum() for tensors in tensor_lists for t in tensors)
        return torch.sqrt(torch.as_tensor(total, dtype=torch.float64)).float().reshape(1), None

    if clip_grads.l2_norm_impl.__name__ == "local_multi_tensor_l2_norm":
        clip_grads.l2_norm_impl = l2_norm_fp64


def apply_cpu_compat() -> None:
    """Install the six shims (idempotent).

    Raises:
        RuntimeError: called on a machine with a GPU, where the shims would hide real CUDA.
    """
    global _APPLIED
    if _APPLIED:
        return
    if torch.cuda.is_available():
        raise RuntimeError("apply_cpu_compat() must not run when a GPU is present")
    _shim_device()
    _shim_rng()
    _shim_stream()
    _shim_moe()
    _shim_l2norm()
    CudaToCpuMode().__enter__()
    warnings.filterwarnings(
        "ignore",
        message=r"The \.grad attribute of a Tensor that is not a leaf Tensor",
        category=UserWarning,
        module=r"megatron_gamma\.compat$",
    )
    logging.getLogger("megatron.core.tensor_parallel.random").setLevel(logging.ERROR)
    _APPLIED = True


def patch_distributed_optimizer_load() -> None:
    """The ``distopt`` patch (idempotent; CPU and GPU alike). megatron-core 0.16 without apex /
    Transformer Engine: loading a ``fully_reshardable``
    distributed-optimizer checkpoint copies every per-parameter torch Adam state key from the
    checkpoint, including ``step``, which that format stores once per group (and megatron-core
    has already restored) rather than per parameter, so the load fails with KeyError 'step'.
    Skip that key, and give each parameter its own copy of the restored ``step``: megatron-core
    assigns one tensor to every parameter, which torch's Adam then increments once per parameter
    per step (wrong bias correction from the first step after a resume)."""
    from megatron.core.optimizer import distrib_optimizer

    cls = distrib_optimizer.DistributedOptimizer
    upstream = cls._set_main_param_and_optimizer_states
    if getattr(upstream, "_megatron_gamma_fix", False):
        return

    def _set_main_param_and_optimizer_states(self, model_param, tensors):
        if "step" not in tensors and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group_index, group_order = self.model_param_group_index_map[model_param]
            main_param = self.optimizer.param_groups[group_index]["params"][group_order]
            state = self.optimizer.state[main_param]
            step = state.pop("step", None)
            try:
                return upstream(self, model_param, tensors)
            finally:
                if step is not None:
                    state["step"] = step.clone()
        return upstream(self, model_param, tensors)

    _set_main_param_and_optimizer_states._megatron_gamma_fix = True
    cls._set_main_param_and_optimizer_states = _set_main_param_and_optimizer_states


SAVE_QUEUE_VERSIONS = ("0.16.",)
"""megatron-core versions whose synchronous save puts and takes its write results in the saving
process (read in their ``dist_checkpointing/strategies``): where :func:`patch_save_results_queue`
applies."""


def patch_save_results_queue() -> None:
    """The ``savequeue`` patch (idempotent; CPU and GPU alike): megatron-core's
    ``FileSystemWriterAsync`` takes its results queue from ``filesystem_async._results_queue``,
    made on first use as ``multiprocessing.get_context("spawn").Manager().Queue()``; set it to a
    ``queue.Queue`` before that. A synchronous save (``execute_sync``, the only kind here)
    writes through forked workers that report on their own queue, then puts the collected
    results on this one and reads them back in the same process, so no other process needs it.
    Nothing changes where megatron-core's version is not one of :data:`SAVE_QUEUE_VERSIONS`, or
    where its queue exists already."""
    from megatron.core import package_info
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not package_info.__version__.startswith(SAVE_QUEUE_VERSIONS):
        return
    if getattr(filesystem_async, "_results_queue", False) is None:
        filesystem_async._results_queue = queue.Queue()


class _LoadGuard(types.ModuleType):
    """``module`` as one megatron-core module sees it: every attribute ``module``'s, except
    ``load``, which is ``load`` (a reader that runs no code from the file). Installed in place
    of that module's global name (:func:`patch_checkpoint_reader`,
    :func:`patch_index_cache_load`); the rest of the process keeps the real module."""

    def __init__(self, module: types.ModuleType, load) -> None:
        super().__init__(module.__name__)
        self._module, self.load = module, load

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def patch_checkpoint_reader() -> None:
    """The ``reader`` patch (idempotent; CPU and GPU alike): megatron-core's torch_dist load
    strategy builds its torch DCP reader with ``strategies.torch._get_filesystem_reader``;
    return :class:`~megatron_gamma.checkpoint_trust.TrustedFileSystemReader` instead (it caches
    the metadata, as megatron-core's ``cache_metadata`` reader does). And its common strategy
    (``strategies.common``: ``common.pt``, and the ``KEY.pt`` object files of checkpoints whose
    objects are not in ``*.distcp``) loads with ``weights_only=True``
    (:func:`~megatron_gamma.checkpoint_trust.weights_only_load` as its ``torch.load``:
    :class:`_LoadGuard`), so ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot reopen it."""
    from megatron.core.dist_checkpointing.strategies import common as common_strategy
    from megatron.core.dist_checkpointing.strategies import torch as torch_strategy

    from megatron_gamma.checkpoint_trust import TrustedFileSystemReader, weights_only_load

    if not isinstance(common_strategy.torch, _LoadGuard):
        common_strategy.torch = _LoadGuard(torch, weights_only_load)
    if getattr(torch_strategy._get_filesystem_reader, "_megatron_gamma_fix", False):
        return

    def _get_filesystem_reader(checkpoint_dir, cache_metadata: bool = False):
        return TrustedFileSystemReader(checkpoint_dir)

    _get_filesystem_reader._megatron_gamma_fix = True
    torch_strategy._get_filesystem_reader = _get_filesystem_reader


INDEX_CACHE_MODULES = ("gpt_dataset", "blended_dataset")
"""The modules of ``megatron.core.datasets`` whose ``numpy.load`` :func:`patch_index_cache_load`
replaces: the two that read index caches for a GPT run."""


def _index_cache_load(file, *args, **kwargs):
    """``numpy.load(file, ..., allow_pickle=False)`` whatever the caller passed: the ``load``
    of megatron-core's dataset modules (:func:`patch_index_cache_load`).

    Raises:
        ConfigError: ``file`` holds pickled data (a pickle, or an object array), naming it and
            the fix.
    """
    kwargs["allow_pickle"] = False
    try:
        return numpy.load(file, *args, **kwargs)
    except ValueError as e:
        if "allow_pickle" not in str(e):
            raise
        raise ConfigError(
            f"index cache {str(file)!r}: holds pickled Python objects, not the plain integer "
            "array megatron-core writes there; refused, as loading it could run code. Fix: "
            f"delete {os.path.dirname(str(file))!r} (the next run rebuilds its caches) or "
            "pass --data-cache-path with a directory of your own"
        ) from None


def patch_index_cache_load() -> None:
    """The ``npycache`` patch (idempotent; CPU and GPU alike): the ``numpy`` of megatron-core's
    :data:`INDEX_CACHE_MODULES` becomes a :class:`_LoadGuard` whose ``load`` is
    :func:`_index_cache_load`, so their index caches load
    with ``allow_pickle=False``. Their arrays are integers; writing is unchanged."""
    import importlib

    for name in INDEX_CACHE_MODULES:
        module = importlib.import_module(f"megatron.core.datasets.{name}")
        if not isinstance(module.numpy, _LoadGuard):
            module.numpy = _LoadGuard(numpy, _index_cache_load)
