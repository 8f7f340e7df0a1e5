"""``cluster.env`` values (tokens, API keys) never leave in clear: not in a run's config.yaml, its
W&B run, its log, or an ``export-hf`` directory, which also records no path of this host. Names
are kept, values redacted."""

from __future__ import annotations

import glob
import json
import os

import pytest
import yaml
from conftest import TINY_MODEL, run_cli

from megatron_gamma.config import REDACTED, load_config
from megatron_gamma.config.effects import no_effect_warnings
from megatron_gamma.hf.hf_export import export_hf
from megatron_gamma.hf.hf_import import import_hf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRETS = {"HF_TOKEN": "secret123", "WANDB_API_KEY": "secret456"}


def _files_holding(root, needles: list[str]) -> list[str]:
    """Files under ``root`` whose bytes hold any of ``needles``."""
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                data = f.read()
            out += [os.path.join(dirpath, name) for s in needles if s.encode() in data]
    return out


def _strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


@pytest.mark.slow
def test_cluster_env_values_reach_no_config_wandb_log_or_export(
    tmp_path, tmp_path_factory, demo_prefix, monkeypatch
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = tmp_path / "secret.yaml"
    config.write_text(yaml.safe_dump({"cluster": {"env": SECRETS}}))
    run = tmp_path / "run"
    args = ["pretrain", "--config", str(config), "--data-path", demo_prefix, "--run-dir", str(run)]
    args += [*TINY_MODEL, "--train-iters", "2", "--eval-interval", "100"]
    args += ["--save", str(run / "checkpoints"), "--wandb-project", "secrets-test"]
    proc = run_cli(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    secrets = list(SECRETS.values())
    assert not [s for s in secrets if s in proc.stdout + proc.stderr]  # the log
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["cluster"]["env"] == dict.fromkeys(SECRETS, REDACTED)  # names kept
    (wandb_run,) = glob.glob(str(run / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    with open(wandb_run, "rb") as f:
        assert b"HF_TOKEN" in f.read()  # W&B got the config, with the names
    assert _files_holding(run, secrets) == []  # config.yaml, W&B files, metrics, checkpoints

    out = tmp_path / "hf"
    export_hf(str(run), str(out))
    assert _files_holding(out, secrets) == []
    meta = json.loads((out / "megatron_gamma.json").read_text())
    assert meta["config"]["cluster"]["env"] == dict.fromkeys(SECRETS, REDACTED)
    assert meta["checkpoint"] == "iter_0000002"
    host = [str(tmp_path_factory.getbasetemp()), REPO, os.path.expanduser("~")]
    paths = [s for s in _strings(meta) if os.path.isabs(s) or any(h in s for h in host)]
    assert paths == []
    for name in os.listdir(out):  # nor any other file of the export
        if name.endswith((".json", ".py")):
            text = (out / name).read_text()
            assert not [h for h in host[:2] if h in text], name
    imported = import_hf(str(out), str(tmp_path / "imported"))  # and it still imports
    assert imported["iteration"] == 2
    again = yaml.safe_load((tmp_path / "imported" / "config.yaml").read_text())
    assert again["model"] == saved["model"] and again["training"] == saved["training"]


def test_no_effect_warning_names_environment_variables_without_values():
    cfg = load_config(None, {"env": ["HF_TOKEN=secret123"]})
    (line,) = no_effect_warnings(cfg, {"env": "flag"})
    assert line.startswith(f"env={{'HF_TOKEN': '{REDACTED}'}}: no effect")
    assert "secret123" not in line
