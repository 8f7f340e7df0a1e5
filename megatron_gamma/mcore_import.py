"""Import megatron-core without the parts of its package import a process does not use.

Importing any part of megatron-core runs its package ``__init__``:

- Its inference context and timers try ``import wandb``. With wandb installed that costs about
  1.0-1.7 CPU-s and 42 MiB per process (measured on this project's CI machine; every rank of a
  run pays it). Here ``sys.modules["wandb"]`` is None during megatron-core's first import, so
  its ``try: import wandb`` takes the ``except ImportError`` branch; the entry is removed
  afterwards, so a later ``import wandb`` (this project's ``--wandb-project``
  telemetry, :mod:`megatron_gamma.training.telemetry`) works. What stays: in this process
  megatron-core's ``Timers.write`` cannot write to wandb and its dynamic inference context does
  not log to it; megatron-gamma uses neither (its W&B writer is its own).
- Its ``@jit_fuser`` decorators call ``torch.compile``, which imports TorchDynamo and Inductor
  (about 2 s of a 3-3.5 s import, ``python -X importtime``). With :func:`import_megatron_core`,
  megatron-core's own ``megatron.core.jit.disable_jit_fuser()`` runs as soon as that module
  exists (:func:`_eager_jit_fuser`), and its ``enable_jit_fuser()`` after the import, so modules
  imported later compile as usual. What stays: the functions decorated during this import (the
  bias-GeLU/GeGLU/SwiGLU fusions, the MoE router's expert bias and routing-map padding, the flex
  dispatcher's preprocessing) run eagerly in this process, with the same math. Only data
  commands, which build no model, ask for it.

:func:`import_megatron_core` does both; :func:`megatron_core_without_wandb` hides wandb from
megatron-core's first import wherever it happens in a block (``megatron-gamma``'s commands run in
one, :func:`megatron_gamma.cli.main`). Where megatron-core is already imported, nothing changes;
where wandb already is (``pretrain --wandb-project`` imports it first), it is left to
megatron-core.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterator
from types import ModuleType


@contextlib.contextmanager
def _wandb_hidden() -> Iterator[None]:
    """``import wandb`` raises ImportError in the block, unless wandb is imported already."""
    hide = "wandb" not in sys.modules
    if hide:
        sys.modules["wandb"] = None
    try:
        yield
    finally:
        if hide and sys.modules.get("wandb") is None:
            sys.modules.pop("wandb", None)


class _OnImport(importlib.abc.MetaPathFinder):
    """Finds module ``name`` at its first import and runs its body as ``run(exec_module,
    module)``, so that ``run`` can act around it; removes itself on use."""

    def __init__(self, name: str, run: Callable[[Callable[[ModuleType], None], ModuleType], None]):
        self.name, self.run = name, run

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module
            spec.loader.exec_module = lambda module: self.run(exec_module, module)
        return spec


def _without_wandb(exec_module: Callable[[ModuleType], None], module: ModuleType) -> None:
    """The ``megatron.core`` package's ``__init__`` (its whole package import) with wandb hidden."""
    with _wandb_hidden():
        exec_module(module)


def _eager_jit_fuser(exec_module: Callable[[ModuleType], None], module: ModuleType) -> None:
    """``megatron.core.jit``, then its ``disable_jit_fuser()`` at once, so that the
    ``@jit_fuser`` decorators megatron-core's package import meets (``fusions``,
    ``transformer.utils``, the MoE router and dispatcher) leave their functions eager instead of
    calling ``torch.compile``."""
    exec_module(module)
    getattr(module, "disable_jit_fuser", lambda: None)()


@contextlib.contextmanager
def megatron_core_without_wandb() -> Iterator[None]:
    """In the block, megatron-core's first import (by any module) runs without wandb, as the
    module docstring says; nothing changes where megatron-core is imported already."""
    finder = None if "megatron.core" in sys.modules else _OnImport("megatron.core", _without_wandb)
    if finder is not None:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


def import_megatron_core(module: str) -> ModuleType:
    """``module`` (one of megatron-core's), imported without wandb and without ``torch.compile``
    for the ``@jit_fuser`` functions decorated during the import (module docstring), when this
    process has not imported megatron-core yet; for commands that build no model.

    Raises:
        ImportError: megatron-core (or ``module``) is not installed.
    """
    if "megatron.core" in sys.modules:
        return importlib.import_module(module)
    finder = _OnImport("megatron.core.jit", _eager_jit_fuser)
    sys.meta_path.insert(0, finder)
    try:
        with _wandb_hidden():
            imported = importlib.import_module(module)
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
    jit = sys.modules.get("megatron.core.jit")
    getattr(jit, "enable_jit_fuser", lambda: None)()
    return imported
