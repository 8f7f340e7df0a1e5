"""megatron_gamma.ops.rms_norm on both backends (compiled extension and pure-torch reference),
on CPU and, when present, CUDA, against an independent fp64 evaluation of the textbook formula
y = x / sqrt(mean(x^2) + eps) * w and its fp64 autograd gradients.

Error measure: max |out - ref| / max |ref| over the tensor, for y, dx and dweight.
Tolerances (about one unit in the last place of the output dtype; measured worst cases on CPU in
brackets): fp32 1e-6 [2e-7], bf16 8e-3 [3.6e-3], fp16 1e-3 [4.5e-4], fp64 1e-12.
Input scales: fp32 and bf16 (same exponent range) 1e-30, 1e-10, 1e-6, 1, 1e4; fp16 1e-4 (partly
subnormal), 1, 1e4 (at 1e-6 the true dx, about 1e5 * dy, overflows fp16's 65504).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import backend, rel_err

import megatron_gamma.ops as ops

TOL = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float64: 1e-12}
SCALES = {
    torch.float32: (1e-30, 1e-10, 1e-6, 1.0, 1e4),
    torch.bfloat16: (1e-30, 1e-10, 1e-6, 1.0, 1e4),
    torch.float16: (1e-4, 1.0, 1e4),
}
CASES = [(dtype, scale) for dtype, scales in SCALES.items() for scale in scales]
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
    ),
]
BACKENDS = ["reference", "extension"]


def fp64_reference(x, weight, eps, dy, zero_centered_gamma=False):
    """y, dx, dweight of the textbook formula, in fp64 from the (rounded) inputs."""
    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    gain = w64 + 1.0 if zero_centered_gamma else w64
    y = x64 / torch.sqrt(x64.square().mean(-1, keepdim=True) + eps) * gain
    y.backward(dy.double())
    return y.detach(), x64.grad, w64.grad


def run(x, weight, eps, dy, zero_centered_gamma=False):
    """y, dx, dweight from megatron_gamma.ops.rms_norm under the current backend."""
    x = x.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    y = ops.rms_norm(x, weight, eps, zero_centered_gamma)
    y.backward(dy)
    return y.detach(), x.grad, weight.grad


def make(rows, hidden, dtype, scale, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, hidden, generator=gen, dtype=torch.float64) * scale).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen, dtype=torch.float64)).to(dtype)
    dy = (0.1 * torch.randn(rows, hidden, generator=gen, dtype=torch.float64)).to(dtype)
    return x.to(device), w.to(device), dy.to(device)


def assert_matches_fp64(out, ref, dtype, what=""):
    for name, o, r in zip(("y", "dx", "dweight"), out, ref, strict=True):
        assert o.dtype == dtype, f"{what} {name} dtype {o.dtype}"
        err = rel_err(o, r)
        assert err <= TOL[dtype], f"{what} {name}: relative error {err:.3g} > {TOL[dtype]:g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
@pytest.mark.parametrize("dtype,scale", CASES)
def test_matches_fp64_across_scales(device, backend_name, eps, dtype, scale):
    x, w, dy = make(8, 1000, dtype, scale, device)
    with backend(backend_name, device):
        out = run(x, w, eps, dy)
    assert_matches_fp64(out, fp64_reference(x, w, eps, dy), dtype, f"scale {scale:g}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e20, 1e30])
def test_huge_rows_where_torch_rms_norm_returns_zero(device, backend_name, dtype, scale):
    """x^2 overflows fp32 above 1.8e19: F.rms_norm (fp32 accumulation) returns all zeros."""
    x, w, dy = make(8, 1000, dtype, scale, device)
    ref = fp64_reference(x, w, 1e-12, dy)
    naive = F.rms_norm(x, (x.shape[-1],), w, 1e-12)
    assert rel_err(naive, ref[0]) > 0.5  # garbage: (nearly) all zeros
    with backend(backend_name, device):
        out = run(x, w, 1e-12, dy)
    assert_matches_fp64(out, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_bf16_naive_in_dtype_formula_is_garbage_ours_is_not(device, backend_name):
    """The formula evaluated in bf16, x * rsqrt(mean(x^2) + eps), overflows x^2 at 1e20."""
    x, w, dy = make(8, 1000, torch.bfloat16, 1e20, device)
    ref = fp64_reference(x, w, 1e-12, dy)
    eps = torch.tensor(1e-12, dtype=torch.bfloat16, device=device)
    naive = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    assert naive.dtype == torch.bfloat16 and rel_err(naive, ref[0]) > 0.5
    with backend(backend_name, device):
        out = run(x, w, 1e-12, dy)
    assert_matches_fp64(out, ref, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_fp16_naive_in_dtype_formula_is_garbage_ours_is_not(device, backend_name):
    """In fp16, eps = 1e-12 rounds to 0 and x^2 underflows for |x| < 2.4e-4: inf/NaN."""
    x, w, dy = make(8, 1000, torch.float16, 1e-4, device)
    ref = fp64_reference(x, w, 1e-12, dy)
    eps = torch.tensor(1e-12, dtype=torch.float16, device=device)
    assert float(eps) == 0.0
    naive = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    assert not torch.isfinite(naive).all() or rel_err(naive, ref[0]) > 0.5
    with backend(backend_name, device):
        out = run(x, w, 1e-12, dy)
    assert_matches_fp64(out, ref, torch.float16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_zero_rows_give_zero_output_and_finite_gradients(device, backend_name, dtype):
    """An all-zero row (padding): y = 0 exactly, dx = dy * w / sqrt(eps), dweight finite."""
    eps = 1e-12
    x, w, dy = make(6, 257, dtype, 1.0, device)
    x[0] = 0
    x[3] = 0
    dy = dy * 1e-2  # dx = 1e6 * dy * w on zero rows must fit fp16
    with backend(backend_name, device):
        y, dx, dw = run(x, w, eps, dy)
    assert torch.all(y[0] == 0) and torch.all(y[3] == 0)
    assert torch.isfinite(dx).all() and torch.isfinite(dw).all()
    closed_form = dy[0].double() * w.double() / math.sqrt(eps)
    assert rel_err(dx[0], closed_form) <= TOL[dtype]
    assert_matches_fp64((y, dx, dw), fp64_reference(x, w, eps, dy), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [7, 1000, 4097, 16384])
def test_hidden_sizes(device, backend_name, dtype, hidden):
    x, w, dy = make(4, hidden, dtype, 1.0, device)
    with backend(backend_name, device):
        out = run(x, w, 1e-12, dy)
    assert_matches_fp64(out, fp64_reference(x, w, 1e-12, dy), dtype, f"hidden {hidden}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_centered_gamma(device, backend_name, dtype):
    """The stored weight is w - 1 (Transformer Engine convention); dweight is the same."""
    x, w, dy = make(8, 1000, dtype, 1e-3, device)
    stored = (0.1 * torch.randn(1000, dtype=torch.float64)).to(dtype).to(device)
    with backend(backend_name, device):
        out = run(x, stored, 1e-12, dy, zero_centered_gamma=True)
    assert_matches_fp64(out, fp64_reference(x, stored, 1e-12, dy, True), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous_inputs(device, backend_name, dtype):
    """Transposed x, strided weight, strided dy, and a 3-D (seq, batch, hidden) view: the same
    values as dense copies (bitwise for the extension, which copies to dense; the reference's
    reductions may sum in another order)."""
    x_t, _, _ = make(1000, 12, dtype, 1.0, device)
    x = x_t.t()  # (12, 1000), strides (1, 12)
    w = make(1, 2000, dtype, 1.0, device)[1][::2]
    dy = make(12, 2000, dtype, 1.0, device)[2][:, ::2]
    assert not (x.is_contiguous() or w.is_contiguous() or dy.is_contiguous())
    with backend(backend_name, device):
        out = run(x, w, 1e-12, dy)
        dense = run(x.contiguous(), w.contiguous(), 1e-12, dy.contiguous())
        x3 = x.reshape(3, 4, 1000).transpose(0, 1)
        y3 = ops.rms_norm(x3, w, 1e-12)
    assert_matches_fp64(out, fp64_reference(x, w, 1e-12, dy), dtype)
    tol = 0.0 if backend_name == "extension" else TOL[dtype]
    for a, b in zip(out, dense, strict=True):
        assert rel_err(a, b.double()) <= tol
    assert rel_err(y3, dense[0].reshape(3, 4, 1000).transpose(0, 1).double()) <= tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("zero_centered_gamma", [False, True])
@pytest.mark.parametrize("eps,scale", [(1e-5, 1.0), (1e-12, 1.0), (1e-5, 1e-3)])
def test_gradcheck_float64(device, backend_name, zero_centered_gamma, eps, scale):
    x, w, _ = make(3, 17, torch.float64, scale, device)
    if eps >= 1e-5:
        x[1] = 0  # an all-zero row: smooth on gradcheck's 1e-6 steps only when sqrt(eps) >> 1e-6
    with backend(backend_name, device):
        assert torch.autograd.gradcheck(
            lambda a, b: ops.rms_norm(a, b, eps, zero_centered_gamma),
            (x.requires_grad_(), w.requires_grad_()),
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_extension_agrees_with_reference(device, dtype):
    """Same contract, different summation order: within one unit in the last place."""
    x, w, dy = make(64, 1000, dtype, 1e-2, device)
    with backend("extension", device):
        ext = run(x, w, 1e-12, dy)
    with backend("reference", device):
        ref = run(x, w, 1e-12, dy)
    for name, a, b in zip(("y", "dx", "dweight"), ext, ref, strict=True):
        err = rel_err(a, b.double())
        assert err <= TOL[dtype], f"{name}: extension vs reference {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extension_opcheck(device, dtype):
    """Schema, fake kernel, autograd registration and AOT dispatch of the custom ops."""
    with backend("extension", device):
        x, w, dy = make(4, 64, dtype, 1.0, device)
        rstd = torch.ops.megatron_gamma.rms_norm_fwd(x, w, 1e-12, False)[1]
        torch.library.opcheck(
            torch.ops.megatron_gamma.rms_norm_fwd.default,
            (x.requires_grad_(), w.requires_grad_(), 1e-12, False),
        )
        torch.library.opcheck(
            torch.ops.megatron_gamma.rms_norm_bwd.default, (dy, x.detach(), w.detach(), rstd, True)
        )


@pytest.mark.parametrize("device", DEVICES)
def test_extension_traces_under_torch_compile(device, monkeypatch):
    """fullgraph torch.compile (aot_eager: dynamo + fake kernels + AOT autograd) matches eager."""
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    x, w, dy = make(8, 256, torch.float32, 1e-7, device)
    with backend("extension", device):
        eager = run(x, w, 1e-12, dy)
        torch._dynamo.reset()
        compiled = torch.compile(ops.rms_norm, backend="aot_eager", fullgraph=True)
        xc = x.clone().requires_grad_()
        wc = w.clone().requires_grad_()
        y = compiled(xc, wc, 1e-12)
        y.backward(dy)
    for a, b in zip(eager, (y.detach(), xc.grad, wc.grad), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(weight=torch.ones(9)), ValueError, "does not match the hidden size 8"),
        (dict(eps=0.0), ValueError, "eps=0.0 must be finite"),
        (dict(eps=float("nan")), ValueError, "eps=nan"),
        (dict(x=torch.ones(2, 8, dtype=torch.int32)), TypeError, "torch.int32"),
        (dict(x=torch.ones(())), ValueError, "no hidden dimension"),
    ],
)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_bad_arguments_raise_before_work(kwargs, error, match, backend_name):
    args = dict(x=torch.ones(2, 8), weight=torch.ones(8), eps=1e-12) | kwargs
    with backend(backend_name, "cpu"), pytest.raises(error, match=match):
        ops.rms_norm(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden", [1000, 4096])
def test_cuda_extension_agrees_with_cpu_extension(dtype, hidden):
    x, w, dy = make(64, hidden, dtype, 1e-2, "cpu")
    with backend("extension", "cuda"):
        gpu = run(x.cuda(), w.cuda(), 1e-12, dy.cuda())
    with backend("extension", "cpu"):
        cpu = run(x, w, 1e-12, dy)
    for name, a, b in zip(("y", "dx", "dweight"), gpu, cpu, strict=True):
        err = rel_err(a.cpu(), b.double())
        assert err <= TOL[dtype], f"{name}: CUDA vs CPU {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_fp16_gradient_overflows_exactly_where_fp64_exceeds_fp16_range(device, backend_name):
    """The documented fp16 contract: dx is +-inf where the fp64 gradient is >= 65520 (fp16's
    overflow threshold) and matches fp64 elsewhere; bf16 and fp32 stay finite on the same rows."""
    eps = 1e-12
    x, w, dy = make(16, 512, torch.float16, 1e-6, device, seed=3)  # RMS ~ 1e-6: dx ~ 7e4 * dy
    dy = dy * 10
    _, ref_dx, _ = fp64_reference(x, w, eps, dy)
    with backend(backend_name, device):
        _, dx, _ = run(x, w, eps, dy)
    big = ref_dx.abs() >= 65520
    clear = (ref_dx.abs() - 65520).abs() > 1e-3 * 65520  # not within rounding of the threshold
    assert 0 < int(big.sum()) < big.numel()
    assert torch.equal(torch.isinf(dx)[clear], big[clear])
    assert torch.equal(torch.sign(dx.double())[big & clear], torch.sign(ref_dx)[big & clear])
    finite = ~big & clear
    assert float(((dx.double() - ref_dx).abs()[finite]).max()) <= TOL[torch.float16] * 65504
    for dtype in (torch.bfloat16, torch.float32):
        with backend(backend_name, device):
            y, dx_wide, dw = run(x.to(dtype), w.to(dtype), eps, dy.to(dtype))
        assert torch.isfinite(dx_wide).all() and torch.isfinite(y).all(), dtype
        assert torch.isfinite(dw).all(), dtype
