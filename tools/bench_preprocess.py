"""Benchmark preprocessing: tokens per CPU-second and wall tokens/s per path and worker count,
ratios from alternated rounds, worker scaling, peak memory, core-hours for 1e12 tokens.

    python tools/bench_preprocess.py --megatron-lm MEGATRON_LM_DIR       # demo + Debian corpus
    python tools/bench_preprocess.py --megatron-lm MEGATRON_LM_DIR --corpus DIR --rounds 10

It needs ``transformers`` (``pip install -e ".[eval]"``: the re-creation builds its tokenizer
through it, as megatron-core does) and a megatron-core with ``IndexedDatasetBuilder.add_documents``
(Megatron-LM 889c909922 or later: ``--megatron-lm`` gives a checkout's; the released wheel has
none yet). A target is called only on a corpus of at least a million tokens, and only while the
re-creation agrees with the real script (below).

The corpus is read as one file (several are first concatenated into one, gzip if they all
are), as the real script takes one ``--input``. Paths, each run in a fresh process per round
(imports not timed, including those a path makes lazily on first use, which are imported
first; any module still imported inside a clock is printed; the whole process, imports
included, is reported beside), in one order in even rounds and the reverse order in odd rounds,
so that neither a drift in load within a round nor a path's place in it favours one path:

* ``ours-gigatoken`` / ``ours-hf``: ``megatron_gamma.data.preprocess.preprocess`` with
  ``--tokenizer-backend gigatoken`` / ``hf`` (reading, checks, language tags, filters, packing,
  writing, and for gigatoken the start-up check against HF tokenizers), per worker count;
* ``mlm-fast``: Megatron-LM's ``tools/preprocess_data_fast.py`` re-created call for call
  (its tokenizer built through ``transformers`` as megatron-core's ``HuggingFaceTokenizer``
  builds it, ``gigatoken`` ``encode_files`` on all cores, megatron-core's ``IndexedDatasetBuilder``
  ``add_documents(docs, eod_token=eod)`` and ``finalize``), the reference of the table's ratios
  without ``--megatron-lm``;
* ``mlm-real`` (with ``--megatron-lm DIR``): that script itself, from the checkout (its commit is
  printed), imported first and its ``main()`` timed, the reference of every ratio; ``mlm-fast``
  then uses the checkout's megatron-core too, and the two must agree within 10 % CPU per token
  (printed; while they do not, no target is called);
* ``per-doc-hf``: Megatron-LM's ``tools/preprocess_data.py`` loop: ``Pool(workers).imap(encode,
  lines, 32)`` with ``json.loads``, one HF ``Tokenizer.encode`` and one list per document, and
  ``IndexedDatasetBuilder.add_document`` per document in the main process;
* ``gigatoken-raw``: the ceiling, ``gigatoken`` ``encode_batch`` alone on texts already in
  memory, one thread (CPU time of the encode calls only, second pass: warm pretoken cache).
* ``side-by-side`` (per worker count N > 1): N independent 1-worker ``ours-gigatoken`` runs
  whose clocks start together, counted as one run (all tokens, all CPU, the slowest's wall):
  what this machine gives N processes that share no work, so the 1 -> N worker scaling can be
  read against the machine's own ceiling (shared caches, memory bandwidth, hypervisor).

Steady state (``--head-records N``, default 64): the real script, the re-creation and ours also
run, right after each run on the corpus, on a file of its first N records (gzip level 6 for a
``.gz`` corpus, else plain), and per round the corpus's run less the head's run gives tokens per
CPU-second beyond start-up (:func:`beyond_head`): each path's fixed cost (building its
tokenizer; ours' start-up check against HF ``tokenizers`` and its statistics tables) falls in
both and cancels; what remains is what a trillion-token corpus pays per token. It is reported,
logged and pooled beside the whole-file figure, never in place of it.

"Per core" is tokens per CPU-second (user + system time of the process, its threads and its
workers), which depends little on how busy the machine is; wall tokens/s and the 1 -> 2 worker
scaling need an idle machine. Each path's figure is its median over rounds. Each ratio is the
geometric mean of the per-round ratios against ``mlm-real`` (``mlm-fast`` without
``--megatron-lm``); on the lines below the table it comes with its 95 % Student-t
interval, rounds being the unit of replication (df = rounds - 1), and each target is called met
only when the whole interval clears it, not met when the whole interval misses it, and
inconclusive otherwise (:func:`rounds_ratio`, :func:`against`). Such a call speaks for this
machine at this hour: both paths' rates have moved between runs on one host by more than one
run's interval, so a claim for a machine takes several runs, each run's ratio one observation
(docs/preprocess-benchmark.md, "Runs 29-32"). Peak memory is ``ru_maxrss`` of
the main process and the largest ``VmHWM`` of its forked workers (its direct children whose
command line is its own, read from ``/proc`` every 0.1 s while it runs; "—" when it forks none),
not ``RUSAGE_CHILDREN``, which also holds the parent's RSS inherited by the ``git`` that GitPython
runs when megatron-core's import imports ``wandb``. Each child imports megatron-core as its path
does: the ``ours`` paths without ``wandb`` (:func:`~megatron_gamma.data.indexed.indexed_dataset`),
the others with it where it is installed. All paths that write must write identical bytes
(checked).
With a large corpus, ``ours-gigatoken`` also runs over the corpus repeated ``--memory-copies``
times (symlinks) to show that peak memory does not grow with the input; repeated text holds no
new word, so ``--fresh-documents K`` also runs it over K and then 2K generated documents of 250
random 5-12-letter words each (seeded; every word new, the worst case for ``gigatoken``'s
pretoken cache, which :class:`~megatron_gamma.data.token_backend.GigatokenBackend` bounds).
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import importlib.util
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRILLION = 1e12
SIDE_BY_SIDE = "side-by-side"
WRITERS = ("ours-gigatoken", "ours-hf", "mlm-fast", "mlm-real", "per-doc-hf", SIDE_BY_SIDE)
SMALL_CORPUS_TOKENS = 1_000_000
WINDOW_GAP_S = 3600
"""Runs on one host are one window while each starts less than this many seconds after the one
before (:func:`windows`)."""
CPU_CLOCKS = ("cpu", "user", "system")  # each run's, in CPU-seconds (_usage): cpu = user + system
REFERENCES = ("mlm-fast", "mlm-real")
REFERENCE = {"dir": None, "pythonpath": [], "commit": None}
"""The Megatron-LM checkout of ``--megatron-lm`` (set by :func:`main`)."""
PATHS = ("mlm-fast", "gigatoken-raw", "per-doc-hf", "ours-gigatoken", "ours-hf", SIDE_BY_SIDE)
HEAD_PATHS = ("mlm-fast", "mlm-real", "ours-gigatoken", "ours-hf")
"""The paths also run on the head file of ``--head-records``, for the steady state."""
IMPORTS_EXCLUDED = "tokens per CPU-second, imports excluded: path / against"
"""The ``measure`` of a runs-log record of the whole file's runs (also of records without one)."""


def steady_measure(head_records: int) -> str:
    """The ``measure`` of a runs-log record of the steady state (:func:`beyond_head`)."""
    return (
        f"tokens per CPU-second beyond start-up (the whole file's run less its first "
        f"{head_records} records' run), imports excluded: path / against"
    )


def rounds_ratio(ratios: Sequence[float], unit: str = "rounds"):
    """Geometric mean of ratios, each one observation (per round: A/B measured in the same round;
    per run: one run's geometric mean, :func:`summarize_runs`), with the 95 % Student-t interval
    of their logarithms mapped back (df = observations - 1; no interval from one).

    Args:
        ratios: the positive ratios.
        unit: what one ratio is ('rounds', 'runs', 'hosts'), for the printed text.

    Returns:
        :class:`megatron_gamma.study.fits.Interval` of ratios.

    Raises:
        ValueError: no ratios, or one that is not positive.
    """
    from megatron_gamma.study.fits import Interval, t_interval  # scipy: the parent's only

    if not ratios or min(ratios) <= 0:
        raise ValueError(f"ratios {list(ratios)}: need at least one, all > 0")
    logs = t_interval([math.log(r) for r in ratios], unit=unit)
    return Interval(
        math.exp(logs.mean), math.exp(logs.low), math.exp(logs.high), logs.n, logs.df, unit
    )


def _bound(x: float) -> str:
    """``x`` to two decimals, or to as many more (up to four) as it takes not to print a target
    or band edge (:data:`TARGETS`, :data:`RECREATION_BAND`) that ``x`` is not: a lower bound of
    1.0009 prints 1.001, so a call that the third decimal decides is shown deciding it."""
    edges = (*TARGETS, *RECREATION_BAND)
    for places in (2, 3, 4):
        text = f"{x:.{places}f}"
        if not any(text == f"{e:.{places}f}" and x != e for e in edges):
            return text
    return text


def ratio_text(iv) -> str:
    """``1.08x [0.99, 1.18] (df 3, 4 rounds)``, or ``1.08x (1 round: no interval)``; a bound
    that two decimals would round onto a target is printed with more (:func:`_bound`)."""
    if not iv.has_interval:
        return f"{iv.mean:.2f}x ({iv.n} {iv.unit.removesuffix('s')}: no interval)"
    bounds = f"[{_bound(iv.low)}, {_bound(iv.high)}]"
    return f"{iv.mean:.2f}x {bounds} (df {iv.df:.0f}, {iv.n} {iv.unit})"


def against(iv, low: float, high: float = math.inf) -> str:
    """'met' when ``iv``'s whole interval lies in [``low``, ``high``], 'not met' when it lies
    wholly outside, else 'inconclusive' (also without an interval)."""
    if not iv.has_interval:
        return "inconclusive (no interval)"
    if low <= iv.low and iv.high <= high:
        return "met"
    if iv.high < low or iv.low > high:
        return "not met"
    return "inconclusive"


def _per_round(runs: list[dict], refs: list[dict], clock: str) -> list[float]:
    """Per round: tokens per ``clock`` second of ``runs``' run over that of ``refs``' run."""
    return [
        (x["tokens"] / x[clock]) / (m["tokens"] / m[clock]) for x, m in zip(runs, refs, strict=True)
    ]


def beyond_head(full: list[dict], head: list[dict]) -> list[dict] | None:
    """Per round, what the whole file's run did beyond its head file's run (the same path, the
    same round): tokens and each CPU clock of ``full`` less those of ``head``. A path's fixed
    start-up (its tokenizer and checks; ours' start-up check against HF ``tokenizers``) falls in
    both and cancels, so tokens over the CPU left is the steady state of a long run, what a
    trillion-token corpus pays per token; the head's own share of the cold pretoken cache
    cancels with it, the rest of the file's stays in.

    Returns:
        one dict per round (``tokens``, ``cpu``, ``user``, ``system``), or None where a round's
        head run wrote as many tokens or took as much CPU as its whole-file run (a head too
        large, or a file too small, to tell start-up from steady state).
    """
    rounds = []
    for f, h in zip(full, head, strict=True):
        left = {k: f[k] - h[k] for k in ("tokens", *CPU_CLOCKS)}
        if left["tokens"] <= 0 or left["cpu"] <= 0:
            return None
        rounds.append(left)
    return rounds


def cpu_split(runs: list[dict]) -> str:
    """'user U, system S, total T CPU-s (system P %)': the median of each over ``runs`` (dicts
    with ``user``, ``system`` and ``cpu`` in CPU-seconds), so U + S need not be T; the share is
    S of T."""
    cpu, user, system = (statistics.median(x[k] for x in runs) for k in CPU_CLOCKS)
    return (
        f"user {user:.3f}, system {system:.3f}, total {cpu:.3f} CPU-s "
        f"(system {100 * system / cpu:.0f} %)"
    )


RUNS_LOG_FIELDS = {
    "time": str,
    "source": str,
    "host": str,
    "corpus": str,
    "tokens": int,
    "path": str,
    "workers": int,
    "against": str,
    "rounds": int,
    "ratio": (int, float),
}
"""The fields every line of a ``--runs-log`` must hold, and their JSON types."""
RECREATION_BAND = (0.9, 1.1)
"""The re-creation's CPU per token over the real script's must lie here (issue 29)."""
TARGETS = (1.0, 1.3)
"""Ours over the real script, tokens per CPU-second (issue 29): the target and the stretch."""


def host_key() -> str:
    """``'hostname / CPU model / N CPUs / boot 1a2b3c4d'``: the machine a run ran on and its boot
    (Linux's boot id; 'unknown' where there is none). Machines of one kind may share a hostname
    and CPU model, so the boot id is what tells them apart; a machine rebooted therefore counts as
    two hosts, which :func:`summarize_runs` says beside every interval across hosts."""
    from megatron_gamma.host import cpu_model

    boot = "unknown"
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()[:8]
    return f"{platform.node()} / {cpu_model()} / {os.cpu_count()} CPUs / boot {boot}"


def _code_version() -> tuple[str, str]:
    """(HEAD's commit, the git tree ids of ``megatron_gamma`` and ``csrc`` at HEAD, which commits
    changing only docs, tests or tools share), '+ uncommitted changes' added where either folder
    differs from HEAD; 'unknown (not a git checkout)' outside one."""
    git = ["git", "-C", ROOT]
    try:
        ids = subprocess.run(
            [*git, "rev-parse", "HEAD", "HEAD:megatron_gamma", "HEAD:csrc"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "megatron_gamma", "csrc"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return ("unknown (not a git checkout)",) * 2
    code = f"megatron_gamma {ids[1][:10]}, csrc {ids[2][:10]}"
    return ids[0], code + " + uncommitted changes" * bool(dirty)


def _versions() -> dict:
    """Python's and the installed versions of the packages both sides' speed depends on
    (``gigatoken`` encodes for both; 'not installed' where one is missing)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("gigatoken", "tokenizers", "isal", "orjson", "numpy", "torch", "awkward"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def read_runs_log(path: str) -> list[dict]:
    """The records of a ``--runs-log`` file (JSON lines, blank lines skipped), each checked.

    Returns:
        one dict per run and path, with at least :data:`RUNS_LOG_FIELDS`.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line that is not a JSON object with those fields of those types, a ratio
            that is not a positive finite number, or tokens, workers or rounds below 1; the
            message names the line.
    """
    records = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path} line {number}: not UTF-8 text ({e}). Fix: a file that "
                                 "--runs-log wrote") from None  # fmt: skip
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e}). Fix: a file that --runs-log wrote, "
                                 "or a new path") from None  # fmt: skip
            if not isinstance(record, dict):
                raise ValueError(f"{where}: a {type(record).__name__}, not a JSON object. Fix: "
                                 "a file that --runs-log wrote, or a new path")  # fmt: skip
            bad = [
                k
                for k, kind in RUNS_LOG_FIELDS.items()
                if not isinstance(record.get(k), kind) or isinstance(record.get(k), bool)
            ]
            if not bad and not (math.isfinite(record["ratio"]) and record["ratio"] > 0):
                bad = ["ratio"]
            if not bad:
                try:
                    run_start(record["time"])
                except ValueError:
                    bad = ["time"]
            bad += [k for k in ("tokens", "workers", "rounds") if k not in bad and record[k] < 1]
            if bad:
                shown = {k: record.get(k) for k in bad}
                raise ValueError(
                    f"{where}: bad or missing {', '.join(bad)} ({shown}). Fix: each line a JSON "
                    "object as --runs-log writes it: time (ISO 8601 UTC), source, host, corpus, "
                    "path and against strings; tokens, workers and rounds integers >= 1; ratio a "
                    "number > 0"
                )
            records.append(record)
    return records


def run_start(text: str) -> float:
    """Seconds since the epoch of a runs-log ``time`` (ISO 8601, UTC: ``2026-12-04T22:01:42Z``).

    Raises:
        ValueError: ``text`` is not such a time, naming it and the fix.
    """
    from datetime import datetime, timezone

    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ValueError(f"time {text!r}: not an ISO 8601 UTC time. Fix: e.g. "
                         "'2026-12-04T22:01:42Z', as --runs-log writes it")  # fmt: skip
    return when.astimezone(timezone.utc).timestamp()


def windows(runs: Sequence[dict], gap_s: float = WINDOW_GAP_S) -> list[list[dict]]:
    """``runs`` (one host's records) in time order, cut where one starts ``gap_s`` seconds or
    more after the one before: the windows of :func:`summarize_runs`, runs that shared the
    machine's state of the hour.

    Raises:
        ValueError: a ``time`` that is not ISO 8601 (``2026-12-04T22:01:42Z``), naming it.
    """
    timed = sorted(((run_start(r["time"]), r) for r in runs), key=lambda tr: tr[0])
    cut: list[list[dict]] = []
    for i, (t, r) in enumerate(timed):
        if not i or t - timed[i - 1][0] >= gap_s:
            cut.append([])
        cut[-1].append(r)
    return cut


def _calls(iv, recreation: bool, tokens: int) -> str:
    """The target calls of a pooled ratio (:func:`summarize_runs`); none on a corpus of fewer
    than :data:`SMALL_CORPUS_TOKENS` tokens, as in a run."""
    if tokens < SMALL_CORPUS_TOKENS:
        return "not called: too few tokens (start-up dominates)"
    if recreation:
        return f"within 10 % (0.90-1.10x): {against(iv, *RECREATION_BAND)}"
    return ", ".join(f">= {t:.1f}x: {against(iv, t)}" for t in TARGETS)


def _left_out(record: dict) -> str | None:
    """Why a run's ratio must not be pooled: its paths wrote different bytes, or the run withheld
    its targets (the re-creation and the real script disagreed); else None."""
    if record.get("identical") is False:
        return "bytes differed"
    if record.get("withheld"):
        return f"targets withheld ({record['withheld']})"
    return None


def commit_codes(commits, root: str = ROOT) -> dict[str, str]:
    """``{commit: 'megatron_gamma <tree>, csrc <tree>'}``: the code each commit of ``root``'s git
    history holds, as :func:`_code_version` names it (the first 10 hex digits of each tree id);
    commits git cannot resolve there (another clone's, a shallow one's) are left out."""
    codes = {}
    for commit in commits:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            trees = subprocess.run(
                ["git", "-C", root, "rev-parse", f"{commit}:megatron_gamma", f"{commit}:csrc"],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            codes[commit] = f"megatron_gamma {trees[0][:10]}, csrc {trees[1][:10]}"
    return codes


def _across_code(per_host: dict, code_of, recreation: bool, tokens: int) -> list[str]:
    """The lines after the across-hosts interval when its runs did not all run one recorded
    code: that it mixes code versions; that host and code are confounded where no code ran on
    every host; then, for each code that ran on two hosts or more, the interval over those hosts'
    runs of that code alone (each host's mean one observation), which compares hosts like with
    like."""
    ran = {host: {code_of(r) for r in rs} for host, rs in per_host.items()}
    codes = set().union(*ran.values())
    if len(codes) == 1 and "not recorded" not in codes:
        return []
    unknown = " (or did not record it)" if "not recorded" in codes else ""
    lines = [f"    the runs did not all run the same code{unknown}: each host's is listed above"]
    if not set.intersection(*ran.values()) - {"not recorded"}:
        lines.append("    no code ran on every host, so host and code are confounded in this "
                     "interval: the hosts are not compared on the same code")  # fmt: skip
    for code in sorted(codes - {"not recorded"}):
        hosts = [host for host in per_host if code in ran[host]]
        if len(hosts) < 2:
            continue
        means = [
            rounds_ratio([_pooled(r, recreation) for r in per_host[host] if code_of(r) == code],
                         unit="runs").mean
            for host in hosts
        ]  # fmt: skip
        iv = rounds_ratio(means, unit="hosts")
        which = ("the code every host ran" if len(hosts) == len(per_host)
                 else f"the code {len(hosts)} of the {len(per_host)} hosts ran")  # fmt: skip
        lines.append(f"    on {which} ({code}): {ratio_text(iv)}; "
                     f"{_calls(iv, recreation, tokens)}")  # fmt: skip
    return lines


def _pooled(record: dict, recreation: bool) -> float:
    """A run's ratio as :func:`summarize_runs` pools it: the re-creation's as CPU per token over
    the reference (the inverse of its logged ratio), every other path's as logged."""
    return 1 / record["ratio"] if recreation else record["ratio"]


def summarize_runs(records: Sequence[dict]) -> list[str]:
    """Each run's ratio as one observation, per corpus, path, worker count, reference (the
    Megatron-LM commit) and measure (the whole file's run, or the steady state beyond start-up:
    :func:`beyond_head`), per host (Student-t over runs, df = runs - 1; where the host's runs fall
    in several :func:`windows`, also over windows, each window's geometric mean one observation,
    df = windows - 1), then across hosts (each host's geometric mean, over its windows where it
    has several, one observation, df = hosts - 1): the lines to print.

    A run's rounds share the machine and the hour, and both paths' rates move between runs on
    one host by more than one run's interval (docs/preprocess-benchmark.md, "Runs 29-32"), so a
    claim for a host takes its runs as the unit; runs of one hour share the machine's state too,
    and one host's windows hours apart have differed by more than their runs' intervals ("Runs
    45-53"), so where a host has several windows its calls take the windows as the unit; a
    claim beyond the hosts measured takes the hosts. ``ours`` paths are called against 1.0x and
    1.3x tokens per CPU-second; ``mlm-fast`` (the re-creation) is shown as CPU per token over the
    reference (:func:`_pooled`) and called against :data:`RECREATION_BAND`. Runs whose paths
    wrote different bytes or that withheld their targets are left out, and counted. Each host's
    runs are listed with the code and package versions they ran: the code of the run's commit
    where this checkout's history holds it (:func:`commit_codes`), else the code it recorded
    ("not recorded" for runs entered by hand). Where the hosts did not all run the same code, the
    across-hosts interval says so and is followed by one over each code that two hosts or more
    ran (:func:`_across_code`).
    """
    known = commit_codes({r["commit"] for r in records if r.get("commit")})

    def code_of(r: dict) -> str:
        recorded = r.get("code") or "not recorded"
        return recorded if "uncommitted" in recorded else known.get(r.get("commit"), recorded)

    groups: dict = {}
    for r in records:
        measured = r.get("measure") or IMPORTS_EXCLUDED
        key = (r["corpus"], r["tokens"], r["path"], r["workers"], r["against"], r.get("reference"))
        groups.setdefault((*key, measured), {}).setdefault(r["host"], []).append(r)
    lines = []
    for (corpus, tokens, path, workers, against_, commit, measured), hosts in groups.items():
        recreation = path == "mlm-fast"
        measure = "CPU per token" if recreation else "tokens per CPU-second"
        if measured != IMPORTS_EXCLUDED:
            first = next(iter(hosts.values()))[0]
            head, head_tokens = first.get("head_records"), first.get("head_tokens")
            of = f", {head_tokens:,} tokens" if isinstance(head_tokens, int) else ""
            measure += f" beyond start-up (less the run on the first {head} records{of})"
        reference = f"{against_} (Megatron-LM {str(commit)[:10]})" if commit else against_
        lines.append(f"{corpus} ({tokens:,} tokens), {path}, workers={workers}, x {reference}, "
                     f"{measure} (imports excluded):")  # fmt: skip
        means, per_host = [], {}
        for host, every in hosts.items():
            reasons = [_left_out(r) for r in every]
            why = sorted({w for w in reasons if w})
            if why:
                lines.append(f"  {host}: {sum(map(bool, reasons))} of {len(every)} runs left out: "
                             f"{'; '.join(why)}")  # fmt: skip
            rs = [r for r, w in zip(every, reasons, strict=True) if not w]
            if not rs:
                continue
            iv = rounds_ratio([_pooled(r, recreation) for r in rs], unit="runs")
            cut = windows(rs)
            per_host[host] = rs
            if len(cut) == 1:
                means.append(iv.mean)
                lines.append(f"  {host}: {ratio_text(iv)}; {_calls(iv, recreation, tokens)}")
            else:
                by_window = [rounds_ratio([_pooled(r, recreation) for r in w], unit="runs")
                             for w in cut]  # fmt: skip
                host_iv = rounds_ratio([w.mean for w in by_window], unit="windows")
                means.append(host_iv.mean)
                lines.append(f"  {host}: {ratio_text(iv)} with the runs taken as independent, "
                             f"but they fall in {len(cut)} windows, so the windows are the unit "
                             "of the calls")  # fmt: skip
                lines.append(
                    f"    over windows (each window's mean one observation; a window is runs "
                    f"started under {WINDOW_GAP_S / 3600:g} h apart): {ratio_text(host_iv)}; "
                    f"{_calls(host_iv, recreation, tokens)}"
                )
                lines.append("    windows: " + "; ".join(
                    f"{w[0]['time']} to {w[-1]['time']} {ratio_text(m)}"
                    for w, m in zip(cut, by_window, strict=True)))  # fmt: skip
            codes = {code_of(r) for r in rs}
            versions = {
                ", ".join(f"{k} {v}" for k, v in sorted(r["versions"].items()))
                if isinstance(r.get("versions"), dict) else "not recorded"
                for r in rs
            }  # fmt: skip
            lines.append(
                f"    {sum(r['rounds'] for r in rs)} rounds, {min(r['time'] for r in rs)} to "
                f"{max(r['time'] for r in rs)}; code: {'; '.join(sorted(codes))}; packages: "
                f"{'; '.join(sorted(versions))}"
            )
            users = [u for r in rs if isinstance(u := r.get("user_ratio"), (int, float)) and u > 0]
            if not recreation and users:
                user = ratio_text(rounds_ratio(users, unit="runs"))
                lines.append(f"    user time alone (no target; the {len(users)} of {len(rs)} runs "
                             f"that recorded it): {user}")  # fmt: skip
        if len(means) > 1:
            iv = rounds_ratio(means, unit="hosts")
            lines.append(f"  across hosts (each host's mean one observation; a host is one boot, "
                         f"so a machine rebooted counts twice): {ratio_text(iv)}; "
                         f"{_calls(iv, recreation, tokens)}")  # fmt: skip
            lines += _across_code(per_host, code_of, recreation, tokens)
        else:
            lines.append("  across hosts: one host measured; nothing is said beyond it")
    return lines


def append_runs(path: str, records: Sequence[dict]) -> None:
    """Append ``records`` to the ``--runs-log`` file ``path``, one JSON line each, in one write
    flushed to disk."""
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _tokens_written(prefix: str, tokenizer_path: str) -> int:
    """Tokens in ``{prefix}.bin`` (megatron-core's token dtype for the tokenizer's vocabulary)."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import DType

    from megatron_gamma.data.tokenizer import BilingualTokenizer

    dtype = DType.optimal_dtype(BilingualTokenizer(tokenizer_path).vocab_size)
    return os.path.getsize(prefix + ".bin") // np.dtype(dtype).itemsize


def _usage() -> dict:
    """CPU seconds of this process and its waited-for children (all threads): ``user``,
    ``system`` and their sum ``cpu``; and this process's peak RSS (MiB)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = me.ru_utime + kids.ru_utime, me.ru_stime + kids.ru_stime
    return {
        "cpu": user + system,
        "user": user,
        "system": system,
        "rss_main_mib": me.ru_maxrss / 1024,
    }


def _peak_kib(pid: int) -> int | None:
    """``VmHWM`` (peak RSS, KiB) of ``pid``, or None once it has exited."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class _WorkerPeak(threading.Thread):
    """Polls, every ``interval`` s, the peak RSS of the forked workers of benchmark child ``pid``:
    its direct children whose command line is ``cmd`` on two polls (a fork keeps its parent's;
    the ``git`` that GitPython runs at import has it only until its exec). Runs in this process,
    so that its CPU is not the child's; ``VmHWM`` only grows, so polling misses only a worker's
    last ``interval`` s (and a worker that lives less than two polls)."""

    def __init__(self, pid: int, cmd: list[str], interval: float = 0.1):
        import psutil

        super().__init__(daemon=True)
        self.process, self.cmd, self.interval = psutil.Process(pid), list(cmd), interval
        self.workers: dict[int, int] = {}  # child pid -> polls it had our command line; -1: not
        self.peaks: dict[int, int] = {}  # child pid -> largest VmHWM (KiB) read
        self.done = threading.Event()

    def _poll(self) -> None:
        import psutil

        try:
            children = self.process.children()
        except psutil.Error:
            return
        for child in children:
            pid = child.pid
            if 0 <= self.workers.get(pid, 0) < 2:  # a fork + exec has our command line till exec
                try:
                    same = child.cmdline() == self.cmd
                except psutil.Error:
                    continue
                self.workers[pid] = self.workers.get(pid, 0) + 1 if same else -1
            if self.workers[pid] > 0:
                self.peaks[pid] = max(self.peaks.get(pid, 0), _peak_kib(pid) or 0)

    def peak_mib(self) -> float | None:
        """The largest peak RSS (MiB) of the children seen as forks on two polls, or None."""
        peaks = [kib for pid, kib in self.peaks.items() if self.workers[pid] >= 2]
        return max(peaks) / 1024 if peaks and max(peaks) else None

    def run(self) -> None:
        while not self.done.wait(self.interval):
            self._poll()

    def stop(self) -> float | None:
        """Stop polling; the largest worker's peak RSS in MiB, None if no worker was seen."""
        self.done.set()
        self.join()
        return self.peak_mib()


def _open_lines(path: str):
    if path.endswith(".gz"):
        import gzip

        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


_TOK = None
_EOD = 0


def _per_doc_init(tokenizer_path: str, eod: int) -> None:
    global _TOK, _EOD
    from tokenizers import Tokenizer

    _TOK, _EOD = Tokenizer.from_file(tokenizer_path), eod
    _TOK.encode_special_tokens = True


def _per_doc_encode(line: str):
    text = json.loads(line)["text"]
    ids = _TOK.encode(text, add_special_tokens=False).ids
    ids.append(_EOD)
    return ids, len(line)


def _child_per_doc(files: list[str], tokenizer_path: str, prefix: str, workers: int) -> dict:
    """Megatron-LM's preprocess_data.py loop (one encode and one list per document)."""
    import multiprocessing as mp

    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    from megatron_gamma.data.tokenizer import BilingualTokenizer

    tok = BilingualTokenizer(tokenizer_path)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(tok.vocab_size))
    tokens = 0
    pool = mp.get_context("fork").Pool(workers, _per_doc_init, (tokenizer_path, tok.eod))
    for path in files:
        with _open_lines(path) as fin:
            lines = (line for line in fin if line.strip())
            for ids, _ in pool.imap(_per_doc_encode, lines, 32):
                builder.add_document(ids, [len(ids)])
                tokens += len(ids)
    builder.finalize(prefix + ".idx")
    pool.close()
    pool.join()
    return {"tokens": tokens}


def _child_mlm_fast(files: list[str], tokenizer_path: str, prefix: str, workers: int) -> dict:
    """Megatron-LM ``tools/preprocess_data_fast.py``'s ``process_key``, call for call (with
    ``--append-eod``): the tokenizer built as its ``HuggingFaceTokenizer(use_gigatoken=True)``
    builds it (``transformers`` ``AutoTokenizer`` of the directory, then
    ``gigatoken.Tokenizer(hf).as_hf()``), gigatoken ``encode_files`` on all cores, then
    megatron-core's ``IndexedDatasetBuilder(bin, dtype=...)``, ``add_documents(docs,
    eod_token=eod)`` and ``finalize(idx)``. ``add_documents`` is in Megatron-LM since 889c909922
    (2026-08-21); an older megatron-core is refused by name."""
    import gigatoken
    from megatron.core.datasets import indexed_dataset

    from megatron_gamma.data.tokenizer import BilingualTokenizer

    if not hasattr(indexed_dataset.IndexedDatasetBuilder, "add_documents"):
        raise SystemExit(
            f"mlm-fast: the megatron-core at {indexed_dataset.__file__} has no "
            "IndexedDatasetBuilder.add_documents, which Megatron-LM's preprocess_data_fast.py "
            "calls (added in 889c909922, 2026-08-21). Fix: --megatron-lm DIR, a Megatron-LM "
            "checkout at or after it"
        )
    from transformers import AutoTokenizer

    tok = BilingualTokenizer(tokenizer_path)
    # megatron-core's HuggingFaceTokenizer(use_gigatoken=True): the transformers tokenizer of the
    # directory, rebuilt by gigatoken, whose Rust tokenizer encodes the files.
    hf = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(tokenizer_path)))
    giga = gigatoken.Tokenizer(hf).as_hf().tokenizer
    encoded_docs = giga.encode_files(gigatoken.JsonlFileSource(files, field="text"), parallel=True)
    builder = indexed_dataset.IndexedDatasetBuilder(
        prefix + ".bin", dtype=indexed_dataset.DType.optimal_dtype(tok.vocab_size)
    )
    builder.add_documents(encoded_docs, eod_token=tok.eod)
    builder.finalize(prefix + ".idx")
    return {"tokens": int(sum(builder.sequence_lengths))}


def _child_mlm_real(files: list[str], tokenizer_path: str, prefix: str, workers: int) -> dict:
    """The real ``tools/preprocess_data_fast.py`` of the checkout on ``PYTHONPATH``: imported
    (not timed), then its ``main()`` timed. Its output name is ``{prefix}_text_document``."""
    import runpy
    import typing

    if not hasattr(typing, "override"):  # Python < 3.12; megatron.training imports it
        import typing_extensions

        typing.override = typing_extensions.override
    script = os.path.join(os.environ["MEGATRON_LM_DIR"], "tools", "preprocess_data_fast.py")
    tokenizer_dir = os.path.dirname(os.path.abspath(tokenizer_path))
    sys.argv = [script, "--tokenizer-type", "HuggingFaceTokenizer", "--use-gigatoken"]
    sys.argv += ["--tokenizer-model", tokenizer_dir, "--input", *files]
    sys.argv += ["--output-prefix", prefix, "--append-eod"]
    real_main = runpy.run_path(script, run_name="preprocess_data_fast")["main"]
    return {"main": real_main, "prefix": f"{prefix}_text_document"}


def _child_ours(backend: str):
    def run(files: list[str], tokenizer_path: str, prefix: str, workers: int) -> dict:
        from megatron_gamma.data.preprocess import preprocess

        r = preprocess(
            files, tokenizer_path, prefix, workers=workers, progress=False,
            tokenizer_backend=backend,
        )  # fmt: skip
        return {"tokens": r.tokens, "prefix": r.prefix}

    return run


def _child_raw(files: list[str], tokenizer_path: str, prefix: str, workers: int) -> dict:
    """gigatoken ``encode_batch`` alone, one thread, on texts in memory, 256 per call; the second
    of two passes is timed (warm pretoken cache, as in a long run)."""
    from megatron_gamma.data.token_backend import GigatokenBackend

    giga = GigatokenBackend(tokenizer_path)
    texts = []
    for path in files:
        with _open_lines(path) as fin:
            texts += [json.loads(line)["text"] for line in fin if line.strip()]
    for _ in range(2):
        t0 = time.process_time()
        tokens = sum(
            len(giga.encode_batch(texts[i : i + 256])[0]) for i in range(0, len(texts), 256)
        )
        cpu = time.process_time() - t0
    return {"tokens": tokens + len(texts), "encode_cpu": cpu}


CHILDREN = {
    "ours-gigatoken": _child_ours("gigatoken"),
    "ours-hf": _child_ours("hf"),
    "mlm-fast": _child_mlm_fast,
    "mlm-real": _child_mlm_real,
    "per-doc-hf": _child_per_doc,
    "gigatoken-raw": _child_raw,
}


def _start_child(
    mode: str, files: list[str], tokenizer: str, prefix: str, workers: int, hold: bool = False
) -> tuple[subprocess.Popen, str, str]:
    """Start one path's run; with ``hold`` it imports, prints 'ready' and waits for a line on
    stdin before starting its clock (:func:`_run_side_by_side`)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--tokenizer", tokenizer]
    cmd += ["--prefix", prefix, "--workers", str(workers), "--files", *files]
    cmd += ["--hold"] if hold else []
    path = [ROOT, os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if mode in REFERENCES and REFERENCE["dir"]:
        path = [REFERENCE["dir"], *REFERENCE["pythonpath"], *path]
        env["MEGATRON_LM_DIR"] = REFERENCE["dir"]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE if hold else None, **pipes)
    proc.whole_process = (before, start)
    proc.worker_peak = _WorkerPeak(proc.pid, cmd)
    proc.worker_peak.start()
    return proc, mode, prefix


def _finish_child(child: tuple[subprocess.Popen, str, str]) -> dict:
    proc, mode, prefix = child
    stdout, stderr = proc.communicate()
    rss_worker = proc.worker_peak.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{stderr[-3000:]}")
    before, start = proc.whole_process
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(stdout.strip().splitlines()[-1])
    result.setdefault("prefix", prefix)
    result["rss_worker_mib"] = rss_worker
    result["process_wall"] = time.time() - start
    result["process_cpu"] = sum(
        getattr(after, f) - getattr(before, f) for f in ("ru_utime", "ru_stime")
    )
    if "encode_cpu" in result:  # the raw ceiling counts the encode calls only
        result["cpu"] = result["encode_cpu"]
    return result


def _max_or_none(values) -> float | None:
    """The largest of ``values`` that are not None; None if all are."""
    return max((v for v in values if v is not None), default=None)


def _run_child(mode: str, files: list[str], tokenizer: str, prefix: str, workers: int) -> dict:
    return _finish_child(_start_child(mode, files, tokenizer, prefix, workers))


def _run_side_by_side(files: list[str], tokenizer: str, prefix: str, copies: int) -> dict:
    """``copies`` independent 1-worker ``ours-gigatoken`` runs whose clocks start together:
    what this machine gives processes that share no work (only its caches, memory bandwidth
    and hypervisor), the ceiling of any worker design. Returned as one run: all tokens, all
    CPU, the wall time of the slowest."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = [
        _start_child("ours-gigatoken", files, tokenizer, f"{prefix}-{i}", 1, hold=True)
        for i in range(copies)
    ]
    for proc, mode, _ in children:
        if proc.stdout.readline().strip() != "ready":
            proc.kill()
            raise SystemExit(f"{mode} side-by-side run failed:\n{proc.stderr.read()[-3000:]}")
    for proc, _, _ in children:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [_finish_child(c) for c in children]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "tokens": sum(r["tokens"] for r in results),
        **{clock: sum(r[clock] for r in results) for clock in CPU_CLOCKS},
        "wall": max(r["wall"] for r in results),
        "process_cpu": sum(
            getattr(after, f) - getattr(before, f) for f in ("ru_utime", "ru_stime")
        ),
        "process_wall": max(r["process_wall"] for r in results),
        "rss_main_mib": max(r["rss_main_mib"] for r in results),
        "rss_worker_mib": _max_or_none(r["rss_worker_mib"] for r in results),
        "prefix": results[0]["prefix"],
    }


def _commit(checkout: str) -> str:
    """``git rev-parse HEAD`` of ``checkout``, or 'unknown (not a git checkout)'."""
    try:
        out = subprocess.run(
            ["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return out.stdout.strip()


def _one_file(files: list[str], folder: str) -> list[str]:
    """The corpus as one file, as Megatron-LM's script takes one ``--input``: ``files`` as they
    are when there is one, else their lines concatenated into ``folder/all.jsonl`` (gzip level 6,
    ``all.jsonl.gz``, when every input is ``.gz``)."""
    if len(files) == 1:
        return files
    import gzip
    import shutil

    os.makedirs(folder)
    packed = all(f.endswith(".gz") for f in files)
    out = os.path.join(folder, "all.jsonl.gz" if packed else "all.jsonl")
    with gzip.open(out, "wb", compresslevel=6) if packed else open(out, "wb") as dst:
        for path in files:
            with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as src:
                shutil.copyfileobj(src, dst)
    return [out]


def head_file(path: str, folder: str, records: int) -> str | None:
    """The first ``records`` non-blank lines of the JSON-lines file ``path`` (gzip or plain),
    written as ``folder/head-{records}.jsonl`` (``.jsonl.gz``, gzip level 6, for a ``.gz``):
    the start-up run of :func:`beyond_head`. None where ``path`` holds no more than ``records``
    such lines, or is neither (``.zst``, parquet: no head is cut from those)."""
    import gzip
    import itertools

    if not path.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return None
    packed = path.endswith(".gz")
    out = os.path.join(folder, f"head-{records}.jsonl" + ".gz" * packed)
    with gzip.open(path, "rb") if packed else open(path, "rb") as src:
        lines = (line for line in src if line.strip())
        head = list(itertools.islice(lines, records + 1))
    if len(head) <= records:
        return None
    os.makedirs(folder, exist_ok=True)
    with gzip.open(out, "wb", compresslevel=6) if packed else open(out, "wb") as dst:
        dst.writelines(head[:records])
    return out


def _same_bytes(a: str, b: str) -> bool:
    return all(filecmp.cmp(a + ext, b + ext, shallow=False) for ext in (".bin", ".idx"))


def bench_corpus(
    name: str,
    files: list[str],
    tokenizer: str,
    workers: list[int],
    rounds: int,
    tmp: str,
    paths: tuple[str, ...] = PATHS,
    log: list | None = None,
    head: tuple[str, int] | None = None,
) -> dict:
    """Run ``paths`` (and ``mlm-fast``, and ``mlm-real`` with a checkout) ``rounds`` times, in
    reverse order every other round; print medians and ratios. With ``head`` (a file of the
    corpus's first records, :func:`head_file`, and how many), each of :data:`HEAD_PATHS` also
    runs on it right after its run on the corpus, and the steady state (:func:`beyond_head`) is
    reported beside. With ``log``, append to it one record per path compared with the reference
    (``ours`` paths and the re-creation) and measure: this run's geometric-mean ratio of tokens
    per CPU-second and what :func:`summarize_runs` needs."""
    started, load = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), os.getloadavg()[0]
    size = sum(map(os.path.getsize, files))
    print(f"\n== {name}: {len(files)} files, {size / 1e6:.1f} MB on disk, {rounds} rounds")
    runs = [("mlm-fast", 1)] + [("mlm-real", 1)] * bool(REFERENCE["dir"])
    runs += [("gigatoken-raw", 1)] * ("gigatoken-raw" in paths)
    runs += [("per-doc-hf", workers[0])] * ("per-doc-hf" in paths)
    runs += [(m, w) for w in workers for m in ("ours-gigatoken", "ours-hf") if m in paths]
    runs += [(SIDE_BY_SIDE, w) for w in workers[1:] if SIDE_BY_SIDE in paths]
    results: dict = {run: [] for run in runs}
    heads: dict = {run: [] for run in runs if head and run[0] in HEAD_PATHS}
    for r in range(rounds):
        for mode, w in runs if r % 2 == 0 else runs[::-1]:
            prefix = os.path.join(tmp, f"{name}-{mode}-w{w}-r{r}")
            if mode == SIDE_BY_SIDE:
                results[(mode, w)].append(_run_side_by_side(files, tokenizer, prefix, w))
            else:
                results[(mode, w)].append(_run_child(mode, files, tokenizer, prefix, w))
            if (mode, w) in heads:
                heads[(mode, w)].append(_run_child(mode, [head[0]], tokenizer, prefix + "-head", w))
        print(f"  round {r + 1}/{rounds} done (load {os.getloadavg()[0]:.1f})")
    base = "mlm-real" if REFERENCE["dir"] else "mlm-fast"
    ref = results[(base, 1)]
    print("  mlm-fast: Megatron-LM preprocess_data_fast.py's calls, re-created here")
    if REFERENCE["dir"]:
        print(f"  mlm-real: {REFERENCE['dir']}/tools/preprocess_data_fast.py itself, Megatron-LM "
              f"{REFERENCE['commit']}, main() timed")  # fmt: skip
    print(f"  x {base}: the geometric mean of the per-round ratios to {base}; its interval and "
          "targets below are this run's (this machine, this hour): for a machine, repeat the "
          "run with --runs-log and read --summarize, which takes each run as one "
          "observation")  # fmt: skip
    print("  tok/CPU-s and tok/s wall: imports excluded; whole proc: the whole process, imports "
          "included")  # fmt: skip
    if SIDE_BY_SIDE in paths:
        print("  side-by-side: N independent 1-worker ours-gigatoken runs at once (the machine's "
              "ceiling)")  # fmt: skip
    x = f"x {base}"
    print(f"  {'path':16s} {'workers':>7s} {'tok/CPU-s':>11s} {x:>10s} {'tok/s wall':>11s} "
          f"{x:>10s} {'whole proc':>11s} {x:>10s} {'RSS main':>9s} {'worker':>7s}")  # fmt: skip
    summary = {}
    for (mode, w), rs in results.items():
        per_cpu = statistics.median(x["tokens"] / x["cpu"] for x in rs)
        cpu_ratio = rounds_ratio(_per_round(rs, ref, "cpu")).mean
        walls = [x["tokens"] / x["wall"] for x in rs if "wall" in x]
        summary[(mode, w)] = {"per_cpu": per_cpu, "wall": statistics.median(walls or [0])}
        wall_txt = (
            f"{statistics.median(walls):>11,.0f} "
            f"{rounds_ratio(_per_round(rs, ref, 'wall')).mean:>9.2f}x"
            if walls else f"{'-':>11s} {'-':>10s}"
        )  # fmt: skip
        process = statistics.median(x["tokens"] / x["process_cpu"] for x in rs)
        process_ratio = rounds_ratio(_per_round(rs, ref, "process_cpu")).mean
        rss_main = max(x["rss_main_mib"] for x in rs)
        rss_worker = _max_or_none(x["rss_worker_mib"] for x in rs)
        worker_txt = f"{rss_worker:>4.0f} MiB" if rss_worker is not None else f"{'—':>8s}"
        print(
            f"  {mode:16s} {w:>7d} {per_cpu:>11,.0f} {cpu_ratio:>9.2f}x {wall_txt} "
            f"{process:>11,.0f} {process_ratio:>9.2f}x {rss_main:>5.0f} MiB {worker_txt}"
        )
    print("  CPU-s per run, imports excluded (medians over rounds); a thread pool's waiting "
          "shows as system time")  # fmt: skip
    for (mode, w), rs in results.items():
        if mode != "gigatoken-raw":  # its clock counts the encode calls only
            print(f"  {mode:16s} {w:>7d} {cpu_split(rs)}")
    for (mode, w), rs in results.items():
        late = sorted({m for x in rs for m in x.get("imported_in_clock", ())})
        if late:
            print(f"  {mode} workers={w} imported inside its clock (timed): {', '.join(late)}")
    tokens = results[("mlm-fast", 1)][-1]["tokens"]
    withheld = None
    if ("mlm-real", 1) in results:
        real = results[("mlm-real", 1)]
        gap = rounds_ratio([1 / r for r in _per_round(results[("mlm-fast", 1)], real, "cpu")])
        agree = against(gap, 0.9, 1.1)
        print(f"  mlm-fast re-creation vs the real script: CPU per token {ratio_text(gap)}; "
              f"within 10 % (0.90-1.10x): {agree}")  # fmt: skip
        withheld = (
            f"{tokens:,} tokens are too few (start-up dominates)"
            if tokens < SMALL_CORPUS_TOKENS
            else "the re-creation and the real script disagree, so one of them timed more than "
            "its work"
            if agree == "not met"
            else None
        )
        if withheld:
            print(f"  targets not called: {withheld}")

        def call(iv, target: float) -> str:
            return "not called" if withheld else against(iv, target)

        for mode, w in runs:
            if mode in ("ours-gigatoken", "ours-hf"):
                ours = results[(mode, w)]
                per_cpu, whole = (
                    rounds_ratio(_per_round(ours, real, cpu)) for cpu in ("cpu", "process_cpu")
                )
                user = rounds_ratio(_per_round(ours, real, "user"))
                print(f"  {mode} workers={w} vs the real script, tokens per CPU-second (imports "
                      f"excluded): {ratio_text(per_cpu)}; "
                      + ", ".join(f">= {t:.1f}x: {call(per_cpu, t)}" for t in TARGETS)
                      + f"; whole process: "
                      f"{ratio_text(whole)}; user time alone (no target): "
                      f"{ratio_text(user)}")  # fmt: skip
    steady, steady_withheld = _report_steady(heads, results, base, head, withheld)
    reference = results[("mlm-fast", 1)][-1]["prefix"]
    same = {
        (mode, w): _same_bytes(results[(mode, w)][-1]["prefix"], reference)
        for mode, w in runs[1:]
        if mode in WRITERS
    }
    if heads:
        head_reference = heads[("mlm-fast", 1)][-1]["prefix"]
        for mode, w in heads:
            if (mode, w) in same and mode != "mlm-fast":
                same[(mode, w)] &= _same_bytes(heads[(mode, w)][-1]["prefix"], head_reference)
    for (mode, w), identical in same.items():
        print(f"  {mode} workers={w}: bytes identical to mlm-fast: {'yes' if identical else 'NO'}"
              + " (the corpus and its head)" * bool(heads))  # fmt: skip
    if log is not None:
        (commit, code), versions, host = _code_version(), _versions(), host_key()
        for mode, w in runs:
            if mode not in ("ours-gigatoken", "ours-hf", "mlm-fast") or mode == base:
                continue
            kept = withheld if tokens >= SMALL_CORPUS_TOKENS else None
            measured = [(results, ref, IMPORTS_EXCLUDED, {}, kept)]
            if steady:
                extra = {"head_records": head[1], "head_tokens": heads[(base, 1)][-1]["tokens"]}
                measured.append(
                    (steady, steady[(base, 1)], steady_measure(head[1]), extra, steady_withheld)
                )
            for runs_of, ref_of, measure, extra, held in measured:
                iv = rounds_ratio(_per_round(runs_of[(mode, w)], ref_of, "cpu"))
                user = rounds_ratio(_per_round(runs_of[(mode, w)], ref_of, "user")).mean
                log.append({
                    "time": started, "source": "tools/bench_preprocess.py", "host": host,
                    "commit": commit, "code": code, "reference": REFERENCE["commit"],
                    "corpus": name, "tokens": tokens, "path": mode, "workers": w,
                    "against": base, "rounds": rounds, "ratio": iv.mean,
                    "low": iv.low if iv.has_interval else None,
                    "high": iv.high if iv.has_interval else None,
                    "measure": measure, "user_ratio": user,
                    "identical": same.get((mode, w), same.get((base, 1), True)),
                    "withheld": held, "versions": versions,
                    "load": [load, os.getloadavg()[0]], **extra,
                })  # fmt: skip
    speedups: dict = {}
    for mode in ("ours-gigatoken", "ours-hf", SIDE_BY_SIDE):
        base = ("ours-gigatoken" if mode == SIDE_BY_SIDE else mode, workers[0])
        for w in workers[1:]:
            if base not in results or (mode, w) not in results:
                continue
            one, many = results[base], results[(mode, w)]
            speedups[(mode, w)] = _per_round(many, one, "wall")
            scale = rounds_ratio(speedups[(mode, w)])
            cpu = rounds_ratio([1 / r for r in _per_round(many, one, "cpu")])
            what = (
                f"{w} independent 1-worker ours-gigatoken runs at once (this machine's ceiling)"
                if mode == SIDE_BY_SIDE
                else f"{mode}: {workers[0]} -> {w} workers"
            )
            print(f"  {what}: speed-up {ratio_text(scale)} (wall tokens/s), CPU per token "
                  f"{cpu.mean:.2f}x")  # fmt: skip
    for w in workers[1:]:
        if ("ours-gigatoken", w) in speedups and (SIDE_BY_SIDE, w) in speedups:
            ours, ceiling = speedups[("ours-gigatoken", w)], speedups[(SIDE_BY_SIDE, w)]
            share = rounds_ratio([a / b for a, b in zip(ours, ceiling, strict=True)])
            print(f"  ours-gigatoken {workers[0]} -> {w} workers' speed-up over the ceiling's, "
                  f"same rounds: {ratio_text(share)}")  # fmt: skip
    if tokens < SMALL_CORPUS_TOKENS:
        print(f"  no core-hour projection: {tokens:,} tokens are too few (fixed start-up costs "
              "dominate; use a corpus of millions of tokens)")  # fmt: skip
        return summary
    for mode in ("ours-gigatoken", "ours-hf", "mlm-fast", "per-doc-hf"):
        if mode not in {m for m, _ in runs}:
            continue
        best = max(s["per_cpu"] for (m, _), s in summary.items() if m == mode)
        print(f"  {mode}: 1e12 tokens = {TRILLION / best / 3600:,.0f} core-hours")
    return summary


def _report_steady(
    heads: dict, results: dict, base: str, head: tuple[str, int] | None, withheld: str | None
) -> tuple[dict, str | None]:
    """Print each path's start-up CPU (its head run) and the steady state against ``base``
    (:func:`beyond_head`; targets called against the real script only, and not while
    ``withheld`` or on fewer than :data:`SMALL_CORPUS_TOKENS` tokens beyond the head).

    Returns:
        (the per-round steady state by run, empty when not measured; why its targets are
        withheld, for the runs log, or None)."""
    if not heads:
        return {}, None
    head_cpu = ", ".join(
        f"{mode} {statistics.median(x['cpu'] for x in rs):.3f}" for (mode, _), rs in heads.items()
    )
    print(f"  start-up: each path's run on the corpus's first {head[1]} records "
          f"({heads[(base, 1)][-1]['tokens']:,} tokens), CPU-s (medians): {head_cpu}")  # fmt: skip
    steady = {run: beyond_head(results[run], rs) for run, rs in heads.items()}
    if any(rs is None for rs in steady.values()):
        print(f"  steady state not measured: a run on the first {head[1]} records wrote as many "
              "tokens or took as much CPU as the run on the whole corpus. Fix: a larger corpus, "
              "or a smaller --head-records")  # fmt: skip
        return {}, None
    ref = steady[(base, 1)]
    beyond, whole = ref[-1]["tokens"], results[(base, 1)][-1]["tokens"]
    logged = withheld if whole >= SMALL_CORPUS_TOKENS else None  # as the whole file's record
    if withheld is None and whole >= SMALL_CORPUS_TOKENS > beyond:
        withheld = logged = f"{beyond:,} tokens beyond the head are too few (start-up dominates)"
        print(f"  steady-state targets not called: {withheld}")
    print("  steady state: tokens per CPU-second beyond start-up, per round the whole corpus's "
          "run less its head's (each path's fixed start-up cancels)")  # fmt: skip
    for (mode, w), rs in steady.items():
        if mode == base:
            continue
        per_round = _per_round(rs, ref, "cpu")
        if mode == "mlm-fast":
            inverse = rounds_ratio([1 / r for r in per_round])
            print(f"  mlm-fast re-creation vs {base}, steady state: CPU per token "
                  f"{ratio_text(inverse)}")  # fmt: skip
            continue
        iv, calls = rounds_ratio(per_round), ""
        if base == "mlm-real":
            calls = "; " + ", ".join(
                f">= {t:.1f}x: {'not called' if withheld else against(iv, t)}" for t in TARGETS
            )
        print(f"  {mode} workers={w} vs {base}, steady state, tokens per CPU-second: "
              f"{ratio_text(iv)}{calls}")  # fmt: skip
    return steady, logged


def bench_memory(name: str, files: list[str], tokenizer: str, tmp: str, copies: int) -> None:
    folder = os.path.join(tmp, f"{name}-mem-x{copies}")
    os.makedirs(folder)
    linked = []
    for c in range(copies):
        for f in files:
            link = os.path.join(folder, f"{c}-{os.path.basename(f)}")
            os.symlink(os.path.abspath(f), link)
            linked.append(link)
    mode = "ours-gigatoken"
    one = _run_child(mode, files, tokenizer, os.path.join(tmp, f"{name}-mem-one"), 1)
    many = _run_child(mode, linked, tokenizer, os.path.join(tmp, f"{name}-mem-many"), 1)
    print(
        f"  peak RSS, {mode}, 1 worker: {one['rss_main_mib']:.0f} MiB for {one['tokens']:,d} "
        f"tokens; {many['rss_main_mib']:.0f} MiB for {many['tokens']:,d} tokens ({copies}x input)"
    )


def _fresh_text(path: str, documents: int, seed: int) -> None:
    """``documents`` JSON lines of 250 random lowercase words of 5-12 letters (gzip level 1)."""
    import gzip
    import random
    import string

    rng = random.Random(seed)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        for _ in range(documents):
            words = (
                "".join(rng.choices(string.ascii_lowercase, k=rng.randint(5, 12)))
                for _ in range(250)
            )
            f.write(json.dumps({"text": " ".join(words)}) + "\n")


def bench_fresh_memory(tokenizer: str, tmp: str, documents: int) -> None:
    """Peak RSS of ``ours-gigatoken`` (1 worker) on ``documents`` and 2 x ``documents`` documents
    of fresh random words (module docstring)."""
    print(f"\n== fresh text: {documents:,d} and {2 * documents:,d} documents of random words")
    for n in (documents, 2 * documents):
        path = os.path.join(tmp, f"fresh-{n}.jsonl.gz")
        _fresh_text(path, n, seed=n)
        r = _run_child("ours-gigatoken", [path], tokenizer, os.path.join(tmp, f"fresh-{n}"), 1)
        print(f"  peak RSS, ours-gigatoken, 1 worker: {r['rss_main_mib']:.0f} MiB for "
              f"{r['tokens']:,d} tokens, {r['cpu']:.2f} CPU-s")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument(
        "--corpus",
        nargs="*",
        default=None,
        help="directories or files of zh/en jsonl(.gz) (default: the demo corpus, and "
        "../shared/data/debian-docs-bilingual beside the checkout when it exists)",
    )
    p.add_argument(
        "--workers",
        nargs="+",
        type=int,
        default=[1, 2],
        help="worker counts to run ours at (default: 1 2)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds per path, the unit of the intervals (default: 3)",
    )
    p.add_argument(
        "--tokenizer",
        default=os.path.join(ROOT, "megatron_gamma/data/demo/tokenizer.json"),
        help="a tokenizer.json; its directory is what the Megatron-LM paths load (default: the "
        "demo tokenizer)",
    )
    p.add_argument(
        "--paths",
        nargs="+",
        choices=PATHS,
        default=list(PATHS),
        help="paths to run (default: all; mlm-fast, and mlm-real with --megatron-lm, always run)",
    )
    p.add_argument(
        "--memory-copies",
        type=int,
        default=3,
        help="the peak-memory run's input repeats (default: 3; 0: no memory run)",
    )
    p.add_argument(
        "--fresh-documents",
        type=int,
        default=20000,
        help="documents of random words for the fresh-text memory run, then twice as many "
        "(default: 20000; 0: no such run)",
    )
    p.add_argument(
        "--head-records",
        type=int,
        default=64,
        metavar="N",
        help="steady state: in every round also run mlm-fast, mlm-real and ours-* on the "
        "corpus's first N records (one more run per path; the corpus must be a .jsonl/.json, "
        "plain or .gz, of more than N records) and report tokens per CPU-second of the whole "
        "run less that run, i.e. beyond start-up (default: 64; 0: off)",
    )
    p.add_argument(
        "--megatron-lm",
        metavar="DIR",
        help="a Megatron-LM source tree: also run its tools/preprocess_data_fast.py (mlm-real), "
        "and run mlm-fast with its megatron-core (needed while the installed megatron-core "
        "lacks IndexedDatasetBuilder.add_documents, as the released wheel does)",
    )
    p.add_argument(
        "--reference-pythonpath",
        nargs="*",
        default=[],
        metavar="DIR",
        help="extra PYTHONPATH entries for mlm-fast/mlm-real only (e.g. a pip --target folder "
        "with triton, which the checkout's megatron.core imports)",
    )
    p.add_argument(
        "--runs-log",
        metavar="FILE",
        help="append this run's ratios to FILE (JSON lines; created if missing), one record per "
        "path compared with the reference, for --summarize",
    )
    p.add_argument(
        "--summarize",
        metavar="FILE",
        help="run nothing: read a --runs-log FILE and print each host's ratio with each run as "
        "one observation, and the hosts' with each host as one",
    )
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--prefix", help=argparse.SUPPRESS)
    p.add_argument("--files", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        import awkward  # noqa: F401  (imports are not timed)
        import gigatoken  # noqa: F401
        import numpy.ma  # noqa: F401  (gigatoken's awkward output imports it on first use)
        import tokenizers  # noqa: F401

        import megatron_gamma.data.preprocess  # noqa: F401
        from megatron_gamma.data.indexed import indexed_dataset

        if args.child.startswith("ours"):
            indexed_dataset()  # as preprocess imports megatron-core: without wandb
            import psutil  # noqa: F401  (the pretoken-cache budget reads the RSS)

            from megatron_gamma import _C  # noqa: F401  (the token-statistics kernel)
        else:
            import megatron.core.datasets.indexed_dataset  # noqa: F401  (torch, for every writer)

        if args.child in ("mlm-fast", "mlm-real"):
            # Both build their tokenizer through it (megatron-core's huggingface_tokenizer.py);
            # `transformers` resolves it lazily, on first access, which must not fall inside
            # either clock (seen inside the real script's main() in a fresh install).
            from transformers import AutoTokenizer  # noqa: F401

            with contextlib.suppress(ImportError):  # transformers 5 loads it on first use
                import transformers.tokenization_python  # noqa: F401

        child = CHILDREN[args.child]
        call = (args.files, args.tokenizer, args.prefix, args.workers[0])
        prepared = child(*call) if args.child == "mlm-real" else None
        if args.hold:
            print("ready", flush=True)
            sys.stdin.readline()
        modules = set(sys.modules)
        before, start = _usage(), time.time()
        if prepared is None:
            result = child(*call)
        else:
            prepared.pop("main")()
            result = prepared | {"tokens": _tokens_written(prepared["prefix"], args.tokenizer)}
        after = _usage()
        for clock in CPU_CLOCKS:
            after[clock] -= before[clock]
        after["imported_in_clock"] = sorted(set(sys.modules) - modules)
        if args.child != "gigatoken-raw":
            result["wall"] = time.time() - start
        print(json.dumps(result | after))
        return
    if args.summarize:
        try:
            records = read_runs_log(args.summarize)
        except ValueError as e:
            p.error(f"--summarize {args.summarize}: {e}")
        except OSError as e:
            p.error(f"--summarize {args.summarize}: cannot be read ({e}). Fix: the path of a file "
                    "that --runs-log wrote")  # fmt: skip
        if not records:
            p.error(f"--summarize {args.summarize}: no runs in it. Fix: a file that --runs-log "
                    "wrote")  # fmt: skip
        print(f"{args.summarize}: {len(records)} records; 95 % Student-t intervals")
        print("\n".join(summarize_runs(records)))
        return
    if args.runs_log:
        if os.path.exists(args.runs_log):
            try:
                read_runs_log(args.runs_log)
            except ValueError as e:
                p.error(f"--runs-log {args.runs_log}: appending to it would mix runs into a file "
                        f"that is not a runs log: {e}")  # fmt: skip
            except OSError as e:
                p.error(f"--runs-log {args.runs_log}: cannot be read ({e}). Fix: a runs log "
                        "file, or a new path in a writable folder")  # fmt: skip
    if args.rounds < 1 or min(args.memory_copies, args.fresh_documents, args.head_records) < 0:
        p.error(
            f"--rounds {args.rounds} --memory-copies {args.memory_copies} --fresh-documents "
            f"{args.fresh_documents} --head-records {args.head_records}: need >= 1, >= 0, >= 0, "
            ">= 0"
        )
    if min(args.workers) < 1:
        p.error(f"--workers {' '.join(map(str, args.workers))}: each must be >= 1. Fix: e.g. 1 2")
    missing = [c for c in args.corpus or [] if not os.path.exists(c)]
    if missing:
        p.error(f"--corpus {missing[0]!r}: no such file or directory. Fix: a folder of jsonl(.gz)")
    if importlib.util.find_spec("transformers") is None:
        p.error(
            "transformers is not installed: the re-creation (mlm-fast) builds its tokenizer "
            "through it, as megatron-core does. Fix: pip install -e '.[eval]'"
        )
    if args.megatron_lm:
        script = os.path.join(args.megatron_lm, "tools", "preprocess_data_fast.py")
        if not os.path.isfile(script):
            p.error(f"--megatron-lm {args.megatron_lm}: no {script}. Fix: a Megatron-LM checkout")
        REFERENCE.update(
            dir=os.path.abspath(args.megatron_lm),
            pythonpath=[os.path.abspath(d) for d in args.reference_pythonpath],
            commit=_commit(args.megatron_lm),
        )
    else:
        from megatron_gamma.data.indexed import indexed_dataset

        if not hasattr(indexed_dataset().IndexedDatasetBuilder, "add_documents"):
            p.error(
                "the installed megatron-core has no IndexedDatasetBuilder.add_documents, which "
                "Megatron-LM's preprocess_data_fast.py calls (added in 889c909922). Fix: "
                "--megatron-lm DIR, a Megatron-LM checkout at or after it"
            )
    if args.runs_log:
        try:  # after every other check, before any run: the runs must not be lost at the end
            open(args.runs_log, "a", encoding="utf-8").close()
        except OSError as e:
            p.error(f"--runs-log {args.runs_log}: cannot be appended to ({e}). Fix: a new path "
                    "in a writable folder")  # fmt: skip
    from megatron_gamma.data.readers import expand_inputs

    corpora = args.corpus
    if corpora is None:
        corpora = [os.path.join(ROOT, "megatron_gamma/data/demo")]
        big = os.path.join(ROOT, "..", "shared", "data", "debian-docs-bilingual")
        if os.path.isdir(big):
            corpora.append(os.path.normpath(big))
    print(f"tokenizer {args.tokenizer}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench_preprocess_") as tmp:
        for corpus in corpora:
            name = os.path.basename(corpus.rstrip("/"))
            files = _one_file(expand_inputs([corpus]), os.path.join(tmp, name))
            paths = tuple(args.paths)
            log: list | None = [] if args.runs_log else None
            head = None
            if args.head_records:
                cut = head_file(files[0], os.path.join(tmp, f"{name}-head"), args.head_records)
                if cut is None:
                    print(f"  {name}: no steady state: {files[0]} is not a JSON-lines file "
                          f"(gzip or plain) of more than {args.head_records} records")  # fmt: skip
                head = (cut, args.head_records) if cut else None
            bench_corpus(
                name, files, args.tokenizer, args.workers, args.rounds, tmp, paths, log, head
            )
            if log:
                append_runs(args.runs_log, log)
                print(f"  {len(log)} records appended to {args.runs_log}")
            if sum(map(os.path.getsize, files)) > 5e6 and args.memory_copies:
                bench_memory(name, files, args.tokenizer, tmp, args.memory_copies)
        if args.fresh_documents:
            bench_fresh_memory(args.tokenizer, tmp, args.fresh_documents)


if __name__ == "__main__":
    main()
