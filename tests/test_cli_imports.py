"""What the commands import. The data and sizing commands start without torch or megatron-core
(issue 29, item 3): each command runs in a fresh interpreter and reports which of the two it
imported. The commands that need the ``eval`` extra name it when it is not installed."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli

from megatron_gamma.data import demo_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_CONFIG = os.path.join(ROOT, "examples", "configs", "demo.yaml")
DEMO_CORPUS = [os.path.join(demo_dir(), "zh.jsonl"), os.path.join(demo_dir(), "en.jsonl")]
PROBE = """
import json, sys
from megatron_gamma.cli import main
try:
    rc = main(json.loads(sys.argv[1]))
except SystemExit as e:
    rc = e.code
heavy = [m for m in ("torch", "megatron.core") if m in sys.modules]
print(json.dumps({"rc": rc, "imported": heavy}))
"""


def _probe(args: list[str], launched: dict | None = None) -> tuple[dict, str, str]:
    """(the probe's {'rc', 'imported'}, stdout before its line, stderr) of ``args``, with the
    launcher's variables ``launched`` (e.g. torchrun's RANK, WORLD_SIZE, LOCAL_RANK) set."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.update(launched or {})
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    *out, last = proc.stdout.rstrip("\n").split("\n")
    return json.loads(last), "\n".join(out), proc.stderr


def _run(args: list[str]) -> tuple[int, list[str], str]:
    """(exit status, heavy modules imported, stdout before the probe's line) of ``args``."""
    doc, out, _ = _probe(args)
    return doc["rc"], doc["imported"], out


@pytest.mark.parametrize("command", ["estimate", "preprocess", "merge", "train-tokenizer"])
def test_help_imports_neither_torch_nor_megatron_core(command):
    rc, imported, out = _run([command, "--help"])
    assert rc == 0 and "usage: megatron-gamma" in out
    assert imported == []


def test_estimate_imports_neither_torch_nor_megatron_core():
    rc, imported, out = _run(["estimate", "--config", DEMO_CONFIG, "--world-size", "1"])
    assert rc == 0 and "parameters, total" in out
    assert imported == []


def test_train_tokenizer_imports_neither_torch_nor_megatron_core(tmp_path):
    out_json = str(tmp_path / "tok" / "tokenizer.json")
    args = ["train-tokenizer", "--input", *DEMO_CORPUS, "--vocab-size", "300",
            "--sample-chars", "20000", "--output", out_json, "--no-progress"]  # fmt: skip
    rc, imported, _ = _run(args)
    assert rc == 0 and os.path.exists(tmp_path / "tok" / "tokenizer_metadata.json")
    assert imported == []


def test_preprocess_and_merge_input_errors_come_before_megatron_core(tmp_path):
    """Bad input is reported before the writer (megatron-core's builder) is imported."""
    missing = str(tmp_path / "missing.jsonl")
    args = ["preprocess", "--input", missing, "--tokenizer-model", demo_dir(),
            "--output-prefix", str(tmp_path / "x"), "--no-progress"]  # fmt: skip
    rc, imported, _ = _run(args)
    assert rc != 0 and imported == []
    args = ["merge", "--input", missing, "--num-shards", "2", "--output-prefix", missing]
    rc, imported, _ = _run(args)
    assert rc != 0 and imported == []


def test_a_pretrain_config_error_comes_before_torch_and_megatron_core(tmp_path):
    """A bad flag value or YAML key stops ``pretrain`` without the seconds of those imports."""
    rc, imported, _ = _run(["pretrain", "--config", DEMO_CONFIG, "--lr", "-1"])
    assert rc != 0 and imported == []
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  hidden_size: 32\n  hidden_size: 64\n")
    rc, imported, _ = _run(["pretrain", "--config", str(config)])
    assert rc != 0 and imported == []


def test_a_reused_config_yaml_with_another_runs_load_is_refused_before_torch(tmp_path):
    """Trial 9, finding 1: ``pretrain --config RUN1/config.yaml --run-dir E4 --save E4/ck``
    resumed RUN1's checkpoints (the file records the load RUN1 ran with) after 50 false
    no-effect warnings. It is refused before torch and megatron-core, without a warning; the
    same file with --load on the command line gets past that check (to the next one, the
    missing data here)."""
    from megatron_gamma.config import load_config, save_config

    run1 = tmp_path / "run1"
    run1.mkdir()
    ckpt, config = str(run1 / "ckpt"), str(run1 / "config.yaml")
    save_config(
        load_config(DEMO_CONFIG, {"run_dir": str(run1), "save": ckpt, "load": ckpt}), config
    )
    new = ["--run-dir", str(tmp_path / "e4"), "--save", str(tmp_path / "e4" / "ck")]
    doc, _, err = _probe(["pretrain", "--config", config, *new, "--train-iters", "2"])
    assert doc == {"rc": 2, "imported": []}
    assert err == (
        f"megatron-gamma pretrain: error: load={ckpt!r}: comes from the YAML file {config!r} "
        f"(checkpoint.load), not from --load, and is not this run's save={new[3]!r}: this run "
        "would resume another run's checkpoints (a run's config.yaml records the load it ran "
        f"with). Fix: pass --load {new[3]} for a run of its own (it resumes from its save "
        "directory, and starts fresh while that holds no checkpoint), --load "
        f"{ckpt} on the command line to start from those checkpoints, or remove `load` from "
        "the file (or from a copy of it)\n"
    )
    # trial 14: starting from other weights (an import-hf run's), --load of those is refused
    # later (weights only); the fix is the run's own --load
    pretrained = ["--pretrained-checkpoint", ckpt]
    doc, _, err = _probe(["pretrain", "--config", config, *new, *pretrained, "--train-iters", "2"])
    assert doc == {"rc": 2, "imported": []}
    assert err.endswith(
        f"Fix: pass --load {new[3]}: with --pretrained-checkpoint the run starts from "
        f"{ckpt!r}'s weights while its own save directory holds no checkpoint, and resumes "
        "from that directory after\n"
    )
    missing = str(tmp_path / "none")
    doc, _, err = _probe(
        ["pretrain", "--config", config, *new, "--load", ckpt, "--data-path", missing]
    )
    assert doc == {"rc": 2, "imported": []}
    assert "warning" not in err and "load=" not in err
    assert f"error: data_path={missing!r}: {missing}.bin does not exist" in err


def test_a_reused_config_yaml_under_only_a_new_run_dir_is_refused_before_torch(tmp_path):
    """``pretrain --config RUN1/config.yaml --run-dir NEW`` (no --save) kept RUN1's save and
    load (equal, so the load check passed) and resumed and saved into RUN1's checkpoints. It is
    refused before torch and megatron-core; ``submit --dry-run`` refuses it too, and writes no
    script."""
    from megatron_gamma.config import load_config, save_config

    run1, new = tmp_path / "run1", str(tmp_path / "new")
    run1.mkdir()
    ckpt, config = str(run1 / "checkpoints"), str(run1 / "config.yaml")
    save_config(
        load_config(DEMO_CONFIG, {"run_dir": str(run1), "save": ckpt, "load": ckpt}), config
    )
    doc, _, err = _probe(["pretrain", "--config", config, "--run-dir", new])
    assert doc == {"rc": 2, "imported": []}
    assert err.startswith(
        f"megatron-gamma pretrain: error: save={ckpt!r}, load={ckpt!r}: from the YAML file "
        f"{config!r}, whose run_dir={str(run1)!r}, while this run's --run-dir is {new!r}"
    )
    assert f"Fix: pass --save {new}/checkpoints --load {new}/checkpoints for a run" in err
    submit = ["submit", "--config", config, "--run-dir", new, "--nodes", "1", "--dry-run"]
    doc, _, err = _probe([*submit, "--gpus-per-node", "1"])
    assert doc["rc"] == 2 and f"save={ckpt!r}, load={ckpt!r}: from the YAML file" in err
    assert not os.path.exists(new)


def test_a_missing_tokenizer_and_another_runs_save_are_refused_before_torch(tmp_path):
    """Trials 9 and 10: a missing --tokenizer-model and a --save holding another run's
    checkpoints (no --load) were refused only after torch and megatron-core loaded (11-19 s on a
    busy host). Both are now refused before them, with the same messages."""
    gone = str(tmp_path / "no-tokenizer")
    base = ["pretrain", "--mock-data", "--train-iters", "2", "--run-dir", str(tmp_path / "r")]
    doc, _, err = _probe([*base, "--tokenizer-model", gone])
    assert doc == {"rc": 2, "imported": []}
    assert f"tokenizer_model={gone!r}" in err and "Fix: " in err
    save = tmp_path / "other" / "ckpt"
    (save / "iter_0000005").mkdir(parents=True)
    doc, _, err = _probe([*base, "--save", str(save)])
    assert doc == {"rc": 2, "imported": []}
    assert err == (
        f"megatron-gamma pretrain: error: save={str(save)!r}: holds checkpoints (newest "
        f"iter_0000005) that this run does not load (no --load). Fix: add --load {save} to "
        "resume from them, --overwrite to delete them and start afresh, or give another --save\n"
    )
    assert not os.path.exists(tmp_path / "r")


def test_evaluate_and_analyze_refuse_bad_arguments_before_torch_and_megatron_core(tmp_path):
    """A mistyped checkpoint, run directory, config, data prefix or output directory, a task's
    data file missing from where ``datasets`` would read it (trial 11: found 24 s in, after the
    imports), or a bad row count, was refused only after megatron-core's import (5 s and
    more); a bad --device needs torch to read it, not megatron-core. Each refusal names the
    value."""
    run = tmp_path / "run"
    run.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("")
    gone = str(tmp_path / "gone")
    coded = tmp_path / "coded_tasks"  # a task whose docs pass through a module's function
    coded.mkdir()
    (coded / "t.yaml").write_text("task: t\nprocess_docs: !function utils.keep\n")
    moved = tmp_path / "moved_tasks"  # relative data_files, read from the current directory
    moved_file = os.path.join("lm_eval_tasks", "tiny_mc.jsonl")
    moved.mkdir()
    (moved / "m.yaml").write_text(
        "task: m\ndataset_path: json\n"
        "dataset_kwargs: {data_files: {test: lm_eval_tasks/tiny_mc.jsonl}}\n"
    )
    cases = [
        (["evaluate", gone], f"checkpoint={gone!r}: does not exist. Fix: pass a checkpoint"),
        (["evaluate", str(run), "--tasks", "t", "--compare", gone], f"--compare={gone!r}: does "),
        (["evaluate", str(run), "--config", gone], f"--config={gone!r}: no such file. Fix:"),
        (["evaluate", str(run), "--tasks", "t", "--include-path", gone],
         f"--include-path={gone!r}: not a directory"),
        (["evaluate", str(run), "--tasks", "t", "--include-path", str(coded)],
         f"--include-path={str(coded)!r}: its task files would make lm-eval run Python code: "
         f"{str(coded / 't.yaml')!r} uses the '!function' tag (imports the module beside it). "
         "Fix: read that code, then pass --trust-task-code"),
        (["evaluate", str(run), "--tasks", "m", "--include-path", str(moved)],
         f"--include-path={str(moved)!r}: task 'm' ({moved / 'm.yaml'}) names data_files (test) "
         f"'lm_eval_tasks/tiny_mc.jsonl': no file {os.path.join(ROOT, moved_file)!r}. "
         f"A relative data_files path is read from the current directory ({ROOT!r})"),
        (["evaluate", str(run), "--tasks", "t", "--trust-task-code"],
         "--trust-task-code: acts only on the task files of --include-path"),
        (["evaluate", str(run), "--trust-task-code"], "--trust-task-code=True: acts only with"),
        (["evaluate", str(run), "--data-path", gone], f"data_path={gone!r}: {gone}.bin does not"),
        (["evaluate", str(run), "--output-dir", str(afile)],
         f"--output-dir={str(afile)!r}: exists and is not a directory. Fix:"),
        (["evaluate", str(run), "--tasks", "t", "--output-dir", str(afile / "x")],
         f"--output-dir={str(afile / 'x')!r}: {str(afile)!r} is not a directory. Fix:"),
        (["analyze", gone], f"run_dir={gone!r}: not a directory. Fix:"),
        (["analyze", str(run), "--heatmap-rows", "1"], "--heatmap-rows 1: need at least 2 rows"),
        (["analyze", str(run), str(run)], "several runs need --output-dir. Fix:"),
        (["analyze", str(run), str(run), "--output-dir", str(tmp_path / "a")],
         f"run_dir={str(run)!r}: the same run as {str(run)!r}, given twice. Fix:"),
        (["analyze", str(run), "--output-dir", str(afile)],
         f"output_dir={str(afile)!r}: exists and is not a directory. Fix:"),
        (["analyze", str(run), "--data-cache-path", str(afile)],
         f"--data-cache-path={str(afile)!r}: exists and is not a directory. Fix:"),
    ]  # fmt: skip
    for args, message in cases:
        doc, _, err = _probe(args)
        assert (doc["rc"], doc["imported"]) == (2, []), (args, doc, err[-2000:])
        assert f"megatron-gamma {args[0]}: error: {message}" in err, (args, err[-2000:])
    doc, _, err = _probe(["evaluate", str(run), "--tasks", "t", "--device", "gpu"])
    assert (doc["rc"], doc["imported"]) == (2, ["torch"]), err[-2000:]
    assert "error: device='gpu': not a device string torch reads" in err


def test_export_import_and_compare_refuse_bad_paths_before_torch_and_megatron_core(tmp_path):
    """export-hf, import-hf and compare refused a missing checkpoint, model directory, config,
    data prefix or an output directory that is a file only after 4-5 s of imports (and compare
    said "no complete checkpoint found" of a path that does not exist)."""
    run = tmp_path / "run"
    run.mkdir()
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    afile = tmp_path / "afile"
    afile.write_text("")
    gone = str(tmp_path / "gone")
    data = str(tmp_path / "d")
    for suffix in (".bin", ".idx"):
        Path(data + suffix).write_bytes(b"")
    cmp = ["compare", str(run), str(run), "--output-dir", str(tmp_path / "c")]
    cases = [
        (["export-hf", gone, str(tmp_path / "hf")],
         f"checkpoint={gone!r}: does not exist. Fix: pass a checkpoint"),
        (["export-hf", str(run), str(tmp_path / "hf"), "--config", gone],
         f"--config={gone!r}: no such file. Fix:"),
        (["export-hf", str(run), str(afile)],
         f"out_dir={str(afile)!r}: exists and is not a directory. Fix: choose a new directory"),
        (["export-hf", str(run), str(full)],
         f"out_dir={str(full)!r}: exists and is not empty. Fix: choose a new directory, or "
         "remove it"),
        (["export-hf", str(run), str(afile / "hf")],
         f"out_dir={str(afile / 'hf')!r}: {str(afile)!r} is not a directory. Fix:"),
        (["import-hf", gone, str(tmp_path / "r")], f"hf_dir={gone!r}: does not exist. Fix:"),
        (["import-hf", str(afile), str(tmp_path / "r")],
         f"hf_dir={str(afile)!r}: is not a directory. Fix:"),
        (["import-hf", str(run), str(afile)],
         f"run_dir={str(afile)!r}: exists and is not a directory. Fix: choose a new run "
         "directory"),
        (["compare", gone, str(run), "--data-path", gone, "--output-dir", str(tmp_path / "c")],
         f"CKPT_A={gone!r}: does not exist. Fix: pass a checkpoint"),
        (["compare", str(run), gone, "--data-path", gone, "--output-dir", str(tmp_path / "c")],
         f"CKPT_B={gone!r}: does not exist. Fix: pass a checkpoint"),
        ([*cmp, "--data-path", gone, "--config-b", gone], f"--config-b={gone!r}: no such file."),
        ([*cmp, "--data-path", gone], f"data_path={gone!r}: {gone}.bin does not exist. Fix:"),
        (["compare", str(run), str(run), "--data-path", data, "--output-dir", str(afile)],
         f"--output-dir={str(afile)!r}: exists and is not a directory. Fix:"),
    ]  # fmt: skip
    for args, message in cases:
        doc, _, err = _probe(args)
        assert (doc["rc"], doc["imported"]) == (2, []), (args, doc, err[-2000:])
        assert f"megatron-gamma {args[0]}: error: {message}" in err, (args, err[-2000:])
    assert os.listdir(full) == ["x"] and afile.read_text() == ""


def test_a_bad_record_met_while_encoding_is_reported_before_megatron_core(tmp_path):
    """The writer imports megatron-core only to write the index, after the last chunk: a
    malformed record past the backend check's sample stops the run without that import."""
    corpus = tmp_path / "corpus.jsonl"
    good = json.dumps({"text": "a sentence of plain words. " * 40}) + "\n"
    corpus.write_text(good * 200 + '{"text": "unterminated\n' + good)
    args = ["preprocess", "--input", str(corpus), "--tokenizer-model", demo_dir(),
            "--output-prefix", str(tmp_path / "x"), "--no-progress"]  # fmt: skip
    rc, imported, _ = _run(args)
    assert rc != 0 and "megatron.core" not in imported
    args[-3:-1] = ["--output-prefix", str(tmp_path / "y")]
    corpus.write_text(good * 201)
    rc, imported, _ = _run(args)
    assert rc == 0 and "megatron.core" in imported  # the index is megatron-core's
    assert os.path.getsize(tmp_path / "y_text_document.idx") > 0


def test_tokenizer_metadata_is_megatron_cores_bytes(tmp_path):
    """``write_metadata`` writes tokenizer_metadata.json itself (no megatron-core import): the
    bytes must be those of megatron-core's ``MegatronTokenizer.write_metadata``."""
    from megatron.core.tokenizers import MegatronTokenizer

    from megatron_gamma.data.tokenizer import write_metadata

    ours = tmp_path / "tokenizer.json"
    ours.write_bytes((Path(demo_dir()) / "tokenizer.json").read_bytes())
    written = write_metadata(str(ours))
    theirs = tmp_path / "mcore_metadata.json"
    MegatronTokenizer.write_metadata(
        tokenizer_path=str(tmp_path), tokenizer_library="huggingface", model_type="gpt",
        metadata_path=str(theirs),
    )  # fmt: skip
    assert str(tmp_path / "tokenizer_metadata.json") in written
    assert (tmp_path / "tokenizer_metadata.json").read_bytes() == theirs.read_bytes()


def test_the_eval_extra_is_named_when_it_is_missing(tmp_path):
    """export-hf, import-hf and evaluate --tasks without ``transformers`` (the default install)
    stop with the install command, not a traceback; ``EVAL_EXTRA_MODULES`` is setup.py's extra."""
    import ast

    from megatron_gamma.cli import EVAL_EXTRA_MODULES

    tree = ast.parse(Path(ROOT, "setup.py").read_text())
    pins = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EVAL_REQUIRES"
    )
    assert sorted(EVAL_EXTRA_MODULES) == sorted(p.split("==")[0].replace("-", "_") for p in pins)

    blocked = "import sys; sys.modules['transformers'] = None\n"
    (tmp_path / "ckpt").mkdir()  # paths that pass the checks made before the imports
    (tmp_path / "hf").mkdir()
    for args in (["export-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf")],
                 ["import-hf", str(tmp_path / "hf"), str(tmp_path / "run")]):  # fmt: skip
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run(
            [sys.executable, "-c", blocked + PROBE, json.dumps(args)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert json.loads(proc.stdout.rstrip("\n").split("\n")[-1])["rc"] == 2, proc.stderr
        assert f"{args[0]}: error: transformers is not installed" in proc.stderr
        assert 'Fix: pip install --no-build-isolation -e ".[eval]"' in proc.stderr


def test_export_hf_refuses_a_bad_shard_size_before_loading(tmp_path, capsys):
    """``--max-shard-size`` takes what ``save_pretrained`` hands to huggingface_hub's shard
    splitter (its own parser the reference); a bad value is refused at parsing, before torch."""
    from huggingface_hub.serialization._base import parse_size_to_int

    from megatron_gamma.cli import parse_args

    def parsed(value):
        return parse_args(["export-hf", "RUN", "OUT", "--max-shard-size", value]).max_shard_size

    for value in ("5GB", "500MB", "0.5gb", " 2 TB"):
        assert parsed(value) == value and parse_size_to_int(value) > 0
    assert parsed("2000000000") == 2_000_000_000
    assert parse_args(["export-hf", "RUN", "OUT"]).max_shard_size == "5GB"
    for value in ("lots", "5GiB", "5G", "GB"):
        with pytest.raises(ValueError):
            parse_size_to_int(value)
        with pytest.raises(SystemExit):
            parsed(value)
        err = capsys.readouterr().err
        assert f"argument --max-shard-size: {value!r}: not a size save_pretrained reads" in err
        assert "Fix: pass e.g. --max-shard-size 5GB (the default)" in err
    rc, imported, _ = _run(
        ["export-hf", str(tmp_path), str(tmp_path / "hf"), "--max-shard-size", "lots"]
    )
    assert rc == 2 and imported == []


def test_a_layout_the_world_cannot_hold_is_refused_before_torch_once_per_node(tmp_path):
    """Under torchrun, ``--num-layers 3 --pipeline-model-parallel-size 2`` was refused 21 s
    after launch, after torch and megatron-core had been imported, and every process printed
    the error. The layout is now checked against the launcher's world size before torch, and a
    configuration error is printed by each node's first process at once; another process
    prints it, naming its local rank, only if it is still running after ``PEER_GRACE_S``
    (under a launcher the first process's exit has stopped it by then)."""
    from megatron_gamma.cli import PEER_GRACE_S

    args = ["pretrain", "--config", DEMO_CONFIG, "--num-layers", "3",
            "--pipeline-model-parallel-size", "2", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    why = "pipeline_model_parallel_size=2: does not divide num_layers=3. Fix: choose a divisor"
    first = f"megatron-gamma pretrain: error: {why} of num_layers\n"
    other = f"megatron-gamma pretrain: error on local rank 1: {why} of num_layers\n"
    for rank, local_rank, printed in ((0, 0, first), (1, 1, other), (2, 0, first)):
        launched = {"RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(local_rank)}
        start = time.monotonic()
        doc, _, stderr = _probe(args, launched)
        assert (doc, stderr) == ({"rc": 2, "imported": []}, printed), rank
        assert (time.monotonic() - start >= PEER_GRACE_S) == (local_rank > 0), rank
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_configuration_error_under_torchrun_is_printed_whichever_process_exits_first(tmp_path):
    """Trial 13: under ``torchrun --nproc-per-node 2`` a bad value was printed in 4 of 8
    launches: only local rank 0 printed, every process exited at once, and where local rank 1
    exited first torchrun stopped rank 0 before it printed. Now the other process waits, so
    the message is printed in every launch (real torchrun, five launches)."""
    args = ["pretrain", "--config", DEMO_CONFIG, "--init-gamma", "-1",
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    for launch in range(5):
        proc = run_cli(args, nproc=2, timeout=240)
        assert proc.returncode != 0, launch
        assert "error: init_gamma=-1.0: gamma must be > 0" in proc.stderr, (launch, proc.stderr)
    assert not os.path.exists(tmp_path / "run")


def test_report_and_pretrain_refuse_missing_inputs_before_torch(tmp_path):
    """Trial 7: `report` on a directory without study.json, and `pretrain` with a dataset prefix
    without its files, were refused only after torch and megatron-core were imported (74 s and
    37 s on a loaded machine)."""
    doc, _, err = _probe(["report", str(tmp_path)])
    assert doc == {"rc": 2, "imported": []}
    assert f"study_dir={str(tmp_path)!r}: no study.json. Fix: run `megatron-gamma sweep" in err
    missing = str(tmp_path / "nowhere" / "corpus_text_document")
    args = ["pretrain", "--config", DEMO_CONFIG, "--run-dir", str(tmp_path / "run"),
            "--data-path", missing, "--train-iters", "2"]  # fmt: skip
    doc, _, err = _probe(args)
    assert doc == {"rc": 2, "imported": []}
    assert f"{missing}.bin does not exist" in err
    assert not (tmp_path / "run").exists()


def test_pretrain_refuses_another_runs_directory_before_torch_and_megatron_core(tmp_path):
    """A fresh run in a directory that holds another run's config.yaml and metrics was refused
    only under the run-directory lock, after torch and megatron-core were imported; the same
    refusal (``rundir.paths.check_takeover``) now comes first, and nothing in the directory
    changes."""
    run, save, other = tmp_path / "run", tmp_path / "ckpt", str(tmp_path / "other")
    run.mkdir()
    (run / "config.yaml").write_text(f"checkpoint:\n  save: {save}\n")
    (run / "metrics.jsonl").write_text('{"iteration": 1, "split": "train", "loss": 9.0}\n')
    data = str(tmp_path / "d")
    for suffix in (".bin", ".idx"):  # a prefix whose files exist: the dataset check passes
        Path(data + suffix).write_bytes(b"")
    args = ["pretrain", "--config", DEMO_CONFIG, "--run-dir", str(run), "--data-path", data]
    for flags, why in (([], "no --load"), (["--load", other], f"load={other!r} is elsewhere")):
        doc, _, err = _probe([*args, *flags])
        assert doc == {"rc": 2, "imported": []}, err[-2000:]
        assert (
            f"megatron-gamma pretrain: error: run_dir={str(run)!r}: holds the records of a run "
            f"(config.yaml, metrics.jsonl) that this run does not continue "
            f"({why}); starting here would replace its config.yaml. Fix: give this run its own "
            f"--run-dir NEW_DIR, add --load {save} to resume it, or add --overwrite"
        ) in err, err[-2000:]
    assert sorted(os.listdir(run)) == ["config.yaml", "metrics.jsonl"]
    assert (run / "config.yaml").read_text() == f"checkpoint:\n  save: {save}\n"


def test_evaluate_refuses_window_counts_its_flags_decide_before_torch(tmp_path):
    """``evaluate --data-path`` refused --data-cache-path, too few --eval-tokens for one window,
    a window longer than --config's positions, and a prefix shorter than its share only after
    torch and megatron-core were imported and the checkpoint read; where the flags (and the
    .idx, read with numpy) decide them, they now come first. A count the data holds exactly
    goes on to the checkpoint (an empty run directory here), with torch."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    run, prefix = tmp_path / "run", str(tmp_path / "p")
    run.mkdir()
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(1000))
    for n in (10, 20, 11):  # 41 tokens: (41 - 1) // 8 = 5 windows of 8
        builder.add_document(np.arange(n, dtype=np.int64), [n])
    builder.finalize(prefix + ".idx")
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  seq_length: 16\n  max_position_embeddings: 16\n")
    cache = str(tmp_path / "cache")
    data = ["evaluate", str(run), "--data-path", prefix]
    cases = [
        ([*data, "--data-cache-path", cache],
         f"data_cache_path={cache!r}: acts only on the run's own validation split; windows of "
         "--data-path are read straight from the dataset, with no index cache. Fix: drop "
         "--data-cache-path"),
        ([*data, "--seq-length", "64", "--eval-tokens", "10"],
         "eval_tokens=10: fewer than one window of 64 tokens. Fix: raise it"),
        ([*data, "--seq-length", "8", "--eval-tokens", "48"],
         f"eval_tokens=48: {prefix} holds 5 windows of 8 tokens, its share needs 6. Fix: lower "
         "--eval-tokens or add data"),
        ([*data, "--seq-length", "64"],
         f"data_path={prefix!r}: 41 tokens, fewer than one window of 65. Fix: use more data or "
         "a smaller --seq-length"),
        ([*data, "--config", str(config), "--seq-length", "32"],
         "seq_length=32: must lie in [1, max_position_embeddings=16]. Fix: use a shorter "
         "--seq-length"),
        ([*data, "--config", str(config), "--eval-tokens", "8"],
         "eval_tokens=8: fewer than one window of 16 tokens. Fix: raise it"),
    ]  # fmt: skip
    for args, message in cases:
        doc, _, err = _probe(args)
        assert (doc["rc"], doc["imported"]) == (2, []), (args, doc, err[-2000:])
        assert f"megatron-gamma evaluate: error: {message}\n" in err, (args, err[-2000:])
    doc, _, err = _probe([*data, "--seq-length", "8", "--eval-tokens", "40"])
    assert doc == {"rc": 2, "imported": ["torch", "megatron.core"]}, err[-2000:]
    assert f"checkpoint={str(run)!r}: no complete checkpoint found" in err, err[-2000:]
