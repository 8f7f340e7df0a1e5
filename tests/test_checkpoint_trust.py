"""No code runs from a checkpoint: a tampered ``.metadata``, ``common.pt`` or pickled object in
a ``*.distcp`` file is refused with the named :class:`CheckpointError` by every command that
reads checkpoints, and its payload (creating a marker file) never runs."""

import dataclasses
import io
import os
import pickle
import shutil

import pytest
import torch
from helpers import TINY_MODEL, pretrain, run_cli

from megatron_gamma.checkpoint_trust import METADATA_FILE, CheckpointError, read_metadata

TAMPERED = "not written by megatron-core or has been tampered with"


class _Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _tamper_metadata(ckpt: str, marker: str) -> None:
    with open(os.path.join(ckpt, METADATA_FILE), "wb") as f:
        pickle.dump(_Payload(marker), f)


def _tamper_common(ckpt: str, marker: str) -> None:
    torch.save(_Payload(marker), os.path.join(ckpt, "common.pt"))


def _tamper_objects(ckpt: str, marker: str) -> None:
    """Point every pickled object of the checkpoint (RNG states, ``_extra_state``) at the
    payload, appended to its ``*.distcp`` file; the metadata stays well-formed."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = read_metadata(os.path.join(ckpt, METADATA_FILE))
    buf = io.BytesIO()
    torch.save(_Payload(marker), buf)
    payload = buf.getvalue()
    for index, info in list(metadata.storage_data.items()):
        if isinstance(metadata.state_dict_metadata[index.fqn], BytesStorageMetadata):
            path = os.path.join(ckpt, info.relative_path)
            offset = os.path.getsize(path)
            with open(path, "ab") as f:
                f.write(payload)
            metadata.storage_data[index] = dataclasses.replace(
                info, offset=offset, length=len(payload)
            )
    with open(os.path.join(ckpt, METADATA_FILE), "wb") as f:
        pickle.dump(metadata, f)


TAMPER = {"metadata": _tamper_metadata, "common": _tamper_common, "objects": _tamper_objects}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, demo_prefix) -> str:
    run = tmp_path_factory.mktemp("trust") / "run"
    pretrain(run, demo_prefix, "--train-iters", "2", "--eval-interval", "100",
             "--log-diagnostics-interval", "0", "--save", str(run / "checkpoints"))  # fmt: skip
    return str(run)


def _tampered_copy(trained_run: str, tmp_path, kind: str) -> tuple[str, str]:
    run = str(tmp_path / "run")
    shutil.copytree(trained_run, run)
    marker = str(tmp_path / "payload-ran")
    TAMPER[kind](os.path.join(run, "checkpoints", "iter_0000002"), marker)
    return run, marker


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(TAMPER))
def test_offline_commands_refuse_tampered_checkpoint(trained_run, demo_prefix, tmp_path, kind):
    from megatron_gamma.diagnostics.analyze import analyze
    from megatron_gamma.diagnostics.compare import compare
    from megatron_gamma.evaluation.evaluate import evaluate
    from megatron_gamma.hf.hf_export import export_hf

    run, marker = _tampered_copy(trained_run, tmp_path, kind)
    commands = {
        "export-hf": lambda: export_hf(run, str(tmp_path / "hf")),
        "evaluate": lambda: evaluate(run, [demo_prefix], eval_tokens=2 * 64),
        "analyze": lambda: analyze([run], str(tmp_path / "analysis"), progress=False),
        "compare": lambda: compare(
            trained_run, run, demo_prefix, str(tmp_path / "cmp"), num_sequences=2, progress=False
        ),
    }
    for name, command in commands.items():
        with pytest.raises(CheckpointError, match=TAMPERED) as err:
            command()
        assert "iter_0000002" in str(err.value), name
        assert "weights_only" not in str(err.value), name
        assert not os.path.exists(marker), name
    assert not os.path.exists(tmp_path / "hf")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(TAMPER))
def test_pretrain_refuses_tampered_checkpoint(trained_run, demo_prefix, tmp_path, kind):
    run, marker = _tampered_copy(trained_run, tmp_path, kind)
    load = "--load" if kind != "metadata" else "--pretrained-checkpoint"
    args = ["pretrain", "--data-path", demo_prefix, "--run-dir", str(tmp_path / "next")]
    proc = run_cli(
        [*args, *TINY_MODEL, "--train-iters", "2", load, os.path.join(run, "checkpoints")]
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert TAMPERED in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not os.path.exists(marker)


def test_every_checkpoint_read_goes_through_checkpoint_trust():
    """No module but checkpoint_trust unpickles a file: megatron-core's loaders, torch.load and
    pickle.load are called there only (a new reader elsewhere would bypass the checks)."""
    import re

    import megatron_gamma

    pattern = re.compile(r"dist_checkpointing\.load\w*\(|torch\.load\(|pickle\.load\(")
    root = os.path.dirname(megatron_gamma.__file__)
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and name != "checkpoint_trust.py":
                with open(path, encoding="utf-8") as f:
                    found += [f"{path}: {m.group()}" for m in pattern.finditer(f.read())]
    assert not found, found


def _damaged_copy(trained_run: str, tmp_path, damage) -> str:
    """A copy of ``trained_run`` whose checkpoint ``damage(iter_0000002 directory)`` changed."""
    run = str(tmp_path / "run")
    shutil.copytree(trained_run, run)
    damage(os.path.join(run, "checkpoints", "iter_0000002"))
    return run


def _truncate_shard(ckpt: str) -> None:
    with open(os.path.join(ckpt, "__0_0.distcp"), "r+b") as f:
        f.truncate(1000)


def _garble_config(ckpt: str) -> None:
    with open(os.path.join(ckpt, "metadata.json"), "w") as f:
        f.write("{bad\n")


DAMAGE = {
    "truncated shard": (
        _truncate_shard,
        "__0_0.distcp': unreadable (truncated: unexpected end of file at byte 1,000, where the "
        "checkpoint's .metadata places data up to byte ",
    ),
    "garbled metadata.json": (
        _garble_config,
        "metadata.json': damaged, not megatron-core's checkpoint config (JSONDecodeError: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)). Fix: ",
    ),
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_checkpoint_file_is_named_in_one_line_with_the_fix(
    trained_run, demo_prefix, tmp_path, kind
):
    """evaluate and pretrain --load name the damaged file (a truncated ``*.distcp``, a garbled
    ``metadata.json``), what is wrong and the fix in one line, not torch's CheckpointException
    with every rank's traceback in its text, nor a bare JSON error."""
    from megatron_gamma.evaluation.evaluate import evaluate

    damage, said = DAMAGE[kind]
    run = _damaged_copy(trained_run, tmp_path, damage)
    ckpt = os.path.join(run, "checkpoints", "iter_0000002")
    with pytest.raises(CheckpointError) as err:
        evaluate(run, [demo_prefix], eval_tokens=2 * 64)
    message = str(err.value)
    assert f"checkpoint file '{ckpt}{os.sep}" in message and said in message, message
    assert "\n" not in message and "Fix: use a complete checkpoint" in message, message
    args = ["pretrain", "--data-path", demo_prefix, "--run-dir", str(tmp_path / "next")]
    args += [*TINY_MODEL, "--train-iters", "3", "--override-opt-param-scheduler"]
    proc = run_cli([*args, "--load", os.path.join(run, "checkpoints")])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize(
    "text, why",
    [
        ("{bad", "JSONDecodeError: Expecting property name"),
        ("[1]", "ValueError: a JSON list, not an object"),
        ('{"backend": 1}', "TypeError: "),
    ],
)
def test_a_damaged_metadata_json_is_named_with_the_fix(tmp_path, text, why):
    from megatron_gamma.checkpoint_trust import check_config

    (tmp_path / "metadata.json").write_text(text)
    with pytest.raises(CheckpointError) as err:
        check_config(str(tmp_path))
    want = f"checkpoint file {str(tmp_path / 'metadata.json')!r}: damaged, not megatron-core's "
    assert str(err.value).startswith(f"{want}checkpoint config ({why}"), str(err.value)
    assert "Fix: use a complete checkpoint" in str(err.value)
    (tmp_path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    check_config(str(tmp_path))


def test_the_common_strategys_object_files_load_weights_only_whatever_the_environment(
    tmp_path, monkeypatch
):
    """megatron-core's common strategy reads the `KEY.pt` object files of a checkpoint whose
    objects are not in `*.distcp` with a bare `torch.load`, which TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
    turns into a full unpickler (trust audit, 2026-12-06). With the reader patch installed it
    reads weights only: the payload is refused and does not run; a plain tensor still loads.
    The reference: the same file through torch.load under that variable runs the payload."""
    from megatron.core.dist_checkpointing import ShardedObject
    from megatron.core.dist_checkpointing.strategies import common

    from megatron_gamma.checkpoint_trust import TrustedCommonLoadStrategy
    from megatron_gamma.compat import patch_checkpoint_reader

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "payload-ran"
    obj = ShardedObject("rng", None, (1,), (0,))
    (tmp_path / f"{obj.unique_key}.pt").parent.mkdir(parents=True, exist_ok=True)
    torch.save(_Payload(str(marker)), tmp_path / f"{obj.unique_key}.pt")
    patch_checkpoint_reader()
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        TrustedCommonLoadStrategy().load_sharded_objects({"rng": obj}, str(tmp_path))
    assert not marker.exists()
    torch.save(torch.arange(3), tmp_path / f"{obj.unique_key}.pt")
    loaded = {"rng": ShardedObject("rng", None, (1,), (0,))}
    TrustedCommonLoadStrategy().load_sharded_objects(loaded, str(tmp_path))
    assert torch.equal(loaded["rng"], torch.arange(3))
    torch.save(_Payload(str(marker)), tmp_path / "plain.pt")
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        torch.load(tmp_path / "plain.pt")
    assert marker.exists() and common.torch.load is not torch.load
