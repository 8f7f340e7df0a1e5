"""`megatron-gamma submit` / `submit-preprocess` without a cluster: checks that fail before
sbatch, dry runs, and the rendered scripts (bash syntax, the examples kept in sync).

A stand-in ``sbatch`` on PATH records whether it was ever called; the real submission path runs
against a real SLURM in tests/slurm/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from helpers import cli_env, read_dataset

from megatron_gamma.cli import main
from megatron_gamma.data import demo_dir
from megatron_gamma.launch.slurm import (
    PreprocessJob,
    PretrainJob,
    SubmitError,
    example_scripts,
    render_preprocess,
    render_pretrain,
    time_limit_seconds,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def sbatch_calls(tmp_path, monkeypatch):
    """Put a stand-in ``sbatch`` first on PATH; returns the file it appends its arguments to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch_calls.txt"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho 4242\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


@pytest.fixture
def config(tmp_path) -> str:
    """A small config whose dataset files exist (empty stand-ins are enough before sbatch)."""
    prefix = tmp_path / "data" / "demo_text_document"
    prefix.parent.mkdir()
    for ext in (".bin", ".idx"):
        (tmp_path / "data" / f"demo_text_document{ext}").write_bytes(b"")
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4},
                "parallel": {"tensor_model_parallel_size": 2},
                "data": {"data_path": [str(prefix)]},
                "training": {"micro_batch_size": 2, "global_batch_size": 16},
                "logging": {"run_dir": str(tmp_path / "run")},
            }
        )
    )
    return str(path)


def test_time_limits_in_every_slurm_form():
    assert time_limit_seconds("30") == 30 * 60
    assert time_limit_seconds("30:15") == 30 * 60 + 15
    assert time_limit_seconds("04:00:00") == 4 * 3600
    assert time_limit_seconds("2-12") == 2 * 86400 + 12 * 3600
    assert time_limit_seconds("1-02:03") == 86400 + 2 * 3600 + 3 * 60
    assert time_limit_seconds("1-02:03:04") == 86400 + 2 * 3600 + 3 * 60 + 4
    for bad in ("", "4h", "1:2:3:4", "-5", "1-", "12::00"):
        with pytest.raises(SubmitError, match="time="):
            time_limit_seconds(bad)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--nodes", "0", "--gpus-per-node", "4"], "nodes=0: must be >= 1"),
        (["--nodes", "1", "--gpus-per-node", "3"], "gpus_per_node=3: not divisible by tensor_"),
        (["--nodes", "3", "--gpus-per-node", "2"], "3 x 2 = 6 processes do not fit"),
        (  # the fix names submit's own flags
            ["--nodes", "3", "--gpus-per-node", "2", "--pipeline-model-parallel-size", "2"],
            "Fix: launch a multiple of TP x PP processes (--nodes x --gpus-per-node) or lower",
        ),
        (["--nodes", "1", "--gpus-per-node", "4", "--time", "4h"], "time='4h'"),
        (["--nodes", "1", "--gpus-per-node", "4", "--time", "5"], "warning_seconds=300"),
        (["--nodes", "1", "--gpus-per-node", "4", "--container-mounts", "/a:/a"], "container_m"),
        (  # the fix gives the job its own load, not "drop --load" (a recipe's file sets it)
            ["--nodes", "1", "--gpus-per-node", "4", "--load", "/elsewhere"],
            "a requeued job resumes from --load. Fix: pass --load ",
        ),
    ],
)
def test_bad_submission_fails_before_sbatch(config, sbatch_calls, tmp_path, capsys, flags, message):
    assert main(["submit", "--config", config, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Fix:" in err, err
    assert not sbatch_calls.exists()
    assert not (tmp_path / "run").exists()


def test_missing_config_and_missing_data_fail_before_sbatch(config, sbatch_calls, tmp_path, capsys):
    missing = str(tmp_path / "nope.yaml")
    assert main(["submit", "--config", missing, "--nodes", "1", "--gpus-per-node", "2"]) == 2
    assert f"config={missing!r}: file not found" in capsys.readouterr().err
    args = ["submit", "--config", config, "--nodes", "1", "--gpus-per-node", "2"]
    assert main([*args, "--data-path", str(tmp_path / "absent")]) == 2
    assert "absent.bin does not exist" in capsys.readouterr().err
    assert not sbatch_calls.exists()


def test_submit_freezes_config_writes_script_and_calls_sbatch(
    config, sbatch_calls, tmp_path, capsys
):
    args = ["submit", "--config", config, "--nodes", "2", "--gpus-per-node", "4"]
    assert main([*args, "--train-iters", "7", "--partition", "gpu", "--time", "1:00:00"]) == 0
    out = capsys.readouterr().out
    slurm_dir = tmp_path / "run" / "slurm"
    script = slurm_dir / "pretrain.sbatch"
    assert f"script: {script}" in out
    assert f"submitted job 4242, log: {slurm_dir}/mg-run-4242.out" in out
    assert sbatch_calls.read_text().split() == ["--parsable", str(script)]
    frozen = yaml.safe_load((slurm_dir / "config.yaml").read_text())
    assert frozen["training"]["train_iters"] == 7
    ckpt = str(tmp_path / "run" / "checkpoints")
    assert frozen["checkpoint"]["save"] == frozen["checkpoint"]["load"] == ckpt
    text = script.read_text()
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1:00:00",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --requeue",
        f"#SBATCH --chdir={os.getcwd()}",
        f"CONFIG={slurm_dir}/config.yaml",
        f"CHECKPOINTS={ckpt}",
        "LAUNCHER=srun",
    ):
        assert line in text.splitlines(), line
    assert os.access(script, os.X_OK)


def test_dry_run_prints_the_script_and_writes_only_its_config(
    config, sbatch_calls, tmp_path, capsys
):
    args = ["submit", "--config", config, "--nodes", "2", "--gpus-per-node", "8", "--dry-run"]
    mounts = f"{os.getcwd()}:{os.getcwd()}"
    assert main([*args, "--launcher", "torchrun", "--container-image", "img.sqsh",
                 "--container-mounts", mounts]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert captured.out.startswith("#!/bin/bash\n")
    assert "#SBATCH --ntasks-per-node=1" in captured.out.splitlines()
    assert "CONTAINER_IMAGE=img.sqsh" in captured.out.splitlines()
    assert "warning" not in captured.err
    assert not sbatch_calls.exists()
    slurm_dir = tmp_path / "run" / "slurm"
    assert os.listdir(slurm_dir) == ["config.yaml"]  # the config the script references
    assert f"CONFIG={slurm_dir}/config.yaml" in captured.out.splitlines()
    frozen = yaml.safe_load((slurm_dir / "config.yaml").read_text())
    assert frozen["checkpoint"]["save"] == str(tmp_path / "run" / "checkpoints")


def test_an_ablation_does_not_replace_an_earlier_submissions_frozen_config(
    config, sbatch_calls, tmp_path, capsys
):
    """Trial 15: a recipe layered with an ablation and no --run-dir of its own froze the
    ablation into the baseline's slurm/config.yaml, which the baseline's pending or requeued
    job reads when it starts: it would have trained gamma = 0.5 as the baseline. Refused,
    dry run included, before anything is written; the same config again, or other job
    settings, pass, and so does any config after a dry run (no job reads its config);
    --overwrite replaces it with a warning."""
    raw = yaml.safe_load(open(config, encoding="utf-8"))
    raw["logging"]["run_dir"] = str(tmp_path / "runs" / "gpt")
    raw["checkpoint"] = {"save": str(tmp_path / "ckpt" / "gpt")}
    recipe, ablation = tmp_path / "gpt.yaml", tmp_path / "gamma-0.5.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    ablation.write_text(yaml.safe_dump({"init": {"init_gamma": 0.5}}))
    shape = ["--nodes", "1", "--gpus-per-node", "2"]
    base = ["submit", "--config", str(recipe), *shape]
    # trial 16: a dry run submits no job (it writes the config, no script): it blocks nothing
    assert main([*base, "--config", str(ablation), "--dry-run"]) == 0
    assert main(base) == 0
    slurm_dir = tmp_path / "runs" / "gpt" / "slurm"
    frozen, script = slurm_dir / "config.yaml", slurm_dir / "pretrain.sbatch"
    first = frozen.read_bytes(), script.read_bytes()
    assert main([*base, "--time", "2:00:00"]) == 0  # the same run again, with a longer limit
    assert frozen.read_bytes() == first[0] and "#SBATCH --time=2:00:00" in script.read_text()
    assert len(sbatch_calls.read_text().splitlines()) == 2
    capsys.readouterr()
    script_before = script.read_bytes()
    layered = [*base, "--config", str(ablation)]
    for dry_run in ([], ["--dry-run"]):
        assert main([*layered, *dry_run]) == 2
        err = capsys.readouterr().err
        run_dir, sibling = tmp_path / "runs" / "gpt-gamma-0.5", tmp_path / "ckpt" / "gpt-gamma-0.5"
        assert (
            f"error: run_dir={str(tmp_path / 'runs' / 'gpt')!r}: {frozen} holds the config of an "
            "earlier submission, which this one would replace with other settings: "
            "init_gamma=0.5 (it holds 1.0). A pending or requeued job of that submission reads "
            f"it when it starts, so it would train these settings under its name, run directory "
            f"and checkpoints. Fix: pass --run-dir {run_dir} --save {sibling} to submit a run of "
            "its own, or add --overwrite"
        ) in err, err
        assert frozen.read_bytes() == first[0] and script.read_bytes() == script_before
        assert sorted(os.listdir(slurm_dir)) == ["config.yaml", "pretrain.sbatch"]
    assert len(sbatch_calls.read_text().splitlines()) == 2
    assert main([*layered, "--run-dir", str(run_dir), "--save", str(sibling)]) == 0  # the fix
    own = yaml.safe_load((run_dir / "slurm" / "config.yaml").read_text())
    assert own["init"]["init_gamma"] == 0.5 and own["checkpoint"]["load"] == str(sibling)
    assert yaml.safe_load(frozen.read_text())["init"]["init_gamma"] == 1.0
    capsys.readouterr()
    assert main([*layered, "--overwrite"]) == 0
    assert f"warning: --overwrite: {frozen}, the config of an earlier submission, is replaced" in (
        capsys.readouterr().err
    )
    assert yaml.safe_load(frozen.read_text())["init"]["init_gamma"] == 0.5


def test_finetune_from_another_directory_is_submitted_as_a_pretrained_checkpoint(
    config, sbatch_calls, tmp_path, capsys
):
    """Megatron-LM's --finetune --load SRC would reload SRC at iteration 0 on every requeue; the
    job takes SRC's weights once (--pretrained-checkpoint) and resumes from its own saves."""
    src = tmp_path / "pretrained"
    args = ["submit", "--config", config, "--nodes", "1", "--gpus-per-node", "2", "--dry-run"]
    assert main([*args, "--finetune", "--load", str(src)]) == 0
    err = capsys.readouterr().err
    assert f"--finetune --load {src}: submitted as --pretrained-checkpoint {src}" in err
    assert f"{src} does not exist on this host; the job needs it on the cluster" in err
    frozen = yaml.safe_load((tmp_path / "run" / "slurm" / "config.yaml").read_text())["checkpoint"]
    assert frozen["finetune"] is False and frozen["pretrained_checkpoint"] == str(src)
    assert frozen["load"] == frozen["save"] == str(tmp_path / "run" / "checkpoints")
    both = ["--finetune", "--load", str(src), "--pretrained-checkpoint", str(tmp_path / "other")]
    assert main([*args, *both]) == 2
    assert "two checkpoints to take the weights from" in capsys.readouterr().err
    real = ["submit", "--config", config, "--nodes", "1", "--gpus-per-node", "2"]
    assert main([*real, "--pretrained-checkpoint", str(src)]) == 2
    assert f"pretrained_checkpoint='{src}': does not exist" in capsys.readouterr().err
    assert not sbatch_calls.exists()
    own = ["--finetune", "--load", str(tmp_path / "run" / "checkpoints")]
    assert main([*args, *own]) == 2
    assert "every requeue would take the weights of its newest" in capsys.readouterr().err


def test_dry_run_of_a_cluster_recipe_warns_for_paths_absent_here(tmp_path, capsys, monkeypatch):
    """The 1.5B recipe's data lives on the cluster: a dry run renders it, one warning per path,
    with nodes and GPUs per node from the recipe's cluster: section."""
    monkeypatch.chdir(tmp_path)
    recipe = os.path.join(REPO, "examples", "configs", "gpt-1.5b.yaml")
    with open(recipe, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    run = ["--run-dir", str(tmp_path / "r")]
    assert main(["submit", "--config", recipe, *run, "--dry-run"]) == 2  # the recipe's checkpoints
    assert f"--save {raw['checkpoint']['save']} --load " in capsys.readouterr().err
    own = ["--save", str(tmp_path / "ck"), "--load", str(tmp_path / "ck")]
    assert main(["submit", "--config", recipe, *run, *own, "--dry-run"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert f"#SBATCH --nodes={raw['cluster']['slurm_nodes']}" in lines
    assert f"#SBATCH --gpus-per-node={raw['cluster']['slurm_gpus_per_node']}" in lines
    items = raw["data"].get("data_path") or raw["data"]["train_data_path"]
    prefixes = items if len(items) == 1 else items[1::2]
    for prefix in prefixes:
        for ext in (".bin", ".idx"):
            assert f"warning: {prefix}{ext} does not exist on this host" in captured.err
    assert (tmp_path / "r" / "slurm" / "config.yaml").is_file()


def test_nodes_come_from_the_flag_or_the_config(config, sbatch_calls, tmp_path, capsys):
    base = ["submit", "--config", config, "--dry-run"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "nodes=None: neither --nodes nor the config's cluster.slurm_nodes" in err
    assert main([*base, "--slurm-nodes", "2", "--slurm-gpus-per-node", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --gpus-per-node=4" in lines
    with open(config, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    raw["cluster"] = {"slurm_nodes": 2, "slurm_gpus_per_node": 4}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(raw))
    recipe = ["submit", "--config", str(tmp_path / "cluster.yaml"), "--dry-run"]
    assert main([*recipe, "--nodes", "1", "--gpus-per-node", "2"]) == 0  # flags beat the recipe
    lines = capsys.readouterr().out.splitlines()
    assert "#SBATCH --nodes=1" in lines and "#SBATCH --gpus-per-node=2" in lines
    frozen = yaml.safe_load((tmp_path / "run" / "slurm" / "config.yaml").read_text())["cluster"]
    assert (frozen["slurm_nodes"], frozen["slurm_gpus_per_node"]) == (1, 2)  # the job's, not 2 x 4
    assert main([*base, "--nodes", "1", "--slurm-nodes", "3"]) == 2
    assert "--nodes 1 and --slurm-nodes 3: two counts for the same job" in capsys.readouterr().err
    assert main([*base, "--gpus-per-node", "2", "--slurm-gpus-per-node", "2", "--nodes", "1"]) == 0


def test_account_qos_dependency_and_environment(config, sbatch_calls, tmp_path, capsys):
    with open(config, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    raw["cluster"] = {"env": {"NCCL_IB_TIMEOUT": "20", "HF_HOME": "/cache/hf"}}
    layered = tmp_path / "layered.yaml"
    layered.write_text(yaml.safe_dump(raw))
    args = ["submit", "--config", str(layered), "--nodes", "1", "--gpus-per-node", "2"]
    flags = ["--account", "proj42", "--qos", "high", "--dependency", "singleton",
             "--env", "NCCL_IB_TIMEOUT=22", "--env", "NCCL_SOCKET_IFNAME=ib0,ib1"]  # fmt: skip
    assert main([*args, *flags, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for line in (
        "#SBATCH --account=proj42",
        "#SBATCH --qos=high",
        "#SBATCH --dependency=singleton",
    ):
        assert line in lines, line
    exports = [line for line in lines if line.startswith("export ") and "=" in line]
    assert exports == [
        "export PYTHONFAULTHANDLER=1",
        "export NCCL_DEBUG=WARN",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1",  # the config has tensor_model_parallel_size 2
        "export HF_HOME='<redacted>'",  # the config's cluster.env (its YAML keys sorted); the
        "export NCCL_IB_TIMEOUT='<redacted>'",  # values given are not printed
        "export NCCL_SOCKET_IFNAME='<redacted>'",
    ]
    script = tmp_path / "run" / "slurm" / "pretrain.sbatch"
    assert lines[5:8] == [  # the printout says it is not the script to submit, and where that is
        "# DRY RUN: the values of HF_HOME, NCCL_IB_TIMEOUT, NCCL_SOCKET_IFNAME are printed as "
        "<redacted>;",
        "# do not submit this printout. `megatron-gamma submit` without --dry-run writes the "
        "script",
        f"# with them to {script}.",
    ]
    assert main([*args, *flags]) == 0  # the script submitted holds them
    lines = (tmp_path / "run" / "slurm" / "pretrain.sbatch").read_text().splitlines()
    assert [line for line in lines if line.startswith("export ") and "=" in line][3:] == [
        "export HF_HOME=/cache/hf",
        "export NCCL_IB_TIMEOUT=22",  # --env overrides the config's value
        "export NCCL_SOCKET_IFNAME=ib0,ib1",
    ]
    tp1 = ["--tensor-model-parallel-size", "1", "--run-dir", str(tmp_path / "tp1")]
    assert main([*args, *tp1, "--dry-run"]) == 0  # another run: "run" holds TP 2's config
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in capsys.readouterr().out
    for bad, message in (
        (["--dependency", "after"], "dependency='after': not a SLURM dependency"),
        (["--env", "NOEQUALS"], "env='NOE... (8 characters)': expected KEY=VALUE (the item"),
        (["--env", "hf_secret_token"], "env='hf_... (15 characters)': expected KEY=VALUE"),
        (["--env", "1BAD=x"], "env='1BAD': not a shell variable name"),
    ):
        assert main([*args, *bad, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert message in err and "secret_token" not in err


def test_container_workdir_outside_the_mounts_is_a_warning(config, sbatch_calls, tmp_path, capsys):
    args = ["submit", "--config", config, "--nodes", "1", "--gpus-per-node", "2", "--dry-run"]
    assert main([*args, "--container-image", "img.sqsh", "--container-mounts", "/data:/data"]) == 0
    err = capsys.readouterr().err
    assert (
        f"megatron-gamma submit: warning: the working directory {os.getcwd()} is not in "
        "--container-mounts '/data:/data';" in err
    )
    parent = os.path.dirname(os.getcwd())
    assert main([*args, "--container-image", "i", "--container-mounts", f"{parent}:{parent}"]) == 0
    assert "working directory" not in capsys.readouterr().err
    tok = os.path.join(demo_dir(), "tokenizer.json")
    pre = [
        "submit-preprocess",
        "--input",
        tok,
        "--tokenizer-model",
        tok,
        "--num-shards",
        "1",
        "--output-prefix",
        str(tmp_path / "o"),
        "--container-image",
        "i",
        "--dry-run",
    ]
    assert main(pre) == 0
    assert (
        f"megatron-gamma submit-preprocess: warning: the working directory {os.getcwd()} is not "
        "in the container (no --container-mounts); " in capsys.readouterr().err
    )


def test_submit_preprocess_submits_array_then_dependent_merge(sbatch_calls, tmp_path, capsys):
    inputs = [os.path.join(demo_dir(), f) for f in ("zh.jsonl", "en.jsonl")]
    tok = os.path.join(demo_dir(), "tokenizer.json")
    prefix = tmp_path / "out" / "corpus"
    args = ["submit-preprocess", "--input", *inputs, "--tokenizer-model", tok]
    assert main([*args, "--output-prefix", str(prefix), "--num-shards", "2"]) == 0
    out = capsys.readouterr().out
    script = tmp_path / "out" / "slurm" / "preprocess-corpus.sbatch"
    logs = tmp_path / "out" / "slurm"
    array_call, merge_call = sbatch_calls.read_text().splitlines()
    assert array_call.split() == [
        "--parsable", "--array=0-1", f"--output={logs}/%x-%A_%a.out", str(script), "shard",
    ]  # fmt: skip
    assert merge_call.split() == [
        "--parsable", "--dependency=afterok:4242", "--kill-on-invalid-dep=yes",
        f"--output={logs}/%x-merge-%j.out", str(script), "merge",
    ]  # fmt: skip
    assert out.count("submitted job 4242") == 2
    text = script.read_text()
    assert f"OUTPUT_PREFIX={prefix}" in text.splitlines()
    assert "NUM_SHARDS=2" in text.splitlines()
    assert '--shard-index "$SHARD" --num-shards "$NUM_SHARDS"' in text


def _run_by_hand(script, num_shards: int) -> list[subprocess.CompletedProcess]:
    """Run a submit-preprocess script's array tasks (the last first) and then its merge job on
    this machine, as SLURM would; each must succeed."""
    env = dict(cli_env(), SLURMD_NODENAME="node1", PYTHON=sys.executable)
    jobs = []
    for task in [*reversed(range(num_shards)), None]:
        mode = "merge" if task is None else "shard"
        task_env = env if task is None else {**env, "SLURM_ARRAY_TASK_ID": str(task)}
        job = subprocess.run(["bash", str(script), mode], env=task_env, capture_output=True,
                             text=True)  # fmt: skip
        assert job.returncode == 0, job.stdout + job.stderr
        jobs.append(job)
    return jobs


def test_the_array_and_merge_write_what_a_local_sharded_run_writes(sbatch_calls, tmp_path, capsys):
    """The written script's shard tasks and merge job, run by hand: the merged dataset, its
    statistics and blend are those of `preprocess --num-shards 2` (the job wrote PREFIX.bin/.idx,
    without statistics or blend)."""
    inputs = [os.path.join(demo_dir(), f) for f in ("zh.jsonl", "en.jsonl")]
    tok = os.path.join(demo_dir(), "tokenizer.json")
    local, prefix = tmp_path / "local" / "c", tmp_path / "sp" / "c"
    flags = ["--input", *inputs, "--tokenizer-model", tok, "--num-shards", "2"]
    assert main(["preprocess", *flags, "--output-prefix", str(local), "--no-progress"]) == 0
    assert main(["submit-preprocess", *flags, "--output-prefix", str(prefix)]) == 0
    assert capsys.readouterr().out.endswith(
        f"outputs, as preprocess --num-shards 2 writes them: {prefix}_*.bin/.idx and "
        f"{prefix}.stats.json, whose data_path is the blend for --data-path (the merge job's "
        "log prints it)\n"
    )
    *_, merge = _run_by_hand(tmp_path / "sp" / "slurm" / "preprocess-c.sbatch", 2)
    assert f"blend: --data-path {prefix}_text_document\n" in merge.stdout
    assert read_dataset(f"{prefix}_text_document") == read_dataset(f"{local}_text_document")
    with open(f"{local}.stats.json") as a, open(f"{prefix}.stats.json") as b:
        assert a.read().replace(str(local), str(prefix)) == b.read()
    assert sorted(os.listdir(tmp_path / "sp")) == sorted(os.listdir(tmp_path / "local")) + ["slurm"]


def test_preprocess_flags_reach_every_task_and_give_the_local_runs_outputs(
    sbatch_calls, tmp_path, capsys
):
    """--per-language, a filter, --on-error, --log-interval and --chunk-size were 'unrecognized
    arguments' for submit-preprocess: with them the array writes the outputs and statistics of
    `preprocess` given the same flags, and each task logs its progress."""
    inputs = [os.path.join(demo_dir(), f) for f in ("zh.jsonl", "en.jsonl")]
    tok = os.path.join(demo_dir(), "tokenizer.json")
    local, prefix = tmp_path / "local" / "c", tmp_path / "sp" / "c"
    flags = ["--input", *inputs, "--tokenizer-model", tok, "--num-shards", "2", "--per-language"]
    flags += [
        "--min-chars",
        "300",
        "--on-error",
        "skip",
        "--log-interval",
        "20",
        "--chunk-size",
        "1",
    ]
    assert main(["preprocess", *flags, "--output-prefix", str(local), "--no-progress"]) == 0
    assert main(["submit-preprocess", *flags, "--output-prefix", str(prefix)]) == 0
    shard1, shard0, merge = _run_by_hand(tmp_path / "sp" / "slurm" / "preprocess-c.sbatch", 2)
    with open(f"{local}.stats.json") as a, open(f"{prefix}.stats.json") as b:
        want, got = json.loads(a.read().replace(str(local), str(prefix))), json.load(b)
    assert got == want
    assert sorted(got["outputs"]) == ["en_text_document", "zh_text_document"]
    assert got["languages"]["zh"]["dropped"]["min_chars"] == 5
    for name in got["outputs"]:
        assert read_dataset(f"{prefix}_{name}") == read_dataset(f"{local}_{name}")
    assert f"blend: --data-path {' '.join(got['data_path'])}\n" in merge.stdout
    for i, shard in ((0, shard0), (1, shard1)):
        assert f"INFO: shard {i}/2: Processed 20 documents (" in shard.stderr, shard.stderr


def test_one_shard_is_one_task_and_no_merge_job(sbatch_calls, tmp_path, capsys):
    tok = os.path.join(demo_dir(), "tokenizer.json")
    args = ["submit-preprocess", "--input", os.path.join(demo_dir(), "en.jsonl")]
    assert main([*args, "--tokenizer-model", tok, "--output-prefix", str(tmp_path / "o" / "c"),
                 "--num-shards", "1"]) == 0  # fmt: skip
    assert [c.split()[1] for c in sbatch_calls.read_text().splitlines()] == ["--array=0-0"]
    assert capsys.readouterr().out.count("submitted job") == 1
    script = tmp_path / "o" / "slurm" / "preprocess-c.sbatch"
    merge = subprocess.run(["bash", str(script), "merge"], capture_output=True, text=True)
    assert merge.returncode == 0, merge.stderr
    assert merge.stdout == f"1 shard: its task wrote {tmp_path / 'o' / 'c'}, nothing to merge\n"
    calls = sbatch_calls.read_text()
    as_job = dict(os.environ, SLURM_JOB_ID="7", SLURM_JOB_NAME="mg-prep-c")  # sbatch THIS_FILE
    refused = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=as_job)
    assert refused.returncode == 2 and sbatch_calls.read_text() == calls  # submitted nothing
    assert "error: this file ran as SLURM job 7 without a mode (sbatch THIS_FILE)" in (
        refused.stderr
    )
    in_salloc = dict(as_job, SLURM_JOB_NAME="interactive")  # bash THIS_FILE in an allocation
    again = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=in_salloc)
    assert again.returncode == 0, again.stderr
    assert sbatch_calls.read_text().count("--array=0-0") == calls.count("--array=0-0") + 1


def test_submit_preprocess_checks_before_sbatch(sbatch_calls, tmp_path, capsys):
    tok = os.path.join(demo_dir(), "tokenizer.json")
    base = ["submit-preprocess", "--tokenizer-model", tok, "--output-prefix", str(tmp_path / "o")]
    assert main([*base, "--input", str(tmp_path / "none.jsonl"), "--num-shards", "2"]) == 2
    assert "none.jsonl" in capsys.readouterr().err
    real = os.path.join(demo_dir(), "en.jsonl")
    assert main([*base, "--input", real, "--num-shards", "0"]) == 2
    assert "num_shards=0: must be >= 1" in capsys.readouterr().err
    assert not sbatch_calls.exists()


def test_submit_preprocess_refuses_what_preprocess_refuses_with_its_message(
    sbatch_calls, tmp_path, capsys
):
    """More shards than input files (array tasks 2-3 failed at run time, the merge job was
    cancelled) and a directory as --output-prefix: refused before anything is written or
    submitted, with preprocess's own message."""
    inputs = [os.path.join(demo_dir(), f) for f in ("zh.jsonl", "en.jsonl")]
    tok = os.path.join(demo_dir(), "tokenizer.json")
    for prefix, shards, message in (
        (tmp_path / "sp" / "c", "4", "num_shards=4: more shards than the 2 input files"),
        (f"{tmp_path / 'sp2'}/", "2", f"--output-prefix '{tmp_path / 'sp2'}/' names a directory"),
    ):
        flags = ["--input", *inputs, "--tokenizer-model", tok, "--output-prefix", str(prefix)]
        flags += ["--num-shards", shards]
        assert main(["preprocess", *flags]) == 2
        local = capsys.readouterr().err.split("error: ", 1)[1]
        assert message in local
        for dry in ([], ["--dry-run"]):
            assert main(["submit-preprocess", *flags, *dry]) == 2
            err = capsys.readouterr().err
            assert err == f"megatron-gamma submit-preprocess: error: {local}", err
    assert not sbatch_calls.exists()
    assert os.listdir(tmp_path) == ["bin"]


def test_submit_preprocess_checks_the_preprocess_flags_as_preprocess_does(
    sbatch_calls, tmp_path, capsys
):
    """The flags every task gets are checked before sbatch with preprocess's own code and message
    (a task would have failed with it); a directory holding tokenizer.json, which preprocess
    takes, is taken too (submit-preprocess wanted the file)."""
    tok = os.path.join(demo_dir(), "tokenizer.json")
    base = ["--input", os.path.join(demo_dir(), "en.jsonl"), "--num-shards", "1"]
    base += ["--output-prefix", str(tmp_path / "o" / "c")]
    gpt2 = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(tmp_path / "v.json")]
    for flags, message in (
        (["--tokenizer-model", tok, "--min-chars", "-1"], "min_chars=-1: must be >= 0"),
        (["--tokenizer-model", tok, "--log-interval", "0"], "log_interval=0: must be >= 1"),
        (["--tokenizer-model", tok, "--json-keys", "text", "text"], "repeated key"),
        ([], "--tokenizer-model is required with --tokenizer-type HuggingFaceTokenizer"),
        ([*gpt2, "--merge-file", str(tmp_path / "m.txt")], f"{tmp_path / 'v.json'}': file not"),
        (gpt2, "merge_file=None"),
    ):
        assert main(["preprocess", *base, *flags]) == 2
        local = capsys.readouterr().err.split("error: ", 1)[1]
        assert message in local
        assert main(["submit-preprocess", *base, *flags]) == 2
        assert capsys.readouterr().err == f"megatron-gamma submit-preprocess: error: {local}"
    assert not sbatch_calls.exists()
    assert main(["submit-preprocess", *base, "--tokenizer-model", demo_dir(), "--dry-run"]) == 0
    assert f"OPTIONS=(--tokenizer-model={demo_dir()})" in capsys.readouterr().out.splitlines()


def _bash_syntax(text: str, tmp_path) -> None:
    path = tmp_path / "script.sh"
    path.write_text(text)
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
@pytest.mark.parametrize("image", [None, "nvcr.io#nvidia/pytorch:25.09-py3"])
def test_rendered_scripts_are_valid_bash(launcher, image, tmp_path):
    mounts = "/data:/data" if image else None
    job = PretrainJob(nodes=4, gpus_per_node=8, launcher=launcher, container_image=image,
                      container_mounts=mounts, time="2-00:00:00")  # fmt: skip
    text = render_pretrain(job, "c y.yaml", "ck", "%x-%j.out", "name", workdir="/w")
    _bash_syntax(text, tmp_path)
    assert "CONFIG='c y.yaml'" in text.splitlines()  # shell-quoted
    pre = PreprocessJob(inputs=["a b.jsonl", "c.jsonl"], options=["--lang-key=l g"],
                        output_prefix="o", num_shards=2, container_image=image,
                        container_mounts=mounts)  # fmt: skip
    text = render_preprocess(pre, log_dir="logs", job_name="p")
    _bash_syntax(text, tmp_path)
    if image:  # srun inside the job is given the job's CPUs (newer srun does not inherit them)
        assert 'srun --ntasks=1 --cpus-per-task="$WORKERS" "${opts[@]}" "$@"' in text
    assert "INPUTS=('a b.jsonl' c.jsonl)" in text.splitlines()
    assert "OPTIONS=('--lang-key=l g')" in text.splitlines()


def test_examples_are_current_renderings_of_the_templates():
    for name, text in example_scripts().items():
        with open(os.path.join(REPO, "examples", "slurm", name), encoding="utf-8") as f:
            stale = f"examples/slurm/{name} is stale: run python tools/render_slurm_examples.py"
            assert f.read() == text, stale


@pytest.mark.parametrize(
    "said, fix",
    [
        ("sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\nsbatch: "
         "fatal: Could not establish a configuration source",
         "sbatch cannot reach the cluster's controller or configuration from this machine: "
         "submit from a login node of the cluster (`sinfo` there answers), or run the same "
         "`sbatch` on job.sbatch there (the file written here holds the --env values; a "
         "--dry-run printout shows them redacted)"),
        ("sbatch: error: invalid partition specified: gpux",
         "correct the setting sbatch names (partition, time, nodes, GPUs) and submit again"),
    ],
)  # fmt: skip
def test_a_refused_sbatch_gets_the_fix_its_message_calls_for(tmp_path, monkeypatch, said, fix):
    """sbatch that could not reach a controller was told to correct its partition, time, nodes
    or GPUs; its own message is kept, and the fix is the one that fits it."""
    from megatron_gamma.launch.slurm import sbatch

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "said.txt").write_text(said + "\n")
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ncat {tmp_path / 'said.txt'} >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(SubmitError) as e:
        sbatch("job.sbatch")
    assert str(e.value).startswith(f"sbatch job.sbatch: refused (exit code 1): {said}. Fix: {fix}")
