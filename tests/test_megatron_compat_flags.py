"""Megatron-LM flags found missing by a new user: the fusion switches, the optimizer, data and
determinism flags, ``--split`` as megatron-core reads it, and Megatron-LM's preprocess flags.
Each is checked against the megatron-core field it sets or the refusal naming it."""

import pytest

from megatron_gamma import cli
from megatron_gamma.config import ConfigError, load_config, overrides_from_args
from megatron_gamma.model.builder import transformer_config

# Megatron-LM flag -> the megatron-core TransformerConfig field it turns off there.
FUSION_FLAGS = {
    "--no-masked-softmax-fusion": "masked_softmax_fusion",
    "--no-bias-gelu-fusion": "bias_activation_fusion",
    "--no-bias-swiglu-fusion": "bias_activation_fusion",
    "--no-bias-dropout-fusion": "bias_dropout_fusion",
    "--no-gradient-accumulation-fusion": "gradient_accumulation_fusion",
    "--no-rope-fusion": "apply_rope_fusion",
    "--no-persist-layer-norm": "persist_layer_norm",
}


def _config(argv: list[str]):
    return load_config(None, overrides_from_args(cli.parse_args(["pretrain", *argv])))


@pytest.mark.parametrize("flag", sorted(FUSION_FLAGS))
@pytest.mark.parametrize("swiglu", ["--swiglu", "--no-swiglu"])
def test_megatron_lm_fusion_switches_are_accepted_and_the_fusion_is_off(flag, swiglu):
    tcfg = transformer_config(_config([flag, swiglu]), on_gpu=False)
    assert getattr(tcfg, FUSION_FLAGS[flag]) is False


@pytest.mark.parametrize("flag", sorted(FUSION_FLAGS))
def test_a_fusion_switched_on_is_refused_naming_the_flag(flag):
    on = "--" + flag[len("--no-") :]
    key = on[2:].replace("-", "_")
    with pytest.raises(ConfigError) as e:
        _config([on])
    assert str(e.value).startswith(f"{key}=True: megatron-gamma builds every model with")
    assert f"Fix: drop {on}" in str(e.value)


def _unknown_flag_error(flag: str, capsys) -> str:
    with pytest.raises(SystemExit):
        cli.parse_args(["pretrain", flag])
    return capsys.readouterr().err


def test_an_unknown_no_flag_is_not_matched_to_an_unrelated_flag_by_its_prefix(capsys):
    err = _unknown_flag_error("--no-async-tensor-model-parallel-allreduce", capsys)
    assert "unrecognized arguments: --no-async-tensor-model-parallel-allreduce" in err
    assert "did you mean" not in err


def test_a_misspelt_no_flag_still_gets_its_suggestion(capsys):
    assert "--no-load-optm: did you mean --no-load-optim?" in _unknown_flag_error(
        "--no-load-optm", capsys
    )


@pytest.mark.parametrize("split", ["90,10", "1,2", "100", "90/5/5", "949,50,1", " 3 , 1 ", "0,1"])
def test_split_takes_what_megatron_core_takes_with_the_same_shares(split, demo_prefix, tmp_path):
    from megatron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split

    from megatron_gamma.config.sections import split_shares

    cfg = load_config(None, {"split": split, "data_path": [demo_prefix]})
    shares = split_shares(cfg.data.split)
    assert [s / sum(shares) for s in shares] == pytest.approx(parse_and_normalize_split(split))


@pytest.mark.parametrize("split", ["-1,2", "a,b", "0,0,0", "1,1,1,1", "1e3", "1.2.3", "", "1,,1"])
def test_a_split_megatron_core_would_misread_is_an_error_naming_it(split):
    with pytest.raises(ConfigError) as e:
        load_config(None, {"split": split})
    assert str(e.value).startswith(f"split={split!r}: needs one to three non-negative numbers")
    assert "Fix: use e.g." in str(e.value)


def test_the_split_fix_says_what_corpus_megatron_lms_default_needs():
    """Trial 13: the format error suggested '949,50,1', which a 300-document corpus cannot
    fill. It now names the size below which its test split is empty, as megatron-core's own
    split bounds (``round(bound x documents)``) give it."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    test = convert_split_vector_to_split_matrix(parse_and_normalize_split("949,50,1"))[2]
    empty = [n for n in range(400, 600) if round(test[0] * n) == round(test[1] * n)]
    assert empty[-1] == 500
    with pytest.raises(ConfigError) as e:
        load_config(None, {"split": "98,2,0,1"})
    assert "Fix: use e.g. '98,2,0' (train, valid, no test) or '949,50,1'" in str(e.value)
    assert f"whose 0.1% test split is empty below {empty[-1] + 1} documents" in str(e.value)


def test_sgd_momentum_reaches_megatron_cores_optimizer_config():
    from types import SimpleNamespace

    import torch

    from megatron_gamma.training.loop import Trainer

    cfg = _config(["--optimizer", "sgd", "--sgd-momentum", "0.5"])
    fake = SimpleNamespace(cfg=cfg, tcfg=SimpleNamespace(params_dtype=torch.float32))
    ocfg = Trainer._optimizer_config(fake)
    assert (ocfg.optimizer, ocfg.sgd_momentum) == ("sgd", 0.5)
    with pytest.raises(ConfigError, match=r"^sgd_momentum=1\.5: must lie in \[0, 1\)"):
        _config(["--optimizer", "sgd", "--sgd-momentum", "1.5"])


def test_num_dataset_builder_threads_reaches_gpt_dataset_config(demo_prefix, monkeypatch, tmp_path):
    from megatron_gamma.data import datasets
    from megatron_gamma.data.tokenizer_types import load_tokenizer

    built = []

    class Builder:
        def __init__(self, cls, sizes, is_built_on_rank, config):
            built.append(config)

        def build(self):
            raise RuntimeError("config captured")

    monkeypatch.setattr(datasets, "BlendedMegatronDatasetBuilder", Builder)
    argv = ["--num-dataset-builder-threads", "3", "--data-path", demo_prefix]
    cfg = _config([*argv, "--run-dir", str(tmp_path)])
    with pytest.raises(RuntimeError, match="config captured"):
        datasets.build_datasets(cfg, load_tokenizer(cfg.data, cfg.logging.run_dir))
    assert built[0].num_dataset_builder_threads == 3


@pytest.mark.parametrize(
    "flag", ["--encoder-seq-length", "--non-persistent-save-interval", "--data-impl"]
)
def test_megatron_lm_flags_we_cannot_honour_are_refused_by_name(flag, capsys):
    from megatron_gamma.config.megatron_lm import REFUSED

    err = _unknown_flag_error(flag, capsys)
    why, fix = REFUSED[flag]
    assert f"{flag}: refused: {why}. Fix: {fix}" in err


@pytest.mark.parametrize("command", ["preprocess", "submit-preprocess"])
@pytest.mark.parametrize("flag, value", [("--partitions", "4"), ("--dataset-impl", "mmap")])
def test_megatron_lm_preprocess_flags_we_do_not_honour_are_refused_by_name(
    command, flag, value, capsys
):
    from megatron_gamma.config.megatron_lm import PREPROCESS_REFUSED

    args = [command, "--input", "x.jsonl", "--output-prefix", "o", "--num-shards", "2"]
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args([*args, flag, value])
    assert exit_.value.code == 2
    why, fix = PREPROCESS_REFUSED[flag]
    err = capsys.readouterr().err
    assert f"{flag}: refused: {why}. Fix: {fix}" in err
    assert "unrecognized arguments" not in err


@pytest.mark.parametrize("command", ["preprocess", "submit-preprocess"])
@pytest.mark.parametrize("given", [["--partitions", "1"], ["--partitions=1"]])
def test_megatron_lms_default_partitions_1_is_accepted_with_a_warning(command, given, capsys):
    """Trial 15: `--partitions 1`, Megatron-LM's own default, was refused with the message meant
    for a split into several partition files; only another count is refused."""
    from megatron_gamma.config.megatron_lm import PREPROCESS_NO_EFFECT

    args = [command, "--input", "x.jsonl", "--output-prefix", "o", "--num-shards", "3", *given]
    parsed = cli.parse_args(args)
    assert (parsed.input, parsed.output_prefix, parsed.num_shards) == (["x.jsonl"], "o", 3)
    assert capsys.readouterr().err == (
        f"megatron-gamma {command}: warning: --partitions 1: no effect: "
        f"{PREPROCESS_NO_EFFECT['--partitions'][1]}\n"
    )
    for other in (["--partitions", "2"], ["--partitions=0"]):
        with pytest.raises(SystemExit):
            cli.parse_args([*args[: -len(given)], *other])
        err = capsys.readouterr().err
        assert "--partitions: refused: input files are not split into partition files (only " in err
        assert "Fix: drop it and use --workers N, or --num-shards N --shard-index I" in err
        assert "no effect" not in err
    with pytest.raises(SystemExit):  # one flag of pretrain's takes no such value
        cli.parse_args(["pretrain", "--partitions", "1"])
    assert "no effect" not in capsys.readouterr().err


def test_partitions_1_changes_no_byte(tmp_path, capsys):
    """``--partitions 1`` writes what the same command without it writes."""
    from pathlib import Path

    corpus = Path(cli.__file__).parent / "data" / "demo" / "en.jsonl"
    tok = Path(cli.__file__).parent / "data" / "demo"
    base = ["preprocess", "--input", str(corpus), "--tokenizer-model", str(tok), "--no-progress"]
    written = []
    for name, extra in (("plain", []), ("one", ["--partitions", "1"])):
        assert cli.main([*base, "--output-prefix", str(tmp_path / name / "d"), *extra]) == 0
        written.append({p.name: p.read_bytes() for p in (tmp_path / name).glob("d_*.*")})
    assert written[0] == written[1] and "d_text_document.bin" in written[0]
    assert "--partitions 1: no effect" in capsys.readouterr().err


def test_keep_newlines_and_sequential_samples_change_no_byte(tmp_path):
    """--split-sentences keeps the newlines between sentences already (what --keep-newlines asks
    of Megatron-LM), and the output keeps the input order (--keep-sequential-samples)."""
    from pathlib import Path

    from megatron_gamma.data.sentences import split_sentences

    text = "First sentence here.\nSecond one follows.\n\nThird after a blank line."
    assert "".join(split_sentences(text)) == text
    corpus = Path(cli.__file__).parent / "data" / "demo" / "en.jsonl"
    tok = Path(cli.__file__).parent / "data" / "demo"
    base = ["preprocess", "--input", str(corpus), "--tokenizer-model", str(tok), "--no-progress"]
    base += ["--split-sentences"]
    outputs = []
    for name, extra in (("plain", []), ("kept", ["--keep-newlines", "--keep-sequential-samples"])):
        prefix = tmp_path / name / "d"
        assert cli.main([*base, "--output-prefix", str(prefix), *extra]) == 0
        outputs.append(sorted(p.name for p in (tmp_path / name).glob("d_*.bin")))
        outputs.append([p.read_bytes() for p in sorted((tmp_path / name).glob("d_*.bin"))])
    assert outputs[0] == outputs[2] and outputs[1] == outputs[3] and outputs[0]
