"""Resumable, crash-safe outputs: a partial directory, renames, and a done-marker.

One unit of work (a shard of a preprocessing run, or a merge) with base prefix ``B`` writes every
file into ``{dir}/.{name}.partial/`` (``B = {dir}/{name}``). When all are complete it

1. removes an outdated ``B.done.json`` (a redone unit),
2. renames each file to its final name (``B_{output}.bin/.idx``, ``B.stats.json``): an atomic
   rename on one file system, so no final name ever holds a half-written file,
3. writes ``B.done.json`` (under a temporary name, then renamed) holding the fingerprint of the
   work, the counts, and the size and SHA-256 of every file, and removes the partial directory.

A rerun with the same fingerprint skips a unit whose marker verifies (files present, sizes and
checksums equal) and redoes one whose marker is missing or does not verify; a partial directory
left by a killed run is deleted first. A marker whose fingerprint differs (other inputs, options
or tokenizer) stops the run instead of mixing two runs under one prefix, and an empty or torn
marker (not JSON) stops it with the file named. The work's owner may pass a ``reconcile``
function (:data:`Reconcile`) that says which recorded fingerprints count as this work's (a
marker of an older format) and when such a unit is redone all the same. Only one process may
work on a given ``B`` at a time: :meth:`UnitOutput.locked` holds an exclusive ``flock`` on
``{dir}/.{name}.lock`` (released by the kernel when the process ends, however it ends) and
refuses a second writer by name.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import shlex
import shutil
from collections.abc import Callable, Iterator

from megatron_gamma.atomic import (
    LinkedFileError,
    creation_refused,
    missing_dirs,
    move,
    open_in_place,
)
from megatron_gamma.config import ConfigError, changed_fields
from megatron_gamma.data.indexed import sha256_file
from megatron_gamma.data.stats import read_json, write_json

MARKER_FORMAT = "megatron-gamma-done/1"
log = logging.getLogger(__name__)

Reconcile = Callable[[dict, dict], tuple[dict, str | None]]
"""``reconcile(recorded, current)``: the fingerprint a done-marker must hold for its unit to
count as the ``current`` work's, given the ``recorded`` one, and the reason to redo the unit all
the same when it matches (None: skip it if its files verify)."""


def check_output_prefix(prefix: str) -> None:
    """Refuse, before any work, an ``--output-prefix`` whose files could not be written: one that
    names a directory (it ends in ``/``, or is ``.`` or ``..``; a prefix names files, ``DIR/NAME``),
    or whose directory could not be made or written into (:func:`check_output_dir`). Nothing else
    is created here (shards of one run start at once and share the directory).

    Raises:
        ConfigError: naming the prefix, the reason and the fix.
    """
    if os.path.basename(prefix) in ("", ".", ".."):
        raise ConfigError(
            f"--output-prefix {prefix!r} names a directory, but a prefix names files "
            "(PREFIX_text_document.bin/.idx, PREFIX.stats.json). Fix: a name inside it, e.g. "
            f"--output-prefix {shlex.quote(os.path.join(prefix, 'corpus'))}"
        )
    check_output_dir("--output-prefix", prefix)


def check_output_dir(flag: str, path: str) -> None:
    """Refuse, before any work, a ``flag`` ``path`` (a file to write) whose directory could not
    be made or written into: an ancestor that is a file, or a symbolic link to nothing (which
    ``os.makedirs`` cannot follow); the nearest existing directory not writable by this user, on
    a read-only file system, or refusing new entries, as ``/proc`` does even for root (an empty
    directory of a unique name is made there and removed at once). Nothing else is created.

    Raises:
        ConfigError: naming ``flag``, ``path``, the reason and the fix.
    """
    missing = missing_dirs(os.path.dirname(os.path.abspath(path)))
    for blocker in reversed(missing):  # outermost first: the one makedirs would meet
        if os.path.islink(blocker) and not os.path.exists(blocker):
            raise ConfigError(
                f"{flag} {path!r}: {blocker!r} is a symbolic link to {os.readlink(blocker)!r}, "
                "which does not exist. Fix: create the directory it points to, or remove the "
                f"link, or give an {flag} in another directory"
            )
        if os.path.exists(blocker):
            raise ConfigError(
                f"{flag} {path!r}: {blocker!r} is a file, not a directory. Fix: an {flag} in "
                "another directory"
            )
    existing = os.path.dirname(missing[-1]) if missing else os.path.dirname(os.path.abspath(path))
    if os.statvfs(existing).f_flag & os.ST_RDONLY or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{flag} {path!r}: {existing!r} is not writable (read-only file system or no "
            f"permission). Fix: an {flag} in a directory you can write"
        )
    refused = creation_refused(existing)
    if refused is not None:
        raise ConfigError(
            f"{flag} {path!r}: nothing can be created in {existing!r} ({refused}). Fix: an "
            f"{flag} in a directory you can write"
        )


def verify_marker(base: str, marker: dict) -> bool:
    """True if every file the done-marker of ``base`` lists exists with its size and SHA-256
    (a warning names the first that does not)."""
    for suffix, want in marker["files"].items():
        path = f"{base}{suffix}"
        if (
            not os.path.isfile(path)
            or os.path.getsize(path) != want["bytes"]
            or sha256_file(path) != want["sha256"]
        ):
            log.warning("%s is missing or changed since %s completed", path, base)
            return False
    return True


def read_marker_file(path: str) -> dict:
    """The done-marker at ``path``, read as it is (its files are not verified).

    Raises:
        ConfigError: the file is empty or torn (not a JSON object), named with the fix.
    """
    try:
        marker = read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        marker = e
    if not isinstance(marker, dict):
        what = "empty" if os.path.getsize(path) == 0 else f"torn or not JSON ({marker})"
        raise ConfigError(
            f"{path}: done-marker is {what}, e.g. written by a process killed mid-write. Fix: "
            f"delete {shlex.quote(path)} and rerun to redo that output (its files are written "
            "again)"
        )
    return marker


def read_marker(base: str) -> dict | None:
    """The done-marker ``{base}.done.json`` if it exists and verifies, else None.

    Raises:
        ConfigError: the marker is empty or torn.
    """
    path = f"{base}.done.json"
    if not os.path.exists(path):
        return None
    marker = read_marker_file(path)
    if marker.get("format") != MARKER_FORMAT or not verify_marker(base, marker):
        return None
    return marker


def _same(recorded: dict, current: dict) -> tuple[dict, None]:
    """The default :data:`Reconcile`: a marker counts only with the current fingerprint."""
    return current, None


def _entry_text(entry: object) -> str:
    """An input entry of a fingerprint for people: ``[path, size, modification time in ns]``
    (``[path, size]`` in format 1) as the path with its size and time; anything else as is."""
    shaped = isinstance(entry, list) and len(entry) in (2, 3) and isinstance(entry[0], str)
    if not shaped or not all(isinstance(x, int) for x in entry[1:]):
        return repr(entry)
    if not any(entry[1:]):
        return f"{entry[0]!r} (not found)"
    size = f"{entry[1]:,} bytes"
    if len(entry) == 3:
        when = datetime.datetime.fromtimestamp(entry[2] / 1e9, datetime.timezone.utc)
        size += f", modified {when:%Y-%m-%d %H:%M:%S.%f} UTC"
    return f"{entry[0]!r} ({size})"


def _differences(old: dict, new: dict) -> str:
    """The names of the fields that differ; for a list, also its first differing entry, with
    the value recorded and the value now (e.g. an input's path, size and modification time)."""
    out = []
    for name, a, b in changed_fields(old, new):
        if isinstance(a, list) and isinstance(b, list):
            pairs = enumerate(zip(a, b, strict=False))
            i = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
            was = _entry_text(a[i]) if i < len(a) else "nothing"
            now = _entry_text(b[i]) if i < len(b) else "nothing"
            name = f"{name} (entry {i + 1} is now {now}, was {was})"
        out.append(name)
    return ", ".join(out)


class UnitOutput:
    """The files of one unit of work under base prefix ``base``.

    Args:
        base: output prefix of the unit (``--output-prefix``, or its shard name).
        fingerprint: JSON-able description of everything that determines the output bytes.
        reconcile: how a recorded fingerprint is compared with ``fingerprint`` (:data:`Reconcile`;
            default: it must equal it).
    """

    def __init__(self, base: str, fingerprint: dict, reconcile: Reconcile | None = None):
        self.base = base
        self.fingerprint = fingerprint
        self.reconcile = reconcile
        folder, name = os.path.split(os.path.abspath(base))
        self.folder = folder
        self.partial = os.path.join(folder, f".{name}.partial")
        self.marker = f"{base}.done.json"
        self.stats = f"{base}.stats.json"
        self.lock = os.path.join(folder, f".{name}.lock")

    def final(self, suffix: str) -> str:
        """Final path of ``B{suffix}`` (e.g. ``_text_document.bin``, ``.stats.json``)."""
        return f"{self.base}{suffix}"

    def temp(self, suffix: str) -> str:
        """Where ``B{suffix}`` is written before the commit."""
        return os.path.join(self.partial, os.path.basename(self.base) + suffix)

    def completed(self) -> dict | None:
        """The done-marker if this unit is complete and intact, else None (also when
        ``reconcile`` gives a reason to redo it, which is logged).

        Raises:
            ConfigError: the marker belongs to work with a different fingerprint, or is empty
                or torn.
        """
        if not os.path.exists(self.marker):
            return None
        marker = read_marker_file(self.marker)
        if marker.get("format") != MARKER_FORMAT:
            raise ConfigError(
                f"{self.marker}: not a megatron-gamma done-marker. Fix: use another --output-prefix"
            )
        recorded = marker.get("fingerprint", {})
        want, redo = (self.reconcile or _same)(recorded, self.fingerprint)
        if recorded != want:
            raise ConfigError(
                f"{self.marker}: {self.base!r} holds a completed run with different inputs or "
                f"settings (differs in: {_differences(recorded, want)}). Fix: use another "
                f"--output-prefix, or delete {shlex.quote(self.marker)} to redo it with these (its "
                "outputs are then replaced)"
            )
        if redo is not None:
            log.warning("%s: %s; redoing it", self.base, redo)
            return None
        return marker if verify_marker(self.base, marker) else None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold ``{dir}/.{name}.lock`` for the block: an exclusive ``flock``; the file holds this
        process's id and is removed at the end (a killed process leaves it behind, unlocked).

        Raises:
            ConfigError: another process holds it, named by its process id; or it is a
                symbolic link (:func:`~megatron_gamma.atomic.open_in_place`).
        """
        os.makedirs(self.folder, exist_ok=True)
        while True:
            try:  # truncated and rewritten below: never through a symbolic link
                fd = open_in_place(self.lock, os.O_RDWR | os.O_CREAT, 0o644)
            except LinkedFileError as e:
                raise ConfigError(f"output_prefix={self.base!r}: {e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise ConfigError(
                    f"{self.lock}: another process (pid {holder}) is writing {self.base!r}. "
                    "Fix: wait for it to finish, or use another --output-prefix"
                ) from None
            try:
                same = os.stat(self.lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:  # else its holder removed it between our open and flock: take the new one
                break
            os.close(fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            os.remove(self.lock)
            os.close(fd)  # releases the lock

    def begin(self) -> None:
        """Start (or restart) the unit: delete a partial directory left by a killed run."""
        if os.path.isdir(self.partial):
            log.warning("%s: removing the partial output of an interrupted run", self.base)
            shutil.rmtree(self.partial)
        os.makedirs(self.partial)

    def abort(self) -> None:
        """Delete the partial directory (final names are untouched)."""
        shutil.rmtree(self.partial, ignore_errors=True)

    def commit(self, suffixes: list[str], counts: dict, sha256: dict | None = None) -> dict:
        """Move the finished files ``B{suffix}`` to their final names and write the marker.

        Args:
            suffixes: the files to move.
            counts: totals recorded in the marker.
            sha256: {suffix: hex SHA-256} already computed while writing; the other files
                are hashed here.

        Returns:
            The marker written.
        """
        files = {}
        for suffix in suffixes:
            path = self.temp(suffix)
            digest = (sha256 or {}).get(suffix) or sha256_file(path)
            files[suffix] = {"bytes": os.path.getsize(path), "sha256": digest}
        marker = {
            "format": MARKER_FORMAT,
            "fingerprint": self.fingerprint,
            "counts": counts,
            "files": files,
        }
        if os.path.exists(self.marker):
            os.remove(self.marker)
        for suffix in suffixes:
            move(self.temp(suffix), self.final(suffix))
        write_json(self.marker, marker)
        shutil.rmtree(self.partial, ignore_errors=True)
        return marker
