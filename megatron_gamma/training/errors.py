"""The errors a training run stops with that the command line reports without a traceback.
Imports nothing, so the command line can name them without importing torch."""


class NonFiniteLossError(RuntimeError):
    """A training iteration's loss or gradient norm was NaN or inf
    (``check_for_nan_in_loss_and_grad``); ``megatron-gamma pretrain`` exits 1 with its
    message."""
