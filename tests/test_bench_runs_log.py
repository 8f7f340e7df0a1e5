"""The preprocessing benchmark's runs log (``tools/bench_preprocess.py --runs-log`` and
``--summarize``): what a run records, checked against the per-round ratios it was given; the
pooled intervals, checked against scipy's Student-t interval of the logarithms with runs (within a
host) and hosts (across hosts) as the unit; and the refusal of a file that is not a runs log."""

import json
import math
import platform

import numpy as np
import pytest
from helpers import load_tool
from scipy import stats


@pytest.fixture(scope="module")
def bench():
    return load_tool("bench_preprocess")


def record(**fields) -> dict:
    base = {
        "time": "2026-12-04T09:01:00Z",
        "source": "test",
        "host": "host A",
        "corpus": "debian",
        "tokens": 11_770_299,
        "path": "ours-gigatoken",
        "workers": 1,
        "against": "mlm-real",
        "rounds": 12,
        "ratio": 1.0,
    }
    return base | fields


def scipy_ratio_interval(ratios: list[float]) -> tuple[float, float, float]:
    logs = np.log(ratios)
    low, high = stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
    return float(stats.gmean(ratios)), math.exp(low), math.exp(high)


def interval_text(bench, low: float, high: float) -> str:
    """``[low, high]`` as the summary prints an interval (two decimals unless that would round a
    bound onto a target: ``_bound``, tested in test_bench_ratios.py)."""
    return f"[{bench._bound(low)}, {bench._bound(high)}]"


def test_a_hosts_runs_are_its_observations_and_hosts_are_the_unit_across_hosts(bench):
    a, b = [1.23, 1.08, 0.99, 1.09, 1.16], [1.01, 0.96, 0.92, 0.84]
    versions = {"gigatoken": "0.10.0", "python": "3.11.7"}
    records = [record(ratio=r, user_ratio=0.8, versions=versions, code="c1") for r in a]
    records += [record(ratio=r, host="host B", time="2026-12-03T21:10:00Z") for r in b]
    lines = bench.summarize_runs(records)
    mean_a, low_a, high_a = scipy_ratio_interval(a)
    mean_b, low_b, high_b = scipy_ratio_interval(b)
    assert low_a > 1.0 and low_b < 1.0 < high_b  # the calls below are the ones these imply
    assert (
        f"  host A: {mean_a:.2f}x {interval_text(bench, low_a, high_a)} "
        "(df 4, 5 runs); >= 1.0x: met, "
        ">= 1.3x: not met" in lines
    )
    assert (
        f"  host B: {mean_b:.2f}x {interval_text(bench, low_b, high_b)} (df 3, 4 runs); >= 1.0x: "
        "inconclusive, >= 1.3x: not met" in lines
    )
    span = "2026-12-04T09:01:00Z to 2026-12-04T09:01:00Z"
    assert f"    60 rounds, {span}; code: c1; packages: gigatoken 0.10.0, python 3.11.7" in lines
    span = "2026-12-03T21:10:00Z to 2026-12-03T21:10:00Z"
    assert f"    48 rounds, {span}; code: not recorded; packages: not recorded" in lines
    assert any(
        line.startswith("    user time alone (no target; the 5 of 5 runs that recorded it): 0.80x")
        for line in lines
    )
    mean, low, high = scipy_ratio_interval([mean_a, mean_b])
    assert (
        "  across hosts (each host's mean one observation; a host is one boot, so a machine "
        f"rebooted counts twice): {mean:.2f}x {interval_text(bench, low, high)} "
        "(df 1, 2 hosts); >= 1.0x: "
        "inconclusive, >= 1.3x: inconclusive" in lines
    )


def test_runs_hours_apart_on_one_host_are_windows_and_the_windows_are_its_unit(bench):
    early = {
        "2026-12-04T19:41:00Z": 0.93,
        "2026-12-04T20:00:00Z": 0.96,
        "2026-12-04T20:40:59Z": 0.99,
    }
    late = {
        "2026-12-04T22:01:00Z": 1.20,
        "2026-12-04T22:06:00Z": 1.14,
        "2026-12-04T22:38:00Z": 1.12,
    }
    other = [1.01, 1.05, 1.09]
    records = [record(time=t, ratio=r) for t, r in (late | early).items()]  # not in time order
    records += [record(host="host B", ratio=r) for r in other]
    lines = bench.summarize_runs(records)

    every = [*early.values(), *late.values()]
    mean, low, high = scipy_ratio_interval(every)
    assert (
        f"  host A: {mean:.2f}x {interval_text(bench, low, high)} "
        "(df 5, 6 runs) with the runs taken as "
        "independent, but they fall in 2 windows, so the windows are the unit of the calls" in lines
    )
    by_window = [scipy_ratio_interval(list(w.values())) for w in (early, late)]
    mean, low, high = scipy_ratio_interval([m for m, _, _ in by_window])
    assert low < 1.0 < high  # the runs alone (above) would have called >= 1.0x met
    assert (
        "    over windows (each window's mean one observation; a window is runs started under 1 h "
        f"apart): {mean:.2f}x {interval_text(bench, low, high)} "
        "(df 1, 2 windows); >= 1.0x: inconclusive, "
        ">= 1.3x: inconclusive" in lines
    )
    (m1, l1, h1), (m2, l2, h2) = by_window
    assert (
        f"    windows: 2026-12-04T19:41:00Z to 2026-12-04T20:40:59Z {m1:.2f}x [{l1:.2f}, {h1:.2f}] "
        f"(df 2, 3 runs); 2026-12-04T22:01:00Z to 2026-12-04T22:38:00Z {m2:.2f}x [{l2:.2f}, "
        f"{h2:.2f}] (df 2, 3 runs)" in lines
    )
    across, lo, hi = scipy_ratio_interval([mean, scipy_ratio_interval(other)[0]])
    assert any(f"{across:.2f}x [{lo:.2f}, {hi:.2f}] (df 1, 2 hosts)" in line for line in lines)
    assert any(line.startswith("  host B: ") and "windows" not in line for line in lines)


def test_a_window_is_cut_at_a_gap_of_an_hour_or_more_between_starts(bench):
    times = ["2026-12-04T10:00:00Z", "2026-12-04T10:59:59Z", "2026-12-04T11:59:59Z",
             "2026-12-04T13:00:00+01:00", "2026-12-04T13:00:00Z"]  # fmt: skip
    cut = bench.windows([record(time=t, ratio=i + 1) for i, t in enumerate(times)])
    assert [[r["ratio"] for r in w] for w in cut] == [[1, 2], [3, 4], [5]]  # +01:00 is 12:00Z
    with pytest.raises(ValueError, match="time 'noon': not an ISO 8601 UTC time. Fix: e.g."):
        bench.windows([record(time="noon")])


def test_the_recreation_is_pooled_as_cpu_per_token_against_the_10_percent_band(bench):
    cpu_per_token = [0.94, 0.93, 0.94, 0.97, 0.98, 1.03, 0.98]
    records = [record(path="mlm-fast", ratio=1 / c) for c in cpu_per_token]
    lines = bench.summarize_runs(records)
    mean, low, high = scipy_ratio_interval(cpu_per_token)
    assert 0.9 <= low and high <= 1.1
    assert lines[0].endswith("mlm-fast, workers=1, x mlm-real, CPU per token (imports excluded):")
    assert lines[1] == (
        f"  host A: {mean:.2f}x {interval_text(bench, low, high)} (df 6, 7 runs); within 10 % "
        "(0.90-1.10x): met"
    )
    assert lines[-1] == "  across hosts: one host measured; nothing is said beyond it"


def test_corpora_paths_and_worker_counts_are_never_pooled_together(bench):
    records = [record(ratio=1.1), record(ratio=1.2, workers=2), record(ratio=2.0, tokens=47)]
    heads = [line for line in bench.summarize_runs(records) if not line.startswith(" ")]
    assert heads == [
        "debian (11,770,299 tokens), ours-gigatoken, workers=1, x mlm-real, tokens per "
        "CPU-second (imports excluded):",
        "debian (11,770,299 tokens), ours-gigatoken, workers=2, x mlm-real, tokens per "
        "CPU-second (imports excluded):",
        "debian (47 tokens), ours-gigatoken, workers=1, x mlm-real, tokens per CPU-second "
        "(imports excluded):",
    ]
    small = bench.summarize_runs([record(tokens=47, ratio=r) for r in (2.0, 2.1, 2.2)])
    assert small[1].endswith("; not called: too few tokens (start-up dominates)")


OURS_CPU, REAL_CPU = [0.70, 0.66, 0.74, 0.69], [0.81, 0.76, 0.83, 0.79]
OURS_USER, REAL_USER = [0.62, 0.60, 0.65, 0.61], [0.50, 0.49, 0.52, 0.50]
TOKENS = 11_770_299


def logged_run(bench, tmp_path, monkeypatch, recreation: float) -> list[dict]:
    """``bench_corpus``'s log of a 4-round run whose children report the CPU times above (the
    re-creation's CPU ``recreation`` times the real script's)."""
    calls = {"ours-gigatoken": 0, "mlm-real": 0, "mlm-fast": 0}

    def fake_child(mode, files, tokenizer, prefix, workers):
        i = calls[mode]
        calls[mode] += 1
        cpu, user = {
            "ours-gigatoken": (OURS_CPU[i], OURS_USER[i]),
            "mlm-real": (REAL_CPU[i], REAL_USER[i]),
            "mlm-fast": (REAL_CPU[i] * recreation, REAL_USER[i]),
        }[mode]
        return {
            "tokens": TOKENS, "cpu": cpu, "user": user, "system": cpu - user,
            "process_cpu": cpu + 5, "wall": cpu, "rss_main_mib": 400.0,
            "rss_worker_mib": None, "prefix": prefix,
        }  # fmt: skip

    monkeypatch.setattr(bench, "_run_child", fake_child)
    monkeypatch.setattr(bench, "_same_bytes", lambda a, b: True)
    monkeypatch.setitem(bench.REFERENCE, "dir", str(tmp_path))
    monkeypatch.setitem(bench.REFERENCE, "commit", "d98e8a64dd")
    corpus = tmp_path / "all.jsonl.gz"
    corpus.write_bytes(b"x")
    log: list = []
    bench.bench_corpus(
        "debian", [str(corpus)], "tok.json", [1], 4, str(tmp_path), ("ours-gigatoken",), log
    )
    return log


def test_a_run_records_its_geometric_mean_ratio_of_tokens_per_cpu_second(
    bench, tmp_path, monkeypatch
):
    log = logged_run(bench, tmp_path, monkeypatch, recreation=1.02)
    assert [(r["path"], r["workers"]) for r in log] == [("mlm-fast", 1), ("ours-gigatoken", 1)]
    ours = log[1]
    expected = stats.gmean([r / o for o, r in zip(OURS_CPU, REAL_CPU, strict=True)])
    user = stats.gmean([r / o for o, r in zip(OURS_USER, REAL_USER, strict=True)])
    assert ours["ratio"] == pytest.approx(expected, rel=1e-12)
    assert ours["user_ratio"] == pytest.approx(user, rel=1e-12)
    assert log[0]["ratio"] == pytest.approx(1 / 1.02, rel=1e-12)
    expected_fields = ("mlm-real", 4, TOKENS, "d98e8a64dd")
    assert (ours["against"], ours["rounds"], ours["tokens"], ours["reference"]) == expected_fields
    assert ours["host"] == bench.host_key() and ours["identical"] is True
    assert ours["withheld"] is None
    assert ours["versions"]["python"] == platform.python_version()
    path = tmp_path / "runs.jsonl"
    bench.append_runs(str(path), log)
    bench.append_runs(str(path), log)
    assert bench.read_runs_log(str(path)) == [json.loads(json.dumps(r)) for r in log + log]


def test_a_run_whose_recreation_disagrees_is_logged_as_withheld_and_left_out(
    bench, tmp_path, monkeypatch
):
    log = logged_run(bench, tmp_path, monkeypatch, recreation=1.5)
    assert log[1]["withheld"].startswith("the re-creation and the real script disagree")
    lines = bench.summarize_runs(log)
    assert lines[1].startswith("  ") and "1 of 1 runs left out: targets withheld" in lines[1]
    assert not any("x [" in line for line in lines)


@pytest.mark.parametrize(
    "line, named",
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: a list, not a JSON object"),
        (json.dumps(record(ratio=0)), "line 2: bad or missing ratio"),
        (json.dumps(record(ratio=True)), "line 2: bad or missing ratio"),
        (json.dumps(record(workers=0)), "line 2: bad or missing workers"),
        (json.dumps(record(time="yesterday")), "line 2: bad or missing time"),
        (json.dumps(record(time="2026-12-04T09:01:00")), "line 2: bad or missing time"),  # no zone
        (json.dumps({k: v for k, v in record().items() if k != "host"}), "missing host"),
    ],
)
def test_a_bad_line_is_refused_by_its_number(bench, tmp_path, line, named):
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(record()) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=named):
        bench.read_runs_log(str(path))


def test_runs_log_refuses_a_file_that_is_not_one_before_any_run(bench, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    with pytest.raises(SystemExit) as e:
        bench.main(["--runs-log", str(notes), "--corpus", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "appending to it would mix runs into a file that is not a runs log" in err
    assert "line 1: not JSON" in err
    assert notes.read_text() == "my notes\n"


def test_summarize_refuses_a_missing_or_empty_log(bench, tmp_path, capsys):
    for path, why in [(tmp_path / "none.jsonl", "No such file"), (tmp_path, "Is a directory")]:
        with pytest.raises(SystemExit):
            bench.main(["--summarize", str(path)])
        err = capsys.readouterr().err
        assert why in err and "Fix: the path of a file that --runs-log wrote" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SystemExit):
        bench.main(["--summarize", str(empty)])
    assert "no runs in it. Fix: a file that --runs-log wrote" in capsys.readouterr().err


def fake_checkout(tmp_path) -> str:
    """A folder that passes ``--megatron-lm``'s check (it holds the script's path)."""
    tools = tmp_path / "megatron-lm" / "tools"
    tools.mkdir(parents=True)
    (tools / "preprocess_data_fast.py").write_text("")
    return str(tmp_path / "megatron-lm")


def test_runs_log_refuses_a_path_it_cannot_append_to_before_any_run(bench, tmp_path, capsys):
    checkout = fake_checkout(tmp_path)
    for path, why in [
        (tmp_path / "missing" / "runs.jsonl", "cannot be appended to"),
        (tmp_path, "cannot be read"),
    ]:
        with pytest.raises(SystemExit) as e:
            bench.main(["--runs-log", str(path), "--corpus", str(tmp_path), "--megatron-lm",
                        checkout])  # fmt: skip
        assert e.value.code == 2
        assert f"--runs-log {path}: {why}" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


def test_a_run_refused_for_another_flag_leaves_no_runs_log_behind(bench, tmp_path, capsys):
    log = tmp_path / "new.jsonl"
    with pytest.raises(SystemExit):
        bench.main(["--runs-log", str(log), "--workers", "0", "--corpus", str(tmp_path)])
    assert "--workers 0: each must be >= 1" in capsys.readouterr().err
    assert not log.exists()


def test_runs_whose_bytes_differed_or_that_withheld_their_targets_are_left_out(bench):
    kept = [1.10, 1.12, 1.08]
    records = [record(ratio=r) for r in kept]
    records += [record(ratio=5.0, identical=False), record(ratio=0.2, withheld="disagree")]
    lines = bench.summarize_runs(records)
    mean, low, high = scipy_ratio_interval(kept)
    assert lines[1] == (
        "  host A: 2 of 5 runs left out: bytes differed; targets withheld (disagree)"
    )
    assert lines[2].startswith(
        f"  host A: {mean:.2f}x {interval_text(bench, low, high)} (df 2, 3 runs)"
    )


def test_another_megatron_lm_commit_is_another_group(bench):
    records = [record(ratio=1.1, reference="a" * 40), record(ratio=0.9, reference="b" * 40)]
    heads = [line for line in bench.summarize_runs(records) if not line.startswith(" ")]
    assert [h.split(", x ")[1].split(",")[0] for h in heads] == [
        "mlm-real (Megatron-LM aaaaaaaaaa)",
        "mlm-real (Megatron-LM bbbbbbbbbb)",
    ]


def test_hosts_that_ran_one_code_get_no_code_lines(bench):
    records = [record(ratio=r, code="c1") for r in (1.1, 1.2)]
    records += [record(ratio=r, code="c1", host="host B") for r in (0.9, 1.0)]
    lines = bench.summarize_runs(records)
    assert lines[-1].startswith("  across hosts (each host's mean")


def test_hosts_on_different_code_are_said_to_be_confounded(bench):
    records = [record(ratio=r, code="c1") for r in (1.1, 1.2)]
    records += [record(ratio=r, code="c2", host="host B") for r in (0.9, 1.0)]
    lines = bench.summarize_runs(records)
    assert lines[-2:] == [
        "    the runs did not all run the same code: each host's is listed above",
        "    no code ran on every host, so host and code are confounded in this interval: the "
        "hosts are not compared on the same code",
    ]


def test_hosts_are_also_compared_on_the_code_every_host_ran(bench):
    a1, a2, b1 = [1.10, 1.25, 1.18], [0.80, 0.85], [0.95, 1.05]
    records = [record(ratio=r, code="c1") for r in a1] + [record(ratio=r, code="c2") for r in a2]
    records += [record(ratio=r, code="c1", host="host B") for r in b1]
    records += [record(ratio=0.7, host="host B")]  # code not recorded
    lines = bench.summarize_runs(records)
    mean, low, high = scipy_ratio_interval([stats.gmean(a1), stats.gmean(b1)])
    assert lines[-2:] == [
        "    the runs did not all run the same code (or did not record it): each host's is listed "
        "above",
        f"    on the code every host ran (c1): {mean:.2f}x {interval_text(bench, low, high)} "
        "(df 1, "
        "2 hosts); >= 1.0x: inconclusive, >= 1.3x: inconclusive",
    ]


def test_hosts_that_shared_a_code_are_compared_on_it_when_not_every_host_ran_it(bench):
    a, b2, c1, c2 = [0.90, 0.95], [1.10, 1.20, 1.15], [1.30], [1.00, 1.06]
    records = [record(ratio=r, code="c1") for r in a]
    records += [record(ratio=r, code="c2", host="host B") for r in b2]
    records += [record(ratio=r, code=code, host="host C") for r, code in
                [(c1[0], "c1"), (c2[0], "c2"), (c2[1], "c2")]]  # fmt: skip
    lines = bench.summarize_runs(records)
    on_c1 = scipy_ratio_interval([stats.gmean(a), stats.gmean(c1)])
    on_c2 = scipy_ratio_interval([stats.gmean(b2), stats.gmean(c2)])
    assert lines[-3:] == [
        "    no code ran on every host, so host and code are confounded in this interval: the "
        "hosts are not compared on the same code",
        f"    on the code 2 of the 3 hosts ran (c1): {on_c1[0]:.2f}x [{on_c1[1]:.2f}, "
        f"{on_c1[2]:.2f}] (df 1, 2 hosts); >= 1.0x: inconclusive, >= 1.3x: inconclusive",
        f"    on the code 2 of the 3 hosts ran (c2): {on_c2[0]:.2f}x [{on_c2[1]:.2f}, "
        f"{on_c2[2]:.2f}] (df 1, 2 hosts); >= 1.0x: inconclusive, >= 1.3x: inconclusive",
    ]


def test_a_runs_code_is_read_from_its_commit_where_the_history_holds_it(bench, tmp_path):
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip

    git("init", "-q")
    for folder, name in (("megatron_gamma", "a.py"), ("csrc", "b.cpp")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text(f"{name}\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    commit = git("rev-parse", "HEAD").strip()
    trees = {line.split()[3]: line.split()[2] for line in git("ls-tree", "HEAD").splitlines()}
    codes = bench.commit_codes([commit, "0" * 40], root=str(tmp_path))
    expected = f"megatron_gamma {trees['megatron_gamma'][:10]}, csrc {trees['csrc'][:10]}"
    assert codes == {commit: expected}
