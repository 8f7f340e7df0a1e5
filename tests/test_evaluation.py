"""evaluate / export-hf / import-hf / lm-eval benchmarks on tiny trained checkpoints.

References: megatron-core's own GPTModel forward on the same tokens (logits, greedy decoding),
the Hugging Face export's per-token cross-entropy computed here (held-out loss), the bytes of the
original checkpoint (round trip), and closed forms for the paired bootstrap.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from helpers import pretrain, read_metrics, run_cli

from megatron_gamma import atomic
from megatron_gamma.checkpoint_trust import CheckpointError
from megatron_gamma.config import ConfigError, load_config
from megatron_gamma.evaluation.bootstrap import paired_bootstrap
from megatron_gamma.evaluation.evaluate import evaluate
from megatron_gamma.hf.hf_export import MODELING_FILE, export_hf
from megatron_gamma.hf.hf_import import import_hf
from megatron_gamma.hf.mapping import UnmappableArchitectureError
from megatron_gamma.rundir import checkpoint, loader
from megatron_gamma.rundir.checkpoint import TokenizerNotFoundError
from megatron_gamma.training.loop import preflight

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = os.path.join(REPO, "tests", "lm_eval_tasks")
ITERS = ["--train-iters", "3", "--eval-interval", "100", "--log-diagnostics-interval", "0"]
VARIANTS = {
    "llama_tied_gqa": ["--gated-attention", "none", "--num-query-groups", "2",
                       "--no-untie-embeddings-and-output-weights"],
    "llama_untied": ["--gated-attention", "none"],
    "elementwise_gqa": ["--gated-attention", "elementwise", "--num-query-groups", "2"],
    "headwise_tied": ["--gated-attention", "headwise", "--no-untie-embeddings-and-output-weights"],
    "moe": ["--gated-attention", "elementwise", "--num-experts", "4", "--moe-router-topk", "2"],
    "bf16": ["--gated-attention", "headwise", "--bf16"],
}  # fmt: skip


@pytest.fixture(scope="session")
def runs(tmp_path_factory, demo_prefix) -> dict[str, str]:
    """One 3-iteration tiny run per variant (TP = PP = 1), by name -> run directory."""
    root = tmp_path_factory.mktemp("eval_runs")
    out = {}
    for name, flags in VARIANTS.items():
        run = root / name
        pretrain(run, demo_prefix, *ITERS, *flags, "--save", str(run / "checkpoints"))
        out[name] = str(run)
    return out


@pytest.fixture(scope="session")
def tp2pp2_run(tmp_path_factory, demo_prefix) -> str:
    """A gated GQA run saved under TP = 2 x PP = 2 (4 processes)."""
    run = tmp_path_factory.mktemp("eval_tp2pp2") / "run"
    flags = VARIANTS["elementwise_gqa"] + ["--tensor-model-parallel-size", "2"]
    flags += ["--pipeline-model-parallel-size", "2", "--save", str(run / "checkpoints")]
    pretrain(run, demo_prefix, *ITERS, *flags, nproc=4)
    return str(run)


def _megatron_reference(run: str, tokens: torch.Tensor, new_tokens: int):
    """megatron-core logits (B, T, V) on ``tokens`` and its greedy continuation of row 0."""
    rc = checkpoint.resolve(run)
    with loader.single_process(rc.cfg), torch.no_grad():
        model, _ = checkpoint.load_model(rc)
        b, t = tokens.shape
        logits = model(tokens, torch.arange(t).expand(b, t), None)
        ids = tokens[:1]
        for _ in range(new_tokens):
            out = model(ids, torch.arange(ids.size(1)).unsqueeze(0), None)
            ids = torch.cat([ids, out[:, -1].argmax(-1, keepdim=True)], dim=1)
    return logits, ids[0, t:]


def _check_export(run: str, out_dir: str, stock: bool) -> None:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    info = export_hf(run, out_dir)
    assert info["model_type"] == ("llama" if stock else "gamma_gpt")
    with open(os.path.join(out_dir, "config.json")) as f:
        hf_config = json.load(f)
    if stock:
        assert "auto_map" not in hf_config
        assert not os.path.exists(os.path.join(out_dir, MODELING_FILE))
        hf = AutoModelForCausalLM.from_pretrained(out_dir)  # no custom code
        assert type(hf) is LlamaForCausalLM
    else:
        assert os.path.isfile(os.path.join(out_dir, MODELING_FILE))
        hf = AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True)
    hf.eval()
    tokens = torch.randint(0, 4000, (3, 48), generator=torch.Generator().manual_seed(0))
    ref_logits, ref_greedy = _megatron_reference(run, tokens, 20)
    with torch.no_grad():
        logits = hf(tokens).logits
        greedy = hf.generate(tokens[:1], max_new_tokens=20, do_sample=False)[0, 48:]
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
    assert greedy.tolist() == ref_greedy.tolist()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_logits_and_greedy_match_megatron(runs, name, tmp_path):
    _check_export(runs[name], str(tmp_path / "hf"), stock=name.startswith("llama"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_export_from_tp2_pp2_checkpoint(tp2pp2_run, tmp_path):
    _check_export(tp2pp2_run, str(tmp_path / "hf"), stock=False)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_evaluate_on_two_ranks_equals_one_rank(tp2pp2_run, demo_prefix, tmp_path):
    one = evaluate(tp2pp2_run, [demo_prefix], eval_tokens=6 * 64)
    args = ["evaluate", tp2pp2_run, "--data-path", demo_prefix, "--eval-tokens", str(6 * 64)]
    proc = run_cli([*args, "--output-dir", str(tmp_path / "eval")], nproc=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    two = json.loads((tmp_path / "eval" / "eval_loss.json").read_text())
    assert two["tokens"] == one["tokens"] == 6 * 64
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-9)


@pytest.mark.slow
def test_exported_gamma_model_loads_from_megatron_gamma_without_remote_code(runs, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from megatron_gamma.hf import GammaGPTForCausalLM

    export_hf(runs["headwise_tied"], str(tmp_path / "hf"))
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert type(model) is GammaGPTForCausalLM
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tok.decode(tok("你好, world").input_ids) == "你好, world"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["llama_tied_gqa", "moe"])
def test_round_trip_is_bit_identical(runs, name, tmp_path, demo_prefix):
    export_hf(runs[name], str(tmp_path / "hf"), max_shard_size="200KB")
    with open(tmp_path / "hf" / "model.safetensors.index.json") as f:
        assert len(set(json.load(f)["weight_map"].values())) > 1  # sharded
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert set(modes.values()) == {atomic.new_file_mode()}, modes  # safetensors: not owner-only
    imported = import_hf(str(tmp_path / "hf"), str(tmp_path / "imported"))
    states = []
    for run in (runs[name], imported["run_dir"]):
        rc = checkpoint.resolve(run)
        with loader.single_process(rc.cfg):
            model, iteration = checkpoint.load_model(rc)
            states.append({k: v.clone() for k, v in model.state_dict().items() if v is not None})
        assert iteration == 3
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key
    # the loss the next training iteration would see: the same windows of training data
    kwargs = dict(eval_tokens=4 * 64, seq_length=64)
    original = evaluate(runs[name], [demo_prefix], **kwargs)["loss"]
    assert evaluate(imported["run_dir"], [demo_prefix], **kwargs)["loss"] == original


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_from_the_imported_checkpoint_matches_the_original(runs, tmp_path, demo_prefix):
    name = "llama_untied"
    export_hf(runs[name], str(tmp_path / "hf"))
    imported = import_hf(str(tmp_path / "hf"), str(tmp_path / "imported"))
    imported_root = os.path.join(imported["run_dir"], "checkpoints")
    with pytest.raises(ConfigError, match="model weights only.*Fix: start from it with"):
        preflight(load_config(os.path.join(imported["run_dir"], "config.yaml")))
    # the same weights-only start (fresh optimizer and schedule, iteration 0) from both
    starts = {
        "original": ["--finetune", "--load", os.path.join(runs[name], "checkpoints")],
        "imported": ["--pretrained-checkpoint", imported_root],
    }
    losses = {}
    for label, flags in starts.items():
        run = tmp_path / f"{label}-trained"  # not import-hf's run directory: another run's
        losses[label] = pretrain(run, demo_prefix, *ITERS, *VARIANTS[name], *flags)["train"]
    assert sorted(losses["original"]) == [1, 2, 3]
    assert losses["imported"] == losses["original"]
    # the weights were loaded: the first loss is not the one of the original run's random init
    # (same data, seed and flags)
    assert losses["original"][1] != read_metrics(runs[name])["train"][1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_evaluate_loss_equals_hf_per_token_mean(runs, demo_prefix, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from transformers import AutoModelForCausalLM

    run = runs["elementwise_gqa"]
    seq, n = 32, 6
    out = evaluate(run, [demo_prefix], eval_tokens=n * seq + 5, seq_length=seq, micro_batch_size=4)
    assert out["tokens"] == n * seq and out["windows"] == n
    ds = IndexedDataset(demo_prefix)
    stream = np.concatenate([np.asarray(ds[i]) for i in range(len(ds))])[: n * seq + 1]
    windows = torch.stack([torch.from_numpy(stream[i * seq : i * seq + seq + 1]) for i in range(n)])
    export_hf(run, str(tmp_path / "hf"))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True)
    with torch.no_grad():
        logits = hf(windows[:, :-1].long()).logits.double()
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1).long(), reduction="none"
    )
    assert out["loss"] == pytest.approx(float(nll.mean()), abs=1e-5)
    assert out["perplexity"] == pytest.approx(float(nll.mean().exp()), rel=1e-5)


@pytest.mark.slow
def test_bf16_run_evaluates_and_exports_in_fp32(runs, demo_prefix, tmp_path):
    from safetensors.torch import load_file

    export_hf(runs["bf16"], str(tmp_path / "hf"))
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "float32"
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    for name, w in weights.items():  # bf16 values, upcast exactly
        assert w.dtype == torch.float32 and torch.equal(w.bfloat16().float(), w), name
    meta = json.loads((tmp_path / "hf" / "megatron_gamma.json").read_text())
    assert meta["config"]["training"]["bf16"] is True  # the run's own config is kept
    out = evaluate(runs["bf16"], [demo_prefix], eval_tokens=2 * 64)
    assert out["tokens"] == 128 and 0 < out["loss"] < 9.0


@pytest.mark.slow
def test_evaluate_data_path_replaces_the_run_data_path(runs, demo_prefix):
    with open(os.path.join(runs["moe"], "config.yaml")) as f:
        assert yaml.safe_load(f)["data"]["data_path"] == [demo_prefix]
    blend = evaluate(runs["moe"], ["1", demo_prefix, "1", demo_prefix], eval_tokens=4 * 64)
    single = evaluate(runs["moe"], [demo_prefix], eval_tokens=2 * 64)
    assert [d["windows"] for d in blend["data"]] == [2, 2]
    assert blend["data"][0]["loss"] == pytest.approx(single["loss"], abs=1e-6)


@pytest.mark.slow
def test_held_out_evaluate_imports_no_transformers(runs, demo_prefix):
    """Plain ``evaluate`` needs no ``[eval]`` extra: importing the package and computing a
    held-out loss (the same value as in this process) loads no ``transformers`` module."""
    code = (
        "import json, sys\n"
        "import megatron_gamma.evaluation\n"
        "from megatron_gamma.evaluation.evaluate import evaluate\n"
        f"out = evaluate({runs['moe']!r}, [{demo_prefix!r}], eval_tokens=2 * 64)\n"
        "hf = sorted(m for m in sys.modules if m.split('.')[0] == 'transformers')\n"
        "print(json.dumps([out['loss'], hf]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    loss, modules = json.loads(proc.stdout.splitlines()[-1])
    assert modules == []
    assert loss == pytest.approx(evaluate(runs["moe"], [demo_prefix], eval_tokens=2 * 64)["loss"])


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(list(args), timeout=900, cwd=REPO)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_lm_eval_offline_one_checkpoint_and_compare(runs, tmp_path):
    a, b = runs["elementwise_gqa"], runs["llama_untied"]
    one = tmp_path / "one"
    proc = _cli("evaluate", a, "--tasks", "tiny_mc,tiny_gen", "--include-path", TASKS,
                "--output-dir", str(one))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((one / "eval.json").read_text())
    assert report["tasks"]["tiny_mc"]["n"] == 8 and report["tasks"]["tiny_gen"]["n"] == 6
    assert report["tasks"]["tiny_mc"]["metric"] == "acc,none"
    assert "| tiny_mc |" in (one / "eval.md").read_text()
    both = tmp_path / "both"
    proc = _cli("evaluate", a, "--compare", b, "--tasks", "tiny_mc,tiny_gen", "--include-path",
                TASKS, "--output-dir", str(both), "--bootstrap-samples", "2000")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    pair = json.loads((both / "eval.json").read_text())["tasks"]["tiny_mc"]
    assert pair["a"] == report["tasks"]["tiny_mc"]["a"]
    assert pair["diff"] == pytest.approx(pair["a"] - pair["b"])
    assert pair["low"] <= pair["diff"] <= pair["high"]
    assert not [n for n in os.listdir(both) if n.startswith(".hf_export")]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_task_files_that_run_code_need_trust_task_code(runs, tmp_path):
    """lm-eval's `!function` tag imports the module beside a task file when the task loads:
    the audit ran code through --include-path. Without --trust-task-code the directory is
    refused, naming the file, before any model is read, and the module never runs; with it,
    lm-eval runs the module (the marker proves the refusal was not a no-op)."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    spec = yaml.safe_load(open(os.path.join(TASKS, "tiny_mc.yaml")))
    spec["task"] = "coded_mc"
    spec["dataset_kwargs"]["data_files"]["test"] = os.path.join(TASKS, "tiny_mc.jsonl")
    text = yaml.safe_dump(spec) + "process_docs: !function utils.keep\n"
    (tasks / "coded_mc.yaml").write_text(text)
    marker = tmp_path / "ran"
    (tasks / "utils.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n\n\n"
        "def keep(dataset):\n    return dataset\n"
    )
    args = ["evaluate", runs["llama_untied"], "--tasks", "coded_mc", "--include-path",
            str(tasks), "--limit", "2", "--output-dir", str(tmp_path / "out")]  # fmt: skip
    proc = _cli(*args)
    assert proc.returncode == 2 and not marker.exists()
    assert f"{str(tasks / 'coded_mc.yaml')!r} uses the '!function' tag" in proc.stderr
    assert not (tmp_path / "out").exists()
    proc = _cli(*args, "--trust-task-code")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert marker.read_text() == "ran"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_missing_dataset_names_it(runs, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    spec = yaml.safe_load(open(os.path.join(TASKS, "tiny_mc.yaml")))
    spec["task"] = "gone_mc"
    spec["dataset_kwargs"]["data_files"]["test"] = str(tmp_path / "missing.jsonl")
    (tasks / "gone_mc.yaml").write_text(yaml.safe_dump(spec))
    proc = _cli("evaluate", runs["llama_untied"], "--tasks", "gone_mc", "--include-path",
                str(tasks), "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert proc.returncode == 2
    assert "gone_mc" in proc.stderr and "missing.jsonl" in proc.stderr
    assert "--include-path" in proc.stderr
    # a hub dataset with the hub offline (HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1 in _cli)
    proc = _cli("evaluate", runs["llama_untied"], "--tasks", "hellaswag", "--output-dir",
                str(tmp_path / "out"))  # fmt: skip
    assert proc.returncode == 2
    assert "task='hellaswag': its dataset 'Rowan/hellaswag' could not be loaded" in proc.stderr
    assert "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1" in proc.stderr
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_lm_evals_git_probe_prints_nothing_outside_a_repository(tmp_path, monkeypatch, capfd):
    """Trial 13: ``evaluate --tasks`` outside a git repository printed "fatal: not a git
    repository" once per model (lm-eval's ``git describe``). Unwrapped, lm-eval's probe prints
    it (the reference); wrapped, it prints nothing and returns the same value."""
    import lm_eval.evaluator

    from megatron_gamma.evaluation.benchmarks import quiet_git_probe

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    bare = lm_eval.evaluator.get_git_commit_hash()
    assert "fatal: not a git repository" in capfd.readouterr().err
    with quiet_git_probe():
        assert lm_eval.evaluator.get_git_commit_hash() == bare
    assert capfd.readouterr().err == ""
    assert lm_eval.evaluator.get_git_commit_hash() == bare  # unwrapped again after the block
    assert "fatal: not a git repository" in capfd.readouterr().err


def test_paired_bootstrap_against_hand_computation():
    # d = a - b = (0, 0, 0, 1): a resampled mean is K/4 with K ~ Binomial(4, 1/4), so
    # P(K <= 0) = 0.316 > 0.025 and P(K <= 2) = 0.949 < 0.975 < P(K <= 3) = 0.996.
    a, b = np.array([1.0, 0.0, 1.0, 1.0]), np.array([1.0, 0.0, 1.0, 0.0])
    out = paired_bootstrap(a, b, num_samples=20000, seed=3)
    assert (out["a"], out["b"], out["diff"]) == (0.75, 0.5, 0.25)
    assert (out["low"], out["high"]) == (0.0, 0.75)
    # large n: the percentile interval approaches mean -/+ 1.96 sd / sqrt(n)
    rng = np.random.default_rng(0)
    a, b = (rng.random(2000) < 0.6).astype(float), (rng.random(2000) < 0.5).astype(float)
    out = paired_bootstrap(a, b, num_samples=4000, seed=1)
    d = a - b
    half = 1.959964 * d.std() / np.sqrt(d.size)
    assert out["low"] == pytest.approx(d.mean() - half, abs=4e-3)
    assert out["high"] == pytest.approx(d.mean() + half, abs=4e-3)
    with pytest.raises(ValueError, match="same items"):
        paired_bootstrap(np.zeros(3), np.zeros(4))


def _assert_nothing_written(out_dir) -> None:
    assert not os.path.exists(out_dir)
    parent = os.path.dirname(out_dir)
    assert not [n for n in os.listdir(parent) if n.startswith(f".{os.path.basename(out_dir)}.")]


@pytest.mark.slow
def test_named_errors_and_clean_out_dir(runs, tmp_path):
    out = str(tmp_path / "hf")
    with pytest.raises(UnmappableArchitectureError, match="gated_attention='elementwise'"):
        export_hf(runs["elementwise_gqa"], out, hf_format="llama")
    _assert_nothing_written(out)

    partial = tmp_path / "partial"
    shutil.copytree(
        os.path.join(runs["llama_untied"], "checkpoints", "iter_0000003"),
        partial / "iter_0000005.partial",
    )
    os.remove(partial / "iter_0000005.partial" / "metadata.json")
    with pytest.raises(CheckpointError, match="iter_0000005.partial"):
        export_hf(str(partial), out)
    _assert_nothing_written(out)

    corrupt = tmp_path / "corrupt" / "checkpoints" / "iter_0000003"
    shutil.copytree(os.path.join(runs["llama_untied"], "checkpoints", "iter_0000003"), corrupt)
    for name in os.listdir(corrupt):
        if name.endswith(".distcp"):
            with open(corrupt / name, "r+b") as f:
                f.truncate(100)
    cfg = os.path.join(runs["llama_untied"], "config.yaml")
    with pytest.raises(CheckpointError) as err:  # one line naming the file, not a traceback
        export_hf(str(corrupt), out, config=cfg)
    assert re.search(r"distcp': unreadable \(truncated: unexpected end of file", str(err.value))
    assert "\n" not in str(err.value) and "Fix: use a complete checkpoint" in str(err.value)
    _assert_nothing_written(out)

    moved = tmp_path / "moved"
    shutil.copytree(runs["llama_untied"], moved)
    raw = yaml.safe_load((moved / "config.yaml").read_text())
    raw["data"]["tokenizer_model"] = str(tmp_path / "gone" / "tokenizer.json")
    (moved / "config.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(TokenizerNotFoundError, match="gone/tokenizer.json"):
        export_hf(str(moved), out, config=str(moved / "config.yaml"))
    _assert_nothing_written(out)
    raw["data"]["tokenizer_model"] = os.path.join("gone", "tokenizer.json")  # as typed
    (moved / "config.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(TokenizerNotFoundError, match="a path relative to the directory the run "):
        export_hf(str(moved), out, config=str(moved / "config.yaml"))
    _assert_nothing_written(out)

    hf_dir = tmp_path / "mistral"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    (hf_dir / "tokenizer.json").write_text("{}")
    with pytest.raises(UnmappableArchitectureError, match="model_type='mistral'"):
        import_hf(str(hf_dir), str(tmp_path / "imported"))
    assert not os.path.exists(tmp_path / "imported")


@pytest.mark.slow
def test_left_padded_batch_generation_equals_single_prompts(runs, tmp_path):
    from transformers import AutoModelForCausalLM

    export_hf(runs["elementwise_gqa"], str(tmp_path / "hf"))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True)
    gen = torch.Generator().manual_seed(1)
    a, b = (
        torch.randint(0, 4000, (1, 12), generator=gen),
        torch.randint(0, 4000, (1, 7), generator=gen),
    )
    batch = torch.full((2, 12), hf.generation_config.pad_token_id)
    batch[0], batch[1, 5:] = a[0], b[0]
    mask = (torch.arange(12) >= torch.tensor([[0], [5]])).long()
    with torch.no_grad():
        both = hf.generate(batch, attention_mask=mask, max_new_tokens=8, do_sample=False)[:, 12:]
        alone = [hf.generate(x, max_new_tokens=8, do_sample=False)[0, x.size(1) :] for x in (a, b)]
    assert both[0].tolist() == alone[0].tolist() and both[1].tolist() == alone[1].tolist()


def test_import_hf_names_a_missing_source_directory(tmp_path, capsys):
    """A mistyped model directory is named as such, not as its missing tokenizer.json."""
    from megatron_gamma.cli import main

    afile = tmp_path / "config.json"
    afile.write_text("{}")
    fix = (
        "Fix: pass the Hugging Face model directory (config.json, *.safetensors and "
        "tokenizer.json, as `megatron-gamma export-hf` writes it)"
    )
    missing = tmp_path / "nonexistent"
    for source, why in ((missing, "does not exist"), (afile, "is not a directory")):
        assert main(["import-hf", str(source), str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert f"import-hf: error: hf_dir={str(source)!r}: {why}. {fix}\n" in err
        assert "tokenizer" not in err.split(". Fix:")[0]
    assert sorted(os.listdir(tmp_path)) == ["config.json"]


def test_cli_rejects_flags_without_effect(capsys):
    from megatron_gamma.cli import main

    assert main(["evaluate", "RUN", "--compare", "OTHER"]) == 2
    assert "--compare='OTHER': acts only with --tasks" in capsys.readouterr().err
    assert main(["evaluate", "RUN", "--tasks", "hellaswag", "--eval-tokens", "8"]) == 2
    assert "--eval-tokens=8: acts only on the held-out loss" in capsys.readouterr().err
    assert main(["evaluate", "RUN", "--tasks", "hellaswag", "--compare-config", "c.yaml"]) == 2
    assert "acts only with --compare" in capsys.readouterr().err


@pytest.mark.slow
def test_import_of_a_plain_llama_directory(runs, tmp_path):
    hf_dir = tmp_path / "hf"
    export_hf(runs["llama_untied"], str(hf_dir))
    config = json.loads((hf_dir / "config.json").read_text())
    edited = dict(config, rms_norm_eps=1e-5)
    (hf_dir / "config.json").write_text(json.dumps(edited))
    with pytest.raises(CheckpointError, match="norm_epsilon"):
        import_hf(str(hf_dir), str(tmp_path / "mismatch"))
    assert not os.path.exists(tmp_path / "mismatch")
    (hf_dir / "config.json").write_text(json.dumps(config))
    os.remove(hf_dir / "megatron_gamma.json")  # as a Llama from elsewhere: config.json only
    out = import_hf(str(hf_dir), str(tmp_path / "plain"))
    assert out["iteration"] == 0
    imported = yaml.safe_load((tmp_path / "plain" / "config.yaml").read_text())["model"]
    original = yaml.safe_load(open(os.path.join(runs["llama_untied"], "config.yaml")))["model"]
    for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                "num_query_groups", "kv_channels", "norm_epsilon", "rotary_base",
                "untie_embeddings_and_output_weights", "gated_attention"):  # fmt: skip
        assert imported[key] == original[key], key
    states = []
    for run in (runs["llama_untied"], out["run_dir"]):
        rc = checkpoint.resolve(run)
        with loader.single_process(rc.cfg):
            model, _ = checkpoint.load_model(rc)
            states.append({k: v.clone() for k, v in model.state_dict().items() if v is not None})
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def _hub_model(folder, meta_config: dict) -> str:
    """A tiny Llama directory as one comes from elsewhere (no training): config.json,
    safetensors, the demo tokenizer and a megatron_gamma.json of ``meta_config`` on top of the
    model section config.json gives."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from megatron_gamma.data import demo_dir
    from megatron_gamma.hf import mapping

    hf = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
            tie_word_embeddings=True,
        )
    )  # fmt: skip
    hf.save_pretrained(folder)
    shutil.copyfile(os.path.join(demo_dir(), "tokenizer.json"), folder / "tokenizer.json")
    section = mapping.model_section_from_hf(json.loads((folder / "config.json").read_text()))
    meta = {"iteration": 0, "config": {"model": section, **meta_config}}
    (folder / "megatron_gamma.json").write_text(json.dumps(meta))
    return str(folder)


def _plain_llama(tmp_path, **edits) -> str:
    """``_hub_model`` as a Llama from elsewhere (config.json alone, no megatron_gamma.json), its
    config.json in the form transformers 4.x saved (``rope_theta`` at the top, no
    ``rope_parameters``) and then updated with ``edits``."""
    hf_dir = _hub_model(tmp_path / "hub", {})
    os.remove(os.path.join(hf_dir, "megatron_gamma.json"))
    path = os.path.join(hf_dir, "config.json")
    config = json.loads(open(path).read())
    del config["rope_parameters"]
    config["rope_theta"] = 500000.0
    config.update(edits)
    open(path, "w").write(json.dumps(config))
    return hf_dir


LLAMA31_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16, "rope_type": "llama3"}  # fmt: skip


@pytest.mark.parametrize(
    "key, value",
    [
        ("rope_scaling", LLAMA31_ROPE),
        ("rope_scaling", {"type": "linear", "factor": 4.0}),
        ("rope_scaling", {"rope_type": "linear", "factor": 4.0}),
        ("rope_scaling", {"type": "dynamic", "factor": 2.0}),
        (
            "rope_scaling",
            {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16},
        ),
        ("rope_parameters", dict(LLAMA31_ROPE, rope_theta=500000.0)),
        ("partial_rotary_factor", 0.5),
    ],
)
def test_import_refuses_rope_other_than_plain_in_any_key(tmp_path, capsys, key, value):
    """A Llama-3.1 (or any transformers 4.x) config gives its RoPE scaling as ``rope_scaling``;
    import-hf refused it only as ``rope_parameters`` and imported the model with plain RoPE,
    a model other than the one transformers builds from the same directory."""
    from transformers import AutoConfig

    from megatron_gamma.cli import main

    hf_dir = _plain_llama(tmp_path, **{key: value})
    rope = AutoConfig.from_pretrained(hf_dir).rope_parameters  # transformers' own reading
    assert rope["rope_type"] != "default" or rope["partial_rotary_factor"] == 0.5
    assert main(["import-hf", hf_dir, str(tmp_path / "run")]) == 2
    assert (
        f"{key}={value!r}: megatron-gamma builds SiLU-gated models with full causal attention, "
        "default RoPE and no linear biases (q/k/v biases as Qwen2 has them). Fix: import a model "
        "without these options"
    ) in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize(
    "edits",
    [
        {},
        {"rope_scaling": None},
        {"rope_scaling": {"rope_type": "default"}},
        {"rope_scaling": {"type": "default"}},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    ],
)
def test_import_of_plain_rope_in_any_key(tmp_path, edits):
    """The refusal above is of scaling: plain RoPE imports from either key, or from none, with
    the base transformers reads."""
    from transformers import AutoConfig

    hf_dir = _plain_llama(tmp_path, **edits)
    rope = AutoConfig.from_pretrained(hf_dir).rope_parameters
    assert rope["rope_type"] == "default" and rope["rope_theta"] == 500000.0
    import_hf(hf_dir, str(tmp_path / "run"))
    model = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["model"]
    assert model["rotary_base"] == 500000 and model["position_embedding_type"] == "rope"
    assert model.get("rotary_percent", 1.0) == 1.0


QWEN = {
    "qwen2": {"tie_word_embeddings": True},  # as Qwen2.5-0.5B
    "qwen3": {"tie_word_embeddings": False, "head_dim": 32},  # heads x head_dim != hidden_size
}


def _qwen(folder, kind: str):
    """A tiny random ``Qwen2ForCausalLM`` or ``Qwen3ForCausalLM`` (:data:`QWEN`; GQA, 4 heads
    over 2 key-value heads; RoPE base 1e6) saved to ``folder`` with the demo tokenizer, and the
    model in eval mode. Its q/k/v biases and norm weights are drawn at random: transformers
    starts them at 0 and 1, where a mapping that dropped them would go unseen."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from megatron_gamma.data import demo_dir

    config, model = {"qwen2": (Qwen2Config, Qwen2ForCausalLM),
                     "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[kind]  # fmt: skip
    torch.manual_seed(0)
    hf = model(
        config(
            vocab_size=4096, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            **QWEN[kind],
        )
    ).eval()  # fmt: skip
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            elif "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    hf.save_pretrained(folder)
    shutil.copyfile(os.path.join(demo_dir(), "tokenizer.json"), folder / "tokenizer.json")
    return hf


@pytest.mark.parametrize("kind", list(QWEN))
def test_import_of_qwen_gives_the_hf_models_logits(tmp_path, kind):
    """Qwen2 (q/k/v biases: --add-qkv-bias) and Qwen3 (per-head q/k RMSNorm: --qk-layernorm)
    import with their tied or untied output and RoPE base; megatron-core's logits on the
    imported checkpoint equal transformers' on the same tokens in fp32, and so does greedy
    decoding. The biases and q/k norms matter: without them the HF logits move by far more."""
    hf = _qwen(tmp_path / "hf", kind)
    out = import_hf(str(tmp_path / "hf"), str(tmp_path / "run"))
    model = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["model"]
    assert (model["add_qkv_bias"], model["qk_layernorm"]) == (kind == "qwen2", kind == "qwen3")
    assert model["rotary_base"] == 1_000_000 and model["norm_epsilon"] == 1e-6
    assert model["num_query_groups"] == 2 and model["kv_channels"] == (
        16 if kind == "qwen2" else 32
    )
    assert model["untie_embeddings_and_output_weights"] == (kind == "qwen3")
    tokens = torch.randint(0, 4096, (3, 40), generator=torch.Generator().manual_seed(1))
    logits, greedy = _megatron_reference(out["run_dir"], tokens, 12)
    with torch.no_grad():
        ref = hf(tokens).logits
        ref_greedy = hf.generate(tokens[:1], max_new_tokens=12, do_sample=False)[0, 40:]
    assert logits.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5)
    assert greedy.tolist() == ref_greedy.tolist()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("_proj.bias", "q_norm.weight", "k_norm.weight")):
                p.copy_(torch.zeros_like(p) if name.endswith("bias") else torch.ones_like(p))
        assert (hf(tokens).logits - ref).abs().max() > 1e-2


@pytest.mark.parametrize(
    "kind, edits, named",
    [
        ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},
         "use_sliding_window=True (sliding_window=16 from layer max_window_layers=1)"),
        ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]},
         "layer_types=['full_attention', 'sliding_attention'] (only 'full_attention')"),
        ("qwen3", {"attention_bias": True}, "attention_bias=True"),
        ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
         "rope_scaling={'rope_type': 'yarn', 'factor': 4.0}"),
        ("qwen2", {"model_type": "qwen2_moe"},
         "model_type='qwen2_moe' (Qwen2-MoE, a mixture of experts with a gated shared expert: no "
         "weight mapping here): import-hf reads 'llama', 'qwen2', 'qwen3' and 'gamma_gpt' models"),
        ("qwen3", {"model_type": "qwen3_moe"},
         "model_type='qwen3_moe' (Qwen3-MoE, a mixture of experts: no weight mapping here)"),
    ],
)  # fmt: skip
def test_import_refuses_what_qwen_mapping_cannot_carry(tmp_path, capsys, kind, edits, named):
    """Sliding-window attention, Qwen3's o_proj/q/k/v biases, RoPE scaling and the MoE Qwens
    are refused by name before anything is written."""
    from megatron_gamma.cli import main

    _qwen(tmp_path / "hf", kind)
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edits}))
    assert main(["import-hf", str(tmp_path / "hf"), str(tmp_path / "run")]) == 2
    assert named in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run")


def test_import_refuses_weights_that_are_not_the_configs_model(tmp_path):
    """A Qwen2 directory whose config.json says qwen3: its q/k norms are missing and its q/k/v
    biases have no place; both are named (the mapping used to take the tensors it asked for
    and ignore the rest)."""
    _qwen(tmp_path / "hf", "qwen2")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": "qwen3"}))
    with pytest.raises(CheckpointError) as e:
        import_hf(str(tmp_path / "hf"), str(tmp_path / "run"))
    biases = [f"model.layers.{i}.self_attn.{x}_proj.bias" for i in (0, 1) for x in "kqv"]
    norms = [f"model.layers.{i}.self_attn.{x}_norm.weight" for i in (0, 1) for x in "kq"]
    assert str(e.value) == (
        f"hf_dir={str(tmp_path / 'hf')!r}: its safetensors weights are not those of the "
        f"model_type='qwen3' model its config.json describes (missing: {', '.join(norms)}; not "
        f"in it: {', '.join(biases)}). Fix: pass the config.json that came with these weights"
    )
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("logging", "tensorboard_dir", "/elsewhere/tb"),
        ("logging", "wandb_save_dir", "/elsewhere/wandb"),
        ("data", "data_cache_path", "/elsewhere/cache"),
        ("checkpoint", "pretrained_checkpoint", "/elsewhere/ckpt"),
    ],
)
def test_import_refuses_a_run_config_that_names_paths(tmp_path, section, key, value):
    """export-hf records no path of its host in megatron_gamma.json; one from elsewhere that
    names a path would become the imported run's config (config.yaml, the checkpoint's own), so
    that a later pretrain --config RUN/config.yaml wrote TensorBoard events or dataset caches,
    or took weights, where the model's author chose."""
    hf_dir = _hub_model(tmp_path / "hub", {section: {key: value}})
    with pytest.raises(CheckpointError) as e:
        import_hf(hf_dir, str(tmp_path / "run"))
    assert str(e.value).startswith(
        f"megatron_gamma.json: {section}.{key}={value!r}: a path of the host that wrote it"
    )
    assert "Fix: remove megatron_gamma.json to import from config.json alone" in str(e.value)
    assert not os.path.exists(tmp_path / "run")


def test_import_of_a_portable_run_config_from_elsewhere(tmp_path):
    """The same model directory without a path imports (the refusal above is the path's)."""
    hf_dir = _hub_model(tmp_path / "hub", {"logging": {"tensorboard_dir": None}})
    out = import_hf(hf_dir, str(tmp_path / "run"))
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert out["iteration"] == 0 and saved["logging"]["tensorboard_dir"] is None
    assert saved["logging"]["run_dir"] == str(tmp_path / "run")


def _sharded(hf_dir: str, shard: str) -> str:
    """Write ``hf_dir``'s model.safetensors.index.json naming ``shard`` for every tensor; its
    first key (in the message of a refusal)."""
    from safetensors import safe_open

    path = os.path.realpath(os.path.join(hf_dir, shard))
    with safe_open(path, "pt") as f:
        keys = sorted(f.keys())
    index = {"metadata": {}, "weight_map": dict.fromkeys(keys, shard)}
    with open(os.path.join(hf_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    return keys[0]


@pytest.fixture
def weights_read(monkeypatch) -> list[str]:
    """The safetensors files import_hf opens, in order."""
    import safetensors.torch

    opened, real = [], safetensors.torch.load_file
    monkeypatch.setattr(safetensors.torch, "load_file", lambda p: opened.append(p) or real(p))
    return opened


@pytest.mark.parametrize("form", ["dotdot", "absolute", "link"])
def test_import_refuses_a_shard_outside_the_model_directory(tmp_path, form, weights_read):
    """A shard index from elsewhere named files anywhere (``../..``, an absolute path, or a
    link in the directory pointing out), and import-hf read them as the model's weights."""
    hf_dir = _hub_model(tmp_path / "hub", {})
    outside = tmp_path / "elsewhere" / "model.safetensors"
    outside.parent.mkdir()
    os.replace(os.path.join(hf_dir, "model.safetensors"), outside)
    shard = {"dotdot": "../elsewhere/model.safetensors", "absolute": str(outside)}.get(
        form, "model-00001-of-00001.safetensors"
    )
    if form == "link":
        os.symlink(outside, os.path.join(hf_dir, shard))
    key = _sharded(hf_dir, shard)
    with pytest.raises(CheckpointError) as e:
        import_hf(hf_dir, str(tmp_path / "run"))
    why = {
        "dotdot": "a path with a '..' component; import-hf reads only the files in hf_dir=",
        "absolute": "an absolute path; import-hf reads only the files in hf_dir=",
        "link": f"resolves through a link to {str(outside)!r}, outside hf_dir=",
    }[form]
    assert str(e.value).startswith(
        f"model.safetensors.index.json: weight_map[{key!r}]={shard!r}: {why}{hf_dir!r}"
    )
    assert "Fix: " in str(e.value)
    assert weights_read == [] and not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize(
    "name",
    [
        "config.json",
        "megatron_gamma.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ],
)
def test_import_refuses_a_file_that_links_out_of_the_model_directory(tmp_path, name, weights_read):
    """A link in the model directory made import-hf read (and for the tokenizer's files copy
    into the new run) a file anywhere on the host."""
    hf_dir = _hub_model(tmp_path / "hub", {})
    (tmp_path / "hub" / "tokenizer_config.json").write_text('{"eos_token": "<|endoftext|>"}')
    (tmp_path / "hub" / "special_tokens_map.json").write_text('{"eos_token": "<|endoftext|>"}')
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    os.replace(os.path.join(hf_dir, name), outside)
    os.symlink(outside, os.path.join(hf_dir, name))
    with pytest.raises(CheckpointError) as e:
        import_hf(hf_dir, str(tmp_path / "run"))
    assert str(e.value).startswith(
        f"{name}: resolves through a link to {str(outside)!r}, outside hf_dir={hf_dir!r}"
    )
    assert "Fix: import a copy of the directory with its files in it: cp -rL" in str(e.value)
    assert weights_read == [] and not os.path.exists(tmp_path / "run")


def _assert_imported_embedding(run_dir: str, safetensors_file: str) -> None:
    """The imported run's word embedding is, bit for bit, the one in ``safetensors_file``."""
    from safetensors.torch import load_file

    rc = checkpoint.resolve(run_dir)
    with loader.single_process(rc.cfg):
        model, _ = checkpoint.load_model(rc)
        embedding = model.state_dict()["embedding.word_embeddings.weight"]
    torch.testing.assert_close(
        embedding, load_file(safetensors_file)["model.embed_tokens.weight"], rtol=0, atol=0
    )


def test_import_reads_shards_in_the_model_directory_also_through_links(tmp_path, weights_read):
    """The refusals above are of what leads out: a shard in a subdirectory, named through a
    link that stays inside, imports, with the tensors of that file."""
    hf_dir = _hub_model(tmp_path / "hub", {})
    os.mkdir(os.path.join(hf_dir, "shards"))
    real = os.path.join(hf_dir, "shards", "model-00001-of-00001.safetensors")
    os.replace(os.path.join(hf_dir, "model.safetensors"), real)
    os.symlink(os.path.join("shards", os.path.basename(real)), os.path.join(hf_dir, "linked"))
    _sharded(hf_dir, "linked")
    out = import_hf(hf_dir, str(tmp_path / "run"))
    assert weights_read == [os.path.realpath(real)]
    _assert_imported_embedding(out["run_dir"], real)


def _as_hub_cache(hf_dir, repo) -> str:
    """``hf_dir``'s files moved into huggingface_hub's cache layout: ``repo/blobs/SHA`` with
    ``repo/snapshots/main/NAME`` a relative link to each; returns the snapshot directory."""
    import hashlib

    snapshot = repo / "snapshots" / "main"
    os.makedirs(repo / "blobs")
    os.makedirs(snapshot)
    for name in sorted(os.listdir(hf_dir)):
        data = open(os.path.join(hf_dir, name), "rb").read()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", blob), snapshot / name)
    return str(snapshot)


def test_import_reads_a_hub_cache_snapshot_but_not_another_repositorys_blobs(
    tmp_path, weights_read
):
    """A hub cache snapshot's files are links into its repository's ``blobs``: it imports, with
    the tensors of those blobs; a link into another repository's ``blobs`` is refused."""
    hub = _hub_model(tmp_path / "hub", {})
    snapshot = _as_hub_cache(hub, tmp_path / "cache" / "models--org--tiny")
    out = import_hf(snapshot, str(tmp_path / "run"))
    blob = os.path.realpath(os.path.join(snapshot, "model.safetensors"))
    assert weights_read == [blob] and os.path.dirname(blob).endswith("models--org--tiny/blobs")
    _assert_imported_embedding(out["run_dir"], blob)

    with pytest.raises(CheckpointError, match=r"a Hugging Face hub cache repository, not a model "
                       r"directory. Fix: pass one of its snapshots, .*\(here: main\)"):  # fmt: skip
        import_hf(str(tmp_path / "cache" / "models--org--tiny"), str(tmp_path / "run1"))
    other = _as_hub_cache(hub, tmp_path / "cache" / "models--org--other")
    os.remove(os.path.join(snapshot, "config.json"))
    os.symlink(os.path.realpath(os.path.join(other, "config.json")), snapshot + "/config.json")
    with pytest.raises(CheckpointError, match="config.json: resolves through a link to .*other"):
        import_hf(snapshot, str(tmp_path / "run2"))


def test_import_of_a_hub_cache_snapshot_records_the_tokenizer_the_run_has(tmp_path):
    """The checkpoint's tokenizer fingerprint was taken of the snapshot's tokenizer.json where
    its link leads, a blob with no tokenizer_config.json beside it: the EOD its eos_token names
    was lost (the checkpoint recorded <|endoftext|> and another identity than the run's), and its
    files were named in the cache. It is now the run's own tokenizer, files and all."""
    from megatron_gamma.data.tokenizer import BilingualTokenizer
    from megatron_gamma.data.tokenizer_fingerprint import fingerprint
    from megatron_gamma.rundir.layout import saved_description

    hub = _hub_model(tmp_path / "hub", {})
    (tmp_path / "hub" / "tokenizer_config.json").write_text('{"eos_token": "<|bos|>"}')
    snapshot = _as_hub_cache(hub, tmp_path / "cache" / "models--org--tiny")
    out = import_hf(snapshot, str(tmp_path / "run"))
    run_tok = BilingualTokenizer(str(tmp_path / "run" / "tokenizer.json"))
    assert run_tok.eos_token == "<|bos|>" and run_tok.eod == 2  # the demo vocabulary's <|bos|>
    _, recorded = saved_description(out["checkpoint"])
    assert recorded == fingerprint(run_tok)
    run = str(tmp_path / "run")
    assert recorded["source"] == [f"{run}/tokenizer.json", f"{run}/tokenizer_config.json"]


def test_import_keeps_the_eod_an_older_special_tokens_map_names(tmp_path):
    """A model saved before transformers 4.34 names its EOD in special_tokens_map.json (its
    tokenizer_config.json has no added_tokens_decoder): the run's EOD is AutoTokenizer's, both
    files are copied into the run, and the checkpoint records the file that named it."""
    from transformers import AutoTokenizer

    from megatron_gamma.data.tokenizer import BilingualTokenizer
    from megatron_gamma.data.tokenizer_fingerprint import fingerprint
    from megatron_gamma.rundir.layout import saved_description

    hub = _hub_model(tmp_path / "hub", {})
    (tmp_path / "hub" / "tokenizer_config.json").write_text('{"eos_token": "<|endoftext|>"}')
    (tmp_path / "hub" / "special_tokens_map.json").write_text('{"eos_token": "<|bos|>"}')
    out = import_hf(hub, str(tmp_path / "run"))
    run = str(tmp_path / "run")
    run_tok = BilingualTokenizer(os.path.join(run, "tokenizer.json"))
    assert run_tok.eod == AutoTokenizer.from_pretrained(hub).eos_token_id == 2
    _, recorded = saved_description(out["checkpoint"])
    assert recorded == fingerprint(run_tok)
    assert recorded["source"] == [f"{run}/tokenizer.json", f"{run}/special_tokens_map.json"]


@pytest.mark.parametrize("eos_token_id", [2, [2, 5], 0, [5, 0], None, []])
def test_import_warns_when_config_eos_is_not_the_runs_eod(tmp_path, capsys, eos_token_id):
    """config.json's eos_token_id (an id or a list) that does not hold the run's EOD (the demo
    tokenizer's <|endoftext|>, 0) is named with the fix on stderr; the import completes."""
    from megatron_gamma.cli import main

    hf_dir = _hub_model(tmp_path / "hub", {})
    path = os.path.join(hf_dir, "config.json")
    config = json.loads(open(path).read())
    config["eos_token_id"] = eos_token_id
    open(path, "w").write(json.dumps(config))
    assert main(["import-hf", hf_dir, str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("imported iteration 0: ")
    if eos_token_id in (2, [2, 5]):
        assert err.splitlines()[-1] == (
            f"warning: config.json: eos_token_id {eos_token_id} does not hold 0 "
            "('<|endoftext|>'), the run's EOD (the eos_token of tokenizer_config.json or "
            "special_tokens_map.json, or <|endoftext|> where none names one): data preprocessed "
            "with this tokenizer ends each document in 0, while the model was trained to stop "
            f"at {eos_token_id}. Fix: set eos_token in the model directory's "
            "tokenizer_config.json to the model's end-of-document token and import again"
        )
    else:
        assert "eos_token_id" not in err


def test_import_of_a_run_directory_says_what_it_is(tmp_path):
    """import-hf of a megatron-gamma run directory said its tokenizer.json was missing."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {}\n")
    with pytest.raises(CheckpointError) as e:
        import_hf(str(run), str(tmp_path / "out"))
    assert str(e.value) == (
        f"hf_dir={str(run)!r}: no config.json, so not a Hugging Face model directory. Fix: it "
        "holds a config.yaml, so it is a megatron-gamma run directory: evaluate, analyze and "
        "export-hf read it as it is, with no import"
    )
    assert not (tmp_path / "out").exists()


def test_export_hf_shows_no_bar_when_stderr_is_not_a_terminal(tmp_path):
    """export-hf wrote transformers' ``Writing model shards: 100%|...|`` bar into a log file;
    a bar appears only when stderr is a terminal (pretrain's rule). import-hf shows none."""
    hf_dir = _hub_model(tmp_path / "hub", {})
    import_hf(hf_dir, str(tmp_path / "run"))
    proc = run_cli(["export-hf", str(tmp_path / "run"), str(tmp_path / "hf")])  # stderr: a pipe
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("exported iteration 0 as llama: ")
    assert "Writing model shards" not in proc.stderr and "it/s]" not in proc.stderr
    assert "\r" not in proc.stderr
    assert os.path.exists(tmp_path / "hf" / "model.safetensors")


@pytest.mark.parametrize("terminal", [False, True])
def test_transformers_bars_follow_stderr_and_are_put_back(monkeypatch, terminal):
    """Inside ``bars_only_on_a_terminal`` transformers' and huggingface_hub's bars are on only
    when stderr is a terminal; after it, as they were (here: transformers' on, the hub's off)."""
    import io

    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from transformers.utils import logging as hf_logging

    from megatron_gamma.hf import bars_only_on_a_terminal

    class Stderr(io.StringIO):
        def isatty(self):
            return terminal

    monkeypatch.setattr(sys, "stderr", Stderr())
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    disable_progress_bars()
    try:
        with bars_only_on_a_terminal():
            assert hf_logging.is_progress_bar_enabled() is terminal
            assert are_progress_bars_disabled() is True  # off before, and left so
        assert hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
        enable_progress_bars()
        with bars_only_on_a_terminal():
            assert hf_logging.is_progress_bar_enabled() is terminal
            assert are_progress_bars_disabled() is not terminal
        assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def test_an_output_directory_that_is_a_file_is_named_as_such(tmp_path):
    """export-hf and import-hf said "exists and is not empty" of a file given as their output
    directory."""
    afile = tmp_path / "demo.yaml"
    afile.write_text("model: {}\n")
    with pytest.raises(ConfigError) as e:
        export_hf(str(tmp_path / "no-checkpoint"), str(afile))
    assert str(e.value) == (
        f"out_dir={str(afile)!r}: exists and is not a directory. Fix: choose a new directory"
    )
    hf_dir = _hub_model(tmp_path / "hub", {})
    with pytest.raises(ConfigError) as e:
        import_hf(hf_dir, str(afile))
    assert str(e.value) == (
        f"run_dir={str(afile)!r}: exists and is not a directory. Fix: choose a new run directory"
    )
    assert afile.read_text() == "model: {}\n"


def test_reading_a_checkpoint_writes_nothing_where_its_config_points(tmp_path):
    """A GPT-2 BPE run's tokenizer.json is made from its vocab and merges files when the run is
    read; a checkpoint's own config names the run directory of the host that trained it (or
    wherever its author chose), and evaluate / export-hf / compare made that directory and wrote
    the tokenizer there. It is made in a directory of the reading process instead."""
    from megatron.core import dist_checkpointing
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from megatron_gamma.data.tokenizer import EOD
    from megatron_gamma.data.tokenizer_fingerprint import fingerprint
    from megatron_gamma.data.tokenizer_types import load_tokenizer
    from megatron_gamma.rundir import layout

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOD], initial_alphabet=alphabet, show_progress=False
    )
    bpe.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    (tmp_path / "gpt2").mkdir()
    vocab, merges = bpe.model.save(str(tmp_path / "gpt2"))
    recorded = tmp_path / "not_named" / "run"
    cfg = load_config(
        None,
        {"tokenizer_type": "GPT2BPETokenizer", "vocab_file": vocab, "merge_file": merges,
         "run_dir": str(recorded), "num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
         "seq_length": 16, "micro_batch_size": 1, "global_batch_size": 1, "train_iters": 1},
    )  # fmt: skip
    tok = load_tokenizer(cfg.data, str(tmp_path / "author"))
    ckpt = tmp_path / "downloaded" / "iter_0000001"
    ckpt.mkdir(parents=True)
    one = loader.fp32_single_rank(cfg)
    with loader.single_process(one):
        state = {"model": loader.build_model(one, 384).sharded_state_dict(), "iteration": 1}
        state.update(layout.describe(cfg, fingerprint(tok)))
        dist_checkpointing.save(state, str(ckpt))
    run = checkpoint.resolve(str(ckpt))
    assert run.original.logging.run_dir == str(recorded)
    assert not os.path.exists(tmp_path / "not_named")
    assert run.tokenizer.startswith(loader.scratch_dir() + os.sep)
    assert open(run.tokenizer).read() == open(tok.path).read()
