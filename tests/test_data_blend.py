"""Blends for pretraining: Megatron's ``--data-path W1 P1 W2 P2`` and the per-split
``--train-data-path/--valid-data-path/--test-data-path`` (megatron-core ``blend_per_split``),
over per-language outputs of ``preprocess``."""

import numpy as np
import pytest
import torch.distributed as dist
from helpers import DEMO_INPUTS, DEMO_TOKENIZER, TINY_MODEL, read_metrics, run_cli

from megatron_gamma.cli import build_parser
from megatron_gamma.config import ConfigError, DataConfig, load_config, overrides_from_args
from megatron_gamma.data.datasets import build_datasets
from megatron_gamma.data.encode import EncodeOptions
from megatron_gamma.data.preprocess import preprocess
from megatron_gamma.data.tokenizer import BilingualTokenizer


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
