"""docs/megatron-flags.md against the parser: every Megatron-LM flag it lists as accepted is a
``pretrain`` flag, every flag it lists as refused stops the command line naming the flag with the
documented reason, and the refusal table in code and the document hold the same flags."""

import re
from pathlib import Path

import pytest

from megatron_gamma import cli
from megatron_gamma.config import REFUSED_TOKENIZER_TYPES, ConfigError, load_config
from megatron_gamma.config.megatron_lm import REFUSED

DOC = Path(__file__).parents[1] / "docs" / "megatron-flags.md"
STATUSES = {"accepted", "no-op", "renamed", "refused"}


def _rows() -> list[tuple[str, str, str, str]]:
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) == 4 and cells[0].startswith("`--"):
            rows.append((cells[0].strip("`"), *cells[1:]))
    return rows


def _pretrain_flags() -> set[str]:
    parser = cli.build_parser()
    pretrain = parser._subparsers._group_actions[0].choices["pretrain"]
    return set(pretrain._option_string_actions)


def test_the_table_lists_each_flag_once_with_a_known_status():
    rows = _rows()
    assert len(rows) > 100
    flags = [r[0] for r in rows]
    assert len(flags) == len(set(flags)), sorted(f for f in flags if flags.count(f) > 1)
    assert {r[1] for r in rows} <= STATUSES, {r[1] for r in rows} - STATUSES
    assert all(r[3] for r in rows), [r[0] for r in rows if not r[3]]


def test_accepted_flags_are_pretrain_flags():
    known = _pretrain_flags()
    missing = [
        f for f, status, _, _ in _rows() if status in ("accepted", "no-op") and f not in known
    ]
    assert not missing


def test_refused_flags_are_the_code_table_with_its_reasons():
    known = _pretrain_flags()
    refused = [r for r in _rows() if r[1] in ("refused", "renamed")]
    documented = {f: why for f, _, _, why in refused if f not in known}
    assert set(documented) == set(REFUSED)
    for flag, (why, fix) in REFUSED.items():
        assert documented[flag] == f"{why}. Fix: {fix}", flag
    by_value = [(f, field) for f, _, field, _ in refused if f in known]
    assert by_value, "the table lists the pretrain flags refused by value"
    for _, field in by_value:
        with pytest.raises(ConfigError, match=f"^{field}=True: "):
            load_config(None, {field: True})


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_a_refused_flag_stops_the_command_line_naming_it(flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["pretrain", flag, "--lr", "1e-3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    why, fix = REFUSED[flag]
    assert f"{flag}: refused: {why}. Fix: {fix}" in err


def test_refused_and_unknown_flags_are_reported_together(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(
            ["pretrain", "--tp-comm-overlap", "--use-legacy-models", "--save-intervl", "3"]
        )
    err = capsys.readouterr().err
    assert "--tp-comm-overlap: refused:" in err and "--use-legacy-models: refused:" in err
    assert "--save-intervl: did you mean --save-interval?" in err


def test_the_table_names_a_status_for_every_flag_in_megatron_lm_examples():
    listed = {r[0] for r in _rows()}
    fixtures = Path(__file__).parent / "megatron_lm_examples"
    used = set()
    for path in fixtures.glob("*.args"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("--"):
                used.add(line.split()[0])
    assert not used - listed, sorted(used - listed)


def test_no_mmap_bin_files_reads_the_same_samples_through_file_reads(demo_prefix, tmp_path):
    from megatron.core.datasets.indexed_dataset import _FileBinReader, _MMapBinReader

    from megatron_gamma.data.datasets import build_datasets
    from megatron_gamma.data.tokenizer_types import load_tokenizer

    built = {}
    for mmap in (True, False):
        cfg = load_config(
            None,
            {
                "data_path": [demo_prefix],
                "mmap_bin_files": mmap,
                "run_dir": str(tmp_path / f"run{mmap}"),
                "seq_length": 64,
                "train_iters": 2,
                "split": "95,5,0",
            },
        )
        train, _, _ = build_datasets(cfg, load_tokenizer(cfg.data, cfg.logging.run_dir))
        reader = train.dataset.bin_reader
        assert isinstance(reader, _MMapBinReader if mmap else _FileBinReader)
        built[mmap] = [train[i]["tokens"] for i in range(len(train))]
    assert len(built[True]) == len(built[False]) >= 16
    assert all((a == b).all() for a, b in zip(built[True], built[False], strict=True))


def test_manual_gc_disables_collection_and_collects_on_its_schedule(monkeypatch):
    import gc

    from megatron_gamma.training.callback import StepOutput
    from megatron_gamma.training.loop import run_callbacks
    from megatron_gamma.training.manual_gc import ManualGCCallback
    from megatron_gamma.training.preemption import PreemptionGuard

    cfg = load_config(None, {"manual_gc": True, "manual_gc_interval": 3})
    (callback,) = [
        c
        for c in run_callbacks(cfg, PreemptionGuard(None, False))
        if isinstance(c, ManualGCCallback)
    ]
    collected = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append("x") or 0)
    try:
        callback.on_train_start(None)
        assert not gc.isenabled() and len(collected) == 1
        for it in range(1, 8):
            callback.on_step_end(None, StepOutput(it, 1.0, 1.0, 1e-3, 0.1))
        assert len(collected) == 1 + 2  # iterations 3 and 6
        callback.on_eval(None, 7, 1.0)
        assert len(collected) == 4
    finally:
        callback.on_train_end(None)
    assert gc.isenabled()


def test_grad_reduce_in_bf16_reduces_bf16_gradients_in_bf16():
    from megatron_gamma.training.precision import grad_reduce_in_fp32

    assert grad_reduce_in_fp32(load_config(None, {"bf16": True}))
    assert not grad_reduce_in_fp32(load_config(None, {"bf16": True, "grad_reduce_in_bf16": True}))


def test_ckpt_format_other_than_torch_dist_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"ckpt_format='torch'.*torch_dist"):
        load_config(None, {"ckpt_format": "torch"})
    assert load_config(None, {"ckpt_format": "torch_dist"}).checkpoint.ckpt_format == "torch_dist"


def test_vocab_and_merge_files_alone_mean_the_gpt2_tokenizer(tmp_path):
    """Megatron-LM's GPT-3 examples pass --vocab-file/--merge-file without --tokenizer-type."""
    files = {"vocab_file": str(tmp_path / "v.json"), "merge_file": str(tmp_path / "m.txt")}
    assert load_config(None, files).data.tokenizer_type == "GPT2BPETokenizer"
    assert load_config(None, {}).data.tokenizer_type == "HuggingFaceTokenizer"
    with pytest.raises(ConfigError, match="vocab_file=.*--tokenizer-type GPT2BPETokenizer"):
        load_config(None, {**files, "tokenizer_type": "HuggingFaceTokenizer"})


@pytest.mark.parametrize("kind", sorted(REFUSED_TOKENIZER_TYPES))
def test_megatron_lm_tokenizer_types_we_do_not_build_are_refused_by_value_with_the_fix(kind):
    """Megatron-LM's other --tokenizer-type values pass the parser and stop at validation with
    why and the fix (not argparse's bare 'invalid choice'); the help lists only ours."""
    why, fix = REFUSED_TOKENIZER_TYPES[kind]
    args = cli.parse_args(["pretrain", "--tokenizer-type", kind])
    with pytest.raises(ConfigError) as e:
        load_config(None, {"tokenizer_type": args.tokenizer_type})
    built = "(built: HuggingFaceTokenizer, GPT2BPETokenizer)"
    assert str(e.value) == f"tokenizer_type={kind!r}: {why}. Fix: {fix} {built}"
    pretrain = cli.build_parser()._subparsers._group_actions[0].choices["pretrain"]
    assert kind not in pretrain.format_help()


@pytest.mark.parametrize("kind", ["Llama2Tokenizer", "NullTokenizer"])
def test_preprocess_refuses_the_same_tokenizer_types_before_writing(kind, tmp_path, capsys):
    corpus = Path(cli.__file__).parent / "data" / "demo" / "en.jsonl"
    out = tmp_path / "out" / "x"
    args = ["preprocess", "--input", str(corpus), "--output-prefix", str(out)]
    assert cli.main([*args, "--tokenizer-type", kind]) == 2
    why, fix = REFUSED_TOKENIZER_TYPES[kind]
    assert f"tokenizer_type={kind!r}: {why}. Fix: {fix}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_unknown_tokenizer_type_names_only_the_types_built(capsys):
    assert cli.main(["pretrain", "--tokenizer-type", "MyTokenizer"]) == 2
    err = capsys.readouterr().err
    assert "tokenizer_type='MyTokenizer': unknown. Fix: use one of 'HuggingFaceTokenizer'" in err
    assert not any(kind in err for kind in REFUSED_TOKENIZER_TYPES)


def test_the_help_shows_docstrings_without_sphinx_markup():
    """Field docstrings feed --help; their :mod:`x` roles and ``code`` quotes are dropped there
    (the tokenizer-type field's docstring has both)."""
    pretrain = cli.build_parser()._subparsers._group_actions[0].choices["pretrain"]
    text = pretrain.format_help()
    assert "see megatron_gamma.data.tokenizer_types." in " ".join(text.split())
    assert not re.search(r":[a-z]+:`|``", text)
