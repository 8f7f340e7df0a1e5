"""The GPT model (megatron_gamma.model.builder, gamma-init, RMSNorm eps = 1e-12) gives the same
loss and gradients with the compiled kernels as with the pure-torch fallback.

One forward/backward of a 2-layer model on a fixed batch per precision, both precisions in one
subprocess (single rank, gloo; megatron_gamma.parallel installs process-wide CPU shims that must
not leak into other tests).
Tolerances: loss relative difference <= 1e-6 (fp32) / 2e-3 (bf16); every parameter gradient
max |g_ext - g_ref| / max |g_ref| <= 1e-4 (fp32) / 5e-2 (bf16). Measured on CPU: fp32 loss
identical, bf16 loss and gradients bitwise identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import megatron_gamma.ops as ops

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import torch
from megatron_gamma import ops, parallel
from megatron_gamma.config import Config, ModelConfig, TrainingConfig
from megatron_gamma.model.builder import build_model_chunk, transformer_config

def config(precision):
    model = ModelConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, seq_length=32
    )
    training = TrainingConfig(micro_batch_size=2, global_batch_size=2, bf16=precision == "bf16")
    return Config(model=model, training=training)

parallel.initialize(config("fp32"))
try:
    assert ops.backend("cpu") == "extension", ops.extension_status()
    vocab = 256
    out = {}
    for precision in sys.argv[1:]:
        cfg = config(precision)
        model, _ = build_model_chunk(cfg, transformer_config(cfg, on_gpu=False), vocab)
        tokens = torch.randint(vocab, (2, 33), generator=torch.Generator().manual_seed(0))
        position_ids = torch.arange(32).expand(2, 32)
        runs = {}
        for name in ("extension", "reference"):
            model.zero_grad(set_to_none=True)
            with ops.use_backend(name):
                losses = model(tokens[:, :-1], position_ids, None, labels=tokens[:, 1:])
                loss = losses.float().mean()
                loss.backward()
            runs[name] = (loss.item(), {n: p.grad.double() for n, p in model.named_parameters()})
        (ext_loss, ext), (ref_loss, ref) = runs["extension"], runs["reference"]
        grad_err = {n: float((ext[n] - ref[n]).abs().max() / ref[n].abs().max()) for n in ref}
        out[precision] = {"ext_loss": ext_loss, "ref_loss": ref_loss, "grad_err": grad_err}
    print(json.dumps(out))
finally:
    parallel.destroy()
"""
PRECISIONS = {"fp32": (1e-6, 1e-4), "bf16": (2e-3, 5e-2)}


@pytest.fixture(scope="module")
def results() -> dict:
    """{precision: {"ext_loss", "ref_loss", "grad_err": {name: relative error}}} for every
    precision of PRECISIONS, from one subprocess."""
    if ops.backend("cpu") != "extension":
        pytest.skip(f"extension not built: {ops.extension_status()}")
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1", MEGATRON_GAMMA_OPS="auto")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *PRECISIONS],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "precision,loss_tol,grad_tol", [(p, *tols) for p, tols in PRECISIONS.items()]
)
def test_model_loss_same_with_extension_and_fallback(results, precision, loss_tol, grad_tol):
    result = results[precision]
    assert abs(result["ext_loss"] - result["ref_loss"]) <= loss_tol * abs(result["ref_loss"])
    assert len(result["grad_err"]) >= 10  # norms, attention, MLP, embeddings, output layer
    worst = max(result["grad_err"], key=result["grad_err"].get)
    assert result["grad_err"][worst] <= grad_tol, f"{worst}: {result['grad_err'][worst]:.3g}"
