"""Damaged preprocessing state (issue 27 item 7): an empty or torn done-marker is named with the
fix, and a second writer of the same output prefix is refused while the first holds its lock."""

import subprocess
import sys

import pytest
from conftest import DEMO_INPUTS, DEMO_TOKENIZER

from megatron_gamma.config import ConfigError
from megatron_gamma.data.preprocess import preprocess


@pytest.mark.parametrize("damage", ["empty", "torn"])
def test_an_empty_or_torn_done_marker_is_named_with_the_fix(tmp_path, damage):
    prefix = str(tmp_path / "o")
    preprocess(DEMO_INPUTS[1:], DEMO_TOKENIZER, prefix, progress=False)
    marker = tmp_path / "o.done.json"
    text = marker.read_text()
    marker.write_text("" if damage == "empty" else text[: len(text) // 2])
    want = "is empty" if damage == "empty" else "is torn or not JSON"
    with pytest.raises(
        ConfigError, match=rf"o\.done\.json: done-marker {want}.*Fix: delete .*o\.done\.json"
    ):
        preprocess(DEMO_INPUTS[1:], DEMO_TOKENIZER, prefix, progress=False)
    marker.unlink()  # the fix
    assert preprocess(DEMO_INPUTS[1:], DEMO_TOKENIZER, prefix, progress=False).documents > 0


HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
print("locked", flush=True)
sys.stdin.readline()
"""


def test_a_second_writer_of_the_same_output_is_refused(tmp_path):
    prefix = str(tmp_path / "o")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / ".o.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=rf"\.o\.lock: another process \(pid {holder.pid}\)"):
            preprocess(DEMO_INPUTS[1:], DEMO_TOKENIZER, prefix, progress=False)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".o.lock"]  # nothing written
    finally:
        holder.communicate("done\n", timeout=60)
    r = preprocess(DEMO_INPUTS[1:], DEMO_TOKENIZER, prefix, progress=False)
    assert r.documents > 0 and not (tmp_path / ".o.lock").exists()


def test_a_lock_file_that_is_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path):
    """The unit's lock file is truncated and rewritten: a link there (an output directory from
    elsewhere) would overwrite the file it points to."""
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".o.lock").symlink_to(victim)
    with pytest.raises(ConfigError) as e:
        preprocess(DEMO_INPUTS[1:], DEMO_TOKENIZER, str(out / "o"), progress=False)
    assert str(e.value).startswith(
        f"output_prefix={str(out / 'o')!r}: {out / '.o.lock'}: a symbolic link (to {str(victim)!r})"
    )
    assert victim.read_text() == "keep me\n"
    assert sorted(p.name for p in out.iterdir()) == [".o.lock"]  # nothing written
