"""``megatron-gamma sweep --slurm``: a study as one SLURM job array, one task per unfinished run.

Rendered from ``megatron_gamma/launch/templates/study_array.sbatch.j2`` with the launch layer's
:func:`megatron_gamma.launch.slurm.render` and submitted with ``sbatch --parsable``. Before
submitting, the study's data are prepared on the submitting host and every run's
``study-config.yaml`` is written (so the tasks only train). Confirm runs (an arm at the best LR
of its grid) join a later array: rerun ``sweep --slurm`` once the grid runs have finished.

The script's header states the GPU-hours per arm: the estimator's training FLOPs
(:func:`~.sweep.sizing`) at :data:`ASSUMED_MFU` of :data:`ASSUMED_PEAK_TFLOPS`.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from megatron_gamma.launch.slurm import (
    ClusterOptions,
    Submission,
    check_log_dir,
    render,
    require_sbatch,
    sbatch,
    write_executable,
)
from megatron_gamma.parallel import _PEAK_BF16_TFLOPS
from megatron_gamma.study import rundir
from megatron_gamma.study.spec import Run, Study, StudyError, load_study, plan
from megatron_gamma.study.sweep import (
    check_data,
    check_data_unchanged,
    check_runs_unchanged,
    check_study_dir,
    pending_runs,
    prepare_data,
    sizing,
    write_manifest,
    write_run_files,
)

ASSUMED_MFU = 0.4
"""Model FLOPs utilization assumed for the GPU-hours of a plan (dense bf16 training)."""
ASSUMED_PEAK_TFLOPS = _PEAK_BF16_TFLOPS["H100"]
"""Dense bf16 peak assumed for the GPU-hours of a plan (H100/H200: 989 TFLOP/s)."""
MEASURED_MFU = 0.116
"""MFU measured for the 0.1B recipe (bf16, sequence 2048, micro-batch 8, local spec, no
Transformer Engine) on one H200 on 2026-12-04 (docs/gpu-acceptance.md): the plan's total is
also given at it, since small models run far below :data:`ASSUMED_MFU`."""


def gpu_hours(study: Study, todo: list[Run], runs: list[Run]) -> list[str]:
    """Header lines: GPU-hours per arm of the runs to do and of the pending confirm runs."""
    rate = ASSUMED_MFU * ASSUMED_PEAK_TFLOPS * 1e12 * 3600
    hours = {arm: [0.0, 0.0] for arm in study.arms}
    for run in todo:
        hours[run.arm][0] += sizing(run).flops / rate
    for _, run in pending_runs(study, runs):
        hours[run.arm][1] += sizing(run).flops / rate
    lines = [
        "GPU-hours per arm: training FLOPs per `megatron-gamma estimate` at an assumed "
        f"{ASSUMED_MFU:.0%} MFU",
        f"of {ASSUMED_PEAK_TFLOPS:g} TFLOP/s dense bf16 (start-up, evaluation, checkpoints not "
        "counted):",
    ]
    for arm, (now, later) in hours.items():
        lines.append(f"  {arm}: {now:,.2f}" + (f" (+ {later:,.2f} pending confirm)" * (later > 0)))
    total = sum(h[0] for h in hours.values())
    later = sum(h[1] for h in hours.values())
    lines.append(f"  total: {total:,.2f} GPU-hours in this array + {later:,.2f} pending")
    scale = ASSUMED_MFU / MEASURED_MFU
    lines.append(
        f"  at the {MEASURED_MFU:.1%} MFU measured for the 0.1B recipe on one H200 "
        f"(docs/gpu-acceptance.md): {scale * total:,.2f} + {scale * later:,.2f}"
    )
    if study.pending:
        lines.append(
            "confirm runs pending their LR grid: rerun `megatron-gamma sweep --slurm` once the "
            "grid runs have finished"
        )
    return lines


def submit_study(
    study_path: str,
    output_dir: str,
    options: ClusterOptions,
    gpus_per_node: int = 1,
    warning_seconds: int = 300,
    dry_run: bool = False,
    out: TextIO = sys.stdout,
) -> Submission:
    """Render (and unless ``dry_run`` submit) the study's job array.

    Args:
        study_path: the study YAML file.
        output_dir: the study directory (runs go to ``DIR/ARM/SIZE/seed-S``).
        options: partition, time limit, container.
        gpus_per_node: GPUs (= training processes, torchrun) per run.
        warning_seconds: SIGUSR1 this long before the time limit (checkpoint, requeue).
        dry_run: print-only: writes nothing, prepares no data, but checks them
            (:func:`~megatron_gamma.study.sweep.check_data`).
        out: progress messages.

    Returns:
        The script, its path ``DIR/slurm/study.sbatch`` and the array job id.

    Raises:
        StudyError: an ``output_dir`` a sweep cannot run in
            (:func:`~megatron_gamma.study.sweep.check_study_dir`), an invalid study, no run left
            to do, bad job settings, or (``dry_run``) data the sweep would refuse.
        SubmitError: ``output_dir`` holds ``%``, which SLURM would read as a pattern in the
            array's log path (:func:`~megatron_gamma.launch.slurm.check_log_dir`).
        StudyChangedError: an existing run directory with other settings, or changed data.
    """
    if gpus_per_node < 1 or warning_seconds < 1:
        raise StudyError(
            f"gpus_per_node={gpus_per_node}, warning_seconds={warning_seconds}: must be >= 1. "
            "Fix: pass --gpus-per-node 1 or more"
        )
    check_log_dir("output_dir", os.path.abspath(output_dir))  # the array's --output lies in it
    check_study_dir(output_dir)
    study = load_study(study_path)
    runs = plan(study, output_dir)
    note = check_runs_unchanged(runs)
    if dry_run:  # the sweep's data checks, writing nothing; else prepare_data runs them
        check_data(study, output_dir)
    else:
        check_data_unchanged(study, output_dir)
    if note:
        print(note, file=out, flush=True)
    todo = [r for r in runs if not rundir.is_finished(r.config.logging.run_dir, r.train_iters)]
    if not todo:
        raise StudyError(
            f"output_dir={output_dir!r}: every run of the study has finished. Fix: run "
            "`megatron-gamma report` on it"
        )
    slurm_dir = os.path.join(os.path.abspath(output_dir), "slurm")
    script = render(
        "study_array.sbatch.j2",
        job_name=f"mg-study-{study.name}",
        run_dirs=[r.config.logging.run_dir for r in todo],
        gpus_per_node=gpus_per_node,
        account=options.account,
        qos=options.qos,
        partition=options.partition,
        time=options.time,
        dependency=options.dependency,
        warning_seconds=warning_seconds,
        container_image=options.container_image,
        container_mounts=options.container_mounts,
        log_dir=slurm_dir,
        workdir=os.getcwd(),
        header=(
            f"study {study.name} ({study.path}): {len(todo)} of {len(runs)} runs left",
            *gpu_hours(study, todo, runs),
        ),
    )
    path = os.path.join(slurm_dir, "study.sbatch")
    result = Submission(path, script)
    if dry_run:
        return result
    require_sbatch()
    write_manifest(study, runs, output_dir, study_path)
    prepare_data(study, output_dir, out)
    for run in todo:
        write_run_files(run)
    os.makedirs(slurm_dir, exist_ok=True)
    write_executable(path, script)
    job_id = sbatch(path)
    result.job_ids.append(job_id)
    result.logs.append(os.path.join(slurm_dir, f"mg-study-{study.name}-{job_id}_*.out"))
    return result
