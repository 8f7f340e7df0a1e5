"""``--dist-ckpt-strictness`` (Megatron-LM's flag): megatron-core's handling of key mismatches
when a checkpoint is read, for ``--load`` and ``--pretrained-checkpoint``. A checkpoint of a
gated model read into a model without gates holds keys that model does not ask for (its
``linear_gate`` weights): the default drops them without a word, as Megatron-LM's default does;
``log_all`` names them and goes on; ``raise_all`` stops the run naming them. A checkpoint
without gates read into a gated model lacks keys the model asks for: every value stops before the
read with a named error, the keys those megatron-core's ``raise_unexpected`` names, and what any
one rank finds stops every rank with the same error. The values are
megatron-core's own ``StrictHandling`` members, less the two that return keys to a caller."""

import pytest
from distributed import run_distributed
from helpers import TINY_MODEL, pretrain, read_metrics, run_cli
from megatron.core.dist_checkpointing.validation import StrictHandling

from megatron_gamma import cli
from megatron_gamma.config import ConfigError, load_config, overrides_from_args
from megatron_gamma.config.choices import REFUSED_DIST_CKPT_STRICTNESS, DistCkptStrictness
from megatron_gamma.rundir import layout
from megatron_gamma.training.checkpointing import checkpoint_dir, latest_iteration


def _config(argv: list[str]):
    return load_config(None, overrides_from_args(cli.parse_args(["pretrain", *argv])))


def test_the_values_are_megatron_cores_less_the_refused_ones():
    ours = {m.value for m in DistCkptStrictness}
    assert ours | set(REFUSED_DIST_CKPT_STRICTNESS) == {s.value for s in StrictHandling}
    assert not ours & set(REFUSED_DIST_CKPT_STRICTNESS)
    assert DistCkptStrictness.ASSUME_OK_UNEXPECTED.value == "assume_ok_unexpected"


@pytest.mark.parametrize("value", [m.value for m in DistCkptStrictness])
def test_each_value_reaches_the_checkpoint_config_as_a_plain_string(value):
    cfg = _config(["--dist-ckpt-strictness", value, "--load", "ckpt"])
    assert cfg.checkpoint.dist_ckpt_strictness == value
    assert type(cfg.checkpoint.dist_ckpt_strictness) is str


def test_the_default_is_megatron_lms():
    assert _config([]).checkpoint.dist_ckpt_strictness == "assume_ok_unexpected"


@pytest.mark.parametrize("value", sorted(REFUSED_DIST_CKPT_STRICTNESS))
def test_the_returning_values_are_refused_with_the_reason_and_the_fix(value):
    with pytest.raises(ConfigError) as e:
        _config(["--dist-ckpt-strictness", value, "--load", "ckpt"])
    why, fix = REFUSED_DIST_CKPT_STRICTNESS[value]
    assert f"dist_ckpt_strictness={value!r}" in str(e.value)
    assert why in str(e.value) and fix in str(e.value)


def test_an_unknown_value_is_refused_naming_the_values():
    with pytest.raises(ConfigError) as e:
        _config(["--dist-ckpt-strictness", "strict", "--load", "ckpt"])
    assert "dist_ckpt_strictness='strict'" in str(e.value)
    for m in DistCkptStrictness:
        assert f"'{m.value}'" in str(e.value)


@pytest.fixture(scope="module")
def gated_checkpoint(tmp_path_factory, demo_prefix) -> str:
    run = tmp_path_factory.mktemp("strictness") / "gated"
    pretrain(run, demo_prefix, "--train-iters", "2", "--eval-interval", "100",
             "--log-diagnostics-interval", "0", "--save", str(run / "checkpoints"))  # fmt: skip
    return str(run / "checkpoints")


def _start(run_dir, demo_prefix: str, *flags: str, nproc: int = 1):
    return run_cli(["pretrain", "--data-path", demo_prefix, "--run-dir", str(run_dir),
                    *TINY_MODEL, "--eval-interval", "100", "--log-diagnostics-interval", "0",
                    *flags], nproc=nproc)  # fmt: skip


def _without_gates(run_dir, demo_prefix: str, checkpoint: str, *flags: str):
    return _start(run_dir, demo_prefix, "--gated-attention", "none", "--train-iters", "1",
                  "--pretrained-checkpoint", checkpoint, *flags)  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_checkpoint_keys_the_model_does_not_take_pass_silently_by_default_are_logged_or_stop(
    tmp_path, demo_prefix, gated_checkpoint
):
    silent = _without_gates(tmp_path / "default", demo_prefix, gated_checkpoint)
    assert silent.returncode == 0, silent.stderr[-3000:]
    assert "linear_gate" not in silent.stdout + silent.stderr

    logged = _without_gates(
        tmp_path / "log", demo_prefix, gated_checkpoint, "--dist-ckpt-strictness", "log_all"
    )
    assert logged.returncode == 0, logged.stderr[-3000:]
    [warning] = [line for line in logged.stderr.splitlines() if "log_all" in line]
    assert "self_attention.linear_gate.weight" in warning
    assert "optimizer." not in warning and "rng_state" not in warning  # unread on purpose

    stopped = _without_gates(
        tmp_path / "raise", demo_prefix, gated_checkpoint, "--dist-ckpt-strictness", "raise_all"
    )
    assert stopped.returncode != 0
    assert "dist_ckpt_strictness='raise_all'" in stopped.stderr
    assert "self_attention.linear_gate.weight" in stopped.stderr
    assert "optimizer.state" not in stopped.stderr


@pytest.fixture(scope="module")
def ungated_checkpoint(tmp_path_factory, demo_prefix) -> str:
    run = tmp_path_factory.mktemp("strictness") / "ungated"
    pretrain(run, demo_prefix, "--gated-attention", "none", "--train-iters", "2",
             "--eval-interval", "100", "--log-diagnostics-interval", "0",
             "--save", str(run / "checkpoints"))  # fmt: skip
    return str(run / "checkpoints")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("value", [m.value for m in DistCkptStrictness])
def test_keys_the_checkpoint_lacks_stop_every_value_before_the_read_naming_them(
    tmp_path, demo_prefix, ungated_checkpoint, value
):
    proc = _start(tmp_path / "run", demo_prefix, "--train-iters", "1", "--pretrained-checkpoint",
                  ungated_checkpoint, "--dist-ckpt-strictness", value)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]  # a ConfigError, not a traceback
    assert "Traceback" not in proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if "lacks keys this run asks for" in line]
    assert (
        "(2: decoder.layers.self_attention.linear_gate._extra_state, "
        "decoder.layers.self_attention.linear_gate.weight)" in error
    )
    assert "Fix: build the model as the checkpoint was" in error


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("load", ["--pretrained-checkpoint", "--load"])
def test_tensors_of_other_shapes_stop_the_load_before_the_read_naming_them(
    tmp_path, demo_prefix, ungated_checkpoint, load
):
    # TINY_MODEL's hidden size is 64 and its FFN 256; here 32 and 128, as --hidden-size sets both
    smaller = ["--hidden-size", "32", "--ffn-hidden-size", "128", "--gated-attention", "none"]
    proc = _start(tmp_path / "run", demo_prefix, *smaller, "--train-iters", "3",
                  "--use-checkpoint-opt-param-scheduler", load, ungated_checkpoint)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [error] = [
        line for line in proc.stderr.splitlines() if "cannot be loaded into this run" in line
    ]
    assert "it holds tensors of other shapes (" in error and "lacks keys" not in error
    assert "decoder.final_layernorm.weight: checkpoint 64, this run 32" in error
    if load == "--load":  # a resume: the settings this run changed from the checkpoint's run
        assert (
            "Fix: build the model as the checkpoint was: this run changed ffn_hidden_size=128 "
            "(the run had 256), hidden_size=32 (the run had 64), kv_channels=8 (the run had 16); "
            "drop those flags"
        ) in error
    else:
        assert "Fix: build the model as the checkpoint was" in error and "--hidden-size" in error


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_optimizer_state_the_checkpoint_lacks_stops_a_resume_offering_no_load_optim(
    tmp_path, demo_prefix
):
    sgd = tmp_path / "sgd"
    pretrain(sgd, demo_prefix, "--optimizer", "sgd", "--train-iters", "2",
             "--eval-interval", "100", "--log-diagnostics-interval", "0",
             "--save", str(sgd / "checkpoints"))  # fmt: skip
    resume = ["--train-iters", "3", "--use-checkpoint-opt-param-scheduler", "--load",
              str(sgd / "checkpoints")]  # fmt: skip
    adam = _start(tmp_path / "adam", demo_prefix, *resume)  # Adam asks for exp_avg, exp_avg_sq
    assert adam.returncode == 2, adam.stderr[-3000:]
    [error] = [line for line in adam.stderr.splitlines() if "lacks keys this run asks for" in line]
    assert "optimizer.state.exp_avg." in error and "saved from another optimizer" in error
    assert "Fix: --no-load-optim to start the optimizer afresh" in error
    fresh = _start(tmp_path / "fresh", demo_prefix, *resume, "--no-load-optim")
    assert fresh.returncode == 0, fresh.stderr[-3000:]


MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_ep2_checkpoint_resumed_at_ep1_names_the_expert_parallel_layout(tmp_path, demo_prefix):
    """Under EP > 1 megatron-core's optimizer is a ChainedOptimizer (state keyed
    chained_N.optimizer.*), at EP = 1 a single one (optimizer.*): the same Adam, so the error
    names the layout and its fixes, not "another optimizer"; --no-load-optim then resumes."""
    save = tmp_path / "ep2" / "checkpoints"
    ep2 = _start(tmp_path / "ep2", demo_prefix, *MOE, "--expert-model-parallel-size", "2",
                 "--train-iters", "2", "--save", str(save), nproc=2)  # fmt: skip
    assert ep2.returncode == 0, ep2.stderr[-3000:]
    resume = [
        *MOE,
        "--train-iters",
        "3",
        "--use-checkpoint-opt-param-scheduler",
        "--load",
        str(save),
    ]
    ep1 = _start(tmp_path / "ep1", demo_prefix, *resume)
    assert ep1.returncode == 2, ep1.stderr[-3000:]
    [error] = [line for line in ep1.stderr.splitlines() if "lacks keys this run asks for" in line]
    assert "optimizer.state.exp_avg." in error and "another optimizer" not in error, error
    assert (
        "Its optimizer state was saved under another expert-parallel layout: the checkpoint "
        "holds a ChainedOptimizer's (chained_N.optimizer.*: expert_model_parallel_size=2, "
    ) in error, error
    assert (
        "Fix: resume with --expert-model-parallel-size 2, as it was saved, or add "
        "--no-load-optim to start the optimizer afresh (the model weights load into any layout)"
    ) in error, error
    fresh = _start(tmp_path / "fresh", demo_prefix, *resume, "--no-load-optim")
    assert fresh.returncode == 0, fresh.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("saved", [False, True], ids=["saved-plain", "saved-distributed"])
def test_a_resume_across_the_distributed_optimizer_offers_the_weights_alone(
    tmp_path, demo_prefix, saved
):
    """Trial 14 #8: megatron-core converts no optimizer state between its DistributedOptimizer
    and the plain one, and the refusal said only "resume with the same setting"; it now names
    the flag and offers --no-load-optim, in the EP-layout error's words (one fix,
    ``layout.optimizer_layout_fix``). That resume runs, from the checkpoint's weights: its first
    loss is the uninterrupted run's at that iteration (a forward pass before any step)."""
    flag = "--use-distributed-optimizer"
    save = tmp_path / "a" / "checkpoints"
    full = _start(tmp_path / "a", demo_prefix, *[flag] * saved, "--train-iters", "3",
                  "--save-interval", "2", "--save", str(save))  # fmt: skip
    assert full.returncode == 0, full.stderr[-3000:]
    (save / layout.TRACKER).write_text("2\n")  # resume from iteration 2 (the rollback fix)
    resume = [*[flag] * (not saved), "--train-iters", "3", "--load", str(save)]
    refused = _start(tmp_path / "b", demo_prefix, *resume)
    assert refused.returncode == 2, refused.stderr[-3000:]
    same = "--" + "no-" * (not saved) + "use-distributed-optimizer"
    assert (
        f"megatron-gamma pretrain: error: use_distributed_optimizer={not saved}: "
        f"{checkpoint_dir(str(save), 2)} was saved with use_distributed_optimizer={saved}, and "
        "megatron-core cannot convert optimizer state between the two. Fix: resume with "
        f"{same}, as it was saved, or add --no-load-optim to start the optimizer afresh (the "
        "model weights load into any layout), or another checkpoint\n"
    ) in refused.stderr, refused.stderr[-3000:]
    fresh = _start(tmp_path / "c", demo_prefix, *resume, "--no-load-optim")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "resumed at iteration 2" in fresh.stdout
    losses = {run: read_metrics(tmp_path / run)["train"] for run in ("a", "c")}
    assert sorted(losses["c"]) == [3]
    assert losses["c"][3] == pytest.approx(losses["a"][3], rel=1e-6, abs=0)


def test_the_expert_layout_message_names_either_direction(monkeypatch):
    """The message builder alone: a checkpoint of a single optimizer resumed under EP > 1, and
    one whose config does not record its layout; no change of layout, no message."""
    held = {"optimizer.state.exp_avg.w": None, "decoder.w": None}
    chained = ["chained_0.optimizer.state.exp_avg.w", "chained_1.optimizer.state.exp_avg.e"]
    monkeypatch.setattr(layout, "saved_description", lambda p: ({"parallel": {}}, None))
    said = layout.expert_layout_change(chained, held, "ckpt")
    assert "the checkpoint holds a single optimizer's (optimizer.*: " in said
    assert "this run, under expert_model_parallel_size > 1, asks for a ChainedOptimizer's" in said
    assert "Fix: resume with --expert-model-parallel-size 1, as it was saved, or add " in said
    monkeypatch.setattr(layout, "saved_description", lambda p: (None, None))
    said = layout.expert_layout_change(["optimizer.state.exp_avg.w"], dict.fromkeys(chained), "c")
    assert "(chained_N.optimizer.*: expert_model_parallel_size > 1, " in said
    assert "Fix: resume with the --expert-model-parallel-size it was saved with (> 1), or " in said
    assert layout.expert_layout_change(["optimizer.state.exp_avg.v"], held, "ckpt") is None


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "parallel", ["--tensor-model-parallel-size", "--pipeline-model-parallel-size"]
)
def test_keys_the_checkpoint_lacks_stop_every_rank_of_a_resharded_load(
    tmp_path, demo_prefix, ungated_checkpoint, parallel
):
    proc = _start(tmp_path / "run", demo_prefix, "--train-iters", "1", parallel, "2",
                  "--pretrained-checkpoint", ungated_checkpoint, nproc=2)  # fmt: skip
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "lacks keys this run asks for" in line]
    assert errors, proc.stderr[-3000:]  # torchrun may stop the other rank before it prints
    assert all("linear_gate.weight" in line for line in errors)
    assert "KeyError" not in proc.stderr and "CheckpointingException" not in proc.stderr


def _check_loadable_per_rank(path: str, key: str, shape: tuple[int, int]) -> str:
    """Rank 0 asks for ``key`` one column wider than the checkpoint's ``shape``, rank 1 for a
    key the checkpoint lacks; returns the ConfigError this rank raised."""
    import torch
    import torch.distributed as dist
    from megatron.core.dist_checkpointing import ShardedTensor

    from megatron_gamma.rundir.layout import check_loadable

    dist.init_process_group("gloo")
    try:
        if dist.get_rank() == 0:
            wide = torch.zeros(shape[0], shape[1] + 1)
            asked = {"wide": ShardedTensor.from_rank_offsets(key, wide)}
        else:
            asked = {"absent": ShardedTensor.from_rank_offsets("decoder.absent", torch.zeros(2))}
        check_loadable(asked, path)
    except ConfigError as e:
        return str(e)
    finally:
        dist.destroy_process_group()
    return "loadable"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_what_one_rank_finds_stops_every_rank_with_the_same_error(ungated_checkpoint):
    from megatron_gamma.checkpoint_trust import load_tensors_metadata

    path = checkpoint_dir(ungated_checkpoint, latest_iteration(ungated_checkpoint))
    key = "embedding.word_embeddings.weight"
    rows, cols = load_tensors_metadata(path)[key].global_shape
    errors = run_distributed(_check_loadable_per_rank, 2, path, key, (rows, cols))
    assert errors[0] == errors[1]
    assert "it lacks keys this run asks for (1: decoder.absent)" in errors[0]
    want = f"(1: {key}: checkpoint {rows}x{cols}, this run {rows}x{cols + 1})"
    assert f"it holds tensors of other shapes {want}" in errors[0]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "load",
    [
        ["--pretrained-checkpoint"],  # weights only: optimizer and RNG states left unread
        ["--use-checkpoint-opt-param-scheduler", "--no-load-optim", "--load"],  # no optimizer
        ["--use-checkpoint-opt-param-scheduler", "--load"],  # everything read
    ],
    ids=["weights-only", "no-load-optim", "resume"],
)
def test_a_matching_checkpoint_passes_raise_all_however_it_is_loaded(
    tmp_path, demo_prefix, gated_checkpoint, load
):
    proc = _start(tmp_path / "run", demo_prefix, "--train-iters", "3",
                  "--dist-ckpt-strictness", "raise_all", *load, gated_checkpoint)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
