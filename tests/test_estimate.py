"""`megatron-gamma estimate`: the vocabulary comes from the run's tokenizer as in pretrain, and the
table shows only rows that apply."""

import math
import os
import re

import pytest
import yaml
from helpers import DEMO_TOKENIZER
from tokenizers import Tokenizer

from megatron_gamma.cli import main
from megatron_gamma.config import load_config, save_config
from megatron_gamma.estimate import count_parameters

DEMO = os.path.join(os.path.dirname(__file__), "..", "examples", "configs", "demo.yaml")
MOE = os.path.join(os.path.dirname(__file__), "..", "examples", "configs", "moe-0.6b-a0.3b.yaml")


def _total(text: str) -> int:
    return int(re.search(r"^parameters, total +([\d,]+)$", text, re.M).group(1).replace(",", ""))


def test_estimate_reads_the_vocabulary_from_the_tokenizer(capsys):
    """demo.yaml sets no vocab_size: the packaged tokenizer's size (HF tokenizers' own count),
    padded to a multiple of 128 as Megatron-LM does, sizes the embedding."""
    assert main(["estimate", "--config", DEMO, "--world-size", "1"]) == 0
    out = capsys.readouterr().out
    vocab = Tokenizer.from_file(DEMO_TOKENIZER).get_vocab_size()
    padded = -(-vocab // 128) * 128
    cfg = load_config(DEMO)
    counts = count_parameters(cfg, padded)
    assert _total(out) == counts.total
    assert re.search(rf"^  embedding \+ output layer +{counts.embedding:,}$", out, re.M)
    assert "MoE" not in out  # a dense model has no active-parameter row
    bigger = ["estimate", "--config", DEMO, "--world-size", "1", "--vocab-size", "9000"]
    assert main(bigger) == 0  # the larger of the two, as pretrain
    assert _total(capsys.readouterr().out) == count_parameters(cfg, 9088).total


def test_estimate_without_the_tokenizer_needs_the_vocab_size(tmp_path, capsys):
    with open(DEMO, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    missing = str(tmp_path / "absent" / "tokenizer.json")
    raw["data"]["tokenizer_model"] = missing
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump(raw))
    args = ["estimate", "--config", str(config), "--world-size", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"tokenizer_model={missing!r}" in err and "--vocab-size N" in err
    assert main([*args, "--vocab-size", "4000"]) == 0
    assert _total(capsys.readouterr().out) == count_parameters(load_config(str(config)), 4096).total


def test_estimate_says_which_vocabulary_it_used_and_where_from(tmp_path, capsys):
    """The demo tokenizer stands in when no --tokenizer-model is given: the first line says so,
    with the size HF tokenizers counts; --vocab-size above it, or alone, is named instead."""
    vocab = Tokenizer.from_file(DEMO_TOKENIZER).get_vocab_size()
    args = ["estimate", "--config", DEMO, "--world-size", "1"]
    absent = str(tmp_path / "absent")
    lines = {}
    for extra in ([], ["--vocab-size", "9000"], ["--tokenizer-model", DEMO_TOKENIZER],
                  ["--tokenizer-model", absent, "--vocab-size", "4000"]):  # fmt: skip
        assert main(args + extra) == 0
        lines[len(lines)] = capsys.readouterr().out.split("\n")[0]
    demo = "the packaged demo tokenizer"
    hint = "; no --tokenizer-model given: pass yours for its vocabulary"
    assert lines == {
        0: f"vocabulary: {vocab:,} tokens of {demo}, padded to {-(-vocab // 128) * 128:,}{hint}",
        1: f"vocabulary: --vocab-size 9,000 (more than the {vocab:,} tokens of {demo}), padded "
        f"to 9,088{hint}",
        2: f"vocabulary: {vocab:,} tokens of --tokenizer-model {DEMO_TOKENIZER}, padded to "
        f"{-(-vocab // 128) * 128:,}",
        3: "vocabulary: --vocab-size 4,000 (the tokenizer cannot be read here), padded to 4,096",
    }


def test_moe_estimate_shows_the_active_parameters(capsys):
    assert main(["estimate", "--config", MOE, "--world-size", "8"]) == 0
    out = capsys.readouterr().out
    cfg = load_config(MOE)
    counts = count_parameters(cfg, 65536)
    assert counts.active < counts.total
    assert re.search(rf"^  active per token \(MoE top-k\) +{counts.active:,}$", out, re.M)


def test_moe_activations_are_the_dense_ones_plus_the_expert_input():
    """Closed form (module docstring): with top-1 routing to experts of width F, an MoE layer
    keeps what a dense layer of width F keeps plus its s·b·h expert input, in bf16 bytes (2 per
    element) like every other activation."""
    from megatron_gamma.estimate import estimate_memory

    base = {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64}
    base |= {"micro_batch_size": 2, "global_batch_size": 2, "bf16": True}
    dense = load_config(None, {**base, "ffn_hidden_size": 256})
    moe = load_config(
        None, {**base, "num_experts": 4, "moe_router_topk": 1, "moe_ffn_hidden_size": 256}
    )
    a, b = estimate_memory(dense, 512, 1), estimate_memory(moe, 512, 1)
    assert b.activations - a.activations == 4 * 64 * 2 * 128 * 2
    assert b.activations_recompute - a.activations_recompute == 64 * 2 * 128 * 2


def test_the_moe_recipe_fits_its_gpus(capsys):
    """The shipped MoE recipe at its cluster shape (its activations are a few GiB, not TiB)."""
    assert main(["estimate", "--config", MOE]) == 0
    out = capsys.readouterr().out
    act = float(re.search(r"^activations per GPU +([\d.]+) GiB$", out, re.M).group(1))
    assert 1 < act < 40 and "WARNING" not in out


REGISTRY_VARIANTS = {
    "dense": {},
    "moe": {
        "num_experts": 4,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 32,
        "moe_shared_expert_intermediate_size": 48,
        "moe_layer_freq": "[1,0,1]",
        "num_query_groups": 2,
    },
    "moe_bias": {"num_experts": 4, "moe_ffn_hidden_size": 32, "add_bias_linear": True},
    "gated_elementwise": {"gated_attention": "elementwise", "gate_bias": True},
    "gated_headwise": {"gated_attention": "headwise", "swiglu": False},
    "qkv_bias_gqa": {"add_qkv_bias": True, "num_query_groups": 2, "gated_attention": "none"},
    "qk_layernorm": {
        "qk_layernorm": True,
        "position_embedding_type": "learned_absolute",
        "untie_embeddings_and_output_weights": True,
    },
}


def _built_parameters(variants: dict) -> dict:
    """Each variant built on the meta device by the real builder (one rank): its parameters'
    names and shapes, and the padded vocabulary."""
    import torch

    from megatron_gamma import parallel
    from megatron_gamma.model.builder import build_model_chunk, transformer_config
    from megatron_gamma.model.vocab import padded_vocab_size

    out = {}
    for key, overrides in variants.items():
        cfg = load_config(None, overrides)
        parallel.initialize(cfg)
        vocab = padded_vocab_size(cfg.model.vocab_size, cfg)
        with torch.device("meta"):
            model, _ = build_model_chunk(cfg, transformer_config(cfg, on_gpu=False), vocab)
        out[key] = (vocab, {n: tuple(p.shape) for n, p in model.named_parameters()})
        parallel.destroy()
    return out


@pytest.fixture(scope="module")
def built():
    from distributed import run_distributed

    base = {"num_layers": 3, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 96}
    base |= {"seq_length": 16, "vocab_size": 250}
    variants = {k: {**base, **v} for k, v in REGISTRY_VARIANTS.items()}
    return variants, run_distributed(_built_parameters, 1, variants)[0]


@pytest.mark.parametrize("variant", list(REGISTRY_VARIANTS))
def test_registry_lists_every_parameter_and_the_estimator_counts_them(built, variant):
    """The registry's parameter list equals a built model's named_parameters, name by name and
    shape by shape, and the estimator's total is that model's sum(p.numel())."""
    from megatron_gamma.config import moe_layer_pattern
    from megatron_gamma.model.roles import model_parameters

    variants, models = built
    cfg = load_config(None, variants[variant])
    vocab, params = models[variant]
    m = cfg.model
    pattern = (
        [0] * m.num_layers
        if m.num_experts is None
        else moe_layer_pattern(m.moe_layer_freq, m.num_layers)
    )
    assert dict(model_parameters(m, vocab, pattern)) == params
    numel = sum(math.prod(shape) for shape in params.values())
    assert count_parameters(cfg, vocab).total == numel


def test_fp16_is_costed_as_fp16_weights_with_an_fp32_master():
    """Per parameter: 2 B of fp16 weights, 4 B of fp32 gradients, 12 B of optimizer state (fp32
    master + two Adam moments); activations in 2-byte elements, as bf16."""
    from megatron_gamma.estimate import estimate_memory, params_per_gpu

    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32}
    fp16 = load_config(None, {**base, "fp16": True})
    bf16 = load_config(None, {**base, "bf16": True})
    n = params_per_gpu(fp16, 512)["first"]
    est = estimate_memory(fp16, 512, 1)
    assert (est.weights, est.gradients, est.optimizer) == (2 * n, 4 * n, 12 * n)
    assert est.activations == estimate_memory(bf16, 512, 1).activations


@pytest.mark.parametrize("gate", ["none", "elementwise", "headwise"])
def test_activation_bytes_follow_the_docstring_formula(gate):
    """The module docstring's per-layer formula, s·b·(4h + n·d + 2·g·d + w_gate + w_gated +
    f_act) elements, plus the logits, their fp32 softmax and the output layer's backward
    transients, computed by hand for one GPU in fp32."""
    from megatron_gamma.estimate import estimate_memory

    s, b, h, n, g, f, layers, vocab = 32, 2, 64, 4, 2, 96, 3, 512
    cfg = load_config(
        None,
        {
            "num_layers": layers, "hidden_size": h, "num_attention_heads": n,
            "num_query_groups": g, "ffn_hidden_size": f, "seq_length": s,
            "micro_batch_size": b, "global_batch_size": b, "gated_attention": gate,
        },
    )  # fmt: skip
    d = h // n
    w_gate = {"none": 0, "elementwise": n * d, "headwise": n}[gate]
    w_gated = 0 if gate == "none" else n * d
    per_layer = s * b * (4 * h + n * d + 2 * g * d + w_gate + w_gated + 3 * f) * 4
    logits = s * b * vocab * (4 + 4) + s * b * vocab * 4 + vocab * h * 4
    assert estimate_memory(cfg, vocab, 1).activations == layers * per_layer + logits


def test_estimate_world_size_errors_name_estimates_own_flags(capsys):
    """No GPU count, and one that does not fit the layout: the fix names estimate's flags
    (--world-size, --slurm-nodes x --slurm-gpus-per-node), and each works."""
    flags = "--world-size N, or --slurm-nodes N with --slurm-gpus-per-node G"
    assert main(["estimate", "--config", DEMO]) == 2
    assert capsys.readouterr().err.endswith(
        "world_size=None: no GPU count (no --world-size, and the config sets no "
        f"cluster.slurm_nodes). Fix: pass {flags} (G defaults to 8)\n"
    )
    odd = ["estimate", "--config", DEMO, "--tensor-model-parallel-size", "2"]
    assert main([*odd, "--world-size", "3"]) == 2
    err = capsys.readouterr().err
    assert "TP x PP = 2 x 1 does not divide the world size 3" in err
    assert f"Fix: launch a multiple of TP x PP processes ({flags}) or lower" in err
    assert main([*odd, "--world-size", "2"]) == 0
    assert main([*odd, "--slurm-nodes", "1", "--slurm-gpus-per-node", "2"]) == 0


def test_flags_alone_size_a_model_as_a_config_does(capsys, tmp_path):
    """Trial 13: ``estimate`` required --config, so a Megatron-LM launch of flags alone could
    not be sized, though pretrain runs from flags alone. The same model given by flags and by
    a config file (written by ``save_config`` from those values) prints the same table."""
    model = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 512,
             "micro_batch_size": 2, "global_batch_size": 16}  # fmt: skip
    flags = [x for k, v in model.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    assert main(["estimate", *flags, "--world-size", "2"]) == 0
    from_flags = capsys.readouterr().out
    path = str(tmp_path / "model.yaml")
    save_config(load_config(None, model), path)
    assert main(["estimate", "--config", path, "--world-size", "2"]) == 0
    assert capsys.readouterr().out == from_flags
    assert "layout                               TP 1 x PP 1 x EP 1 on 2 GPUs" in from_flags


def test_a_reader_that_leaves_early_gets_no_traceback():
    """``megatron-gamma estimate ... | head -1``: the reader closes the pipe before the table is
    written; the command printed a BrokenPipeError traceback at exit. It exits 1 quietly, as
    Python's documentation recommends."""
    import subprocess

    from helpers import REPO, cli_command, cli_env

    config = os.path.join(REPO, "examples", "configs", "demo.yaml")
    proc = subprocess.Popen(
        cli_command(["estimate", "--config", config, "--world-size", "1"]),
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # before the command has computed anything to write
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_a_world_size_below_one_is_named_as_given(capsys):
    """--world-size 0 was taken for no --world-size ("world_size=None: ... no --world-size")."""
    assert main(["estimate", "--config", DEMO, "--world-size", "0"]) == 2
    assert "error: world_size=0: must be >= 1. Fix: pass --world-size N, the GPUs in the job" in (
        capsys.readouterr().err
    )


def test_memory_warning_comes_exactly_when_the_estimate_exceeds_the_memory():
    """pretrain's start-up warning (a trial's --seq-length 100000 ran silent for minutes on a
    host with a third of the memory it needed): it fires when the estimate's configured total
    exceeds the bytes given, names both in GiB, and is None at or under them."""
    from megatron_gamma.estimate import estimate_memory, memory_warning

    cfg = load_config(DEMO, {"seq_length": 100000, "max_position_embeddings": 100000})
    need = estimate_memory(cfg, 4096, 1).total(False, False)
    assert memory_warning(cfg, 4096, 1, need, "the host") is None
    warning = memory_warning(cfg, 4096, 1, need - 1, "the host")
    gib = 1024**3
    assert warning.startswith(f"this run needs about {need / gib:.1f} GiB per process by ")
    assert f"--seq-length 100000 and --micro-batch-size {cfg.training.micro_batch_size}" in warning
    assert f"more than the host ({(need - 1) / gib:.1f} GiB)" in warning
    full = cfg.replace(recompute_granularity="full")
    assert estimate_memory(full, 4096, 1).total(False, True) < need  # what the fix offers
    assert memory_warning(full, 4096, 1, need - 1, "the host") is None
