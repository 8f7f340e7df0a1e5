"""The pretraining loop, checkpoints and telemetry (on megatron-core's schedules and optimizer)."""
