"""Configs are frozen and rebuilt through the validated constructor; flags document themselves;
the packages import one way (config -> model/parallel -> training -> diagnostics)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import subprocess
import sys
import textwrap

import pytest

from megatron_gamma.config import (
    ConfigError,
    GatedAttention,
    OptimizerConfig,
    TrainingConfig,
    load_config,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "megatron_gamma")


def test_assigning_a_field_of_a_validated_config_raises():
    cfg = load_config(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.parallel.tensor_model_parallel_size = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model = cfg.model


def test_replace_rebuilds_through_every_check():
    cfg = load_config(None, {"hidden_size": 64, "num_attention_heads": 4})
    wider = cfg.replace(num_query_groups=2, run_dir="elsewhere")
    assert (wider.model.num_query_groups, wider.logging.run_dir) == (2, "elsewhere")
    assert (cfg.model.num_query_groups, cfg.logging.run_dir) == (4, "runs/demo")  # untouched
    with pytest.raises(ConfigError, match="num_query_groups=3: does not divide"):
        cfg.replace(num_query_groups=3)
    with pytest.raises(ConfigError, match="hiden_size: unknown key.*did you mean 'hidden_size'"):
        cfg.replace(hiden_size=8)
    with pytest.raises(ConfigError, match="virtual stages need pipeline_model_parallel_size > 1"):
        cfg.replace(num_layers_per_virtual_pipeline_stage=1)


SAMPLE_BASED = """
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4}
training: {train_samples: 80, global_batch_size: 8, micro_batch_size: 4, bf16: true}
optimizer: {lr_warmup_samples: 16, lr_decay_samples: 64}
"""


@pytest.mark.parametrize(
    "changes, flags",
    [
        ({"pipeline_model_parallel_size": 2, "seed": 7, "run_dir": "x"}, None),
        ({"train_samples": 160, "lr_warmup_fraction": 0.1}, None),
        # unsetting train_samples keeps the train_iters it gave (10), not the default 40
        (
            {"train_samples": None, "lr_warmup_samples": 0, "lr_decay_samples": None,
             "lr_warmup_iters": 2, "lr_decay_iters": 8},
            {"train_iters": 10, "lr_warmup_iters": 2, "lr_decay_iters": 8},
        ),
    ],
)  # fmt: skip
def test_replace_equals_the_config_loaded_from_the_same_yaml(tmp_path, changes, flags):
    """``Config.replace`` (the one way to rebuild) gives the config that ``load_config`` builds
    from the same YAML file with the same values as flags."""
    path = tmp_path / "run.yaml"
    path.write_text(SAMPLE_BASED)
    cfg = load_config(str(path))
    assert cfg.training.train_iters == 10
    assert cfg.replace(**changes) == load_config(str(path), flags or changes)


def test_replace_rechecks_the_whole_config_naming_the_bad_value(tmp_path):
    """A rebuilt config runs the checks across sections too (here Megatron-LM's one unit per
    schedule length, between ``training`` and ``optimizer``)."""
    path = tmp_path / "run.yaml"
    path.write_text(SAMPLE_BASED)
    cfg = load_config(str(path))
    with pytest.raises(ConfigError, match="lr_decay_iters=5: training is sample-based"):
        cfg.replace(lr_decay_iters=5)
    with pytest.raises(ConfigError, match="lr_decay_samples=64: training is iteration-based"):
        cfg.replace(train_samples=None)


def test_fp32_single_rank_is_the_run_loaded_with_its_flags(tmp_path):
    """The evaluation config (rebuilt by ``Config.replace``) of a bf16, TP=2, sample-based run
    with a batch-size ramp-up: fp32, one rank, iteration-based with the run's iterations."""
    from megatron_gamma.rundir.loader import fp32_single_rank

    path = tmp_path / "run.yaml"
    path.write_text(
        SAMPLE_BASED.replace("optimizer: {lr_warmup_samples: 16, lr_decay_samples: 64}", "")
    )
    run = load_config(str(path), {"tensor_model_parallel_size": 2, "rampup_batch_size": [4, 4, 16]})
    assert run.training.train_iters == 12  # batches 4, 4, 4, 4, 8 (ramp, 24 samples), 7 x 8
    one = fp32_single_rank(run)
    flags = {"train_iters": 12, "bf16": False, "rampup_batch_size": None}
    assert one == load_config(str(path), flags)


def test_fp32_single_rank_of_a_sample_based_schedule_counts_it_in_iterations(tmp_path):
    """A run with --lr-warmup-samples 16 --lr-decay-samples 64 (global batch 8) evaluates with
    the iteration-based config of the same schedule: warmup 2, decay 8 iterations (it stopped
    with "lr_decay_samples=64: training is iteration-based")."""
    from megatron_gamma.rundir.loader import fp32_single_rank

    path = tmp_path / "run.yaml"
    path.write_text(SAMPLE_BASED)
    one = fp32_single_rank(load_config(str(path)))
    o = one.optimizer
    assert (one.training.train_samples, one.training.train_iters) == (None, 10)
    assert (o.lr_warmup_samples, o.lr_decay_samples) == (0, None)
    assert (o.lr_warmup_iters, o.lr_decay_iters) == (2, 8)


def test_single_rank_config_of_ep2_and_vpp_runs_is_valid():
    """Issue 15.6: the analysis config of an EP=2 MoE run and of a PP=2 x VPP=2 run."""
    from megatron_gamma.config import validate_layout, virtual_stages
    from megatron_gamma.rundir.loader import single_rank_config

    moe = load_config(
        None,
        {"num_experts": 4, "expert_model_parallel_size": 2, "tensor_model_parallel_size": 2,
         "sequence_parallel": True, "use_distributed_optimizer": True},
    )  # fmt: skip
    vpp = load_config(
        None,
        {"num_layers": 4, "pipeline_model_parallel_size": 2,
         "num_layers_per_virtual_pipeline_stage": 1, "overlap_grad_reduce": True},
    )  # fmt: skip
    for cfg in (moe, vpp):
        one = single_rank_config(cfg)
        assert dataclasses.asdict(one.parallel) == dataclasses.asdict(type(cfg.parallel)())
        assert one.model == cfg.model and one.init == cfg.init
        assert virtual_stages(one) is None
        assert validate_layout(one, 1) == 1


def test_choices_are_documented_enums_stored_as_strings():
    cfg = load_config(None, {"gated_attention": "headwise"})
    assert cfg.model.gated_attention == GatedAttention.HEADWISE
    assert type(cfg.model.gated_attention) is str  # checkpoints and YAML see plain strings
    assert cfg.to_dict()["model"]["gated_attention"] == "headwise"
    with pytest.raises(ConfigError, match="lr_decay_style='cos': unknown.*'cosine': half cosine"):
        load_config(None, {"lr_decay_style": "cos"})


def test_help_prints_docstring_choices_and_default():
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_gamma.cli", "pretrain", "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    blocks = {}
    for block in proc.stdout.split("\n  --")[1:]:
        blocks["--" + block.split()[0]] = " ".join(block.split())
    assert "RMSNorm epsilon. The paper lowers it from 1e-5 to 1e-12" in blocks["--norm-epsilon"]
    assert "[model; default: 1e-12]" in blocks["--norm-epsilon"]
    gate = blocks["--gated-attention"]
    assert "'headwise': one scalar gate per head" in gate and "default: 'elementwise'" in gate


def test_no_flag_help_states_two_defaults(capsys):
    """--train-iters said "(default 40; derived from train_samples ...) [training; default:
    None]": a field whose None stands for a derived default its docstring states shows no
    second "default: None"; a None that means "not given" keeps it."""
    from megatron_gamma.cli import main

    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    blocks = {}
    for block in capsys.readouterr().out.split("\n  --")[1:]:
        blocks["--" + block.split()[0]] = " ".join(block.split())
    assert blocks["--train-iters"].endswith(
        "Optimizer steps (default 40; derived from train_samples when that is given). [training]"
    )
    assert blocks["--tensorboard-dir"].endswith("(default: <run_dir>/tensorboard). [logging]")
    assert blocks["--lr-decay-iters"].endswith("[optimizer]")
    assert blocks["--exit-interval"].endswith("[training; default: None]")
    twice = [
        flag
        for flag, text in blocks.items()
        if text.endswith("default: None]") and "default" in text[: text.rindex("[")].lower()
    ]
    assert twice == []
    assert sum(text.endswith("; default: None]") for text in blocks.values()) > 20


def test_field_docs_match_each_class_source_read_alone():
    """Every section's field docs equal those read from ``inspect.getsource`` of its class alone
    (the reference: one parse per class instead of one per file), and none is missing."""
    from megatron_gamma.config.flags import field_docs
    from megatron_gamma.config.loading import section_types

    for section, cls in section_types().items():
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
        expected = {
            node.target.id: " ".join(after.value.value.split())
            for node, after in zip(body, body[1:], strict=False)
            if isinstance(node, ast.AnnAssign)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        }
        assert field_docs(cls) == expected, section
        assert set(expected) == {f.name for f in dataclasses.fields(cls)}, section


def _imports(path: str) -> set[str]:
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_model_imports_neither_argparse_nor_training():
    for name in sorted(os.listdir(os.path.join(PACKAGE, "model"))):
        if name.endswith(".py"):
            found = _imports(os.path.join(PACKAGE, "model", name))
            bad = {m for m in found if m == "argparse" or m.startswith("megatron_gamma.training")}
            assert not bad, (name, bad)


def test_config_modules_import_only_those_listed_before_them():
    """docs/architecture.md lists the modules of ``config/`` in order, one row each; each imports
    only modules of the package listed above it, so the package's modules form no cycle."""
    from helpers import PACKAGE as PACKAGE_PATH
    from helpers import runtime_imports

    doc = open(os.path.join(REPO, "docs", "architecture.md"), encoding="utf-8").read()
    rows = re.findall(r"^\| `config/(\w+)\.py` \|", doc, re.M)
    modules = {p.stem for p in (PACKAGE_PATH / "config").glob("*.py")} - {"__init__"}
    assert rows and sorted(rows) == sorted(modules)
    for i, name in enumerate(rows):
        imported = {
            imp.target.removeprefix("megatron_gamma.config.")
            for imp in runtime_imports(PACKAGE_PATH / "config" / f"{name}.py")
            if imp.target.startswith("megatron_gamma.config.")
        }
        assert sorted(imported - set(rows[:i])) == [], f"config/{name}.py"


def test_diagnostics_do_not_import_the_training_loop():
    modules = [
        f"megatron_gamma.diagnostics.{n[:-3]}"
        for n in sorted(os.listdir(os.path.join(PACKAGE, "diagnostics")))
        if n.endswith(".py") and n != "__init__.py"
    ]
    code = (
        "import sys, importlib\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print('megatron_gamma.training.loop' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == "False"


def test_virtual_pipeline_size_and_layers_per_chunk_give_one_layout():
    from megatron_gamma.config import validate_layout, virtual_stages

    base = {"num_layers": 8, "pipeline_model_parallel_size": 2}
    both_sizes = {"virtual_pipeline_model_parallel_size": 2}
    by_size = load_config(None, {**base, "virtual_pipeline_model_parallel_size": 2})
    by_layers = load_config(None, {**base, "num_layers_per_virtual_pipeline_stage": 2})
    both = load_config(
        None,
        {
            **base,
            "virtual_pipeline_model_parallel_size": 2,
            "num_layers_per_virtual_pipeline_stage": 2,
        },
    )
    alias = load_config(None, {**base, "num_virtual_stages_per_pipeline_rank": 2})
    assert alias.parallel.virtual_pipeline_model_parallel_size == 2
    assert virtual_stages(by_size) == virtual_stages(by_layers) == virtual_stages(both) == 2
    with pytest.raises(ConfigError, match="contradicts virtual_pipeline_model_parallel_size=2"):
        load_config(None, {**base, "num_virtual_stages_per_pipeline_rank": 4, **both_sizes})
    assert validate_layout(both, 2) == 1
    with pytest.raises(ConfigError, match="virtual stages need pipeline_model_parallel_size > 1"):
        load_config(None, {"virtual_pipeline_model_parallel_size": 2})


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"overlap_param_gather": True}, "Fix: add --use-distributed-optimizer"),
        (
            {"overlap_param_gather": True, "use_distributed_optimizer": True},
            "Fix: add --overlap-grad-reduce",
        ),
        ({"context_parallel_size": 2}, "only in Transformer Engine's attention"),
        ({"distributed_timeout_minutes": 0}, "must be >= 1"),
        ({"num_workers": -1}, "must be >= 0"),
    ],
)
def test_parallel_and_data_flags_refuse_what_cannot_work(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def _timeout_of_the_process_group():
    import torch
    import torch.distributed as dist

    from megatron_gamma import parallel

    parallel.initialize(load_config(None, {"distributed_timeout_minutes": 3}))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    timeout = backend.options._timeout.total_seconds()
    parallel.destroy()
    return timeout


def test_distributed_timeout_minutes_reaches_init_process_group():
    from distributed import run_distributed

    assert run_distributed(_timeout_of_the_process_group, 1)[0] == 180.0


def test_yaml_setting_at_the_top_level_names_its_section(tmp_path):
    path = tmp_path / "flat.yaml"
    path.write_text("optimizer:\n  min_lr: 0.0001\nlr: 0.001\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert "lr" in {f.name for f in dataclasses.fields(OptimizerConfig)}
    assert f"config={str(path)!r}: lr: a setting of the optimizer section" in str(e.value)
    assert "Fix: move it into its section, 'lr: 0.001' indented under 'optimizer:'" in str(e.value)
    path.write_text("optimizer:\n  min_lr: 0.0001\n  lr: 0.001\n")
    assert load_config(str(path)).optimizer.lr == 0.001


def test_yaml_key_given_twice_in_one_mapping_is_refused_at_its_line(tmp_path):
    text = "model:\n  hidden_size: 32\n  num_layers: 2\n  hidden_size: 64\ntraining:\n  seed: 3\n"
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    lines = text.splitlines()
    first, repeat = [i + 1 for i, line in enumerate(lines) if "hidden_size" in line]
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert f"config={str(path)!r}: line {repeat}: hidden_size is given twice" in str(e.value)
    assert f"(first on line {first};" in str(e.value) and "Fix: keep one hidden_size" in str(
        e.value
    )
    path.write_text("model: {num_layers: 2, num_layers: 4}\n")
    with pytest.raises(ConfigError, match="line 1: num_layers is given twice"):
        load_config(str(path))
    # the same key in two mappings, and a merged key given again, are not repeats
    path.write_text(
        "model:\n  <<: {num_layers: 2}\n  num_layers: 4\ncluster:\n  env: {num_layers: '1'}\n"
    )
    cfg = load_config(str(path))
    assert (cfg.model.num_layers, cfg.cluster.env) == (4, {"num_layers": "1"})
    # still a safe loader: no Python object is built from a tag
    path.write_text("model: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert str(e.value) == (
        f"config={str(path)!r}: not valid YAML at line 1, column 8: could not determine a "
        "constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.getcwd'. Fix: write "
        "plain data there: no '!!' tag, only plain names as keys"
    )


def test_wrong_choice_and_wrong_type_name_the_file_and_section(tmp_path):
    """A value that is no member of a choice names the YAML file and section it came from, as a
    value of the wrong type does; a flag is named as the flag."""
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  gated_attention: elementwize\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    msg = str(e.value)
    assert msg.startswith("gated_attention='elementwize': unknown. Fix: use one of 'none': ")
    assert msg.endswith(
        f"(gated_attention from model.gated_attention of the YAML file {str(path)!r})"
    )
    path.write_text("model:\n  num_layers: abc\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert str(e.value) == (
        "model.num_layers='abc': expected int, got str. Fix: write num_layers as an integer, "
        f"e.g. 64 (num_layers from model.num_layers of the YAML file {str(path)!r})"
    )
    with pytest.raises(ConfigError, match=r"\(gated_attention from the flag --gated-attention\)$"):
        load_config(None, {"gated_attention": "elementwize"})


def test_yaml_syntax_error_names_file_line_column_and_the_fix(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  num_layers: 2\n  data_path: [a, b\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert str(e.value) == (
        f"config={str(path)!r}: not valid YAML at line 4, column 1: expected ',' or ']', but got "
        "'<stream end>' (while parsing a flow sequence that began at line 3, column 14). Fix: "
        "edit the file there or where that began: close brackets and quotes, indent with spaces "
        "(no tabs), write 'key: value' with a space after the colon"
    )
    path.write_text("model:\n\tnum_layers: 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert str(e.value).startswith(
        f"config={str(path)!r}: not valid YAML at line 2, column 1: found character '\\t' that "
        "cannot start any token. Fix: edit the file there: "
    )


def test_mock_data_conflict_says_where_the_data_path_was_set(tmp_path):
    demo_prefix = str(tmp_path / "demo_text_document")
    path = tmp_path / "data.yaml"
    path.write_text(f"data:\n  data_path: [{demo_prefix}]\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path), {"mock_data": True})
    assert "--data-path" not in str(e.value)
    assert (
        f"mock_data from the flag --mock-data, data_path from data.data_path of the YAML file "
        f"{str(path)!r}" in str(e.value)
    )
    assert "Fix: remove mock_data to train on the dataset, or remove data_path" in str(e.value)
    with pytest.raises(ConfigError, match="data_path from the flag --data-path"):
        load_config(None, {"mock_data": True, "data_path": [demo_prefix]})
    path.write_text("data:\n  num_workers: 0\n")  # the fix: data_path removed from the file
    assert load_config(str(path), {"mock_data": True}).data.data_path == []


@pytest.mark.parametrize(
    "hidden_size, swiglu, ffn",
    [(24, True, 64), (128, True, 320), (192, True, 512), (4096, True, 10880), (192, False, 768)],
)
def test_the_default_ffn_hidden_size_is_megatron_lms(hidden_size, swiglu, ffn):
    """Megatron-LM's arguments.py: with --swiglu int((4 * h * 2 / 3) / 64) * 64 (two thirds of
    4h, the parameters of a GeLU MLP of 4h, cut to a multiple of 64), else 4h; values by hand
    (e.g. 4096: 10922.67 / 64 = 170.67 -> 170 x 64 = 10880). It was 4h under SwiGLU too."""
    cfg = load_config(
        None, {"hidden_size": hidden_size, "num_attention_heads": 4, "swiglu": swiglu}
    )
    assert cfg.model.ffn_hidden_size == ffn
    assert cfg.model.moe_ffn_hidden_size is None or cfg.model.moe_ffn_hidden_size == ffn


def test_a_swiglu_default_ffn_hidden_size_of_zero_is_refused():
    with pytest.raises(ConfigError) as e:
        load_config(None, {"hidden_size": 16, "num_attention_heads": 4})
    assert str(e.value) == (
        "ffn_hidden_size=None: Megatron-LM's SwiGLU default int(4 x hidden_size x 2 / 3 / 64) x "
        "64 is 0 for hidden_size=16 (below 24). Fix: set ffn_hidden_size, e.g. 4 x hidden_size = "
        "64"
    )
    with pytest.raises(ConfigError, match=r"^ffn_hidden_size=0: must be a positive integer\. "):
        load_config(None, {"ffn_hidden_size": 0})


@pytest.mark.parametrize(
    "value, items",
    [
        ("/data/x_text_document", ["/data/x_text_document"]),
        ("0.3 /data/zh_text_document 0.7 /data/en_text_document", None),
        ("1 A 2e-1 B", ["1", "A", "2e-1", "B"]),
    ],
)
def test_a_blend_string_is_split_as_megatron_lm_splits_it(value, items):
    """A YAML scalar is Megatron-LM's 'PREFIX' or 'W1 P1 W2 P2 ...' string, split on
    whitespace."""
    data = load_config(None, {"data_path": value}).data
    assert data.data_path == (items or value.split())


@pytest.mark.parametrize("value", ["/work/sp ace/d d/demo_text_document", "w A x B"])
def test_a_blend_string_that_is_no_blend_names_the_yaml_list_fix(value):
    """A path with spaces written as a YAML scalar was split into pieces and refused as a blend
    whose weights and prefixes do not alternate (trial 3): the error now says why and how to
    write it."""
    with pytest.raises(ConfigError) as e:
        load_config(None, {"valid_data_path": value, "train_data_path": "A"})
    assert str(e.value).startswith(
        f"valid_data_path={value!r}: a string is split on whitespace into Megatron's blend "
        f"'W1 P1 W2 P2 ...', and its {len(value.split())} pieces are none. Fix: a path holding "
        f"spaces goes in a YAML list (valid_data_path: [{value!r}]), or on the command line "
        f"quoted (--valid-data-path '{value}')"
    )


@pytest.mark.parametrize(
    "key, value, why",
    [
        ("rotary_base", 0, "must be > 0 (RoPE's frequencies are rotary_base^(-2i/d)"),
        ("adam_beta1", 2.0, "must lie in [0, 1)"),
        ("adam_beta2", 1.0, "must lie in [0, 1)"),
        ("adam_eps", 0.0, "must be > 0 (Adam divides by sqrt(v) + adam_eps"),
        ("weight_decay", -1.0, "must be >= 0"),
    ],
)
def test_values_torch_or_rope_would_fail_on_are_refused_when_the_config_is_read(key, value, why):
    """A new user's trial 3: torch refused these only when the optimizer was built (after
    --overwrite had deleted the earlier checkpoints), and rotary_base 0 trained a NaN model to
    the end. The config now refuses them, so pretrain, estimate and submit stop before any work."""
    with pytest.raises(ConfigError) as e:
        load_config(None, {key: value})
    assert str(e.value).startswith(f"{key}={value!r}: {why}") and "Fix: " in str(e.value)


def _run_config(tmp_path, **checkpoint) -> str:
    """The config.yaml of a run in ``tmp_path/run1`` as pretrain writes it (save_config)."""
    from megatron_gamma.config import save_config

    run = tmp_path / "run1"
    run.mkdir()
    path = str(run / "config.yaml")
    save_config(load_config(None, {"run_dir": str(run), **checkpoint}), path)
    return path


def test_a_reused_config_yaml_does_not_resume_its_runs_checkpoints(tmp_path):
    """Trial 9, finding 1: a run resumed with --load records checkpoint.load in its config.yaml;
    that file reused as --config for a new run (its own --run-dir and --save) resumed the old
    run's checkpoints without a word. Such a load, from the file alone, is refused, naming the
    file, both directories and the two fixes."""
    from megatron_gamma.config import check_load_origin

    ckpt = str(tmp_path / "run1" / "ckpt")
    path = _run_config(tmp_path, save=ckpt, load=ckpt)
    new = {"run_dir": str(tmp_path / "e4"), "save": str(tmp_path / "e4" / "ck")}
    with pytest.raises(ConfigError) as e:
        check_load_origin(load_config(path, new), path, new)
    assert str(e.value) == (
        f"load={ckpt!r}: comes from the YAML file {path!r} (checkpoint.load), not from --load, "
        f"and is not this run's save={new['save']!r}: this run would resume another run's "
        "checkpoints (a run's config.yaml records the load it ran with). Fix: pass --load "
        f"{new['save']} for a run of its own (it resumes from its save directory, and starts "
        f"fresh while that holds no checkpoint), --load {ckpt} on the command line to start "
        "from those checkpoints, or remove `load` from the file (or from a copy of it)"
    )
    assert e.value.keys == ("load",)
    no_save = {"run_dir": str(tmp_path / "e5")}
    layered = [path, str(_write(tmp_path / "no-save.yaml", "checkpoint:\n  save: null\n"))]
    with pytest.raises(
        ConfigError, match=rf"from the YAML file {path!r} .* this run's save \(none"
    ):
        check_load_origin(load_config(layered, no_save), layered, no_save)


def test_a_load_that_is_the_runs_own_save_or_a_flag_still_resumes(tmp_path):
    """What stays: the file's own run resumed from it (load == save: the --save X --load X
    automatic resume of a recipe or of sweep's study-config.yaml, however the path is spelled),
    --load on the command line (another run's checkpoints, asked for), --finetune (load is the
    weights to start from), and a file without load."""
    from megatron_gamma.config import check_load_origin

    ckpt = str(tmp_path / "run1" / "ckpt")
    path = _run_config(tmp_path, save=ckpt, load=ckpt)
    elsewhere = {"run_dir": str(tmp_path / "e4"), "save": str(tmp_path / "e4" / "ck")}
    for overrides in (
        {},
        {"run_dir": str(tmp_path / "e4")},  # refused by check_run_dir_outputs instead
        {"save": ckpt + "/"},
        {**elsewhere, "load": ckpt},
        {**elsewhere, "finetune": True},
    ):
        cfg = load_config(path, overrides)
        assert check_load_origin(cfg, path, overrides) is None, overrides
        assert cfg.checkpoint.load == ckpt
    hand = _write(tmp_path / "hand.yaml", "checkpoint:\n  save: ck/x\n  load: ./ck//x/\n")
    assert check_load_origin(load_config(str(hand)), str(hand), {}) is None
    fresh = _write(tmp_path / "fresh.yaml", "checkpoint:\n  save: ck/y\n")
    assert check_load_origin(load_config(str(fresh), elsewhere), str(fresh), elsewhere) is None


def test_a_reused_config_yaml_under_a_new_run_dir_keeps_none_of_its_runs_directories(tmp_path):
    """``pretrain --config RUN1/config.yaml --run-dir NEW`` (no --save) passed the load check
    (the file's load is its own save) and resumed and saved into RUN1's checkpoints, outside
    NEW's lock. Every output path the file puts inside its own run_dir is refused, each named
    with the flag that moves it under NEW and the flag that keeps it on purpose."""
    from megatron_gamma.config import check_run_dir_outputs

    run1, new = tmp_path / "run1", str(tmp_path / "new")
    ckpt, tb = str(run1 / "checkpoints"), str(run1 / "tb")
    path = _run_config(tmp_path, save=ckpt, load=ckpt, tensorboard_dir=tb)
    overrides = {"run_dir": new}
    with pytest.raises(ConfigError) as e:
        check_run_dir_outputs(load_config(path, overrides), path, overrides)
    moved = f"{new}/checkpoints"
    assert str(e.value) == (
        f"save={ckpt!r}, load={ckpt!r}, tensorboard_dir={tb!r}: from the YAML file {path!r}, "
        f"whose run_dir={str(run1)!r}, while this run's --run-dir is {new!r}: this run "
        "would write into or resume from that run's directories. Fix: pass --save "
        f"{moved} --load {moved} --tensorboard-dir {new}/tb for a run of its own, or --save "
        f"{ckpt} --load {ckpt} --tensorboard-dir {tb} to use that run's on purpose"
    )
    assert e.value.keys == ("save", "load", "tensorboard_dir")
    given = {"run_dir": new, "save": ckpt, "load": ckpt}
    with pytest.raises(ConfigError) as e:
        check_run_dir_outputs(load_config(path, given), path, given)
    assert e.value.keys == ("tensorboard_dir",)


def test_paths_outside_the_files_run_dir_or_given_as_flags_are_kept(tmp_path):
    """What stays: the file's own run_dir (however spelled, or not given), each output path
    given on the command line, output paths outside the file's run_dir (a shared checkpoint
    store), and a file that names no run_dir."""
    from megatron_gamma.config import check_run_dir_outputs

    run1 = tmp_path / "run1"
    ckpt = str(run1 / "checkpoints")
    path = _run_config(tmp_path, save=ckpt, load=ckpt)
    for overrides in (
        {},
        {"run_dir": str(run1) + "/./"},
        {"run_dir": str(tmp_path / "new"), "save": ckpt, "load": ckpt},
        {"run_dir": str(tmp_path / "new"), "save": str(tmp_path / "new" / "ck"), "load": None},
    ):
        cfg = load_config(path, overrides)
        assert check_run_dir_outputs(cfg, path, overrides) is None, overrides
    tb = str(tmp_path / "store" / "tb")
    shared = str(_write(tmp_path / "shared.yaml", f"logging:\n  run_dir: {run1}\n"
                        f"  tensorboard_dir: {tb}\n"))  # fmt: skip
    elsewhere = {"run_dir": str(tmp_path / "new")}
    assert check_run_dir_outputs(load_config(shared, elsewhere), shared, elsewhere) is None
    bare = str(_write(tmp_path / "bare.yaml", f"checkpoint:\n  save: {ckpt}\n"))
    assert check_run_dir_outputs(load_config(bare, elsewhere), bare, elsewhere) is None


def test_a_recipes_checkpoints_outside_its_run_dir_are_not_shared_with_a_new_run_dir(tmp_path):
    """Trial 11: a recipe (its run_dir runs/gpt-0.3b, its save and load /checkpoints/gpt-0.3b)
    layered with an ablation file under a new --run-dir, no --save: the ablation would save
    among the baseline's checkpoints, or resume them. Refused, with the sibling named after the
    new run directory; with --save alone, load is refused with --save's value as the fix; the
    README's command (--save and --load) passes, on the shipped recipe and ablation files."""
    from megatron_gamma.config import check_load_origin, check_run_dir_outputs

    store = tmp_path / "checkpoints"
    base, ckpt = str(store / "gpt-0.3b"), str(store / "gpt-0.3b-gamma-0.5")
    recipe = str(_write(tmp_path / "recipe.yaml", "logging:\n  run_dir: runs/gpt-0.3b\n"
                        f"checkpoint:\n  save: {base}\n  load: {base}\n"))  # fmt: skip
    ablation = str(_write(tmp_path / "gamma-0.5.yaml", "init:\n  init_gamma: 0.5\n"))
    files, run_dir = [recipe, ablation], "runs/gpt-0.3b-gamma-0.5"
    given = {"run_dir": run_dir}
    with pytest.raises(ConfigError) as e:
        check_run_dir_outputs(load_config(files, given), files, given)
    assert str(e.value) == (
        f"save={base!r}, load={base!r}: from the YAML file {recipe!r}, whose "
        f"run_dir='runs/gpt-0.3b', while this run's --run-dir is {run_dir!r}: this run would "
        f"write into or resume from that run's directories. Fix: pass --save {ckpt} --load "
        f"{ckpt} for a run of its own, or --save {base} --load {base} to use that run's on "
        "purpose"
    )
    given = {"run_dir": run_dir, "save": ckpt}
    with pytest.raises(ConfigError) as e:
        check_run_dir_outputs(load_config(files, given), files, given)
    assert e.value.keys == ("load",) and f"Fix: pass --load {ckpt} for a run" in str(e.value)
    given = {"run_dir": run_dir, "load": ckpt}  # --load alone: --save the same directory
    with pytest.raises(ConfigError) as e:
        check_run_dir_outputs(load_config(files, given), files, given)
    assert e.value.keys == ("save",) and f"Fix: pass --save {ckpt} for a run" in str(e.value)
    shipped = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "configs")
    files = [f"{shipped}/gpt-0.3b.yaml", f"{shipped}/ablations/gamma-0.5.yaml"]
    given = {"run_dir": run_dir, "save": ckpt, "load": ckpt}
    cfg = load_config(files, given)
    assert check_load_origin(cfg, files, given) is None
    assert check_run_dir_outputs(cfg, files, given) is None
    assert (cfg.init.init_gamma, cfg.checkpoint.save) == (0.5, ckpt)


def test_an_unknown_key_names_its_file_and_a_directory_names_its_config_yaml(tmp_path):
    """Trial 10: with two --config files an unknown key's error did not say which file held it
    (a type error did); and --config RUN_DIR said "file not found" of a directory holding the
    run's config.yaml."""
    base = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "configs")
    bad = str(_write(tmp_path / "bad.yaml", "model:\n  hiden_size: 64\n"))
    with pytest.raises(ConfigError) as e:
        load_config([os.path.join(base, "demo.yaml"), bad])
    assert str(e.value) == (
        "model.hiden_size: unknown key. Fix: remove it or correct it; did you mean "
        f"'hidden_size'? (hiden_size from model.hiden_size of the YAML file {bad!r})"
    )
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ConfigError) as e:
        load_config(str(run))
    assert str(e.value) == f"config={str(run)!r}: is a directory. Fix: pass a YAML file to --config"
    _write(run / "config.yaml", "")
    with pytest.raises(ConfigError) as e:
        load_config(str(run))
    assert str(e.value) == (
        f"config={str(run)!r}: is a directory. Fix: pass {run / 'config.yaml'}, the run's "
        "resolved config"
    )


def test_a_key_in_another_section_names_the_section_it_belongs_in(tmp_path):
    """Trial 15: save_interval under training: got "did you mean 'exit_interval'?", another key
    of training, while save_interval is a setting of the checkpoint section (a typo of it
    likewise); a flag of the same name (which sets checkpoint.save_interval) was named as the
    key's origin."""
    from megatron_gamma.config.loading import field_index

    assert field_index()["save_interval"][0] == "checkpoint"
    assert "save_interval" not in [f.name for f in dataclasses.fields(TrainingConfig)]
    base = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "configs")
    bad = str(_write(tmp_path / "tiny.yaml", "training:\n  save_interval: 25\n"))
    want = (
        "training.save_interval: not a setting of the training section; save_interval belongs "
        "in the checkpoint: section. Fix: move 'save_interval: 25' under 'checkpoint:' "
        f"(checkpoint.save_interval) (training.save_interval from the YAML file {bad!r})"
    )
    for overrides in ({}, {"save_interval": 3}):
        with pytest.raises(ConfigError) as e:
            load_config([os.path.join(base, "demo.yaml"), bad], overrides)
        assert str(e.value) == want
    moved = str(_write(tmp_path / "moved.yaml", "checkpoint:\n  save_interval: 25\n"))
    assert load_config(moved).checkpoint.save_interval == 25
    typo = str(_write(tmp_path / "typo.yaml", "training:\n  save_intervall: 2\n"))
    with pytest.raises(ConfigError) as e:  # a typo of it: the closest key, with its section
        load_config(typo)
    assert str(e.value).startswith(
        "training.save_intervall: unknown key. Fix: remove it or correct it; did you mean "
        "'save_interval', a setting of the checkpoint: section (checkpoint.save_interval)?"
    )


def _write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path
