"""Blends for pretraining: Megatron's ``--data-path W1 P1 W2 P2`` and the per-split
``--train-data-path/--valid-data-path/--test-data-path`` (megatron-core ``blend_per_split``),
over per-language outputs of ``preprocess``."""

import os
import shlex

import numpy as np
import pytest
import torch.distributed as dist
from helpers import DEMO_INPUTS, DEMO_TOKENIZER, TINY_MODEL, read_metrics, run_cli
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from megatron_gamma.cli import build_parser
from megatron_gamma.config import ConfigError, DataConfig, load_config, overrides_from_args
from megatron_gamma.data.datasets import build_datasets
from megatron_gamma.data.encode import EncodeOptions
from megatron_gamma.data.preprocess import preprocess
from megatron_gamma.data.tokenizer import BilingualTokenizer
from megatron_gamma.training.loop import preflight


@pytest.fixture
def process_group(tmp_path):
    """A one-process gloo group: megatron-core's BlendedDataset asks for the rank."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def lang_prefixes(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("lang") / "demo"
    r = preprocess(DEMO_INPUTS, DEMO_TOKENIZER, str(out), progress=False,
                   options=EncodeOptions(per_language=True, lang_key="lang"))  # fmt: skip
    return {name.split("_")[0]: prefix for name, prefix in r.prefixes.items()}


def test_per_split_flags_build_one_blend_per_split(tmp_path, lang_prefixes, process_group):
    zh, en = lang_prefixes["zh"], lang_prefixes["en"]
    argv = ["pretrain", "--train-data-path", "0.3", zh, "0.7", en, "--valid-data-path", en,
            "--seq-length", "64", "--global-batch-size", "8", "--micro-batch-size", "4",
            "--train-iters", "25", "--eval-iters", "2", "--run-dir", str(tmp_path)]  # fmt: skip
    cfg = load_config(None, overrides_from_args(build_parser().parse_args(argv)))
    assert cfg.data.blend_per_split() == [([zh, en], [0.3, 0.7]), ([en], None), None]
    assert cfg.data.blend() == ([zh, en], [0.3, 0.7])  # what the pre-flight check validates
    train, valid, test = build_datasets(cfg, BilingualTokenizer(DEMO_TOKENIZER))
    assert test is None
    assert len(train) == 200 and len(valid) >= 16  # a single dataset: one epoch at least
    assert [d.dataset.path_prefix for d in train.datasets] == [zh, en]
    share = np.bincount(train.dataset_index, minlength=2) / len(train)
    np.testing.assert_allclose(share, [0.3, 0.7], atol=1.0 / len(train))
    assert valid.dataset.path_prefix == en
    # each split reads whole datasets: all 52 documents of a language, no train/valid split
    assert [len(d.indices) for d in (*train.datasets, valid)] == [52, 52, 52]


def test_data_path_blend_still_uses_the_split(tmp_path, lang_prefixes, process_group):
    zh, en = lang_prefixes["zh"], lang_prefixes["en"]
    cfg = load_config(None, {"data_path": ["1", zh, "3", en], "split": "90,10,0",
                             "seq_length": 64, "run_dir": str(tmp_path)})  # fmt: skip
    assert cfg.data.blend_per_split() is None
    train, valid, test = build_datasets(cfg, BilingualTokenizer(DEMO_TOKENIZER))
    assert test is None and len(valid) > 0
    share = np.bincount(train.dataset_index, minlength=2) / len(train)
    np.testing.assert_allclose(share, [0.25, 0.75], atol=1.0 / len(train))


def test_per_split_config_errors(lang_prefixes):
    zh, en = lang_prefixes["zh"], lang_prefixes["en"]
    with pytest.raises(ConfigError, match="train_data_path=.*exclude each other"):
        DataConfig(data_path=[zh], train_data_path=[en])
    with pytest.raises(ConfigError, match="train_data_path=\\[\\]: per-split paths need"):
        DataConfig(valid_data_path=[en])
    with pytest.raises(ConfigError, match="valid_data_path=.*must alternate"):
        DataConfig(train_data_path=[zh], valid_data_path=["0.5", zh, "0.5"]).blend_per_split()
    with pytest.raises(ConfigError, match="test_data_path='nope': nope.bin does not exist"):
        DataConfig(train_data_path=[zh], test_data_path=["nope"]).blend_per_split()
    with pytest.raises(ConfigError, match="data_path=.*weights must be >= 0"):
        DataConfig(data_path=["-1", zh, "2", en]).blend()


def test_a_preprocess_output_prefix_as_data_path_suggests_its_datasets(tmp_path, lang_prefixes):
    """--data-path PREFIX where preprocess wrote PREFIX_text_document.bin/.idx (or one dataset
    per language): the error names them; a path with .bin gets its extension dropped."""
    single = preprocess(DEMO_INPUTS[1:], DEMO_TOKENIZER, str(tmp_path / "deb"), progress=False)
    out = str(tmp_path / "deb")
    with pytest.raises(ConfigError) as e:
        DataConfig(data_path=[out]).blend()
    assert str(e.value) == (
        f"data_path={out!r}: {out}.bin does not exist. Fix: --data-path {out}_text_document, what "
        f"`megatron-gamma preprocess --output-prefix {out}` wrote"
    )
    assert DataConfig(data_path=[single.prefix]).blend() == ([single.prefix], None)  # the fix
    with pytest.raises(ConfigError, match=rf"Fix: drop the extension: --data-path {out}_\w+$"):
        DataConfig(data_path=[single.prefix + ".bin"]).blend()
    base = lang_prefixes["en"].removesuffix("_en_text_document")
    with pytest.raises(ConfigError) as e:
        DataConfig(train_data_path=[lang_prefixes["zh"]], valid_data_path=[base]).blend_per_split()
    assert str(e.value).endswith(
        f"Fix: one of {lang_prefixes['en']}, {lang_prefixes['zh']}, what `megatron-gamma "
        f"preprocess --output-prefix {base}` wrote; or their blend, the data_path in "
        f"{base}.stats.json"
    )


def test_a_missing_prefix_names_the_datasets_of_its_folder_quoted(tmp_path):
    """Trial 15: preprocess with --json-keys content writes PREFIX_content_document, and a
    --data-path of PREFIX_text_document (the README's name) said only that its .bin does not
    exist. The fix now names the folder's datasets, each as a shell word (a path with a space
    quoted, so the fix can be pasted), and how preprocess names them."""
    folder = tmp_path / "my data"
    folder.mkdir()
    made = preprocess(DEMO_INPUTS[1:], DEMO_TOKENIZER, str(folder / "mixed"), progress=False).prefix
    content = str(folder / "mixed_content_document")
    for ext in (".bin", ".idx"):
        os.rename(made + ext, content + ext)
    wrong = str(folder / "mixed_text_document")
    with pytest.raises(ConfigError) as e:
        DataConfig(data_path=[wrong]).blend()
    assert str(e.value) == (
        f"data_path={wrong!r}: {wrong}.bin does not exist. Fix: --data-path one of the datasets "
        f"in {folder}: {shlex.quote(content)} (preprocess names them PREFIX_KEY_document after "
        "its --json-keys, e.g. _text_document or _content_document)"
    )
    assert shlex.split(shlex.quote(content)) == [content]
    with pytest.raises(ConfigError) as e:
        DataConfig(data_path=[content + ".bin"]).blend()
    assert str(e.value).endswith(f"Fix: drop the extension: --data-path {shlex.quote(content)}")


# documents short then long: the split with the fewest tokens is not the one with the fewest
# documents
LENGTHS = [2, 3, 2, 4, 3, 2, 3, 1, 15, 30]


def _tiny_dataset(prefix: str, lengths: list[int]) -> str:
    """An indexed dataset of one document per length, written by megatron-core's builder."""
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for i, n in enumerate(lengths):
        builder.add_document(np.full(n, i + 1, dtype=np.int32), [n])
    builder.finalize(prefix + ".idx")
    return prefix


def _split_tokens(prefix: str, datasets) -> dict[str, int]:
    """Tokens per split, summed over the documents megatron-core's GPTDatasets put in it."""
    dataset = IndexedDataset(prefix)  # kept: collecting it unmaps sequence_lengths
    return {
        name: int(dataset.sequence_lengths[d.indices].sum())
        for name, d in zip(("train", "valid", "test"), datasets, strict=True)
        if d is not None
    }


@pytest.mark.parametrize(
    ("lengths", "split", "short", "eval_iters"),
    [
        (LENGTHS, "80,20,0", "train", 1),
        (LENGTHS, "80,10,10", "valid", 1),
        (LENGTHS, "80,10,10", "valid", 0),
        (LENGTHS[::-1], "80,10,10", "test", 1),
    ],
)
def test_split_shorter_than_one_sample_is_refused_where_it_is_read(
    tmp_path, process_group, lengths, split, short, eval_iters
):
    """Train always, valid when the run evaluates (--eval-iters > 0); the test split is built
    but never read, so a short one is no reason to refuse the run."""
    prefix = _tiny_dataset(str(tmp_path / "tiny"), lengths)
    run_dir = str(tmp_path / "run")
    flags = {"data_path": [prefix], "split": split, "run_dir": run_dir, "train_iters": 1,
             "global_batch_size": 1, "micro_batch_size": 1, "eval_iters": eval_iters}  # fmt: skip
    built = build_datasets(
        load_config(None, {**flags, "seq_length": 1, "data_cache_path": str(tmp_path / "cache")}),
        BilingualTokenizer(DEMO_TOKENIZER),
    )
    tokens = _split_tokens(prefix, built)
    assert min(tokens, key=tokens.get) == short  # the parametrization's premise
    n = tokens[short]
    preflight(load_config(None, {**flags, "seq_length": n - 1}))  # one sample fits exactly
    if short == "test" or eval_iters == 0:
        preflight(load_config(None, {**flags, "seq_length": n}))
        return
    with pytest.raises(ConfigError) as e:
        preflight(load_config(None, {**flags, "seq_length": n}))
    assert str(e.value).startswith(
        f"seq_length={n}: the {short} split (--split {split} of {prefix}) holds {n} tokens, but "
        f"one sample needs seq_length + 1 = {n + 1}. Fix: a --seq-length below {n}, or more data"
    )
    assert not os.path.exists(run_dir)  # refused before anything was written


def test_per_split_path_shorter_than_one_sample_is_refused(tmp_path):
    train = _tiny_dataset(str(tmp_path / "train"), LENGTHS)
    valid = _tiny_dataset(str(tmp_path / "valid"), LENGTHS[:3])
    dataset = IndexedDataset(valid)
    n = int(dataset.sequence_lengths.sum())
    assert n == 7
    flags = {"train_data_path": [train], "valid_data_path": [valid], "run_dir": str(tmp_path)}
    preflight(load_config(None, {**flags, "seq_length": n - 1}))
    with pytest.raises(ConfigError) as e:
        preflight(load_config(None, {**flags, "seq_length": n}))
    assert str(e.value) == (
        f"seq_length={n}: the valid split (--valid-data-path {valid}) holds {n} tokens, but one "
        f"sample needs seq_length + 1 = {n + 1}. Fix: a --seq-length below {n}, or a larger "
        "dataset in --valid-data-path"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pretrain_runs_on_per_split_blends(tmp_path, lang_prefixes):
    zh, en = lang_prefixes["zh"], lang_prefixes["en"]
    flags = [f for f in TINY_MODEL if f not in ("--split", "95,5,0")]
    proc = run_cli(["pretrain", "--train-data-path", "0.5", zh, "0.5", en, "--valid-data-path", en,
                    "--run-dir", str(tmp_path), *flags, "--train-iters", "4",
                    "--eval-interval", "2"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = read_metrics(tmp_path)
    assert sorted(metrics["train"]) == [1, 2, 3, 4] and sorted(metrics["valid"]) == [2, 4]
