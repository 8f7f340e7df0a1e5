"""Damaged or outdated preprocessing state (issue 27 item 7): an empty or torn done-marker is named
with the fix, a second writer of the same output prefix is refused while the first holds its
lock, and a marker does not outlive an input edited in place or its own older format."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import DEMO_INPUTS, DEMO_TOKENIZER
from megatron.core.datasets.indexed_dataset import IndexedDataset
from tokenizers import Tokenizer

from megatron_gamma.config import ConfigError
from megatron_gamma.data.encode import EncodeOptions
from megatron_gamma.data.preprocess import preprocess
from megatron_gamma.data.tokenizer import EOD


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


STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}"
"""How a done-marker's refusal prints an input's modification time."""

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


def _edit_in_place(path, text: str) -> None:
    """Rewrite ``path`` with ``text`` (of the same size) and a later modification time."""
    before = path.stat()
    path.write_text(text)
    assert path.stat().st_size == before.st_size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))


def _decoded(prefix: str) -> list[list[int]]:
    return [[int(t) for t in doc] for doc in IndexedDataset(prefix)]


def _hf_ids(text: str) -> list[int]:
    """The reference: HF ``tokenizers``' ids of ``text``, then EOD."""
    tok = Tokenizer.from_file(DEMO_TOKENIZER)
    return tok.encode(text, add_special_tokens=False).ids + [tok.token_to_id(EOD)]


def test_an_input_edited_in_place_is_not_taken_for_the_finished_one(tmp_path):
    """Same size, same path, other text: the modification time in the fingerprint tells it."""
    src = tmp_path / "s.jsonl"
    src.write_text('{"text": "alpha doc"}\n')
    prefix = str(tmp_path / "r" / "p")
    first = preprocess([str(src)], DEMO_TOKENIZER, prefix, progress=False)
    assert _decoded(first.prefix) == [_hf_ids("alpha doc")]
    _edit_in_place(src, '{"text": "ALPHA DOC"}\n')
    marker = f"{prefix}.done.json"
    with pytest.raises(
        ConfigError,
        match=rf"differs in: inputs \(entry 1 is now {re.escape(repr(str(src)))} \(22 bytes, "
        rf"modified {STAMP} UTC\), was {re.escape(repr(str(src)))} \(22 bytes, modified "
        rf"{STAMP} UTC\)\)\)\. Fix: .*delete {re.escape(marker)}",
    ):
        preprocess([str(src)], DEMO_TOKENIZER, prefix, progress=False)
    assert _decoded(first.prefix) == [_hf_ids("alpha doc")]  # refused: nothing touched
    os.remove(marker)  # the fix
    again = preprocess([str(src)], DEMO_TOKENIZER, prefix, progress=False)
    assert again.skipped == 0 and _decoded(again.prefix) == [_hf_ids("ALPHA DOC")]


def _as_older_marker(marker: str) -> None:
    """Rewrite a done-marker as the previous version wrote it: fingerprint format 1, each input
    as [path, size] (no modification time)."""
    with open(marker, encoding="utf-8") as f:
        doc = json.load(f)
    fp = doc["fingerprint"]
    fp["format"], fp["inputs"] = 1, [entry[:2] for entry in fp["inputs"]]
    with open(marker, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def test_a_marker_of_the_older_format_has_its_unit_redone_with_the_reason(tmp_path, caplog):
    """An older marker cannot tell an input edited in place: its unit is redone (with a line
    saying why), not skipped; other differences are still refused."""
    src = tmp_path / "s.jsonl"
    src.write_text('{"text": "alpha doc"}\n')
    prefix = str(tmp_path / "p")
    preprocess([str(src)], DEMO_TOKENIZER, prefix, progress=False)
    _as_older_marker(f"{prefix}.done.json")
    _edit_in_place(src, '{"text": "ALPHA DOC"}\n')
    with caplog.at_level("WARNING"):
        redo = preprocess([str(src)], DEMO_TOKENIZER, prefix, progress=False)
    assert redo.skipped == 0 and _decoded(redo.prefix) == [_hf_ids("ALPHA DOC")]
    assert f"{prefix}: done-marker of an older megatron-gamma, which did not record" in caplog.text
    assert "; redoing it" in caplog.text
    assert preprocess([str(src)], DEMO_TOKENIZER, prefix, progress=False).skipped == 1
    _as_older_marker(f"{prefix}.done.json")
    with pytest.raises(ConfigError, match=r"\(differs in: options\.append_eod\)\. Fix: "):
        preprocess([str(src)], DEMO_TOKENIZER, prefix, progress=False,
                   options=EncodeOptions(append_eod=False))  # fmt: skip
    src.write_text('{"text": "alpha doc, longer"}\n')
    now = r"entry 1 is now '.*' \(30 bytes\), "
    with pytest.raises(ConfigError, match=rf"\(differs in: inputs \({now}"):
        preprocess([str(src)], DEMO_TOKENIZER, prefix, progress=False)


def test_a_changed_input_list_is_named_by_path_size_and_time_not_as_a_list():
    """The refusal's text for inputs that changed: each entry as a path with its size and UTC
    time (2026-12-05 14:00:01.5 UTC is 1796479201.5 s after the epoch), a missing file as not
    found, a removed entry as nothing, and any other list entry as it is."""
    from megatron_gamma.data.resume import _differences

    ns = 1_796_479_201_500_000_000
    was = {"inputs": [["/d/en.jsonl", 22, ns], ["/d/zh.jsonl", 3_226_040, ns]]}
    assert _differences(was, {"inputs": was["inputs"][:1]}) == (
        "inputs (entry 2 is now nothing, was '/d/zh.jsonl' (3,226,040 bytes, modified "
        "2026-12-05 14:00:01.500000 UTC))"
    )
    gone = {"inputs": [["/d/en.jsonl", 0, 0], was["inputs"][1]]}
    assert _differences(was, gone) == (
        "inputs (entry 1 is now '/d/en.jsonl' (not found), was '/d/en.jsonl' (22 bytes, "
        "modified 2026-12-05 14:00:01.500000 UTC))"
    )
    merged = {"merge_of": [["/d/a", 1, 2, 3, 4]]}
    assert _differences(merged, {"merge_of": [["/d/a", 1, 2, 3, 5]]}) == (
        "merge_of (entry 1 is now ['/d/a', 1, 2, 3, 5], was ['/d/a', 1, 2, 3, 4])"
    )
