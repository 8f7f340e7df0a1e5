"""Atomic writes: a file or directory appears complete under its final name, or not at all.

Every write of the package that a crash or an error must not leave torn goes through here: the
content is written under a temporary name beside it (the same file system, so the rename is atomic;
:func:`atomic_path` puts it in a private directory of its own) and moved over the final name with
``os.replace``; on an error the temporary is removed and the previous file, if any, is left as it
was. Readers therefore see the old content or the new, never a part. (No ``fsync``: the guarantee is
against a process that dies or raises, not against a power loss.)

- :func:`atomic_path`: yields the temporary path, for writers that take a path (``np.savez``,
  ``savefig``, a tokenizer's ``save``).
- :func:`atomic_open`, :func:`atomic_write_text`, :func:`atomic_write_bytes`: an open file, or
  the whole content at once.
- :func:`atomic_dir`: a whole directory (an exported model, an imported run).
- :func:`move`: publish a temporary that was completed elsewhere (a checkpoint that every rank
  wrote into ``iter_N.partial``, the files of a data unit).
- :func:`output_dirs`: the output directories of a run, created for it and removed again when it
  fails before writing anything into them.
- :func:`open_in_place`, :func:`refuse_link`: the few files written in place instead (lock
  files, appended logs), opened without following a symbolic link (:class:`LinkedFileError`).

What is published carries the permissions a plain ``open``/``mkdir`` gives under the process's
umask (a temporary made by ``tempfile`` would be owner-only); :func:`new_file_mode` is that mode
for a file, for writers that cannot choose it (``safetensors`` writes owner-only files).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO


def new_file_mode() -> int:
    """The permission bits ``open(path, "w")`` gives a new file: ``0o666`` less the umask (read
    from ``/proc/self/status`` on Linux, which leaves it unchanged; elsewhere set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            mask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path for the caller to write; when the block ends without an error,
    move it over ``path`` (``os.replace``).

    The temporary is ``path``'s base name inside a new directory beside ``path``
    (``.NAME.XXXXXXXX``, made by ``tempfile.mkdtemp``: an unpredictable name, created
    exclusively, writable by this user only), so writers that choose the format by the
    extension, or append one (``np.savez``), keep working, and nobody else who may write
    ``path``'s directory can put a file or symbolic link where the writer opens its temporary:
    writers that follow links (``np.savez``, ``savefig``, a tokenizer's ``save``) cannot be sent
    to another file. On an error (any exception, ``KeyboardInterrupt`` included) the temporary
    directory is removed, ``path`` keeps its previous content, and the error propagates.

    Raises:
        OSError: ``path``'s directory does not exist or refuses new entries, the block wrote
            nothing at the temporary path, or the rename failed.
    """
    parent, name = os.path.split(os.path.abspath(path))
    folder = tempfile.mkdtemp(prefix=f".{name}.", dir=parent)
    try:
        tmp = os.path.join(folder, name)
        yield tmp
        os.replace(tmp, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", **kwargs) -> Iterator[IO]:
    """``open(temporary, mode, **kwargs)`` (``mode``: ``"w"`` or ``"wb"``; ``encoding``,
    ``newline`` as for ``open``), moved over ``path`` once the block ends without an error and
    the file is closed (:func:`atomic_path`). The temporary is created exclusively
    (``O_CREAT | O_EXCL``) with the umask's permissions, which the published file keeps."""
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, mode, **kwargs) as f:
            yield f


def atomic_write_text(
    path: str, text: str, encoding: str = "utf-8", newline: str | None = None
) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_open`)."""
    with atomic_open(path, "w", encoding=encoding, newline=newline) as f:
        f.write(text)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_open`)."""
    with atomic_open(path, "wb") as f:
        f.write(data)


@contextlib.contextmanager
def atomic_dir(path: str) -> Iterator[str]:
    """Yield a new empty directory beside ``path`` (``.NAME.tmpPID``, parents created; made by
    ``mkdir``, so with the umask's permissions) for the caller to fill; when the block ends
    without an error, move it to ``path``. An empty directory at ``path`` is replaced; on an
    error the temporary directory is removed and ``path`` is left as it was; a leftover
    temporary of a killed writer with the same pid is removed first.

    Raises:
        OSError: ``path`` exists and is not an empty directory (callers check that first, with
            their own message).
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(path))}.tmp{os.getpid()}")
    _remove(tmp)
    os.mkdir(tmp)
    try:
        yield tmp
        if os.path.isdir(path):
            os.rmdir(path)
        os.replace(tmp, path)
    finally:
        _remove(tmp)


def move(src: str, dst: str) -> None:
    """Move the complete file or directory ``src`` to ``dst`` in one step (``os.replace``: an
    existing file ``dst`` is replaced; an existing directory must be empty). ``src`` must lie
    on ``dst``'s file system (in practice: the same directory)."""
    os.replace(src, dst)


def creation_refused(directory: str) -> str | None:
    """Why nothing can be created in the existing ``directory`` (``strerror`` of making and
    removing a probe directory there), or None where it can: what ``os.access`` cannot tell
    (root under ``/proc`` or ``/sys``, a mount that refuses new entries)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".megatron-gamma-probe-", dir=directory))
    except OSError as e:
        return e.strerror
    return None


def missing_dirs(path: str) -> list[str]:
    """The absolute paths, innermost first, that are not directories from ``path`` up to its
    nearest existing directory: what ``os.makedirs(path)`` would create (or, where one of them
    is a file, fail on)."""
    missing = []
    parent = os.path.abspath(path)
    while not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    return missing


@contextlib.contextmanager
def output_dirs(path: str) -> Iterator[None]:
    """``os.makedirs(path, exist_ok=True)`` for the block. When the block raises, the directories
    this call created are removed again, innermost first, as long as they are empty, so a run
    that fails leaves no empty directory behind; directories that existed before, or that hold
    anything (a finished shard, a file written by someone else), are kept."""
    created = missing_dirs(path)
    os.makedirs(path, exist_ok=True)
    try:
        yield
    except BaseException:
        for folder in created:
            try:
                os.rmdir(folder)
            except OSError:
                break
        raise


class LinkedFileError(ValueError):
    """A file that is written in place (:func:`open_in_place`) is a symbolic link."""


def refuse_link(path: str) -> None:
    """Refuse ``path`` when it is a symbolic link, for a file that will be written in place
    (:func:`open_in_place`), checked before any work starts.

    Raises:
        LinkedFileError: ``path`` is a symbolic link (naming it, its target and the fix).
    """
    if os.path.islink(path):
        raise LinkedFileError(
            f"{path}: a symbolic link (to {os.readlink(path)!r}); this file is written in place, "
            "so the write would land where the link points. Fix: remove the link (a directory "
            "copied from elsewhere may hold it) and rerun"
        )


def open_in_place(path: str, flags: int, mode: int = 0o666) -> int:
    """``os.open(path, flags, mode)`` for a file written in place rather than through a
    temporary and a rename (a lock file, truncated and rewritten; a log, appended to), refusing
    a symbolic link as ``path``'s last component (``O_NOFOLLOW``). Such a link in a directory
    from elsewhere (a copied run directory, a downloaded checkpoint root) would turn the write
    into one at whatever it points to: truncating ``~/.bashrc``, or creating a file where it
    dangles. Links in the directories above are followed (a run directory may be one). Its
    signature is ``open``'s ``opener``: ``open(path, "a", opener=open_in_place)``.

    Raises:
        LinkedFileError: ``path`` is a symbolic link (:func:`refuse_link`).
        OSError: any other failure of ``os.open``.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            refuse_link(path)
        raise
