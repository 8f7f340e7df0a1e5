"""The run directory and its checkpoints: the one room that knows their files.

A run directory, as ``pretrain`` writes it (Megatron-LM's checkpoint layout inside)::

    RUN/config.yaml                                   the resolved config (rewritten at start)
    RUN/metrics.jsonl                                 one JSON object per record
    RUN/metrics.superseded-N.jsonl                    an earlier run's, set aside at a restart
    RUN/tensorboard/                                  TensorBoard events
    RUN/tensorboard.superseded-N/                     an earlier run's, set aside at a fresh start
    RUN/init_audit.json                               the start-up init audit (--init-audit)
    RUN/init_audit.superseded-N.json                  an earlier run's, set aside at a fresh start
    RUN/analysis/                                     analyze's output (default --output-dir)
    RUN/analysis.superseded-N/                        an earlier one, set aside (fresh start, rerun)
    RUN/.run.lock                                     held (flock) by the live run
    RUN/checkpoints/iter_0000010/                     one complete torch_dist checkpoint (--save)
    RUN/checkpoints/latest_checkpointed_iteration.txt the tracker: newest complete iteration

``--save`` may lie anywhere (Megatron-LM users keep checkpoints apart from logs): every
checkpoint carries the resolved config and the tokenizer fingerprint in its common state, so a
bare ``iter_N`` directory describes itself; checkpoints written before that are described by
the ``config.yaml`` in or above them. A run directory's checkpoints are found where its
``config.yaml`` records ``save`` (:func:`~megatron_gamma.rundir.paths.run_save_dir`), then in
``RUN/checkpoints``.

- :mod:`~megatron_gamma.rundir.paths`: the file names, checkpoint directory names, and the
  checks of a path a command is given that read no checkpoint (a missing checkpoint, ``analyze``'s
  and ``evaluate``'s output directory, another run's directory that ``pretrain`` would take
  over); imports neither torch nor megatron-core, so the command line runs them first.
- :mod:`~megatron_gamma.rundir.layout`: the tracker, checkpoint discovery, the
  checkpoint's self-description, every read of a checkpoint's files
  (:func:`~megatron_gamma.rundir.layout.read_common`, :func:`~megatron_gamma.rundir.layout.
  read_state`) and the ``metrics.jsonl`` reader.
- :mod:`~megatron_gamma.rundir.loader`: the single-rank loader: the run's config for a
  checkpoint (``--config``, else the checkpoint's own, else ``config.yaml``), that config
  rebuilt for one process, the one-process megatron-core state, the model built with the
  run's vocabulary and the checkpoint's weights loaded into it (``analyze``, ``compare``,
  ``evaluate``, ``export-hf``, ``import-hf`` and training's weights-only loads).
- :mod:`~megatron_gamma.rundir.checkpoint`: one checkpoint and its run resolved for a single-rank
  read (``evaluate``, ``export-hf``), its failures as named errors.

Imports: ``atomic``, ``checkpoint_trust``, ``config``, ``data`` (tokenizer), ``model``,
``parallel``; never ``training``, ``diagnostics``, ``evaluation`` or ``study`` (they import this
room).
"""
