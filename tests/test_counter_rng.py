"""The counter-based normal generator of the gamma-init (megatron_gamma.model.counter_rng)."""

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from scipy import stats

from megatron_gamma import ops
from megatron_gamma.model.counter_rng import fill_shard_normal_, normal_at, stream_key

M64 = (1 << 64) - 1


def _reference(seed: int, name: str, index: int, sigma: float) -> float:
    """Independent fp64 reference in pure Python: SplitMix64 (Steele et al. 2014) on unsigned
    ints, the key and counter of the module's docstring, Box-Muller with math.log / math.cos."""
    import hashlib

    def finalize(x):
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
        return x ^ (x >> 31)

    def splitmix(x):
        return finalize((x + 0x9E3779B97F4A7C15) & M64)

    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    key = splitmix(splitmix(seed) ^ h)
    x = finalize((key + (index // 2 + 1) * 0x9E3779B97F4A7C15) & M64)
    u1 = ((x >> 32) + 1) / 2**32
    u2 = (x & 0xFFFFFFFF) / 2**32
    trig = math.sin if index % 2 else math.cos
    return math.sqrt(-2 * math.log(u1)) * trig(2 * math.pi * u2) * sigma


def test_values_match_an_independent_python_reference_within_one_float32_ulp():
    """The series and exact range reductions of the algorithm against math.log/cos/sin in fp64
    on 20,000 random counters (every quadrant, u1 from 2^-32 to 1) and fixed corner indices."""
    name = "decoder.layers.3.mlp.linear_fc1.weight"
    fixed = torch.tensor([0, 1, 2, 3, 12345, 2**31 + 7, 2**40 + 3, 2**52 - 1])
    index = torch.cat([fixed, torch.randint(0, 2**50, (20000,), generator=torch.Generator())])
    got = normal_at(index, stream_key(1234, name), 0.02)
    for i, value in zip(index.tolist(), got.tolist(), strict=True):
        ref = _reference(1234, name, i, 0.02)
        ulp = abs(float(np.spacing(np.float32(ref))))
        assert abs(value - ref) <= ulp, (i, value, ref)


def _fill(backend: str, dtype, shape, dim, parts, rank, halves):
    local = list(shape)
    if dim is not None:
        local[dim] //= parts
    out = torch.empty(local, dtype=dtype)
    with ops.use_backend(backend):
        return fill_shard_normal_(out, shape, stream_key(5, "w"), 0.02, dim, parts, rank, halves)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize(
    "shape,dim,parts,rank,halves",
    [
        ((64, 4099), None, 1, 0, False),  # one run of odd length, several 4K-element tasks
        ((64, 999), 1, 3, 1, False),  # odd width and odd first column
        ((66, 1002), 0, 3, 2, True),  # SwiGLU halves
        ((5001,), None, 1, 0, False),  # 1-D
    ],
)
def test_the_cpu_kernel_and_the_torch_implementation_give_the_same_bits(
    dtype, shape, dim, parts, rank, halves
):
    """csrc/init_cpu.cpp's counter_normal_ (vectorized, IEEE basic operations only) equals the
    torch implementation (the GPU path) bit for bit, in every parameter dtype and at pair
    boundaries that an odd start or width splits."""
    if ops.backend("cpu") != "extension":
        pytest.skip(f"extension not built: {ops.extension_status()}")
    want = _fill("reference", dtype, shape, dim, parts, rank, halves)
    got = _fill("extension", dtype, shape, dim, parts, rank, halves)
    assert torch.equal(got, want)
    assert got.float().std().item() == pytest.approx(0.02, rel=0.05)


def test_a_million_draws_are_standard_normal():
    """Moments against the closed form (mean 0, sd 1, skewness 0, kurtosis 3) within four
    standard errors, the 3-sigma tail mass 2 (1 - Phi(3)), and a Kolmogorov-Smirnov test."""
    n = 1_000_000
    z = normal_at(torch.arange(n), stream_key(7, "w"), 1.0).double().numpy()
    assert abs(z.mean()) < 4 / math.sqrt(n)
    assert abs(z.std() - 1) < 4 * math.sqrt(0.5 / n)
    assert abs(stats.skew(z)) < 4 * math.sqrt(6 / n)
    assert abs(stats.kurtosis(z, fisher=False) - 3) < 4 * math.sqrt(24 / n)
    tail = 2 * stats.norm.sf(3.0)
    assert abs((np.abs(z) > 3).mean() - tail) < 4 * math.sqrt(tail / n)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    # Different names and seeds give uncorrelated streams.
    other = normal_at(torch.arange(n), stream_key(7, "v"), 1.0).double().numpy()
    reseeded = normal_at(torch.arange(n), stream_key(8, "w"), 1.0).double().numpy()
    assert abs(np.corrcoef(z, other)[0, 1]) < 4 / math.sqrt(n)
    assert abs(np.corrcoef(z, reseeded)[0, 1]) < 4 / math.sqrt(n)


@pytest.mark.parametrize("parts", [1, 2, 4, 8])
@pytest.mark.parametrize(
    "dim,halves",
    [(0, False), (1, False), (0, True), (None, False)],
    ids=["rows", "cols", "glu", "whole"],
)
def test_shards_reassemble_the_global_tensor_bit_for_bit(parts, dim, halves):
    """Each rank's shard equals the global tensor cut the way megatron-core cuts it (torch.chunk
    along the partition dim; SwiGLU fc1 per half), at any chunk size."""
    shape, key, sigma = (48, 40), stream_key(3, "p"), 0.125
    full = normal_at(torch.arange(48 * 40).view(shape), key, sigma)
    for rank in range(parts if dim is not None else 1):
        if dim is None:
            want = full
        elif halves:
            want = torch.cat([h.chunk(parts, dim=0)[rank] for h in full.chunk(2, dim=0)])
        else:
            want = full.chunk(parts, dim=dim)[rank]
        for chunk in (7, 40, 1 << 16):
            out = torch.empty_like(want)
            fill_shard_normal_(out, shape, key, sigma, dim, parts, rank, halves, chunk=chunk)
            assert torch.equal(out, want), (rank, chunk)


def test_bad_shapes_and_arguments_are_named():
    key = stream_key(0, "p")
    with pytest.raises(ValueError, match=r"out.shape=\(4, 4\).*holds \(4, 2\)"):
        fill_shard_normal_(torch.empty(4, 4), (4, 8), key, 1.0, 1, 4, 0)
    with pytest.raises(ValueError, match="not divisible into 3 shards per half"):
        fill_shard_normal_(torch.empty(2, 4), (9, 4), key, 1.0, 0, 3, 0, halves=True)
    with pytest.raises(ValueError, match="halves split dim 0"):
        fill_shard_normal_(torch.empty(4, 4), (4, 8), key, 1.0, 1, 2, 0, halves=True)
    with pytest.raises(ValueError, match="seed=-1"):
        stream_key(-1, "p")
    with pytest.raises(TypeError, match="int64"):
        normal_at(torch.arange(4, dtype=torch.int32), key, 1.0)


_PEAK = textwrap.dedent(
    """
    import resource, sys, torch
    from megatron_gamma.model.counter_rng import fill_shard_normal_, normal_at, stream_key
    rows, cols, parts, rank = 1 << 20, 1 << 14, 4096, 4000  # global: 2^34 fp32 = 64 GiB
    key = stream_key(1, "huge")
    out = torch.empty(rows // parts, cols)
    out.zero_()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fill_shard_normal_(out, (rows, cols), key, 0.01, 0, parts, rank)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    end = (rank + 1) * (rows // parts) * cols
    last = torch.arange(end - 5, end)
    ok = torch.equal(out.view(-1)[-5:], normal_at(last, key, 0.01))
    print((after - before) * 1024, out.numel() * 4, int(ok))
    """
)


def test_a_shard_of_a_64_gib_tensor_draws_in_a_working_set_of_megabytes():
    """Rank 4000 of 4096 of a [2^20, 2^14] fp32 matrix (64 GiB, more than this machine holds):
    the draw adds at most 16 MiB to the peak RSS over the preallocated 16 MiB shard (the
    working set is O(chunk), not O(global) nor even O(shard)), and the shard's last elements,
    at global indices near 2^34, are the generator's values there."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK], capture_output=True, text=True, timeout=300, check=True
    )
    grown, shard_bytes, ok = map(int, done.stdout.split())
    assert shard_bytes == 16 << 20
    assert ok == 1
    assert grown <= 16 << 20, grown
