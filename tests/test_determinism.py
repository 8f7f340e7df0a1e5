"""Megatron-LM's ``--deterministic-mode``: the environment it accepts and refuses (Megatron-LM's
``megatron/training/determinism.py`` rules), what it sets, megatron-core's
``TransformerConfig.deterministic_mode``, and a CPU run with it against one without it."""

import pytest
import torch
from helpers import TINY_MODEL, pretrain, read_metrics, run_cli

from megatron_gamma import cli
from megatron_gamma.config import ConfigError, load_config, overrides_from_args
from megatron_gamma.determinism import apply_deterministic_mode, check_determinism_env
from megatron_gamma.model.builder import transformer_config


@pytest.fixture
def torch_deterministic_restored():
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"NCCL_ALGO": "Ring"},
        {"NCCL_ALGO": "CollnetDirect, ^NVLS"},
        {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"},
    ],
)
def test_deterministic_settings_and_unset_variables_are_accepted(env):
    check_determinism_env(env)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"NCCL_ALGO": "Tree"}, "NCCL_ALGO='Tree'"),
        ({"NCCL_ALGO": "Ring,Tree"}, "NCCL_ALGO='Ring,Tree'"),
        ({"NCCL_ALGO": " , "}, "NCCL_ALGO=' , '"),
        ({"CUBLAS_WORKSPACE_CONFIG": ":0:0"}, "CUBLAS_WORKSPACE_CONFIG=':0:0'"),
        ({"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"}, "NVTE_ALLOW_NONDETERMINISTIC_ALGO='1'"),
    ],
)
def test_a_nondeterministic_setting_is_refused_naming_it_and_the_fix(env, named):
    with pytest.raises(ConfigError) as e:
        check_determinism_env(env)
    message = str(e.value)
    assert message.startswith(f"deterministic_mode=True: {named} (")
    assert "Fix: unset the variable (deterministic_mode sets NCCL_ALGO=Ring," in message


def test_two_bad_settings_are_named_together():
    env = {"NCCL_ALGO": "Tree", "CUBLAS_WORKSPACE_CONFIG": ":1:1"}
    with pytest.raises(ConfigError) as e:
        check_determinism_env(env)
    assert "NCCL_ALGO='Tree'" in str(e.value) and "CUBLAS_WORKSPACE_CONFIG=':1:1'" in str(e.value)


def test_apply_sets_what_is_unset_keeps_what_is_set_and_turns_torch_deterministic(
    torch_deterministic_restored,
):
    torch.use_deterministic_algorithms(False)
    env = {"NCCL_ALGO": "CollnetChain", "PATH": "/bin"}
    line = apply_deterministic_mode(env)
    assert env == {
        "NCCL_ALGO": "CollnetChain",
        "PATH": "/bin",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    }
    assert torch.are_deterministic_algorithms_enabled()
    assert line == (
        "deterministic mode: torch.use_deterministic_algorithms(True), NCCL_ALGO=CollnetChain, "
        "CUBLAS_WORKSPACE_CONFIG=:4096:8, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0"
    )


def test_a_refused_setting_changes_nothing(torch_deterministic_restored):
    torch.use_deterministic_algorithms(False)
    env = {"NCCL_ALGO": "Tree"}
    with pytest.raises(ConfigError):
        apply_deterministic_mode(env)
    assert env == {"NCCL_ALGO": "Tree"} and not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize(("argv", "expected"), [([], False), (["--deterministic-mode"], True)])
def test_the_flag_reaches_megatron_cores_transformer_config(argv, expected):
    cfg = load_config(None, overrides_from_args(cli.parse_args(["pretrain", *argv])))
    assert cfg.training.deterministic_mode is expected
    assert transformer_config(cfg, on_gpu=False).deterministic_mode is expected


def test_pretrain_refuses_a_nondeterministic_environment_before_training(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    run_dir = tmp_path / "run"
    assert cli.main(["pretrain", "--deterministic-mode", "--run-dir", str(run_dir)]) == 2
    assert "deterministic_mode=True: NCCL_ALGO='Tree' (" in capsys.readouterr().err
    assert not run_dir.exists()


@pytest.mark.slow
def test_a_deterministic_cpu_run_repeats_bit_exactly_and_matches_the_run_without_the_mode(
    demo_prefix, tmp_path
):
    """Two runs with the mode give the same bits, every loss and gradient norm, and the run
    states the settings it ran under. Against a run without the mode they agree to float32
    rounding, not bit for bit: megatron-core's ``deterministic_mode`` looks the embedding up by
    indexing (``weight[ids]``) rather than ``F.embedding``, and the backward of indexing sums a
    repeated token's gradients in another order (on a sixth 2-core host the training loss of
    iteration 6 differed in its last float32 bit, with megatron-core's setting alone as with the
    whole mode, and not with torch's deterministic algorithms alone)."""
    flags = ["--train-iters", "6", "--eval-interval", "3"]
    plain = pretrain(tmp_path / "plain", demo_prefix, *flags)
    runs = []
    for name in ("deterministic", "again"):
        run_dir = tmp_path / name
        args = ["pretrain", "--data-path", demo_prefix, "--run-dir", str(run_dir), *TINY_MODEL]
        proc = run_cli([*args, *flags, "--deterministic-mode"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (
            "deterministic mode: torch.use_deterministic_algorithms(True), NCCL_ALGO=Ring, "
            "CUBLAS_WORKSPACE_CONFIG=:4096:8, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0\n" in proc.stdout
        )
        assert "deterministic_mode: true" in (run_dir / "config.yaml").read_text()
        runs.append(read_metrics(run_dir))
    assert len(plain["train"]) == 6 and runs[0] == runs[1]
    for split, values in plain.items():
        assert runs[0][split].keys() == values.keys()
        for it, value in values.items():
            assert runs[0][split][it] == pytest.approx(value, rel=1e-6, abs=0), (split, it)
