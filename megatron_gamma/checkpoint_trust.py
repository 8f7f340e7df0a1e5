"""The trust boundary of checkpoints: nothing in a checkpoint directory can run code.

A megatron-core ``torch_dist`` checkpoint (``SAVE/iter_N``) holds three pickled parts, two of
which torch unpickles with no restriction:

- ``.metadata``: torch DCP's ``FileSystemReader.read_metadata`` calls ``pickle.load``. Read
  here by :class:`_MetadataUnpickler`, which resolves only :data:`METADATA_GLOBALS` and the
  torch dtypes.
- the pickled objects inside ``*.distcp`` files (RNG states, ``_extra_state``): torch DCP's
  ``DefaultLoadPlanner.load_bytes`` calls ``torch.load(weights_only=False)``. Each is first
  loaded here by torch's weights-only unpickler, with numpy's RNG-state classes allowed
  (:func:`check_object`).
- ``common.pt``: megatron-core calls ``torch.load``, weights-only by default from torch 2.6
  unless ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` is set. Read here with ``weights_only=True``
  always (:class:`TrustedCommonLoadStrategy`), as are the ``KEY.pt`` object files megatron-core's
  common strategy reads for a checkpoint whose objects are not in ``*.distcp``
  (:func:`megatron_gamma.compat.patch_checkpoint_reader`).

Anything else is refused with :class:`CheckpointError` naming the file and the class, before
the class is imported or called; the tensors themselves torch reads weights-only. Every
checkpoint read of megatron-gamma (``pretrain --load`` / ``--pretrained-checkpoint``,
``evaluate``, ``export-hf``, ``analyze``, ``compare``, ``report``) goes through :func:`load`,
:func:`load_common_state_dict` and :func:`load_tensors_metadata`; the DCP reader is installed
into megatron-core by :func:`megatron_gamma.compat.patch_checkpoint_reader`. Weights from
elsewhere enter as safetensors and JSON through ``import-hf``.

The allowed classes were read from real checkpoints of this repository (dense, MoE,
distributed optimizer) by listing the globals their pickles reference.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle

import torch
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy
from megatron.core.dist_checkpointing.validation import (
    verify_checkpoint_and_load_strategy,
)
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.futures import Future

from megatron_gamma.config import ConfigError

COMMON_FILE = "common.pt"
METADATA_FILE = ".metadata"

METADATA_GLOBALS: dict[str, frozenset[str]] = {
    "torch": frozenset({"Size"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.planner": frozenset(
        {"SavePlan", "WriteItem", "WriteItemType", "TensorWriteData"}
    ),
}
"""The globals a DCP ``.metadata`` pickle may reference (module -> names), besides the torch
dtypes (``torch.float32``, ``torch.bfloat16``, ...): dataclasses and enums of torch's checkpoint
metadata, ``torch.Size``, and torch's layout lookup by name."""

_TAMPERED = (
    "this checkpoint was not written by megatron-core or has been tampered with. Fix: load only "
    "checkpoints written by megatron-gamma / megatron-core (a run's --save, or import-hf's "
    "output); bring third-party weights in as safetensors with import-hf"
)


class CheckpointError(ConfigError):
    """A checkpoint directory is missing, partial (``iter_N.partial``), unreadable, or holds a
    pickle that references a class a megatron-core checkpoint never holds."""


def _object_globals() -> list:
    """The numpy classes of a pickled RNG state (``np.random.get_state()``), allowed on top of
    torch's weights-only set in the objects of ``*.distcp`` files."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype]


def _allowed_in_metadata(module: str, name: str) -> bool:
    if name in METADATA_GLOBALS.get(module, ()):
        return True
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` resolving only :data:`METADATA_GLOBALS` and torch dtypes."""

    def __init__(self, file, path: str):
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str):
        if not _allowed_in_metadata(module, name):
            raise CheckpointError(
                f"checkpoint file {self._path!r}: its pickle references {module}.{name}, which "
                f"no megatron-core checkpoint metadata holds: {_TAMPERED}"
            )
        return super().find_class(module, name)


def read_metadata(path: str) -> Metadata:
    """Unpickle a DCP ``.metadata`` file through :class:`_MetadataUnpickler`.

    Raises:
        CheckpointError: the pickle references a class outside :data:`METADATA_GLOBALS`, is
            damaged, or does not hold a torch DCP ``Metadata``.
    """
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f, path).load()
        except CheckpointError:
            raise
        except Exception as e:  # truncated or garbled pickles raise many types
            raise CheckpointError(
                f"checkpoint file {path!r}: unreadable ({type(e).__name__}: {e}). Fix: use a "
                "complete checkpoint (an earlier iter_N, or rerun the save)"
            ) from e
    if not isinstance(metadata, Metadata):
        raise CheckpointError(
            f"checkpoint file {path!r}: holds a {type(metadata).__name__}, not torch DCP "
            f"Metadata: {_TAMPERED}"
        )
    return metadata


def check_object(data: io.BytesIO, where: str) -> None:
    """Refuse a pickled object (``torch.save`` format) that torch's weights-only unpickler,
    with the numpy RNG-state classes added, would not load. ``data`` is left at position 0.

    Raises:
        CheckpointError: naming ``where`` and the classes the pickle references.
    """
    try:
        with torch.serialization.safe_globals(_object_globals()):
            torch.load(data, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        data.seek(0)
        raise _refused(f"checkpoint {where}", data, e) from None
    finally:
        data.seek(0)


def _refused(where: str, f, error: Exception) -> CheckpointError:
    """The error for a pickle (``torch.save`` format, file or stream ``f``) that torch's
    weights-only unpickler refused with ``error``: the classes it references beyond torch's
    weights-only set, else the unpickler's reason (damage, or a refused opcode)."""
    try:
        classes = torch.serialization.get_unsafe_globals_in_checkpoint(f)
    except Exception:  # a damaged file: no list of globals to give
        classes = []
    if classes:
        return CheckpointError(
            f"{where}: its pickle references {', '.join(classes)}, which no megatron-core "
            f"checkpoint holds: {_TAMPERED}"
        )
    return CheckpointError(
        f"{where}: torch's weights-only unpickler refuses it ({str(error).splitlines()[-1]}): "
        f"it is damaged, or {_TAMPERED}"
    )


class _CheckedObjects:
    """A DCP load planner whose ``load_bytes`` first passes :func:`check_object`."""

    def __init__(self, planner, path: str):
        self._planner = planner
        self._path = path

    def __getattr__(self, name: str):
        return getattr(self._planner, name)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        check_object(value, f"{self._path!r} object {read_item.dest_index.fqn!r}")
        self._planner.load_bytes(read_item, value)


class TrustedFileSystemReader(FileSystemReader):
    """torch DCP ``FileSystemReader`` that reads ``.metadata`` with :func:`read_metadata` (once;
    later calls return the same object, as megatron-core's cached reader does) and checks every
    pickled object with :func:`check_object` before torch unpickles it."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self._metadata: Metadata | None = None

    def read_metadata(self) -> Metadata:
        """The checkpoint's DCP metadata, with ``storage_meta.load_id`` set as torch's reader
        sets it. (No ``rank`` argument: megatron-core writes no rank-local metadata, so torch
        does not look for one.)"""
        if self._metadata is None:
            metadata = read_metadata(os.path.join(str(self.path), METADATA_FILE))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            self._metadata = metadata
        return self._metadata

    def read_data(self, plan, planner):
        """torch's ``read_data``, one data file (``__R_N.distcp``) at a time, so that a file
        that cannot be read is named (:meth:`_unreadable`) rather than surfacing as torch's
        ``CheckpointException`` with every rank's traceback in its text."""
        checked = _CheckedObjects(planner, str(self.path))
        per_file: dict[str, list] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(
                item
            )
        for relative_path, items in per_file.items():
            try:
                super().read_data(dataclasses.replace(plan, items=items), checked)
            except CheckpointError:
                raise
            except Exception as e:  # many types for damaged files (EOFError, RuntimeError, ...)
                raise self._unreadable(relative_path, items, e) from e
        future: Future = Future()
        future.set_result(None)
        return future

    def _unreadable(self, relative_path: str, items: list, error: Exception) -> CheckpointError:
        """The error for data file ``relative_path`` whose ``items`` could not be read
        (``error``): truncated when it ends before the data the metadata places in it, else the
        root exception of ``error`` (its ``__cause__`` / ``__context__`` chain)."""
        path = os.path.join(str(self.path), relative_path)
        end = max(
            self.storage_data[i.storage_index].offset + self.storage_data[i.storage_index].length
            for i in items
        )
        try:
            size = os.path.getsize(path)
        except OSError:
            size = None
        if size is not None and size < end:
            why = (
                f"truncated: unexpected end of file at byte {size:,}, where the checkpoint's "
                f".metadata places data up to byte {end:,}"
            )
        else:
            why = _root_cause(error)
        return CheckpointError(
            f"checkpoint file {path!r}: unreadable ({why}). Fix: use a complete checkpoint (an "
            "earlier iter_N, or rerun the save)"
        )


class TrustedCommonLoadStrategy(TorchCommonLoadStrategy):
    """megatron-core's common-state strategy reading ``common.pt`` with ``weights_only=True``
    (whatever ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says)."""

    def load_common(self, checkpoint_dir):
        """The checkpoint's common (non-sharded) state dict.

        Raises:
            CheckpointError: ``common.pt`` is missing, or references a class torch's
                weights-only unpickler refuses.
        """
        path = os.path.join(str(checkpoint_dir), COMMON_FILE)
        if not os.path.isfile(path):
            raise CheckpointError(
                f"checkpoint={str(checkpoint_dir)!r}: has no {COMMON_FILE}. Fix: use a complete "
                "checkpoint (an earlier iter_N, or rerun the save)"
            )
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise _refused(f"checkpoint file {path!r}", path, e) from None


def weights_only_load(*args, **kwargs):
    """``torch.load(..., weights_only=True)`` whatever the caller passed or
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says (torch honours an explicit True): what
    megatron-core's common strategy calls in place of ``torch.load``
    (:func:`~megatron_gamma.compat.patch_checkpoint_reader`)."""
    kwargs["weights_only"] = True
    return torch.load(*args, **kwargs)


def check_config(checkpoint: str) -> None:
    """Refuse a damaged ``metadata.json`` (megatron-core's checkpoint config, which its
    ``maybe_load_config`` reads with ``json.load``, so that a damaged one would stop every read
    with a bare JSON error naming neither the file nor a fix). A missing one is left to
    megatron-core (not a checkpoint).

    Raises:
        CheckpointError: ``metadata.json`` is not JSON, or not the object megatron-core writes
            (``sharded_backend``, ...), naming the file, what is wrong and the fix.
    """
    from megatron.core.dist_checkpointing.core import CONFIG_FNAME, CheckpointingConfig

    path = os.path.join(str(checkpoint), CONFIG_FNAME)
    if not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON {type(raw).__name__}, not an object")
        CheckpointingConfig(**raw)
    except (OSError, ValueError, TypeError) as e:  # JSONDecodeError, UnicodeDecodeError: ValueError
        raise CheckpointError(
            f"checkpoint file {path!r}: damaged, not megatron-core's checkpoint config "
            f"({type(e).__name__}: {e}). Fix: use a complete checkpoint (an earlier iter_N, or "
            "rerun the save); a checkpoint written by megatron-core holds "
            '{"sharded_backend": "torch_dist", ...} there'
        ) from None


def _root_cause(error: BaseException) -> str:
    """One line for the innermost exception of ``error``'s ``__cause__`` / ``__context__``
    chain: its type and the last line of its text (``unexpected end of file (EOFError)`` for
    an ``EOFError``, which has none)."""
    root = error
    while (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__
    text = str(root).strip().splitlines()
    why = f"{type(root).__name__}: {text[-1]}" if text else type(root).__name__
    return f"unexpected end of file ({why})" if isinstance(root, EOFError) else why


def _named(e: CheckpointException) -> CheckpointError | None:
    """The :class:`CheckpointError` a rank raised inside torch DCP (which wraps every rank's
    exception in one ``CheckpointException``), if any."""
    for exc, _ in e.failures.values():
        if isinstance(exc, CheckpointError):
            return exc
    return None


def load(sharded_state_dict: dict, checkpoint: str, strict: str) -> dict | tuple[dict, set, set]:
    """``dist_checkpointing.load`` through the trusted readers (collective, every rank).
    ``.metadata`` is read once before the load too, because torch DCP turns a failed metadata
    read into an ``AssertionError`` that hides which file and class were refused.

    Args:
        sharded_state_dict: megatron-core sharded state dict to fill.
        checkpoint: one ``iter_N`` directory.
        strict: megatron-core's key-mismatch handling (a ``StrictHandling`` value; the
            run's choices are :class:`~megatron_gamma.config.choices.DistCkptStrictness`).

    Returns:
        The loaded state dict (megatron-core's ``load``); with a ``return_*`` ``strict``, also
        the keys only the checkpoint holds and those only the request holds: ``(state dict,
        missing keys, unexpected keys)`` in megatron-core's naming.

    Raises:
        CheckpointError: a refused class in any pickled part (every rank raises it); a data
            file that cannot be read (truncated, damaged), named; any other failure inside torch
            DCP, one line per rank (its root exception).
    """
    from megatron_gamma.compat import patch_checkpoint_reader

    patch_checkpoint_reader()
    check_config(checkpoint)
    read_metadata(os.path.join(checkpoint, METADATA_FILE))
    try:
        return dist_checkpointing.load(
            sharded_state_dict,
            checkpoint,
            common_strategy=TrustedCommonLoadStrategy(),
            strict=strict,
        )
    except CheckpointException as e:
        named = _named(e)
        if named is None:  # one line per rank, not torch's text with every rank's traceback
            causes = "; ".join(
                f"rank {rank}: {_root_cause(exc)}" for rank, (exc, _) in sorted(e.failures.items())
            )
            named = CheckpointError(
                f"checkpoint={checkpoint!r}: cannot be read ({causes}). Fix: use a complete "
                "checkpoint (an earlier iter_N, or rerun the save)"
            )
        raise named from None


def load_common_state_dict(checkpoint: str) -> dict:
    """The common state of ``checkpoint`` (``common.pt``: iteration, scheduler, ...), read by
    :class:`TrustedCommonLoadStrategy` after megatron-core has checked the format.

    Raises:
        CheckpointError: see :func:`check_config` and
            :meth:`TrustedCommonLoadStrategy.load_common`.
    """
    check_config(checkpoint)
    _, common = verify_checkpoint_and_load_strategy(
        checkpoint, common_strategy=TrustedCommonLoadStrategy()
    )
    return common.load_common(checkpoint)


def load_sharded_metadata(checkpoint: str) -> dict:
    """Every tensor and object ``checkpoint`` holds, without data, by key (megatron-core's
    ``load_sharded_metadata``: ``ShardedTensor`` with the global shape, ``ShardedObject``), from
    ``.metadata`` read by :func:`read_metadata`; no tensor or object is read.

    Raises:
        CheckpointError: see :func:`check_config` and :func:`read_metadata`.
    """
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    from megatron_gamma.compat import patch_checkpoint_reader

    patch_checkpoint_reader()
    check_config(checkpoint)
    return load_sharded_metadata(checkpoint, common_strategy=TrustedCommonLoadStrategy())


def load_tensors_metadata(checkpoint: str) -> dict:
    """Global names and shapes of the tensors of ``checkpoint`` (megatron-core's
    ``load_tensors_metadata``), from ``.metadata`` read by :func:`read_metadata`.

    Raises:
        CheckpointError: see :func:`check_config` and :func:`read_metadata`.
    """
    from megatron_gamma.compat import patch_checkpoint_reader

    patch_checkpoint_reader()
    check_config(checkpoint)
    return dist_checkpointing.load_tensors_metadata(checkpoint)
