"""megatron_gamma.ops.sigmoid_gate (gated attention, y = o * sigmoid(g)) on both backends, on
CPU and, when present, CUDA, against an fp64 closed form: sigmoid(g) = 1 / (1 + exp(-g)),
sigmoid'(g) = exp(-|g|) / (1 + exp(-|g|))^2.

Error measure: max |out - ref| / max |ref| for y, do and dg. Tolerances (about one unit in the
last place; measured worst cases on CPU in brackets): fp32 1e-6 [1.5e-7], bf16 8e-3, fp16 1e-3,
fp64 1e-12. Gates g ~ 4 * N(0, 1), so many are saturated.
"""

from __future__ import annotations

import pytest
import torch
from helpers import backend, rel_err

import megatron_gamma.ops as ops

TOL = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float64: 1e-12}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
    ),
]
BACKENDS = ["reference", "extension"]
# (seq, batch, heads, head_dim) with an odd head_dim and a long flat elementwise tail.
SHAPES = [(5, 3, 4, 64), (2, 1, 3, 129), (7, 1, 1, 5000)]


def fp64_reference(o, g, dy):
    """y, do, dg in fp64 closed form; headwise when g has one value per head."""
    o64, g64, dy64 = o.double(), g.double(), dy.double()
    e = torch.exp(-g64.abs())
    sig = torch.where(g64 >= 0, 1 / (1 + e), e / (1 + e))
    dsig = e / (1 + e) ** 2
    if g.shape != o.shape:
        sig, dsig = sig.unsqueeze(-1), dsig.unsqueeze(-1)
        return o64 * sig, dy64 * sig, (dy64 * o64 * dsig).sum(-1)
    return o64 * sig, dy64 * sig, dy64 * o64 * dsig


def run(o, g, dy):
    o = o.detach().clone().requires_grad_()
    g = g.detach().clone().requires_grad_()
    y = ops.sigmoid_gate(o, g)
    y.backward(dy)
    return y.detach(), o.grad, g.grad


def make(shape, dtype, device, headwise, seed=0):
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(shape, generator=gen, dtype=torch.float64)
    g = 4 * torch.randn(shape[:-1] if headwise else shape, generator=gen, dtype=torch.float64)
    dy = torch.randn(shape, generator=gen, dtype=torch.float64)
    return tuple(t.to(dtype).to(device) for t in (o, g, dy))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("headwise", [False, True], ids=["elementwise", "headwise"])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_fp64(device, backend_name, dtype, headwise, shape):
    o, g, dy = make(shape, dtype, device, headwise)
    with backend(backend_name, device):
        out = run(o, g, dy)
    for name, a, r in zip(("y", "do", "dg"), out, fp64_reference(o, g, dy), strict=True):
        assert a.dtype == dtype and a.shape == r.shape
        err = rel_err(a, r)
        assert err <= TOL[dtype], f"{name}: relative error {err:.3g} > {TOL[dtype]:g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_saturated_gate_keeps_relative_precision(device, backend_name):
    """fp32, |g| up to 80: each do and dg within 1e-5 relative of fp64 (sigmoid * (1 - sigmoid)
    would give dg = 0 for g > 17)."""
    g = torch.linspace(-80, 80, 321, dtype=torch.float64).to(torch.float32).to(device)
    o = torch.ones_like(g)
    dy = torch.ones_like(g)
    with backend(backend_name, device):
        y, d_o, d_g = run(o, g, dy)
    for a, r in zip((y, d_o, d_g), fp64_reference(o, g, dy), strict=True):
        assert float(((a.double() - r).abs() / r.abs()).max()) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("headwise", [False, True], ids=["elementwise", "headwise"])
def test_gradcheck_float64(device, backend_name, headwise):
    o, g, _ = make((2, 3, 4, 5), torch.float64, device, headwise)
    with backend(backend_name, device):
        assert torch.autograd.gradcheck(
            ops.sigmoid_gate, (o.requires_grad_(), (g / 4).requires_grad_())
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("headwise", [False, True], ids=["elementwise", "headwise"])
def test_non_contiguous_inputs(device, backend_name, headwise):
    """o and g as (seq, batch, heads, ...) views of (batch, seq, ...) storage, strided dy."""
    o, g, _ = make((3, 5, 4, 16), torch.float32, device, headwise)
    o, g = o.transpose(0, 1), g.transpose(0, 1)
    dy = make((5, 3, 4, 32), torch.float32, device, False)[2][..., ::2]
    assert not (o.is_contiguous() or g.is_contiguous() or dy.is_contiguous())
    with backend(backend_name, device):
        out = run(o, g, dy)
    for a, r in zip(out, fp64_reference(o, g, dy), strict=True):
        assert rel_err(a, r) <= TOL[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES + [torch.float64])
@pytest.mark.parametrize("headwise", [False, True], ids=["elementwise", "headwise"])
def test_extension_agrees_with_reference(device, dtype, headwise):
    o, g, dy = make((6, 2, 4, 128), dtype, device, headwise)
    with backend("extension", device):
        ext = run(o, g, dy)
    with backend("reference", device):
        ref = run(o, g, dy)
    for name, a, b in zip(("y", "do", "dg"), ext, ref, strict=True):
        err = rel_err(a, b.double())
        assert err <= TOL[dtype], f"{name}: extension vs reference {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("headwise", [False, True], ids=["elementwise", "headwise"])
def test_extension_opcheck(device, headwise):
    """Schema, fake kernel, autograd registration and AOT dispatch of the custom ops."""
    with backend("extension", device):
        o, g, dy = make((3, 2, 4, 8), torch.bfloat16, device, headwise)
        torch.library.opcheck(
            torch.ops.megatron_gamma.sigmoid_gate_fwd.default,
            (o.requires_grad_(), g.requires_grad_()),
        )
        torch.library.opcheck(
            torch.ops.megatron_gamma.sigmoid_gate_bwd.default, (dy, o.detach(), g.detach())
        )


@pytest.mark.parametrize("device", DEVICES)
def test_extension_traces_under_torch_compile(device, monkeypatch):
    """fullgraph torch.compile (aot_eager) of a headwise and an elementwise gate matches eager."""
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    o, g, dy = make((4, 2, 3, 16), torch.float32, device, False)
    gh = make((4, 2, 3, 16), torch.float32, device, True)[1]

    def both(o, g, gh):
        return ops.sigmoid_gate(ops.sigmoid_gate(o, g), gh)

    with backend("extension", device):
        torch._dynamo.reset()
        compiled = torch.compile(both, backend="aot_eager", fullgraph=True)
        leaves = [t.clone().requires_grad_() for t in (o, g, gh)]
        compiled(*leaves).backward(dy)
        leaves_eager = [t.clone().requires_grad_() for t in (o, g, gh)]
        both(*leaves_eager).backward(dy)
    for a, b in zip(leaves, leaves_eager, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


@pytest.mark.parametrize(
    "g,error,match",
    [
        (torch.zeros(2, 3, 5), ValueError, "fits neither o"),
        (torch.zeros(2, 3, 4, dtype=torch.float64), TypeError, "differs from o dtype"),
    ],
)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_bad_arguments_raise_before_work(g, error, match, backend_name):
    with backend(backend_name, "cpu"), pytest.raises(error, match=match):
        ops.sigmoid_gate(torch.zeros(2, 3, 4), g)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("headwise", [False, True], ids=["elementwise", "headwise"])
def test_cuda_extension_agrees_with_cpu_extension(dtype, headwise):
    o, g, dy = make((6, 2, 4, 128), dtype, "cpu", headwise)
    with backend("extension", "cuda"):
        gpu = run(o.cuda(), g.cuda(), dy.cuda())
    with backend("extension", "cpu"):
        cpu = run(o, g, dy)
    for name, a, b in zip(("y", "do", "dg"), gpu, cpu, strict=True):
        err = rel_err(a.cpu(), b.double())
        assert err <= TOL[dtype], f"{name}: CUDA vs CPU {err:.3g}"
