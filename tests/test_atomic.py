"""The one atomic-write helper (:mod:`megatron_gamma.atomic`): an error midway leaves the old
file and no temporary; success replaces the file in one rename; and no other module renames
files itself."""

from __future__ import annotations

import ast
import os

import numpy as np
import pytest
from helpers import PACKAGE

from megatron_gamma import atomic

TOOLS = PACKAGE.parent / "tools"
# megatron_gamma/config.py is being moved into a package by another branch; its one site is
# converted after that merge, so it is left out of the scan until then.
NOT_SCANNED = {PACKAGE / "atomic.py"}


class Midway(Exception):
    pass


def _listing(path) -> list[str]:
    return sorted(os.listdir(path))


def test_an_error_midway_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    with pytest.raises(Midway), atomic.atomic_open(str(path), "w") as f:
        f.write("new, half")
        f.flush()
        raise Midway
    assert path.read_text() == "old"
    assert _listing(tmp_path) == ["out.json"]


def test_an_error_midway_before_any_file_existed_leaves_nothing(tmp_path):
    path = tmp_path / "out.bin"
    with pytest.raises(Midway), atomic.atomic_path(str(path)) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"part")
        raise Midway
    assert _listing(tmp_path) == []


def test_a_write_replaces_the_file_in_one_rename(tmp_path, monkeypatch):
    """Until the rename, readers see the old content; the new content arrives whole, through
    exactly one ``os.replace`` from a temporary in a directory of its own beside the file (the
    same file system)."""
    path = tmp_path / "out.txt"
    path.write_text("old")
    renames = []
    real = os.replace

    def spy(src, dst):
        assert path.read_text() == "old"
        assert open(src).read() == "new content"
        renames.append((os.path.dirname(os.path.dirname(src)), os.fspath(dst)))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    atomic.atomic_write_text(str(path), "new content")
    assert renames == [(str(tmp_path), str(path))]
    assert path.read_text() == "new content"
    assert _listing(tmp_path) == ["out.txt"]


def test_bytes_and_extension_keeping_writers(tmp_path):
    """``np.savez`` appends ``.npz`` to a name without it: the temporary keeps the extension, so
    the array lands under the final name."""
    atomic.atomic_write_bytes(str(tmp_path / "a.bin"), b"\x00\x01")
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    with atomic.atomic_path(str(tmp_path / "x.npz")) as tmp:
        np.savez_compressed(tmp, v=np.arange(3))
    assert np.load(tmp_path / "x.npz")["v"].tolist() == [0, 1, 2]
    assert _listing(tmp_path) == ["a.bin", "x.npz"]


def test_a_mode_chosen_by_the_writer_is_kept(tmp_path):
    """A writer that creates its temporary with ``O_EXCL`` and a mode of its own (a SLURM script,
    0700) finds the name free and publishes that mode."""
    path = str(tmp_path / "run.sh")
    umask = os.umask(0o022)
    try:
        with atomic.atomic_path(path) as tmp:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
            with open(fd, "w") as f:
                f.write("fresh")
    finally:
        os.umask(umask)
    assert open(path).read() == "fresh"
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert _listing(tmp_path) == ["run.sh"]


def test_a_link_at_a_guessable_temporary_name_is_not_written_through(tmp_path):
    """Trust audit: writers that take a path (``np.savez``, ``savefig``, a tokenizer's ``save``)
    open it following symbolic links. The temporary used to be ``PATH.tmpPID.EXT``, a name anyone
    who may write the output directory could guess and, between the removal of a leftover and the
    writer's open, fill with a link to another file. It now lies in a directory made by ``mkdtemp``
    (unpredictable, owner-only): links at the old name, and at names beside the output, are left
    alone and their targets keep their content."""
    victim = tmp_path / "victim"
    victim.write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    path = out / "x.npz"
    guesses = [f"x.npz.tmp{os.getpid()}.npz", ".x.npz", "x.npz.npz"]
    for guess in guesses:
        os.symlink(victim, out / guess)
    seen = []
    for _ in range(2):
        with atomic.atomic_path(str(path)) as tmp:
            seen.append(os.path.dirname(tmp))
            assert os.path.basename(tmp) == "x.npz"
            assert os.stat(os.path.dirname(tmp)).st_mode & 0o777 == 0o700
            with open(tmp, "wb") as f:  # follows links, as np.savez does
                f.write(b"payload")
    assert victim.read_text() == "mine" and path.read_bytes() == b"payload"
    assert seen[0] != seen[1] and os.path.dirname(seen[0]) == str(out)
    assert _listing(out) == sorted([*guesses, "x.npz"])


def test_an_error_midway_removes_the_temporary_directory(tmp_path):
    with pytest.raises(Midway), atomic.atomic_path(str(tmp_path / "fig.png")) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"part")
        raise Midway
    assert _listing(tmp_path) == []


def test_a_directory_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "export"
    with pytest.raises(Midway), atomic.atomic_dir(str(out)) as tmp:
        with open(os.path.join(tmp, "model.safetensors"), "w") as f:
            f.write("part")
        raise Midway
    assert _listing(tmp_path) == []
    out.mkdir()  # an empty directory given as the target is replaced
    with atomic.atomic_dir(str(out)) as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            f.write("{}")
    assert _listing(out) == ["config.json"]
    assert _listing(tmp_path) == ["export"]


def test_output_dirs_are_removed_on_an_error_unless_they_hold_something(tmp_path):
    (tmp_path / "existing").mkdir()
    out = tmp_path / "existing" / "a" / "b"
    with pytest.raises(Midway), atomic.output_dirs(str(out)):
        assert out.is_dir()
        raise Midway
    assert _listing(tmp_path) == ["existing"] and _listing(tmp_path / "existing") == []
    with pytest.raises(Midway), atomic.output_dirs(str(out)):
        (out.parent / "kept.txt").write_text("x")
        raise Midway
    assert _listing(tmp_path / "existing" / "a") == ["kept.txt"]
    with atomic.output_dirs(str(out)):
        pass
    assert out.is_dir()


def _renames(path) -> list[str]:
    """``os.replace`` / ``os.rename`` calls and ``from os import replace/rename`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("replace", "rename")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.append(f"{path}:{node.lineno}: os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [
                f"{path}:{node.lineno}: from os import {a.name}"
                for a in node.names
                if a.name in ("replace", "rename")
            ]
    return found


def test_only_the_helper_renames_files():
    """Every temp-and-rename of the package and its tools goes through megatron_gamma.atomic."""
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p not in NOT_SCANNED]
    files += sorted(TOOLS.rglob("*.py"))
    assert [hit for p in files for hit in _renames(p)] == []
    assert _renames(PACKAGE / "atomic.py") != []  # the scan sees the calls it looks for


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_published_directories_and_files_have_the_umasks_permissions(tmp_path, umask):
    """An exported model or imported run is as readable as anything ``open``/``mkdir`` make
    (not owner-only, as ``tempfile.mkdtemp`` and ``safetensors`` make theirs)."""
    old = os.umask(umask)
    try:
        with open(tmp_path / "plain", "w"):
            pass
        os.mkdir(tmp_path / "plain_dir")
        with atomic.atomic_dir(str(tmp_path / "out")) as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                f.write("{}")
        mode = atomic.new_file_mode()
    finally:
        os.umask(old)
    assert mode == (tmp_path / "plain").stat().st_mode & 0o777 == 0o666 & ~umask
    published = (tmp_path / "out").stat().st_mode & 0o777
    assert published == (tmp_path / "plain_dir").stat().st_mode & 0o777 == 0o777 & ~umask
