"""``tools/bench_preprocess.py`` refuses a bad invocation with the bad value and the fix before
any path runs (each call here would otherwise start benchmark children)."""

import importlib.util

import pytest
from helpers import load_tool

from megatron_gamma.data.indexed import indexed_dataset


@pytest.fixture(scope="module")
def bench():
    return load_tool("bench_preprocess")


def refused(bench, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_a_worker_count_below_one_is_refused(bench, capsys, tmp_path):
    err = refused(bench, ["--corpus", str(tmp_path), "--workers", "1", "0"], capsys)
    assert "--workers 1 0: each must be >= 1. Fix: e.g. 1 2" in err


def test_a_missing_corpus_is_refused(bench, capsys, tmp_path):
    missing = str(tmp_path / "nope")
    err = refused(bench, ["--corpus", missing], capsys)
    assert f"--corpus {missing!r}: no such file or directory" in err


def test_missing_transformers_is_refused_with_the_extra_to_install(
    bench, capsys, tmp_path, monkeypatch
):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformers" else find_spec(name, *a),
    )
    err = refused(bench, ["--corpus", str(tmp_path)], capsys)
    assert "transformers is not installed" in err and "pip install -e '.[eval]'" in err


@pytest.mark.skipif(
    hasattr(indexed_dataset().IndexedDatasetBuilder, "add_documents"),
    reason="this megatron-core has add_documents (Megatron-LM 889c909922 or later)",
)
def test_a_megatron_core_without_add_documents_needs_a_checkout(bench, capsys, tmp_path):
    err = refused(bench, ["--corpus", str(tmp_path)], capsys)
    assert "has no IndexedDatasetBuilder.add_documents" in err and "--megatron-lm DIR" in err
