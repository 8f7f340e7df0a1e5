"""The paper's study as one command: ``megatron-gamma sweep STUDY.yaml`` and ``report DIR``.

============  ======================================================================
module        what
============  ======================================================================
``spec``      the study file: schema, validation, the run plan (one resolved config per run)
``sweep``     data split + preprocessing, runs through ``pretrain``, resume, changed-study check
``slurm``     ``sweep --slurm``: one SLURM job array, a task per run
``rundir``    a run's losses and diagnostics by iteration (files read by megatron_gamma.rundir)
``fits``      scaling fit, effective-size multiplier, γ minimizer, seed-difference intervals
``analysis``  a study's finished runs: loss table, fits, γ grid, mechanism trajectories
``verdicts``  one row per claim of the paper: rule, numbers, verdict
``report``    Δsym (via ``compare``), the files: report.md, report.json, CSV, plots
``plots``     the report's PNG figures
============  ======================================================================
"""
