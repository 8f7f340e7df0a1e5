"""Spectral norm and stable rank of weight matrices.

Paper: "Small Initialization Matters for Large Language Models", *Analysis Metrics* and
*Mechanistic Trajectory*: the stable rank ``srank(W) = ||W||_F^2 / ||W||_2^2`` tracks the
condensation (low stable rank) and later expansion (rising stable rank) of weight matrices.

Two ways to get ``||W||_2`` (the largest singular value ``sigma_1``):

- exact: ``sqrt(lambda_max(G))`` of the float64 Gram matrix ``G = W^T W`` (or ``W W^T``,
  whichever is smaller) by a direct symmetric eigensolver (``torch.linalg.eigvalsh``; same value
  as ``torch.linalg.matrix_norm(W, ord=2)`` to ~1e-15 relative, several times faster on tall
  matrices), used when the work ``rows * cols * min(rows, cols)`` is at most
  :data:`EXACT_MAX_WORK`;
- iterative: seeded block subspace iteration on ``W^T W`` with a Rayleigh-Ritz step
  (:func:`top_singular_values_sq`). It needs only products with the local rows of ``W``, so a
  matrix sharded over tensor-parallel ranks is handled by summing ``B_r^T (B_r V)`` over the
  ranks with one all-reduce per iteration; no rank ever holds the whole matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import torch

EXACT_MAX_WORK = 1 << 28
"""Largest ``rows * cols * min(rows, cols)`` for which :func:`spectral_norm` uses the exact
direct solver (about 0.3 GFLOP; e.g. 4096 x 128 or 640 x 640)."""

AllReduce = Callable[[torch.Tensor], torch.Tensor]
"""Sums a tensor over the ranks that hold row blocks of the same matrices (in place or not)."""


def _check_matrix(w: torch.Tensor, name: str = "w") -> None:
    if w.dim() != 2:
        raise ValueError(
            f"{name} has shape {tuple(w.shape)}: expected a 2-D matrix (rows, cols). "
            "Fix: pass one weight matrix, e.g. param.view(param.size(0), -1)"
        )
    if w.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(w.shape)}). Fix: pass a non-empty matrix")


def frobenius_sq(w: torch.Tensor) -> float:
    """``||W||_F^2 = sum_ij W_ij^2``, accumulated in float64.

    Args:
        w: (rows, cols) matrix, any float dtype.

    Returns:
        The squared Frobenius norm (units of W squared).
    """
    _check_matrix(w)
    return float(w.detach().double().pow(2).sum())


@torch.no_grad()
def top_singular_values_sq(
    blocks: Sequence[torch.Tensor],
    all_reduce: Optional[AllReduce] = None,
    *,
    block_size: int = 16,
    max_iters: int = 300,
    check_every: int = 5,
    tol: float = 1e-6,
    seed: int = 0,
) -> list[float]:
    """Largest squared singular value of each matrix, by seeded block subspace iteration.

    Each matrix ``M_m`` is given by its row block ``B_m`` on this rank: the full matrix is the
    vertical stack of the blocks of all ranks in ``all_reduce``'s group (a column-sharded matrix
    is passed transposed, which has the same singular values). The iteration, for all matrices in
    lockstep (one all-reduce per iteration for all of them)::

        V <- qr(randn(cols, p; seed));  repeat: V <- qr(sum_ranks B^T (B V))
        sigma_1^2 ~ lambda_max(sum_ranks (B V)^T (B V))        (Rayleigh-Ritz)

    in float64; each block is cast one at a time, so no float64 copy of the model is held.

    stopping when every Ritz value changed by less than ``tol`` (relative) over ``check_every``
    iterations, or after ``max_iters``. The error falls as ``(sigma_{p+1} / sigma_1)^(4k)``
    after ``k`` iterations. All ranks must pass matrices of equal column counts in equal order.

    Args:
        blocks: row blocks, each (rows_m, cols_m), any float dtype.
        all_reduce: sums a tensor over the ranks holding the other row blocks; None when each
            block is a whole matrix.
        block_size: p, the subspace dimension (capped at cols_m).
        max_iters: iteration limit.
        check_every: iterations between convergence checks.
        tol: relative change of the Ritz values that counts as converged.
        seed: seed of the start vectors (identical on all ranks, so the iteration is too).

    Returns:
        ``sigma_1(M_m)^2`` for each matrix, in the order given.

    Raises:
        ValueError: a block that is not a non-empty 2-D matrix.
    """
    for i, b in enumerate(blocks):
        _check_matrix(b, f"blocks[{i}]")
    if not blocks:
        return []
    reduce = all_reduce or (lambda t: t)
    gen = torch.Generator().manual_seed(seed)
    mats = [b.detach() for b in blocks]
    vs = []
    for b in mats:
        p = min(block_size, b.size(1))
        v = torch.randn(b.size(1), p, generator=gen, dtype=torch.float64)
        vs.append(torch.linalg.qr(v.to(b.device)).Q)

    def ritz(vs: list[torch.Tensor]) -> list[float]:
        grams = []
        for b, v in zip(mats, vs, strict=True):
            bv = b.double() @ v
            grams.append(bv.T @ bv)
        flat = reduce(torch.cat([g.reshape(-1) for g in grams]))
        out, start = [], 0
        for g in grams:
            n = g.numel()
            small = flat[start : start + n].view_as(g)
            out.append(float(torch.linalg.eigvalsh(0.5 * (small + small.T)).max().clamp_min(0)))
            start += n
        return out

    previous = ritz(vs)
    for it in range(1, max_iters + 1):
        ys = []
        for b, v in zip(mats, vs, strict=True):
            b64 = b.double()
            ys.append(b64.T @ (b64 @ v))
        flat = reduce(torch.cat([y.reshape(-1) for y in ys]))
        start, new_vs = 0, []
        for y in ys:
            n = y.numel()
            new_vs.append(torch.linalg.qr(flat[start : start + n].view_as(y)).Q)
            start += n
        vs = new_vs
        if it % check_every == 0 or it == max_iters:
            current = ritz(vs)
            converged = all(
                abs(c - p) <= tol * max(c, 1e-300) for c, p in zip(current, previous, strict=True)
            )
            previous = current
            if converged:
                break
    return previous


def spectral_norm(
    w: torch.Tensor,
    *,
    exact_max_work: int = EXACT_MAX_WORK,
    seed: int = 0,
) -> float:
    """``||W||_2 = sigma_1(W)``, the largest singular value.

    Exact (largest eigenvalue of the float64 Gram matrix, see the module docstring) when
    ``rows * cols * min(rows, cols) <= exact_max_work``, else :func:`top_singular_values_sq`
    (relative error ~1e-6).

    Args:
        w: (rows, cols) matrix.
        exact_max_work: SVD size threshold; 0 forces the iteration.
        seed: start-vector seed of the iteration.

    Returns:
        sigma_1 (units of W).

    Raises:
        ValueError: ``w`` not a non-empty 2-D matrix.
    """
    _check_matrix(w)
    rows, cols = w.shape
    if rows * cols * min(rows, cols) <= exact_max_work:
        x = w.detach().double()
        gram = x.T @ x if cols <= rows else x @ x.T
        return float(torch.linalg.eigvalsh(gram)[-1].clamp_min(0)) ** 0.5
    return top_singular_values_sq([w], seed=seed)[0] ** 0.5


def stable_rank(w: torch.Tensor, *, exact_max_work: int = EXACT_MAX_WORK, seed: int = 0) -> float:
    """Stable rank ``||W||_F^2 / ||W||_2^2`` (paper, *Analysis Metrics*), dimensionless.

    It lies in ``[1, rank(W)]``: n for an n x n orthogonal matrix, 1 for a rank-1 matrix. A
    zero matrix has stable rank 0 by convention.

    Args:
        w: (rows, cols) matrix.
        exact_max_work: see :func:`spectral_norm`.
        seed: see :func:`spectral_norm`.

    Raises:
        ValueError: ``w`` not a non-empty 2-D matrix.
    """
    fro = frobenius_sq(w)
    if fro == 0.0:
        return 0.0
    sigma = spectral_norm(w, exact_max_work=exact_max_work, seed=seed)
    return fro / (sigma * sigma)
