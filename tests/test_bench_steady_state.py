"""The preprocessing benchmark's steady state (``tools/bench_preprocess.py --head-records N``):
each compared path also runs on the corpus's first N records, and its run on the whole corpus
less that run is what a long run pays per token (start-up cancels). Checked against the
differences and ratios computed here by hand, scipy's geometric mean, and the bytes of the file
the head is cut from."""

import gzip
import json

import pytest
from helpers import load_tool
from scipy import stats


@pytest.fixture(scope="module")
def bench():
    return load_tool("bench_preprocess")


def run(tokens: int, cpu: float, user: float) -> dict:
    return {"tokens": tokens, "cpu": cpu, "user": user, "system": cpu - user}


def test_beyond_head_is_the_whole_runs_tokens_and_clocks_less_the_heads(bench):
    full = [run(1000, 2.0, 1.5), run(1000, 2.5, 1.75)]
    head = [run(40, 0.5, 0.25), run(40, 0.75, 0.5)]
    assert bench.beyond_head(full, head) == [
        {"tokens": 960, "cpu": 1.5, "user": 1.25, "system": 0.25},
        {"tokens": 960, "cpu": 1.75, "user": 1.25, "system": 0.5},
    ]


def test_a_round_whose_head_took_the_whole_runs_cpu_measures_no_steady_state(bench):
    assert bench.beyond_head([run(1000, 2.0, 1.5)], [run(40, 2.0, 1.5)]) is None
    assert bench.beyond_head([run(1000, 2.0, 1.5)], [run(1000, 0.5, 0.2)]) is None


LINES = [b'{"text": "a"}\n', b"\n", b'{"text": "b \\u4e2d"}\n', b"  \n", b'{"text": "c"}\n']


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_the_head_file_holds_the_first_records_bytes_as_they_are(bench, tmp_path, suffix):
    path = tmp_path / f"all{suffix}"
    opener = gzip.open if suffix.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.writelines(LINES)
    head = bench.head_file(str(path), str(tmp_path / "head"), 2)
    assert head == str(tmp_path / "head" / f"head-2{suffix}")
    with opener(head, "rb") as f:
        assert f.read() == LINES[0] + LINES[2]
    assert bench.head_file(str(path), str(tmp_path / "h3"), 3) is None  # only 3 records
    assert not (tmp_path / "h3").exists()


def test_no_head_is_cut_from_a_file_that_is_not_json_lines(bench, tmp_path):
    path = tmp_path / "all.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd")
    assert bench.head_file(str(path), str(tmp_path / "head"), 2) is None


OURS = [(1.10, 0.95, 0.12), (1.00, 0.88, 0.10), (1.20, 1.02, 0.13), (1.05, 0.90, 0.11)]
REAL = [(1.08, 0.80, 0.05), (1.06, 0.79, 0.06), (1.12, 0.84, 0.05), (1.04, 0.78, 0.06)]
# (whole-file CPU-s, whole-file user CPU-s, head CPU-s) per round
TOKENS, HEAD_TOKENS = 11_770_299, 52_000


def logged_run(
    bench, tmp_path, monkeypatch, same=lambda a, b: True, tokens=TOKENS, head_tokens=HEAD_TOKENS
) -> list[dict]:
    """``bench_corpus``'s log of a 4-round run with a head, whose children report the CPU times
    above (the re-creation's those of the real script) and ``tokens`` (``head_tokens`` for the
    head); ``same`` stands in for the byte comparison of two outputs (prefixes)."""
    calls: dict = {}

    def fake_child(mode, files, tokenizer, prefix, workers):
        is_head = files == [str(tmp_path / "head.jsonl.gz")]
        assert prefix.endswith("-head") == is_head
        i = calls.get((mode, is_head), 0)
        calls[(mode, is_head)] = i + 1
        cpu, user, head_cpu = (OURS if mode == "ours-gigatoken" else REAL)[i]
        if is_head:
            cpu, user = head_cpu, head_cpu * 0.8
        return {
            "tokens": head_tokens if is_head else tokens, "cpu": cpu, "user": user,
            "system": cpu - user, "process_cpu": cpu + 5, "wall": cpu, "rss_main_mib": 400.0,
            "rss_worker_mib": None, "prefix": prefix,
        }  # fmt: skip

    monkeypatch.setattr(bench, "_run_child", fake_child)
    monkeypatch.setattr(bench, "_same_bytes", same)
    monkeypatch.setitem(bench.REFERENCE, "dir", str(tmp_path))
    monkeypatch.setitem(bench.REFERENCE, "commit", "d98e8a64dd")
    corpus = tmp_path / "all.jsonl.gz"
    corpus.write_bytes(b"x")
    log: list = []
    head = (str(tmp_path / "head.jsonl.gz"), 64)
    bench.bench_corpus(
        "debian", [str(corpus)], "tok.json", [1], 4, str(tmp_path), ("ours-gigatoken",), log, head
    )
    assert calls == {(m, h): 4 for m in ("mlm-fast", "mlm-real", "ours-gigatoken") for h in (0, 1)}
    return log


def test_a_run_with_a_head_logs_the_steady_state_beside_the_whole_file(
    bench, tmp_path, monkeypatch, capsys
):
    log = logged_run(bench, tmp_path, monkeypatch)
    steady = bench.steady_measure(64)
    assert [(r["path"], r["measure"]) for r in log] == [
        ("mlm-fast", bench.IMPORTS_EXCLUDED),
        ("mlm-fast", steady),
        ("ours-gigatoken", bench.IMPORTS_EXCLUDED),
        ("ours-gigatoken", steady),
    ]
    whole = stats.gmean([r[0] / o[0] for o, r in zip(OURS, REAL, strict=True)])
    per_round = [(r[0] - r[2]) / (o[0] - o[2]) for o, r in zip(OURS, REAL, strict=True)]
    beyond = stats.gmean(per_round)
    assert log[2]["ratio"] == pytest.approx(whole, rel=1e-12)
    assert log[3]["ratio"] == pytest.approx(beyond, rel=1e-12)
    assert beyond > 1.0 > whole  # the two measures say different things on these figures
    assert (log[3]["head_records"], log[3]["head_tokens"], log[3]["tokens"]) == (
        64,
        HEAD_TOKENS,
        TOKENS,
    )
    assert log[1]["ratio"] == pytest.approx(1.0, rel=1e-12)  # the re-creation timed as the real
    out = capsys.readouterr().out
    assert "start-up: each path's run on the corpus's first 64 records (52,000 tokens)" in out
    iv = bench.rounds_ratio(per_round)
    assert f"ours-gigatoken workers=1 vs mlm-real, steady state, tokens per CPU-second: " \
           f"{bench.ratio_text(iv)}; >= 1.0x: {bench.against(iv, 1.0)}" in out  # fmt: skip


def test_the_summary_pools_the_steady_state_apart_from_the_whole_file(bench, tmp_path, monkeypatch):
    log = logged_run(bench, tmp_path, monkeypatch)
    heads = [line for line in bench.summarize_runs(log) if not line.startswith(" ")]
    reference = "x mlm-real (Megatron-LM d98e8a64dd)"
    assert heads == [
        f"debian ({TOKENS:,} tokens), mlm-fast, workers=1, {reference}, CPU per token "
        "(imports excluded):",
        f"debian ({TOKENS:,} tokens), mlm-fast, workers=1, {reference}, CPU per token beyond "
        "start-up (less the run on the first 64 records, 52,000 tokens) (imports excluded):",
        f"debian ({TOKENS:,} tokens), ours-gigatoken, workers=1, {reference}, tokens per "
        "CPU-second (imports excluded):",
        f"debian ({TOKENS:,} tokens), ours-gigatoken, workers=1, {reference}, tokens per "
        "CPU-second beyond start-up (less the run on the first 64 records, 52,000 tokens) "
        "(imports excluded):",
    ]
    path = tmp_path / "runs.jsonl"
    bench.append_runs(str(path), log)
    assert bench.read_runs_log(str(path)) == [json.loads(json.dumps(r)) for r in log]


def test_outputs_that_differ_on_the_head_alone_are_logged_as_differing(
    bench, tmp_path, monkeypatch
):
    log = logged_run(bench, tmp_path, monkeypatch, same=lambda a, b: not a.endswith("-head"))
    assert [r["identical"] for r in log if r["path"] == "ours-gigatoken"] == [False, False]


def test_too_few_tokens_beyond_the_head_withhold_the_steady_states_calls_alone(
    bench, tmp_path, monkeypatch, capsys
):
    log = logged_run(bench, tmp_path, monkeypatch, tokens=1_200_000, head_tokens=400_000)
    held = "800,000 tokens beyond the head are too few (start-up dominates)"
    assert [r["withheld"] for r in log] == [None, held, None, held]
    out = capsys.readouterr().out
    assert f"steady-state targets not called: {held}" in out
    assert ">= 1.0x: not called, >= 1.3x: not called" in out.split("steady state, tokens")[1]
    lines = bench.summarize_runs(log)
    assert sum("1 of 1 runs left out: targets withheld" in line for line in lines) == 2


def test_a_negative_head_is_refused(bench, capsys, tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--head-records", "-1", "--corpus", str(tmp_path)])
    assert "--head-records -1" in capsys.readouterr().err
