"""The run-directory room (:mod:`megatron_gamma.rundir`): ``metrics.jsonl`` with a torn last
line, and continued by a resumed or restarted run without the earlier run's later records,
checkpoints that carry their config and tokenizer fingerprint (read from a bare ``--save``
directory outside the run directory), the ``config.yaml`` fallback for checkpoints written
before, ``--config`` as the override, ``evaluate``'s ranks from the launcher, and a checkpoint
read's console without torch's deprecations of megatron-core's calls.

References: the run's own ``config.yaml`` and the tokenizer file's SHA-256 (what the checkpoint
must carry), the pre-existing explicit-config path (same loss, same logits), fp64 stable ranks of
the loaded weights (analyze), and the single-process evaluation (multi-process evaluate).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import DEMO_TOKENIZER, pretrain, run_cli

from megatron_gamma.config import ConfigError, load_config, redacted_dict
from megatron_gamma.rundir import layout, loader
from megatron_gamma.study.rundir import read_run

ITERS = ["--train-iters", "2", "--eval-interval", "100", "--log-diagnostics-interval", "0"]


def _metrics(run_dir, lines: list[str]) -> bytes:
    text = "".join(lines).encode()
    (run_dir / "metrics.jsonl").write_bytes(text)
    return text


def _rows(iterations) -> list[dict]:
    return [{"iteration": i, "split": "train", "loss": 9.0 - i} for i in iterations]


def test_a_resumed_run_moves_the_earlier_runs_later_records_aside(tmp_path):
    rows = _rows(range(1, 11)) + [{"iteration": 10, "split": "valid", "loss": 0.5}]
    old = _metrics(tmp_path, [json.dumps(r) + "\n" for r in rows])
    said = layout.continue_metrics(str(tmp_path), 4)
    assert "the earlier run's file (7 records past iteration 4) moved whole to" in said
    assert said.endswith("this run resumes after iteration 4 with a copy of the 4 records up to it")
    assert layout.read_metrics(str(tmp_path)) == rows[:4]
    assert (tmp_path / "metrics.superseded-1.jsonl").read_bytes() == old
    assert layout.continue_metrics(str(tmp_path), 4) is None  # nothing past 4 now: untouched
    assert layout.read_metrics(str(tmp_path)) == rows[:4]

    said = layout.continue_metrics(str(tmp_path), 0)  # a fresh start (--overwrite) keeps none
    assert "the earlier run's file (its records) moved whole" in said  # 4 records, all moved
    assert said.endswith("this run starts afresh")
    assert (tmp_path / "metrics.jsonl").read_bytes() == b""
    assert (
        json.loads((tmp_path / "metrics.superseded-2.jsonl").read_text().splitlines()[0])
        == (rows[0])
    )
    assert layout.continue_metrics(str(tmp_path / "absent"), 0) is None


def test_a_torn_last_line_is_set_aside_so_that_appended_records_stay_readable(tmp_path):
    rows = _rows(range(1, 4))
    _metrics(tmp_path, [json.dumps(r) + "\n" for r in rows] + ['{"iteration": 4, "spl'])
    said = layout.continue_metrics(str(tmp_path), 3)
    assert "0 records past iteration 3 and a torn last line" in said
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps(_rows([4])[0]) + "\n")  # as the logger appends
    assert layout.read_metrics(str(tmp_path)) == _rows(range(1, 5))

    _metrics(tmp_path, ['{"iteration": 1, "spl\n', json.dumps(rows[0]) + "\n"])
    said = layout.continue_metrics(str(tmp_path), 3)  # a bad middle line: moved whole
    assert "unreadable" in said and "metrics.jsonl:1: not a JSON object" in said
    assert (tmp_path / "metrics.jsonl").read_bytes() == b""
    assert sorted(os.listdir(tmp_path)) == [
        "metrics.jsonl", "metrics.superseded-1.jsonl", "metrics.superseded-2.jsonl"
    ]  # fmt: skip


def test_the_logger_continues_metrics_of_a_resume_without_the_later_records(tmp_path, capsys):
    from megatron_gamma.training.metrics import MetricsLogger

    _metrics(tmp_path, [json.dumps(r) + "\n" for r in _rows(range(1, 8))])
    log = MetricsLogger(str(tmp_path), str(tmp_path / "tb"), True, 6, 2, progress_bar=False)
    for i in (3, 4):
        log.train_step(i, {"loss": 9.0 - i, "lr": 1e-3})
    log.close()
    assert [(r["iteration"], r["loss"]) for r in layout.read_metrics(str(tmp_path))] == [
        (i, 9.0 - i) for i in range(1, 5)
    ]
    assert "5 records past iteration 2" in capsys.readouterr().out


def _fake_checkpoints(root, iterations) -> None:
    """``iter_N`` directories that :func:`layout.is_checkpoint` accepts, and the tracker."""
    for it in iterations:
        os.makedirs(layout.checkpoint_dir(str(root), it))
        (root / f"iter_{it:07d}" / "metadata.json").write_text("{}")
    (root / layout.TRACKER).write_text(str(iterations[-1]))


def _run_config(run, **sections) -> str:
    os.makedirs(run, exist_ok=True)
    (run / "config.yaml").write_text(yaml.safe_dump(sections))
    return str(run / "config.yaml")


def test_a_run_directory_finds_its_checkpoints_where_config_yaml_records_save(
    tmp_path, monkeypatch
):
    launch, run = tmp_path / "launch", tmp_path / "launch" / "runs" / "x"
    _fake_checkpoints(launch / "ck" / "x", [1, 3])  # --run-dir runs/x --save ck/x from launch/
    _run_config(run, logging={"run_dir": "runs/x"}, checkpoint={"save": "ck/x"})
    os.makedirs(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")  # not where the run was launched from
    want = str(launch / "ck" / "x" / "iter_0000003")
    assert layout.run_save_dir(str(run)) == str(launch / "ck" / "x")
    assert layout.resolve_checkpoint(str(run)) == want
    assert [it for it, _ in layout.list_checkpoints(str(run))] == [1, 3]
    assert layout.list_checkpoints(str(run))[-1][1] == want

    monkeypatch.chdir(launch)  # a relative run_dir given from launch/ resolves the same
    assert layout.resolve_checkpoint("runs/x") == want

    other = tmp_path / "other"  # an absolute save, and RUN/checkpoints when none is recorded
    _run_config(
        other, logging={"run_dir": str(other)}, checkpoint={"save": str(launch / "ck" / "x")}
    )
    assert layout.resolve_checkpoint(str(other)) == want
    _fake_checkpoints(tmp_path / "own" / "checkpoints", [2])
    _run_config(tmp_path / "own", checkpoint={"save": None})
    assert layout.resolve_checkpoint(str(tmp_path / "own")).endswith("checkpoints/iter_0000002")


def test_a_copied_run_directory_reads_the_checkpoints_it_holds(tmp_path):
    """Its config.yaml still records the original's absolute save; its own checkpoints/ wins."""
    original, copy = tmp_path / "run", tmp_path / "copy"
    _fake_checkpoints(original / "checkpoints", [1, 2])
    _run_config(original, checkpoint={"save": str(original / "checkpoints")})
    shutil.copytree(original, copy)
    _fake_checkpoints(original / "checkpoints", [3])  # the original trains on
    assert layout.resolve_checkpoint(str(copy)) == str(copy / "checkpoints" / "iter_0000002")
    assert [it for it, _ in layout.list_checkpoints(str(copy))] == [1, 2]
    assert layout.resolve_checkpoint(str(original)).endswith("run/checkpoints/iter_0000003")


@pytest.mark.parametrize(
    "sections, message",
    [
        ({"checkpoint": {"save": 5}}, "checkpoint.save=5: not a directory path"),
        ({"checkpoint": {"save": ""}}, "checkpoint.save='': not a directory path"),
        ({"checkpoint": ["save"]}, "checkpoint=['save']: not a mapping of keys"),
        ({"checkpoint": {"save": "gone/ck"}}, "checkpoint.save='gone/ck': no such directory"),
    ],
)
def test_a_bad_recorded_save_names_the_file_the_value_and_the_fix(tmp_path, sections, message):
    config = _run_config(tmp_path / "run", **sections)
    for read in (layout.resolve_checkpoint, layout.list_checkpoints):
        with pytest.raises(ConfigError) as err:
            read(str(tmp_path / "run"))
        assert str(err.value).startswith(f"{config}: {message}"), str(err.value)
        assert "Fix: " in str(err.value)
    (tmp_path / "run" / "config.yaml").write_text("checkpoint: [save\n")
    with pytest.raises(ConfigError, match=r"(?s)config.yaml: cannot be read as YAML .*Fix: "):
        layout.resolve_checkpoint(str(tmp_path / "run"))


def _scalars(tb_dir) -> dict[str, list[tuple[int, float]]]:
    """Every non-empty scalar series TensorBoard shows for ``tb_dir`` (its own reader, with its
    purging of the events a restart supersedes)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    series = {
        t: [(e.step, round(e.value, 6)) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]
    }
    return {tag: points for tag, points in series.items() if points}


def _earlier_run_events(tb_dir) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tb_dir))
    for it in range(1, 6):
        writer.add_scalar("train/loss", 100.0 + it, it)
    writer.add_scalar("valid/loss", 50.0, 5)
    writer.close()


def test_a_fresh_start_moves_the_earlier_tensorboard_events_aside(tmp_path, capsys):
    from megatron_gamma.training.metrics import MetricsLogger

    tb = tmp_path / "tensorboard"
    _earlier_run_events(tb)
    earlier = _scalars(tb)
    log = MetricsLogger(str(tmp_path), str(tb), True, 2, 0, progress_bar=False)
    for it in (1, 2):
        log.train_step(it, {"loss": 9.0 - it})
    log.close()
    assert _scalars(tb) == {"train/loss": [(1, 8.0), (2, 7.0)]}
    assert _scalars(tmp_path / "tensorboard.superseded-1") == earlier
    assert "moved to " + str(tmp_path / "tensorboard.superseded-1") in capsys.readouterr().out


def test_a_fresh_start_says_what_earlier_starts_left_set_aside_and_how_to_delete_it(
    tmp_path, capsys
):
    """Trial 16: rerunning a run directory piled up ``*.superseded-N`` entries without a word.
    A start that moves records aside now also says how many starts set records aside (the
    highest N), their size (the bytes written here) and a command that deletes them, which
    works on a path with a space and deletes nothing else; nothing runs it."""
    run = tmp_path / "my run"
    os.makedirs(run / "analysis.superseded-1")
    (run / "analysis.superseded-1" / "loss.png").write_bytes(b"x" * 300_000)
    (run / "metrics.superseded-1.jsonl").write_bytes(b'{"iteration": 1}\n' * 1000)
    (run / "metrics.jsonl").write_bytes(b'{"iteration": 1}\n' * 500)
    (run / "config.yaml").write_bytes(b"model: {}\n")
    from megatron_gamma.training.metrics import MetricsLogger

    MetricsLogger(str(run), str(run / "tensorboard"), True, 2, 0, progress_bar=False).close()
    size = (300_000 + 2 * 17_000 + 500 * 17) / 2**20
    note = capsys.readouterr().out.splitlines()[-1]
    assert note == (
        f"{run} holds records of earlier runs set aside by 2 starts (*.superseded-N, "
        f"{size:.1f} MiB in all), which nothing deletes. To delete them: rm -r "
        f"'{run}'/*.superseded-*"
    )
    assert os.path.exists(run / "metrics.superseded-2.jsonl")
    subprocess.run(note.split("To delete them: ")[1], shell=True, check=True)
    assert sorted(os.listdir(run)) == ["config.yaml", "metrics.jsonl", "tensorboard"]
    assert layout.superseded_note(str(run)) is None


def test_a_fresh_start_sets_the_earlier_runs_init_audit_and_analysis_aside(tmp_path):
    audit = b'[{"name": "embedding.word_embeddings.weight", "measured_sigma": 0.0156}]\n'
    (tmp_path / "init_audit.json").write_bytes(audit)
    (tmp_path / "init_audit.superseded-1.json").write_bytes(b"[]")  # set aside before that
    os.makedirs(tmp_path / "analysis")
    (tmp_path / "analysis" / "loss.png").write_bytes(b"\x89PNG")
    said = layout.set_aside_earlier_run(str(tmp_path))
    assert said == [
        f"{tmp_path / 'init_audit.json'}: the init audit of an earlier run moved to "
        f"{tmp_path / 'init_audit.superseded-2.json'}; this run starts afresh",
        f"{tmp_path / 'analysis'}: the analysis of an earlier run moved to "
        f"{tmp_path / 'analysis.superseded-1'}; this run starts afresh",
    ]
    assert (tmp_path / "init_audit.superseded-2.json").read_bytes() == audit
    assert (tmp_path / "init_audit.superseded-1.json").read_bytes() == b"[]"
    assert (tmp_path / "analysis.superseded-1" / "loss.png").read_bytes() == b"\x89PNG"
    assert sorted(os.listdir(tmp_path)) == [
        "analysis.superseded-1", "init_audit.superseded-1.json", "init_audit.superseded-2.json"
    ]  # fmt: skip
    assert layout.set_aside_earlier_run(str(tmp_path)) == []  # nothing of an earlier run left


def test_a_resume_with_other_initialization_settings_is_refused():
    """A resume continues the checkpoint's weights: a changed init flag would act on nothing
    but would relabel the run in config.yaml and the report."""
    started = yaml.safe_load(yaml.safe_dump(redacted_dict(load_config(None, {}))))
    assert started["init"]["init_gamma"] == 1.0
    layout.check_resume_init(load_config(None, {"init_audit": "off"}), started, "ck")  # allowed
    layout.check_resume_init(load_config(None, {"init_gamma": 0.5}), None, "ck")  # nothing saved
    older = {"init": {k: v for k, v in started["init"].items() if k != "embedding_fan_in"}}
    layout.check_resume_init(load_config(None, {"embedding_fan_in": "vocab"}), older, "ck")
    with pytest.raises(
        ConfigError,
        match=r"load='ck': resuming with other initialization settings: init_gamma=0\.5 "
        r"\(the run had 1\.0\), init_method_std=0\.01 \(the run had 0\.02\).*Fix: drop",
    ):
        layout.check_resume_init(
            load_config(None, {"init_gamma": 0.5, "init_method_std": 0.01}), started, "ck"
        )


def test_section_changes_name_each_changed_model_setting():
    """What a resume's schedule refusal lists of the model (resolved values, sorted by key)."""
    started = yaml.safe_load(yaml.safe_dump(redacted_dict(load_config(None, {}))))
    assert layout.section_changes(load_config(None, {}), started, "model") == []
    wider = load_config(None, {"hidden_size": 256, "num_layers": 2})
    assert layout.section_changes(wider, started, "model") == [
        f"ffn_hidden_size={wider.model.ffn_hidden_size} "
        f"(the run had {started['model']['ffn_hidden_size']})",
        f"hidden_size=256 (the run had {started['model']['hidden_size']})",
        f"kv_channels={wider.model.kv_channels} (the run had {started['model']['kv_channels']})",
        f"num_layers=2 (the run had {started['model']['num_layers']})",
    ]
    assert layout.section_changes(wider, None, "model") == []  # nothing saved
    assert layout.section_changes(wider, {"init": {}}, "model") == []  # no model section


def test_a_resume_at_another_seq_length_is_warned_about():
    """Trial 11: --seq-length changed on resume passed silently, though the data position then
    points into another sample index (Megatron-LM allows it: a warning, not a refusal)."""
    started = yaml.safe_load(yaml.safe_dump(redacted_dict(load_config(None, {"seq_length": 64}))))
    assert layout.seq_length_warning(load_config(None, {"seq_length": 64}), started) is None
    assert layout.seq_length_warning(load_config(None, {"seq_length": 128}), None) is None
    warning = layout.seq_length_warning(load_config(None, {"seq_length": 128}), started)
    assert warning.startswith("WARNING: seq_length=128 (the run had 64): the resumed run's data ")
    assert "Fix: resume with --seq-length 64, or start a run of its own" in warning


def _resumable_checkpoint(save, cfg) -> None:
    """``save/iter_0000002``: the common state a resume's preflight reads (iteration, scheduler,
    ``cfg`` and its tokenizer's fingerprint, as a run saves them), no tensor."""
    from megatron.core import dist_checkpointing

    from megatron_gamma.data.tokenizer import BilingualTokenizer
    from megatron_gamma.data.tokenizer_fingerprint import fingerprint

    path = layout.checkpoint_dir(str(save), 2)
    os.makedirs(path)
    tokenizer = BilingualTokenizer(loader.tokenizer_path(cfg))
    with loader.single_process(loader.fp32_single_rank(cfg)):
        state = {"iteration": 2, "scheduler": {"num_steps": 4}}
        state.update(layout.describe(cfg, fingerprint(tokenizer)))
        dist_checkpointing.save(state, path)
    (save / layout.TRACKER).write_text("2")


def test_a_resume_preflight_reads_the_checkpoints_common_state_once(tmp_path, monkeypatch):
    """The checks of a resume (what the load needs, the tokenizer, the init settings) read
    common.pt three times; once now, and each check still acts on what it holds."""
    from megatron_gamma import checkpoint_trust
    from megatron_gamma.training.loop import preflight

    run = {"mock_data": True, "run_dir": str(tmp_path / "run")}
    _resumable_checkpoint(tmp_path / "save", load_config(None, run))
    reads = []
    read = checkpoint_trust.load_common_state_dict
    monkeypatch.setattr(
        checkpoint_trust, "load_common_state_dict", lambda p: reads.append(p) or read(p)
    )
    preflight(load_config(None, {**run, "load": str(tmp_path / "save")}))
    assert reads == [layout.checkpoint_dir(str(tmp_path / "save"), 2)]
    reads.clear()
    with pytest.raises(ConfigError, match=r"init_gamma=0\.5 \(the run had 1\.0\)"):
        preflight(load_config(None, {**run, "load": str(tmp_path / "save"), "init_gamma": 0.5}))
    assert len(reads) == 1


def test_a_resume_hides_the_earlier_events_past_its_iteration(tmp_path):
    from megatron_gamma.training.metrics import MetricsLogger

    tb = tmp_path / "tensorboard"
    _earlier_run_events(tb)
    log = MetricsLogger(str(tmp_path), str(tb), True, 4, 3, progress_bar=False)
    log.train_step(4, {"loss": 5.0})
    log.close()
    # as metrics.jsonl keeps the records up to 3: the valid/loss of iteration 5 is gone too
    assert _scalars(tb) == {"train/loss": [(1, 101.0), (2, 102.0), (3, 103.0), (4, 5.0)]}
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "tensorboard"]


@pytest.fixture(scope="module")
def bare(tmp_path_factory, demo_prefix) -> tuple[str, str]:
    """(run directory, checkpoint directory) of a gated run saved outside its run directory."""
    root = tmp_path_factory.mktemp("bare")
    run, save = root / "run", root / "elsewhere" / "ckpts"
    pretrain(run, demo_prefix, *ITERS, "--gated-attention", "elementwise", "--save", str(save))
    assert not os.path.exists(run / "checkpoints")
    return str(run), str(save)


def test_metrics_reader_skips_a_torn_last_line_and_names_a_bad_one(tmp_path, caplog):
    rows = [
        {"iteration": 1, "split": "train", "loss": 8.0},
        {"iteration": 1, "split": "valid", "loss": 7.5},
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "metrics.jsonl").write_text(text + '{"iteration": 2, "split": "tra')
    with caplog.at_level(logging.WARNING, logger="megatron_gamma.rundir.layout"):
        assert layout.read_metrics(str(tmp_path)) == rows
    assert "metrics.jsonl:3: torn last line skipped" in caplog.text
    rec = read_run(str(tmp_path))  # what sweep and report read
    assert (rec.train, rec.valid) == ({1: 8.0}, {1: 7.5})

    (tmp_path / "metrics.jsonl").write_text('{"iteration": 1, "spl\n' + text)
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: not a JSON object.*Fix:"):
        layout.read_metrics(str(tmp_path))


@pytest.mark.slow
def test_checkpoint_carries_the_resolved_config_and_tokenizer_fingerprint(bare):
    run, save = bare
    ckpt = layout.resolve_checkpoint(save)
    assert ckpt == layout.checkpoint_dir(save, 2)
    config, tokenizer = layout.saved_description(ckpt)
    with open(os.path.join(run, "config.yaml"), encoding="utf-8") as f:
        assert config == yaml.safe_load(f)
    with open(DEMO_TOKENIZER, "rb") as f:
        assert tokenizer["sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert tokenizer["vocab_size"] == 4096
    assert loader.run_config(save) == load_config(os.path.join(run, "config.yaml"))


def _stable_rank(w: torch.Tensor) -> float:
    w = w.double()
    return float(w.pow(2).sum() / torch.linalg.matrix_norm(w, ord=2) ** 2)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_export_evaluate_analyze_from_a_bare_checkpoint_directory(bare, demo_prefix, tmp_path):
    from transformers import AutoModelForCausalLM

    from megatron_gamma.diagnostics.analyze import analyze
    from megatron_gamma.evaluation.evaluate import evaluate
    from megatron_gamma.hf.hf_export import export_hf
    from megatron_gamma.rundir import checkpoint

    run, save = bare
    config = os.path.join(run, "config.yaml")
    # the reference: the run's config.yaml given explicitly (the path older checkpoints need)
    rc = checkpoint.resolve(save, config)
    tokens = torch.randint(0, 4000, (2, 32), generator=torch.Generator().manual_seed(0))
    with loader.single_process(rc.cfg), torch.no_grad():
        model, _ = checkpoint.load_model(rc)
        ref_logits = model(tokens, torch.arange(32).expand(2, 32), None)
        ref_ranks = {
            "attn_out": _stable_rank(model.decoder.layers[1].self_attention.linear_proj.weight),
            "fc2": _stable_rank(model.decoder.layers[1].mlp.linear_fc2.weight),
        }

    got = evaluate(save, [demo_prefix], eval_tokens=4 * 64)
    want = evaluate(save, [demo_prefix], config=config, eval_tokens=4 * 64)
    assert got["iteration"] == 2 and got["tokens"] == 4 * 64
    assert got["loss"] == want["loss"]

    out = tmp_path / "hf"
    assert export_hf(save, str(out))["iteration"] == 2
    hf = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ref_logits, rtol=0, atol=1e-5)

    written = analyze([save], str(tmp_path / "analysis"), include_init=False, progress=False)
    with open(written["json"], encoding="utf-8") as f:
        (result,) = json.load(f)["runs"]
    assert result["iterations"] == [2]
    for role, want_rank in ref_ranks.items():
        (value,) = result["metrics"][f"stable_rank/{role}/layer_01"]
        assert value == pytest.approx(want_rank, rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_evaluate_export_analyze_a_run_directory_whose_save_lies_elsewhere(
    bare, demo_prefix, tmp_path
):
    from megatron_gamma.diagnostics.analyze import analyze
    from megatron_gamma.evaluation.evaluate import evaluate
    from megatron_gamma.hf.hf_export import export_hf

    run, save = bare  # --run-dir RUN --save ELSEWHERE: RUN/checkpoints does not exist
    assert layout.resolve_checkpoint(run) == layout.checkpoint_dir(save, 2)
    got = evaluate(run, [demo_prefix], eval_tokens=4 * 64)
    want = evaluate(save, [demo_prefix], eval_tokens=4 * 64)
    assert (got["iteration"], got["loss"]) == (2, want["loss"])
    assert export_hf(run, str(tmp_path / "hf"))["iteration"] == 2
    written = analyze([run], str(tmp_path / "analysis"), progress=False)
    with open(written["json"], encoding="utf-8") as f:
        (result,) = json.load(f)["runs"]
    assert result["iterations"] == [0, 2]


@pytest.mark.slow
def test_old_checkpoints_read_config_yaml_and_config_overrides(bare, tmp_path):
    run, save = bare
    old = tmp_path / "old"
    shutil.copytree(save, old / "checkpoints")
    common = old / "checkpoints" / "iter_0000002" / "common.pt"
    state = torch.load(common, weights_only=True)
    del state[layout.RUN_CONFIG_KEY], state[layout.TOKENIZER_KEY]
    torch.save(state, common)
    assert layout.saved_description(str(common.parent)) == (None, None)
    with pytest.raises(ConfigError, match=r"does not carry the run's config.*Fix: pass.*--config"):
        loader.run_config(str(old / "checkpoints"))

    shutil.copyfile(os.path.join(run, "config.yaml"), old / "config.yaml")
    want = load_config(os.path.join(run, "config.yaml")).replace(run_dir=str(old))
    assert loader.run_config(str(old / "checkpoints" / "iter_0000002")) == want

    other = tmp_path / "other.yaml"
    raw = yaml.safe_load((old / "config.yaml").read_text())
    raw["training"]["seed"] = 4321
    other.write_text(yaml.safe_dump(raw))
    assert loader.run_config(save, str(other)).training.seed == 4321
    assert loader.run_config(save).training.seed != 4321


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_evaluate_takes_its_ranks_from_slurm(bare, demo_prefix, tmp_path):
    """Two srun-style tasks (SLURM_PROCID/SLURM_NTASKS, no torchrun variables) share the
    windows instead of each evaluating everything alone."""
    _, save = bare
    one = _evaluate_one_process(save, demo_prefix)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), SLURM_NTASKS="2")
    env.update(OMP_NUM_THREADS="1", TORCHDYNAMO_DISABLE="1")
    args = ["evaluate", save, "--data-path", demo_prefix, "--eval-tokens", str(6 * 64)]
    cmd = [
        sys.executable,
        "-m",
        "megatron_gamma.cli",
        *args,
        "--output-dir",
        str(tmp_path / "eval"),
    ]
    procs = [
        subprocess.Popen(
            cmd,
            env=dict(env, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-4000:]
    two = json.loads((tmp_path / "eval" / "eval_loss.json").read_text())
    assert two["processes"] == 2 and one["processes"] == 1
    assert two["tokens"] == one["tokens"] == 6 * 64
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-9)


def _evaluate_one_process(ckpt: str, prefix: str) -> dict:
    """The single-process held-out loss of ``ckpt`` on 6 windows of 64 tokens."""
    from megatron_gamma.evaluation.evaluate import evaluate

    return evaluate(ckpt, [prefix], eval_tokens=6 * 64)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_moe_run_trained_with_tp2_evaluates_on_two_ranks(demo_prefix, tmp_path):
    """Issue 28: evaluate's config kept expert_tensor_parallel_size=2 while setting TP=1, so
    ``torchrun ... evaluate`` of an MoE run trained with TP=2 stopped in validate_layout."""
    run = tmp_path / "moe"
    flags = ["--num-experts", "4", "--moe-router-topk", "2", "--tensor-model-parallel-size", "2"]
    flags += ["--sequence-parallel", "--save", str(run / "checkpoints")]
    pretrain(run, demo_prefix, *ITERS, *flags, nproc=2)
    assert load_config(str(run / "config.yaml")).parallel.expert_tensor_parallel_size == 2
    one = _evaluate_one_process(str(run), demo_prefix)
    args = ["evaluate", str(run), "--data-path", demo_prefix, "--eval-tokens", str(6 * 64)]
    proc = run_cli([*args, "--output-dir", str(tmp_path / "eval")], nproc=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    two = json.loads((tmp_path / "eval" / "eval_loss.json").read_text())
    assert two["processes"] == 2
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-9)


def test_rundir_and_evaluate_import_neither_upper_rooms_nor_transformers():
    """The room imports no room above it, and plain ``evaluate`` needs no ``[eval]`` extra."""
    code = (
        "import sys\n"
        "import megatron_gamma.rundir.layout, megatron_gamma.rundir.loader\n"
        "upper = ('training', 'diagnostics', 'evaluation', 'study')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[1:2] and m.split('.')[1] in upper\n"
        "             and m.startswith('megatron_gamma.')))\n"
        "import megatron_gamma.evaluation.evaluate\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines() == ["[]", "[]"]


def _with_tokenizer_fingerprint(save: str, dest, fingerprint: dict | None) -> str:
    """A copy of ``save``'s checkpoints at ``dest`` whose common state carries ``fingerprint``
    (None: none, as checkpoints saved before fingerprints); returns the copy's root."""
    shutil.copytree(save, dest)
    common = dest / "iter_0000002" / "common.pt"
    state = torch.load(common, weights_only=True)
    if fingerprint is None:
        del state[layout.TOKENIZER_KEY]
    else:
        state[layout.TOKENIZER_KEY] = fingerprint
    torch.save(state, common)
    assert layout.saved_description(str(common.parent))[1] == fingerprint
    return str(dest)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_checkpoint_loads_only_with_its_tokenizer(bare, demo_prefix, tmp_path, capsys):
    """``pretrain --load``, evaluate/export (``checkpoint.resolve``), analyze and compare check
    the checkpoint's tokenizer fingerprint against the tokenizer they would use: another one is
    a named error before any model is built, a checkpoint without a fingerprint loads with a
    warning. The same tokenizer.json saved again in another layout (same canonical form) loads;
    a fingerprint written before canonical ones existed is compared by its SHA-256 alone."""
    from megatron_gamma.data.tokenizer import BilingualTokenizer
    from megatron_gamma.data.tokenizer_fingerprint import fingerprint
    from megatron_gamma.diagnostics.analyze import analyze
    from megatron_gamma.diagnostics.compare import compare
    from megatron_gamma.rundir import checkpoint
    from megatron_gamma.training.loop import preflight

    run, save = bare
    with open(DEMO_TOKENIZER, encoding="utf-8") as f:
        doc = json.load(f)
    relaid = tmp_path / "relaid" / "tokenizer.json"  # the same JSON, other bytes
    relaid.parent.mkdir()
    relaid.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    other = tmp_path / "other" / "tokenizer.json"  # one merge fewer: another tokenizer
    other.parent.mkdir()
    del doc["model"]["merges"][0]
    other.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    theirs = fingerprint(BilingualTokenizer(str(other)))
    ours = fingerprint(BilingualTokenizer(DEMO_TOKENIZER))
    same = fingerprint(BilingualTokenizer(str(relaid)))
    assert len({theirs["sha256"], ours["sha256"], same["sha256"]}) == 3
    assert same["canonical_sha256"] == ours["canonical_sha256"] != theirs["canonical_sha256"]

    def train_config(load: str):
        overrides = {"load": load, "save": str(tmp_path / "new"), "run_dir": str(tmp_path / "r")}
        return load_config(os.path.join(run, "config.yaml"), overrides)

    # the checkpoint's own tokenizer: loads, silently
    own = loader.check_tokenizer(layout.checkpoint_dir(save, 2), loader.run_config(save), "")
    assert own is None
    assert checkpoint.resolve(save).path == layout.checkpoint_dir(save, 2)
    assert preflight(train_config(save)).sha256 == ours["sha256"]
    assert "tokenizer fingerprint" not in capsys.readouterr().out

    # trained with another tokenizer: every loader names both and the flags of the right one
    foreign = _with_tokenizer_fingerprint(save, tmp_path / "foreign", theirs)
    named = (
        rf"checkpoint='{foreign}/iter_0000002': trained with tokenizer .*sha256 "
        rf"{theirs['sha256'][:12]}\), but the config's tokenizer is .*sha256 "
        rf"{ours['sha256'][:12]}\). Fix: "
    )
    flags = f"--tokenizer-type HuggingFaceTokenizer --tokenizer-model {other}"
    with pytest.raises(ConfigError, match=rf"{named}pass the checkpoint's tokenizer \({flags}\)$"):
        preflight(train_config(foreign))
    with pytest.raises(ConfigError, match=rf"{named}pass --config .*\({flags}\)"):
        checkpoint.resolve(foreign)
    out = tmp_path / "analysis"
    with pytest.raises(ConfigError, match=rf"{named}put the checkpoint's tokenizer \({flags}\)"):
        analyze([foreign], str(out), include_init=False, progress=False)
    with pytest.raises(ConfigError, match=rf"{named}pass --config-b .*\({flags}\)"):
        compare(save, foreign, demo_prefix, str(out), progress=False)
    assert not out.exists() or os.listdir(out) == []

    # trained with the same tokenizer in another layout: loads, silently
    capsys.readouterr()
    relaid_ckpt = _with_tokenizer_fingerprint(save, tmp_path / "relaid_ckpt", same)
    assert checkpoint.resolve(relaid_ckpt).path == layout.checkpoint_dir(relaid_ckpt, 2)
    assert preflight(train_config(relaid_ckpt)).sha256 == ours["sha256"]
    assert "tokenizer" not in capsys.readouterr().err
    # ... but its fingerprint as written before canonical ones existed is another tokenizer's
    older = {k: v for k, v in same.items() if k != "canonical_sha256"}
    older_ckpt = _with_tokenizer_fingerprint(save, tmp_path / "older_ckpt", older)
    with pytest.raises(ConfigError, match=rf"trained with tokenizer .*{relaid}.*Fix: pass --con"):
        checkpoint.resolve(older_ckpt)

    # trained with the tokenizer file at the same path before it changed: no "pass that path"
    before = {"sha256": "0" * 64, "canonical_sha256": "1" * 64}
    changed = _with_tokenizer_fingerprint(save, tmp_path / "changed", {**ours, **before})
    then_now = rf"\(sha256 000000000000 then, {ours['sha256'][:12]} now\)\. Fix: restore"
    with pytest.raises(ConfigError, match=rf"changed since the checkpoint was trained {then_now}"):
        checkpoint.resolve(changed)

    # saved before checkpoints carried a fingerprint: loads, with a warning
    old = _with_tokenizer_fingerprint(save, tmp_path / "old", None)
    capsys.readouterr()
    assert checkpoint.resolve(old).path == layout.checkpoint_dir(old, 2)
    assert f"WARNING: checkpoint {old}/iter_0000002 carries no tokenizer fingerprint" in (
        capsys.readouterr().err
    )
    assert preflight(train_config(old)).sha256 == ours["sha256"]
    assert "carries no tokenizer fingerprint" in capsys.readouterr().out


@pytest.mark.slow
def test_a_checkpoint_read_prints_no_library_deprecation(bare, demo_prefix, tmp_path):
    """torch's FutureWarnings on the APIs megatron-core's checkpoint loading calls say nothing
    the user can act on; the console leaves them out (``warnings_summary._LIBRARY_NOISE``)."""
    run, save = bare
    args = ["evaluate", save, "--config", os.path.join(run, "config.yaml")]
    args += ["--data-path", demo_prefix, "--eval-tokens", str(6 * 64)]
    proc = run_cli([*args, "--output-dir", str(tmp_path / "eval")])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Warning" not in proc.stderr, proc.stderr[-4000:]


def test_missing_checkpoint_names_the_accepted_forms_and_the_saved_iterations(tmp_path, capsys):
    """A mistyped run directory or iteration: the error names the three accepted forms and,
    where the parent holds checkpoints, the iterations saved there."""
    from megatron_gamma.checkpoint_trust import CheckpointError
    from megatron_gamma.cli import main
    from megatron_gamma.rundir import checkpoint

    forms = (
        "a checkpoint (SAVE/iter_NNNNNNN), a checkpoint root (SAVE, for its newest checkpoint) "
        "or a run directory (RUN)"
    )
    save = tmp_path / "demo" / "checkpoints"
    for name in ("iter_0000050", "iter_0000200", "iter_0000300.partial"):
        (save / name).mkdir(parents=True)
    wrong = str(save / "iter_0000100")
    with pytest.raises(CheckpointError) as e:
        checkpoint.resolve(wrong)
    assert str(e.value) == (
        f"checkpoint={wrong!r}: does not exist; {save} holds iter_0000050, iter_0000200. "
        f"Fix: pass one of those, or {forms}"
    )
    typo = str(tmp_path / "dmeo")
    assert main(["evaluate", typo, "--data-path", str(tmp_path / "data")]) == 2
    assert f"checkpoint={typo!r}: does not exist. Fix: pass {forms}\n" in capsys.readouterr().err


def test_a_fix_that_names_a_path_with_a_space_quotes_it(tmp_path):
    """Trial 15: "Fix: add --load runs/my run/ckpt to resume from them" broke when pasted. Each
    path a fix names is a shell word: split as a shell splits it, the flag's value is the
    path."""
    from megatron_gamma.rundir.paths import check_save_dir, check_takeover

    save = tmp_path / "my run" / "ckpt"
    os.makedirs(save / "iter_0000002")
    (save / layout.TRACKER).write_text("2")
    with pytest.raises(ConfigError) as e:
        check_save_dir(str(save), None, False)
    words = shlex.split(str(e.value).split("Fix: add ", 1)[1].split(" to resume")[0])
    assert words == ["--load", str(save)]
    run = tmp_path / "my run"
    (run / "config.yaml").write_text(yaml.safe_dump({"checkpoint": {"save": str(save)}}))
    with pytest.raises(ConfigError) as e:
        check_takeover(str(run), None)
    words = shlex.split(str(e.value).split(", add ", 1)[1].split(" to resume it")[0])
    assert words == ["--load", str(save)]
