"""Model construction: megatron-core GPTModel from layer specs, with gamma-init, our RMSNorm and
an SDPA core attention. No I/O and no process-group creation here."""
