"""The main job end to end through the CLI: learning, resume, and configuration errors."""

import os

import pytest
import yaml
from conftest import pretrain, run_cli

from megatron_gamma.config import ConfigError, load_config


@pytest.mark.timeout(300)
def test_demo_pipeline_learns(tmp_path, demo_prefix):
    ckpt = str(tmp_path / "run" / "checkpoints")
    metrics = pretrain(
        tmp_path / "run", demo_prefix, "--train-iters", "40", "--eval-interval", "20", "--save", ckpt
    )
    first_loss = metrics["train"][1]  # iteration 1's loss is measured at initialization
    assert first_loss == pytest.approx(8.3178, abs=0.05)  # ln(4096): gamma=1 outputs ~uniform
    assert metrics["valid"][40] <= first_loss - 1.0
    assert os.path.isdir(tmp_path / "run" / "checkpoints" / "iter_0000040")
    assert os.path.isfile(tmp_path / "run" / "config.yaml")
    assert any(
        f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "run" / "tensorboard")
    )


@pytest.mark.timeout(400)
def test_resume_reproduces_uninterrupted_losses(tmp_path, demo_prefix):
    flags = ["--train-iters", "20", "--eval-interval", "100", "--hidden-dropout", "0.1"]
    full = pretrain(tmp_path / "full", demo_prefix, *flags)
    ckpt = str(tmp_path / "ckpt")
    pretrain(tmp_path / "first", demo_prefix, *flags, "--exit-interval", "10", "--save", ckpt)
    resumed = pretrain(tmp_path / "second", demo_prefix, *flags, "--load", ckpt, "--save", ckpt)
    assert sorted(resumed["train"]) == list(range(11, 21))
    for it in range(11, 21):
        assert resumed["train"][it] == full["train"][it], it
    assert sorted(os.listdir(ckpt)) == [
        "iter_0000010",
        "iter_0000020",
        "latest_checkpointed_iteration.txt",
    ]


def test_bad_values_name_key_value_and_fix(tmp_path):
    cases = {
        "init_gamma": ({"init_gamma": 0.0}, "init_gamma=0.0"),
        "hidden": ({"hidden_size": 100, "num_attention_heads": 3}, "hidden_size=100"),
        "unknown": ({"hiden_size": 64}, "did you mean 'hidden_size'"),
    }
    for name, (overrides, message) in cases.items():
        with pytest.raises(ConfigError, match=message) as err:
            load_config(None, overrides)
        assert "Fix:" in str(err.value), name


def test_unknown_yaml_key_and_section(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"num_layer": 2}}))
    with pytest.raises(ConfigError, match="model.num_layer.*did you mean 'num_layers'"):
        load_config(str(path))
    path.write_text(yaml.safe_dump({"modle": {}}))
    with pytest.raises(ConfigError, match="section modle.*did you mean 'model'"):
        load_config(str(path))


def test_cli_reports_config_errors_before_training(tmp_path):
    missing = str(tmp_path / "nowhere" / "data_text_document")
    proc = run_cli(["pretrain", "--data-path", missing, "--run-dir", str(tmp_path / "r")])
    assert proc.returncode == 2
    assert "data_path" in proc.stderr and "does not exist" in proc.stderr
    proc = run_cli(["pretrain", "--run-dir", str(tmp_path / "r")])
    assert proc.returncode == 2 and "data_path=[]" in proc.stderr
    proc = run_cli(["pretrain", "--init-gamma", "-1", "--data-path", missing])
    assert proc.returncode == 2 and "init_gamma=-1.0" in proc.stderr
    assert not os.path.exists(tmp_path / "r")
