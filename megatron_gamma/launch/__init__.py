"""Cluster launch: sbatch scripts rendered from Jinja2 templates (``templates/``) and submitted
with ``sbatch``. See :mod:`megatron_gamma.launch.slurm` and docs/cluster.md."""
