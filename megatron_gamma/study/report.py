"""``megatron-gamma report DIR``: the paper's analyses and a verdict table from a study's runs.

Reads ``DIR/study.json`` (written by ``sweep``) and every run directory (no retraining), then
writes ``report.md``, and beside it a folder of the same stem holding ``report.json``,
``losses.csv``, ``runs.csv``, the PNG plots and the ``megatron-gamma compare`` output of
:func:`~.verdicts.concentration_arm` against the baseline (Δsym by difficulty on the held-out
split).

The numbers come from :mod:`~megatron_gamma.study.analysis`, the verdicts from
:mod:`~megatron_gamma.study.verdicts`, the figures from :mod:`~megatron_gamma.study.plots`.
``report.json``'s ``mechanisms`` are :func:`~.analysis.mechanisms`' entries, their seed-mean
trajectories under ``series`` (the stable rank and the condensation score each the mean over
the matrices every arm at that size has, as in the table and the plot); its ``verdicts`` are
:meth:`~.verdicts.Verdict.as_dict`, each with the sizes the row judged.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import time
from typing import Optional

import numpy as np

from megatron_gamma.atomic import atomic_open, atomic_write_text
from megatron_gamma.config import ConfigError
from megatron_gamma.diagnostics.attention import uniform_sink_share
from megatron_gamma.host import cpu_model
from megatron_gamma.study import plots, rundir
from megatron_gamma.study.analysis import (
    StudyData,
    fmt,
    gamma_grid,
    loss_table,
    mechanisms,
    multiplier_text,
    scaling_fits,
)
from megatron_gamma.study.fits import PowerLawFit, mean_std
from megatron_gamma.study.spec import LOSSES_CSV, RUNS_CSV
from megatron_gamma.study.verdicts import (
    NOT_REPRODUCED,
    REPRODUCED,
    SINK_MIN,
    concentration_arm,
    concentration_missing,
    learned_bar,
    verdicts,
)


def run_compare(data: StudyData, out_dir: str) -> Optional[dict]:
    """Run ``megatron-gamma compare`` between :func:`~.verdicts.concentration_arm` (fixed in
    advance, not chosen by loss) and the baseline at the largest size both finished, once per
    common seed (``OUT/compare/seed-N``).

    Returns:
        {"arm", "size", "seeds": {seed: {"delta", "difficulty", "loss_a", "loss_b"} arrays},
        "documents": each token's document (the same tokens in every seed),
        "runs": {seed: compare.json}}, or {"error", "arm", "size"} (a checkpoint missing, one
        outside its own run directory, as written by sweep, or compare failed), or None
        without a pair.
    """
    arm = concentration_arm(data)
    for size in reversed(data.sizes) if arm else []:
        common = sorted(set(data.losses(arm, size)) & set(data.losses(data.baseline, size)))
        if not common:
            continue
        result = {"arm": arm, "size": size, "seeds": {}, "runs": {}}
        for seed in common:
            runs = [os.path.join(data.dir, a, size, f"seed-{seed}") for a in (arm, data.baseline)]
            try:
                ckpts = [rundir.resolve_checkpoint(run) for run in runs]
            except ConfigError as e:
                return {"error": str(e), "arm": arm, "size": size}
            for run, ckpt in zip(runs, ckpts, strict=True):
                own = os.path.abspath(run)
                if os.path.commonpath([os.path.abspath(ckpt), own]) != own:
                    return {
                        "error": f"checkpoint {ckpt!r} lies outside its run directory {run!r} "
                        "(where the run's config.yaml names its save), so it may not be the "
                        "model whose losses the report reads. Fix: restore the run's "
                        "checkpoints/ (sweep saves there), or rerun sweep",
                        "arm": arm,
                        "size": size,
                    }
            target = os.path.join(out_dir, "compare", f"seed-{seed}")
            cmd = [
                sys.executable, "-m", "megatron_gamma.cli", "compare", *ckpts,
                "--data-path", data.manifest["heldout"], "--output-dir", target, "--no-progress",
            ]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                return {"error": proc.stderr.strip()[-600:], "arm": arm, "size": size}
            with open(os.path.join(target, "compare.json"), encoding="utf-8") as f:
                result["runs"][seed] = json.load(f)
            with np.load(os.path.join(target, "tokens.npz")) as tok:
                result["seeds"][seed] = {
                    "delta": tok["delta_sym"],
                    "difficulty": tok["difficulty"],
                    "loss_a": -tok["logp_a"],
                    "loss_b": -tok["logp_b"],
                }
                result.setdefault("documents", tok["document"])
        return result
    return None


def _git_state() -> str:
    """``commit abc1234`` of the megatron-gamma checkout that made the report, with ``, dirty
    tree`` when it has uncommitted changes; ``not a git checkout`` otherwise."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head}" + (", dirty tree (uncommitted changes)" if dirty else ", clean tree")


def _machine() -> str:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    try:
        from importlib.metadata import version

        mcore = version("megatron-core")
    except Exception:  # noqa: BLE001 - version lookup only
        mcore = "unknown"
    return (
        f"{platform.system()} {platform.machine()}, {cpu_model()}, {os.cpu_count()} logical CPUs, "
        f"{gpu}; Python {platform.python_version()}, torch {torch.__version__}, "
        f"megatron-core {mcore}"
    )


def _wall_seconds(data: StudyData) -> tuple[float, int]:
    total, n = 0.0, 0
    for r in data.runs:
        path = os.path.join(data.dir, r["key"], "study-run.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                w = json.load(f).get("wall_seconds")
            if w:
                total += w
                n += 1
    return total, n


def _write_csv(path: str, rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    return path


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "as_dict"):
        return _jsonable(x.as_dict())
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


REPORT_TITLE = "measured reproduction report"
"""The end of a report's first line (``# Study `NAME`: measured reproduction report``)."""


def check_report_output(output: str) -> None:
    """Refuse a report path that would replace what ``report`` did not write: an existing file
    whose first line is not a report's title (an earlier report is replaced, as a rerun should),
    a directory or link, or a plots folder (``output`` without its extension) that is a file.

    Raises:
        ConfigError: naming the path, what is there, and the fix.
    """
    fix = "Fix: pass another --output (a new .md path), or remove it"
    if os.path.islink(output) or os.path.isdir(output):
        kind = "a link" if os.path.islink(output) else "a directory"
        raise ConfigError(f"output={output!r}: {kind}, not a report file. {fix}")
    if os.path.exists(output):
        with open(output, "rb") as f:
            first = f.readline(200).decode("utf-8", "replace").rstrip("\n")
        if not (first.startswith("# Study `") and first.endswith(REPORT_TITLE)):
            raise ConfigError(
                f"output={output!r}: exists and is not a report `megatron-gamma report` wrote "
                f"(its first line: {first!r}); report replaces only an earlier report. {fix}"
            )
    plots = os.path.splitext(output)[0]
    if os.path.lexists(plots) and not os.path.isdir(plots):
        raise ConfigError(
            f"output={output!r}: its plots folder {plots!r} exists and is not a directory. {fix}"
        )


def report(
    study_dir: str,
    output: Optional[str] = None,
    command: Optional[str] = None,
    note: Optional[str] = None,
) -> dict[str, str]:
    """Analyze a study directory and write the report.

    Args:
        study_dir: the sweep's ``--output-dir``.
        output: path of the Markdown report (default ``DIR/report.md``); plots and tables go
            into the folder of the same stem (``DIR/report/``).
        command: the command line to print in the report (default: reconstructed).
        note: free text placed under the header (e.g. how the machine was shared).

    Returns:
        {name: path} of every file written.

    Raises:
        ConfigError: an ``output`` that is not a report (:func:`check_report_output`, checked
            before anything is read), no ``study.json`` in ``study_dir`` or no finished run.
    """
    start = time.time()
    output = output or os.path.join(study_dir, "report.md")
    check_report_output(output)
    data = StudyData.from_dir(study_dir)
    if not data.finished:
        raise ConfigError(
            f"study_dir={study_dir!r}: no finished run. Fix: run (or finish) the sweep first"
        )
    out_dir = os.path.splitext(output)[0]
    os.makedirs(out_dir, exist_ok=True)
    rel = os.path.basename(out_dir)
    table, _ = loss_table(data)
    best_table = loss_table(data, "best")[0] if data.has_lr_grid else []
    fits = scaling_fits(data)
    grids = {"shared LR": gamma_grid(data)}
    if data.has_lr_grid:
        grids["best LR"] = gamma_grid(data, "best")
    mech = mechanisms(data)
    cmp = run_compare(data, out_dir)
    rows = verdicts(data, grids, cmp)
    files = {}
    files["scaling_plot"] = plots.plot_scaling(
        {
            a: {
                "sizes": f["n"],
                "mean": f["mean"],
                "std": [mean_std(list(data.losses(a, s).values()))[1] for s in f["sizes"]],
                "fit": f["fit"],
            }
            for a, f in fits.items()
            if f["sizes"]
        },
        os.path.join(out_dir, "loss_vs_size.png"),
    )
    files["gamma_plot"] = plots.plot_gamma(
        {f"{s} ({g['lr']})": g for grid in grids.values() for s, g in grid.items()},
        os.path.join(out_dir, "loss_vs_gamma.png"),
    )
    files["lr_plot"] = plots.plot_lr_grid(
        {s: {a: data.lr_grid(a, s) for a in data.arms} for s in data.sizes},
        os.path.join(out_dir, "loss_vs_lr.png"),
    )
    largest = {
        a: next((s for s in reversed(data.sizes) if f"{a}|{s}" in mech), None)
        for a in data.arms
        if "@gamma=" not in a
    }
    trajectories = {
        "saturation_plot": (
            "saturation",
            "saturated-token share (σ²(h) ≤ 10ε)",
            "RMSNorm saturation, mean over norms and seeds",
            None,
            True,
        ),
        "sink_plot": (
            "sink_share",
            "attention-sink share",
            "attention sink, mean over layers and seeds",
            uniform_sink_share(data.seq_length()),
            False,
        ),
        "stable_rank_plot": (
            "stable_rank",
            "stable rank",
            "stable rank, mean over the matrices every arm has and over seeds",
            None,
            False,
        ),
    }
    for name, (key, ylabel, title, ref, log_y) in trajectories.items():
        series = {f"{a} ({s})": mech[f"{a}|{s}"][key] for a, s in largest.items() if s}
        files[name] = plots.plot_trajectories(
            series,
            os.path.join(out_dir, f"{key}.png"),
            ylabel,
            title + " (largest size)",
            reference=ref,
            reference_label="uniform attention 1/(i+1)" if ref else "",
            log_y=log_y,
            threshold=None if ref is None else ref + SINK_MIN,
            threshold_label=f"uniform + {SINK_MIN:g}: a sink (claim 5's rule)",
        )
    files = {k: p for k, p in files.items() if p}
    for seed in (cmp or {}).get("runs", {}):
        png = os.path.join(out_dir, "compare", f"seed-{seed}", "delta_sym_by_difficulty.png")
        if os.path.isfile(png):
            files[f"delta_sym_plot_seed{seed}"] = png
    files["losses_csv"] = _write_csv(os.path.join(out_dir, LOSSES_CSV), table)
    files["runs_csv"] = _write_csv(
        os.path.join(out_dir, RUNS_CSV),
        [
            {
                k: r.get(k)
                for k in (
                    "key",
                    "arm",
                    "size",
                    "seed",
                    "params",
                    "non_embedding",
                    "tokens",
                    "train_iters",
                    "lr",
                    "lr_phase",
                    "finished",
                    "loss",
                )
            }
            for r in data.runs
        ],
    )
    summary = {
        "study": data.manifest["name"],
        "runs": len(data.runs),
        "finished": len(data.finished),
        "vocab_size": data.vocab_size,
        "unigram_loss": data.unigram_loss,
        "losses": table,
        "fits": {a: {k: v for k, v in f.items()} for a, f in fits.items()},
        "gamma_grid": grids["shared LR"],
        "gamma_grid_best_lr": grids.get("best LR", {}),
        "mechanisms": {
            k: {
                kk: vv
                for kk, vv in m.items()
                if kk not in ("saturation", "sink_share", "stable_rank", "condensation")
            }
            | {
                "series": {
                    kk: m[kk] for kk in ("saturation", "sink_share", "stable_rank", "condensation")
                }
            }
            for k, m in mech.items()
        },
        "losses_best_lr": best_table,
        "compare": {k: v for k, v in (cmp or {}).items() if k not in ("seeds", "documents")},
        "verdicts": [x.as_dict() for x in rows],
    }
    json_path = os.path.join(out_dir, "report.json")
    with atomic_open(json_path, "w", encoding="utf-8") as f:
        json.dump(_jsonable(summary), f, indent=1, ensure_ascii=False)
    files["json"] = json_path
    md = _markdown(
        data, table, best_table, fits, grids, mech, cmp, rows, files, rel, command, note, start
    )
    atomic_write_text(output, md)
    files["report"] = output
    return files


def _learned_bar(data: StudyData) -> str:
    """The line that says what loss an arm must beat to count as learned (the verdicts'
    not-learned check, :func:`~.verdicts.learned_bar`)."""
    bar = learned_bar(data)
    if bar is None:
        return "Whether the arms learned is not checked: the study records no vocabulary size."
    return (
        f"An arm has learned where its mean final validation loss is below {bar[1]}; a decided "
        "row, or a null credited to the scale, resting on one that has not is not measurable in "
        "these runs."
    )


def stable_rank_cell(entry: dict) -> str:
    """The Mechanisms table's stable-rank cell of a :func:`~.analysis.mechanisms` entry: first →
    min (its iteration) → final, min and final by claim 7's rule
    (:func:`~.analysis.rank_dip`: the min cross-fitted and the final the mean of the last 3
    points where 6 or more are logged after iteration 0); where the minimum reaches the last
    point, the trajectory is still falling there, so the cell says that neither a minimum nor a
    recovery was measured (the fall so far is only a lower bound on the dip); "n/a" with fewer
    than 3 points."""
    if "rank_first" not in entry:
        return "n/a"
    first, final = entry["rank_first"], entry["rank_final"]
    if entry["rank_rise"] is None:
        return (
            f"{first:.2f} → {final:.2f} (it {entry['rank_min_iteration']}): still falling at "
            "the last point, so no minimum and no recovery measured"
        )
    return f"{first:.2f} → {entry['rank_min']:.2f} (it {entry['rank_min_iteration']}) → {final:.2f}"


def _multiplicity(rows: list) -> str:
    """One paragraph on the family of calls the verdict table makes: how many of its rows are
    decided (reproduced or not reproduced), and the bounds on chance calls with no adjustment
    for multiplicity. A false "reproduced" needs a 95% interval to lie wholly beyond the margin
    while the effect is not: at most 2.5% per interval (one side), and a row that needs every
    part beyond it (an intersection-union test) is at most that too; a row that can be called
    two ways (:attr:`~.verdicts.Verdict.routes`: claims 1 and 3 across sizes or at each
    measured size) at most 2.5% per way (trial 13, finding 3: the paragraph said 2.5% for
    those too); over the rows, at most the sum (Bonferroni, which needs no independence: the
    rows share runs). A false "not
    reproduced" (any part on the other side) can take up to 2.5% per part of a row. The
    paragraph names what these bounds assume and the rows where they are not established
    (trial 11, finding 6: claim 7 at 5.5-90% false "reproduced" in simulations of a short
    logging interval's, few points' and a flat loss basin's biases; trial 13, finding 1: the
    best-LR rows, whose LRs one seed picked)."""
    n = len(rows)
    d = sum(v.verdict in (REPRODUCED, NOT_REPRODUCED) for v in rows)
    ways = sum(v.routes for v in rows)
    two = sum(v.routes > 1 for v in rows)
    twice = (
        f"; the {two} row{'s' if two > 1 else ''} of claims 1 and 3 over two or more sizes can "
        "be called two ways, across sizes or at each measured size, so at most 5%"
        if two
        else ""
    )
    return (
        f"The table has {n} rows and decides {d or 'none'} of them (reproduced or not "
        "reproduced), each row a 95% call with no adjustment for multiplicity. A row is called "
        "reproduced only where its interval (every interval it needs: each part's, or each "
        "size's for a row called at the measured sizes) lies beyond the margin, which an effect "
        f"no larger than the margin gives by chance at most 2.5% of the time per way{twice}; "
        f"over the table's k = {n} rows ({ways} ways) the chance of a false 'reproduced' "
        f"is at most {ways} · 2.5%, {min(1.0, 0.025 * ways):.0%} (a bound that holds although "
        "the rows share runs). A row of several parts is 'not reproduced' where any part is, so a "
        "false 'not reproduced' can take up to 2.5% per part. These bounds assume unbiased "
        "per-seed statistics of a contrast nothing else moves, and one look at the data. They "
        "are not established for the condensation rows (claim 7), whose dip depths are read at "
        "the logged iterations only (a dip shorter than the logging step is not seen), nor for "
        "the mechanism rows (claims 4, 5, 7 and 8) read at a shared LR, whose LR check bounds "
        "the loss penalty, not how much the diagnostic changes with the LR, nor fully for the "
        "best-LR rows, whose LRs were picked on one seed (a pick the other seeds refute leaves "
        "the row undecided, but a pick's error within its noise is not in the interval); and "
        "seeds added after a report, then judged again, are a second look that no file "
        "records. Read a "
        "decided row as one result at that level, not the table as a whole."
    )


def _markdown(
    data, table, best_table, fits, grids, mech, cmp, rows, files, rel, command, note, start
) -> str:
    m = data.manifest
    wall, n_wall = _wall_seconds(data)
    out = [f"# Study `{m['name']}`: {REPORT_TITLE}", ""]
    out += [
        "Made by `megatron-gamma report` from the run directories; every number below is "
        "measured, none is copied from the paper.",
        "",
        f"- sweep: `{m['sweep_command']}`",
        f"- report: `{command or 'megatron-gamma report ' + data.dir}`",
        f"- code: megatron-gamma {_git_state()} (the report's checkout)",
        f"- machine: {_machine()}",
        f"- runs: {len(data.finished)} of {len(data.runs)} finished; training wall time "
        f"{wall / 60:.1f} min summed over {n_wall} runs timed by this sweep (start-up included); "
        f"this report took {time.time() - start:.0f} s",
    ]
    if note:
        out += [f"- note: {note}"]
    out += [
        "",
        "## Verdicts",
        "",
        f"Pre-registered margin δ = {data.margin:g} nats. Intervals are 95% Student-t with their "
        "degrees of freedom (df) and unit of replication: seeds within a size (paired by seed), "
        "sizes across sizes (one per-size mean each, known no better than its seeds allow). "
        "*Inconclusive*: the interval includes both the claim and its negation, or there are "
        "too few seeds/sizes for an interval. *Not measurable at this scale*: the mechanism "
        "cannot act in models of these sizes. *Not measurable in these runs*: the runs do not "
        "show it (an arm that has not learned, a trajectory still falling at its last point: "
        "longer runs would measure it; no attention sink formed: larger models or longer runs "
        "might form one, not separated here).",
        "",
        _learned_bar(data),
        "",
        _multiplicity(rows),
        "",
    ]
    if not data.has_lr_grid:
        lr = f" ({data.shared_lr:g})" if data.shared_lr else ""
        out += [f"No LR grid in this study: every comparison is at the shared LR{lr}.", ""]
    out += ["| claim | LR | verdict | measured | rule |", "|---|---|---|---|---|"]
    for v in rows:
        out.append(f"| {v.claim} | {v.lr} | **{v.label()}** | {v.numbers} | {v.rule} |")
    out += [
        "",
        "## Runs",
        "",
        "| size | non-embedding params | total params | tokens | iterations |",
        "|---|---|---|---|---|",
    ]
    for size in data.sizes:
        r = next(r for r in data.runs if r["size"] == size)
        out.append(
            f"| {size} ({r['hidden_size']}×{r['num_layers']}) | {r['non_embedding']:,} | "
            f"{r['params']:,} | {r['tokens']:,} | {r['train_iters']} |"
        )
    out += [
        "",
        "Arms: "
        + "; ".join(
            f"`{a}` (γ={s['init_gamma']:g}, ε={s['norm_epsilon']:.0e}, gate {s['gated_attention']})"
            for a in data.arms
            for s in [data.settings(a)]
        ),
        "",
    ]
    out += [
        "## Final validation loss (held-out split)",
        "",
        "Mean ± sample sd over seeds; Δ = arm − baseline, paired by seed, with a 95% "
        "Student-t interval and its degrees of freedom (df = paired seeds − 1).",
        "",
        "| arm | size | seeds | loss | Δ vs baseline [95% CI] |",
        "|---|---|---|---|---|",
    ]
    for r in table:
        sd = f" ± {r['std']:.4f}" if r["std"] is not None else ""
        out.append(
            f"| {r['arm']} | {r['size']} | {r['seeds']} | {r['mean']:.4f}{sd} | "
            f"{r.get('diff_text', '')} |"
        )
    if best_table:
        out += [
            "",
            f"### LR grid (seed {data.select_seed})",
            "",
            "Final validation loss at each peak LR; **bold**: the arm's best.",
            "",
            "| arm | size | loss by LR |",
            "|---|---|---|",
        ]
        for arm in data.arms:
            for size in data.sizes:
                by_lr = data.lr_grid(arm, size)
                best = data.best_lr(arm, size)
                cells = [
                    f"**{x:g}: {by_lr[x]:.4f}**" if x == best else f"{x:g}: {by_lr[x]:.4f}"
                    for x in sorted(by_lr)
                ]
                if cells:
                    out.append(f"| {arm} | {size} | {', '.join(cells)} |")
        if files.get("lr_plot"):
            out += ["", f"![loss vs lr]({rel}/loss_vs_lr.png)"]
        out += [
            "",
            "### Each arm at its own best LR",
            "",
            f"Best LR chosen on seed {data.select_seed} (the LR grid, extended while its best "
            "LR lay on an edge), losses on the other seeds; Δ paired by seed. *edge*: the best "
            "LR is still the grid's smallest or largest, so the arm's own best LR is not known.",
            "",
            "| arm | size | best LR | seeds | loss | Δ vs baseline [95% CI] |",
            "|---|---|---|---|---|---|",
        ]
        for r in best_table:
            sd = f" ± {r['std']:.4f}" if r["std"] is not None else ""
            out.append(
                f"| {r['arm']} | {r['size']} | {r['lr']:g}{' (edge)' * bool(r['edge'])} | "
                f"{r['seeds']} | {r['mean']:.4f}{sd} "
                f"| {r.get('diff_text', '')} |"
            )
    out += [
        "",
        "## Scaling fits L(N) = E + A·N^(−α)",
        "",
        f"![loss vs size at the shared LR]({rel}/loss_vs_size.png)"
        if "scaling_plot" in files
        else "",
        "",
        "N = non-embedding parameters of the baseline arm (embedding and output layer "
        "excluded); fitted by least squares to the seed-mean final loss at the shared LR at "
        "each size (sizes as "
        "units: one point per size); ± is one standard error with df = sizes − 3. A fit is "
        "shown only where it is identified (more sizes than its 3 parameters, α strictly inside "
        "[0, 3]); a multiplier (the N at which the baseline's fit reaches the arm's seed-mean "
        "loss, over the arm's N; paper: about 1.44 for γ = 1 with both fixes) only where that "
        "loss lies within the baseline's measured losses (no extrapolation), and as a point "
        "estimate without an interval. Otherwise the reason is printed instead.",
        "",
        "| arm | fit | multiplier by size | loss rises with N |",
        "|---|---|---|---|",
    ]
    for arm, f in fits.items():
        fit: Optional[PowerLawFit] = f["fit"]
        text = (
            f"E {fit.e:.3f} ± {fmt(fit.e_err, 3)}, A {fit.a:.3g} ± {fit.a_err:.3g}, α "
            f"{fit.alpha:.3f} ± {fmt(fit.alpha_err, 3)} (df {fit.points - 3}), rms residual "
            f"{fit.rms_residual:.4f}"
            if fit is not None
            else f"not identified: {f['error']}"
        )
        rises = ", ".join(f["loss_rises"]) or "no"
        out.append(f"| {arm} | {text} | {multiplier_text(f) or '—'} | {rises} |")
    out += ["", "## Loss against γ", ""]
    if grids["shared LR"]:
        out.append(
            "Seed-mean loss over the seeds every γ value finished (matched seeds), at the shared "
            "LR and, with an LR grid, at each γ's own best LR (on the seeds other than the "
            "selection seed); the lowest mean is a point estimate, its neighbours' paired "
            "differences are in the verdict table (claim 6)."
        )
        for grid in grids.values():
            for size, g in grid.items():
                pts = ", ".join(
                    f"γ={x:g}: {y:.4f}" for x, y in zip(g["gamma"], g["mean"], strict=True)
                )
                seeds = "; ".join(f"γ={k:g} seeds {v}" for k, v in g["all_seeds"].items())
                best = f"; lowest at γ = {g['best']:g}" if g["best"] is not None else ""
                edges = f"; not bracketed: {'; '.join(g['edges'].values())}" if g["edges"] else ""
                out.append(
                    f"- {size}, {g['lr']} (matched seeds {g['seeds']}): {pts or 'none'}{best} "
                    f"({seeds}){edges}"
                )
        if "gamma_plot" in files:
            out += ["", f"![loss vs gamma]({rel}/loss_vs_gamma.png)"]
    else:
        out.append("No γ grid in this study.")
    out += [
        "",
        "## Mechanisms",
        "",
        f"From `--log-diagnostics-interval` (runs made since the diagnostics log at "
        f"initialization start at iteration 0; older runs at the first interval); every value "
        f"is a mean over the seeds of that arm and size, at the shared LR. "
        f"Uniform-attention sink share for sequence length "
        f"{data.seq_length()}: {uniform_sink_share(data.seq_length()):.4f}. "
        "The stable rank's min and final are read by claim 7's rule (one helper): where 6 or "
        "more points are logged after iteration 0 the final is the mean of the last 3 and the "
        "min is cross-fitted (the lowest even-indexed point's level read on its odd-indexed "
        "neighbours, and the reverse, averaged), so a flat noisy trajectory shows no recovery; "
        "single points with fewer; its iteration is the lowest logged point's.",
        "",
        "| arm | size | max saturated share | final saturated share | final sink share | "
        "stable rank first → min → final (mean over the matrices every arm has) |",
        "|---|---|---|---|---|---|",
    ]
    for key, e in mech.items():
        arm, size = key.split("|")
        rank = stable_rank_cell(e)
        out.append(
            f"| {arm} | {size} | {fmt(e.get('saturation_max'))} | "
            f"{fmt(e.get('saturation_final'))} | {fmt(e.get('sink_final'))} | {rank} |"
        )
    for name, title in (
        ("saturation_plot", "saturation"),
        ("sink_plot", "sink"),
        ("stable_rank_plot", "stable rank"),
    ):
        if name in files:
            out += ["", f"![{title}]({rel}/{os.path.basename(files[name])})"]
    out += ["", "## Δsym by token difficulty (held-out)", ""]
    if cmp and cmp.get("runs"):
        out.append(
            f"A = `{cmp['arm']}` (fixed in advance: γ = 1 with both fixes, else γ = 1), B = "
            f"`{data.baseline}`, size {cmp['size']}; Δsym = (p_A − p_B)/(p_A + p_B); one table "
            "per seed, binned by that seed's own difficulty (the two models' mean loss) with 95% "
            "intervals clustered by document. These tables describe one checkpoint pair each; "
            "their difficulty shares the pair's noise, so the verdict (claim 8) bins each seed "
            "by the other seeds' difficulty instead."
        )
        for seed, c in cmp["runs"].items():
            out += [
                "",
                f"Seed {seed}: {c['tokens']} tokens; mean loss A {c['a']['mean_loss']:.4f}, "
                f"B {c['b']['mean_loss']:.4f} (over these tokens, not those of the final "
                "validation loss above).",
                "",
                "| difficulty (nats) | tokens (documents) | mean Δsym [95% CI] | A better |",
                "|---|---|---|---|",
            ]
            for b in c["bins"]:
                df = f" (df {b['df']:.1f})" if b.get("df") is not None else ""  # by document
                iv = f" [{b['low']:+.4f}, {b['high']:+.4f}]{df}" if b.get("low") is not None else ""
                out.append(
                    f"| {b['lo']:.2f}–{b['hi']:.2f} | {b['count']} ({b.get('documents')}) | "
                    f"{b['mean_delta']:+.4f}{iv} | {b['a_better']:.1%} |"
                )
            out += ["", f"![delta sym]({rel}/compare/seed-{seed}/delta_sym_by_difficulty.png)"]
    else:
        out.append(f"Not measured: {cmp['error'] if cmp else concentration_missing(data)}.")
    out.append("")
    return "\n".join(out)
