"""A counter-based normal generator: the value of element i of a tensor is a pure function of
(seed, tensor name, i), so any shard of any layout is drawn on its own, with O(shard) work.

Source: the counter-based idea of Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3"
(SC 2011; Philox, the generator behind ``torch.cuda``'s RNG), with SplitMix64 (Steele, Lea and
Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014) as the keyed integer hash
and the Box-Muller transform (Box and Muller, 1958) for the normal. Used by
:func:`megatron_gamma.model.init.apply_gamma_init` (issue 18, item 2).

Algorithm, for a tensor of global shape (rows, cols) and global flat index i = row * cols + col,
with counter j = i // 2 (a pair of elements shares one hash, as Box-Muller gives two normals):

1. key = SplitMix64(SplitMix64(seed) XOR h), with h the first 8 bytes of SHA-256 of the name;
2. x = SplitMix64's finalizer of key + (j + 1) * 0x9E3779B97F4A7C15 (mod 2^64);
3. u1 = n / 2^32 with n = (x >> 32) + 1 in [1, 2^32]; the angle word w = x mod 2^32;
4. ln u1 = (e - 32) ln 2 + 2 atanh(s): n = m 2^e exactly with m in [sqrt(1/2), sqrt(2)),
   s = (m - 1) / (m + 1), atanh(s) / s summed to s^20 (|s| <= 0.172: truncation < 1e-18);
5. the angle 2 pi w / 2^32 = q pi / 2 + a, with the quadrant q and the remainder
   a = (w - q 2^30) (pi / 2) / 2^30 in [-pi/4, pi/4) split exactly in integers; cos a and
   sin a by their Taylor series to a^16 and a^15 (truncation < 1e-16), then rotated by q;
6. z = (sqrt(-2 ln u1) * (cos if i is even else sin)) * sigma in float64, rounded once to
   float32.

|z| / sigma is at most sqrt(64 ln 2) = 6.66 (u1 = 2^-32): the normal is truncated at 6.66
standard deviations, a tail of probability 2.7e-11.

Steps 4-6 use only IEEE-754 basic operations (+, -, *, /, sqrt, each correctly rounded on every
CPU and GPU, no fused multiply-add) in one fixed order, written twice: in torch here (GPUs, and
CPUs without the extension) and in C++ (``csrc/init_cpu.cpp``, the CPU path when the extension
is built: ``torch.ops.megatron_gamma.counter_normal_``).

Contract:

* **Layout independence.** An element's value does not depend on which rank computes it, the
  shard's shape, the chunking or the other elements: the same (seed, name, global index) gives
  the same float32 bits. TP/PP/VPP/EP/ETP layouts therefore hold bit-identical weights.
* **Device independence.** The C++ kernel and the torch implementation give the same bits on a
  CPU (tested); on CUDA the torch implementation runs the same correctly rounded operations, so
  CPU and GPU weights are the same bits by construction; verified on an H200 (torch 2.11, CUDA
  13) against the C++ kernel on six tensors, whole, sharded, SwiGLU halves, 1-D and bf16
  (``tools/gpu_acceptance.py``'s init-parity step, docs/gpu-acceptance.md). Against exact
  arithmetic (fp64 ``math.log``/``cos``/``sin`` in the tests) every value is within one float32
  ulp.
* **Work and memory.** O(shard) operations. The C++ kernel's working set is 16 KiB per thread;
  the torch implementation's a few float64 / int64 arrays of at most ``chunk`` elements
  (:data:`CHUNK` per CPU thread, :data:`CUDA_CHUNK` on a GPU). No tensor of the global size is
  allocated.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch

from megatron_gamma import ops

CHUNK = 1 << 16
"""Elements drawn per step and CPU thread: a working set of ~40 bytes per element (~2.5 MiB per
thread) that stays in cache (on one thread 2-4x faster than steps of 2^20, measured)."""

CUDA_CHUNK = 1 << 22
"""Elements drawn per step on a GPU (~160 MiB working set; few kernel launches per shard)."""

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
_MANTISSA = (1 << 52) - 1
_SQRT2_MANTISSA = 0x6A09E667F3BCD
LN2 = 0.6931471805599453
"""ln 2 rounded to float64."""
ANGLE_UNIT = math.pi / 2**31
"""(pi / 2) / 2^30: radians per unit of the angle remainder (step 5)."""
_LOG_SERIES = [1 / k for k in range(21, 0, -2)]
_SIN_SERIES = [(-1) ** (k // 2) / math.factorial(k) for k in range(15, 2, -2)]
_COS_SERIES = [(-1) ** (k // 2) / math.factorial(k) for k in range(16, 1, -2)]


def _signed(x: int) -> int:
    """The int64 with the same 64 bits as the unsigned ``x``."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _splitmix64_int(x: int) -> int:
    """SplitMix64's finalizer on a Python int (unsigned 64-bit)."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * _MUL1) & _MASK64
    x = ((x ^ (x >> 27)) * _MUL2) & _MASK64
    return x ^ (x >> 31)


def stream_key(seed: int, name: str) -> int:
    """The 64-bit key (as a signed int64) of tensor ``name`` under ``seed``.

    Raises:
        ValueError: a negative seed.
    """
    if seed < 0:
        raise ValueError(f"seed={seed}: must be >= 0. Fix: pass a non-negative --seed")
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return _signed(_splitmix64_int(_splitmix64_int(seed) ^ h))


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 tensors, in place (wrapping multiplication)."""
    x ^= _shr(x, 30)
    x *= _signed(_MUL1)
    x ^= _shr(x, 27)
    x *= _signed(_MUL2)
    x ^= _shr(x, 31)
    return x


def _horner(z: torch.Tensor, coefficients: Sequence[float]) -> torch.Tensor:
    """c0 z^k + c1 z^(k-1) + ... + ck, by Horner's rule (one multiply and one add per step)."""
    p = torch.full_like(z, coefficients[0])
    for c in coefficients[1:]:
        p.mul_(z).add_(c)
    return p


def _log_u1(n: torch.Tensor) -> torch.Tensor:
    """ln(n / 2^32) in float64 for int64 ``n`` in [1, 2^32] (step 4 of the algorithm)."""
    bits = n.to(torch.float64).view(torch.int64)
    mantissa = bits & _MANTISSA
    big = (mantissa >= _SQRT2_MANTISSA).to(torch.int64)
    m = (mantissa | ((1023 - big) << 52)).view(torch.float64)
    e = ((bits >> 52) + big - (1023 + 32)).to(torch.float64)
    f = m - 1.0
    s = f / (f + 2.0)
    return e.mul_(LN2).add_((s + s).mul_(_horner(s * s, _LOG_SERIES)))


def _polar(pair: torch.Tensor, key: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Box-Muller radius sqrt(-2 ln u1), cos and sin of the angle (float64) of counter
    ``pair`` (steps 2-5 of the algorithm)."""
    x = (pair + 1) * _signed(_GOLDEN)
    x += key
    _mix(x)
    radius = _log_u1(_shr(x, 32).add_(1)).mul_(-2.0).sqrt_()
    shifted = (x + (1 << 29)) & 0xFFFFFFFF
    q = shifted >> 30
    a = ((shifted & ((1 << 30) - 1)) - (1 << 29)).to(torch.float64).mul_(ANGLE_UNIT)
    z = a * a
    sin_a = a + (a * z).mul_(_horner(z, _SIN_SERIES))
    cos_a = _horner(z, _COS_SERIES).mul_(z).add_(1.0)
    odd = (q & 1).bool()
    cos = torch.where(odd, sin_a, cos_a)
    sin = torch.where(odd, cos_a, sin_a)
    cos = torch.where(((q + 1) & 2).bool(), -cos, cos)
    sin = torch.where((q & 2).bool(), -sin, sin)
    return radius, cos, sin


def normal_at(index: torch.Tensor, key: int, sigma: float) -> torch.Tensor:
    """N(0, sigma^2) float32 values at global flat indices ``index`` of the stream ``key``:
    element i is the cosine (i even) or sine (i odd) Box-Muller normal of counter i // 2.

    Args:
        index: int64 tensor of any shape, values >= 0 (global flat element indices); the result
            has its shape and device.
        key: :func:`stream_key` of the tensor.
        sigma: standard deviation.

    Raises:
        TypeError: ``index`` is not int64.
    """
    if index.dtype != torch.int64:
        raise TypeError(f"index.dtype={index.dtype}: must be torch.int64. Fix: index.long()")
    radius, cos, sin = _polar(index >> 1, key)
    return radius.mul_(torch.where((index & 1).bool(), sin, cos)).mul_(sigma).to(torch.float32)


def _normal_run(start: int, rows: int, width: int, stride: int, key: int, sigma: float, device):
    """float32 values of ``rows`` runs of ``width`` consecutive global indices, run k starting
    at ``start + k * stride``: as :func:`normal_at`, computing each counter once (both normals
    of a pair) when every run starts at an even index and has an even width."""
    base = torch.arange(rows, device=device).mul_(stride).add_(start).unsqueeze(1)
    if start % 2 or stride % 2 or width % 2:
        return normal_at(base + torch.arange(width, device=device), key, sigma)
    pairs = (base >> 1) + torch.arange(width // 2, device=device)
    radius, cos, sin = _polar(pairs, key)
    out = torch.stack((cos, sin), dim=-1).mul_(radius.unsqueeze(-1))
    return out.mul_(sigma).to(torch.float32).view(rows, width)


def _fill_rows_kernel(block: torch.Tensor, first: int, stride: int, key: int, sigma: float):
    """Fill ``block`` (rows, width), row r holding global indices first + r * stride + [0,
    width), with the C++ kernel ``counter_normal_``; whole rows are one run."""
    if block.shape[1] == stride:
        block, stride = block.view(1, -1), block.numel()
    torch.ops.megatron_gamma.counter_normal_(block, first, stride, key, sigma)


def _fill_rows_torch(
    block: torch.Tensor, first: int, stride: int, key: int, sigma: float, chunk: int
):
    """:func:`_fill_rows_kernel` with the torch implementation, about ``chunk`` elements per
    step."""
    rows, width = block.shape
    step = max(1, chunk // max(width, 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        values = _normal_run(first + r0 * stride, r1 - r0, width, stride, key, sigma, block.device)
        block[r0:r1].copy_(values)


def _ranges(size: int, parts: int, rank: int, halves: bool) -> list[tuple[int, int]]:
    """Global [start, stop) index ranges along a dimension of ``size`` held by ``rank`` of
    ``parts`` contiguous shards (each half sharded on its own when ``halves``)."""
    if not halves:
        step = size // parts
        return [(rank * step, (rank + 1) * step)]
    half = size // 2
    step = half // parts
    return [(h * half + rank * step, h * half + (rank + 1) * step) for h in (0, 1)]


@torch.no_grad()
def fill_shard_normal_(
    out: torch.Tensor,
    global_shape: Sequence[int],
    key: int,
    sigma: float,
    partition_dim: int | None = None,
    parts: int = 1,
    rank: int = 0,
    halves: bool = False,
    chunk: int | None = None,
) -> torch.Tensor:
    """Fill ``out``, rank ``rank``'s shard of a global (rows, cols) or (rows,) tensor, with the
    tensor's N(0, sigma^2) values, in place, on ``out``'s device; returns ``out``.

    The shard is as megatron-core's tensor parallelism cuts it: ``parts`` contiguous equal
    chunks along ``partition_dim`` (or the whole tensor for None); with ``halves`` (SwiGLU fc1,
    ``[gate; up]``) each half of dimension 0 is chunked on its own and the rank holds
    ``[gate_shard; up_shard]``.

    Args:
        out: the local shard, float32/bfloat16/float16, contiguous, on any device.
        global_shape: unsharded shape, 1 or 2 dimensions.
        key: :func:`stream_key` of the tensor.
        sigma: standard deviation.
        partition_dim: sharded dimension (0 or 1) or None.
        parts, rank: shard count and this shard's index along ``partition_dim``.
        halves: shard each half of dimension 0 separately (requires ``partition_dim`` 0).
        chunk: elements drawn per step by the torch implementation (working-set bound); default
            :data:`CHUNK` x the CPU threads on CPU, :data:`CUDA_CHUNK` on a GPU. The C++ kernel
            (CPU, extension built; ``MEGATRON_GAMMA_OPS=reference`` turns it off) steps by 4K
            elements over ``torch.get_num_threads()`` threads.

    Raises:
        ValueError: a shape that the sharding does not produce, or unsupported arguments.
    """
    shape = tuple(int(s) for s in global_shape)
    if len(shape) not in (1, 2):
        raise ValueError(f"global_shape={shape}: 1 or 2 dimensions supported")
    if halves and partition_dim != 0:
        raise ValueError(f"halves=True with partition_dim={partition_dim}: halves split dim 0")
    rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (shape[0], 1)
    row_ranges, col_ranges = [(0, rows)], [(0, cols)]
    if partition_dim is not None and parts > 1:
        if not 0 <= rank < parts:
            raise ValueError(f"rank={rank}: must be in [0, {parts})")
        size = shape[partition_dim]
        if size % (parts * (2 if halves else 1)):
            raise ValueError(
                f"global_shape={shape}: dim {partition_dim} not divisible into {parts} shards"
                + (" per half" if halves else "")
            )
        if partition_dim == 0:
            row_ranges = _ranges(rows, parts, rank, halves)
        else:
            col_ranges = _ranges(cols, parts, rank, False)
    local_cols = col_ranges[0][1] - col_ranges[0][0]
    local_rows = sum(b - a for a, b in row_ranges)
    expected = (local_rows, local_cols) if len(shape) == 2 else (local_rows,)
    if tuple(out.shape) != expected or not out.is_contiguous():
        raise ValueError(
            f"out.shape={tuple(out.shape)}: rank {rank} of {parts} along dim {partition_dim} "
            f"of {shape} holds {expected} (contiguous)"
        )
    flat = out.view(-1)
    kernel = ops.uses_cpu_kernels(out.device)
    if chunk is None:
        chunk = CHUNK * torch.get_num_threads() if out.device.type == "cpu" else CUDA_CHUNK
    col0, pos = col_ranges[0][0], 0
    for start, stop in row_ranges:
        block = flat[pos : pos + (stop - start) * local_cols].view(stop - start, local_cols)
        pos += block.numel()
        if kernel:
            _fill_rows_kernel(block, start * cols + col0, cols, key, sigma)
        else:
            _fill_rows_torch(block, start * cols + col0, cols, key, sigma, chunk)
    return out
