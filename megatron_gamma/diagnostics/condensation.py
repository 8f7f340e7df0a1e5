"""Condensation of weight matrices: row-wise cosine similarity, a scalar score, heatmap order.

Paper: *Analysis Metrics* (row-wise cosine similarity) and *Mechanistic Trajectory*: with small
initialization the rows of a weight matrix (the input-weight vectors of the output neurons,
``W[i, :]`` in torch's (out, in) layout) first align into a few coherent blocks of (anti-)
parallel directions ("condensation"), then diversify ("expansion").

Definitions used here (ours; the paper shows heatmaps, not a scalar):

- ``C_ij = <w_i, w_j> / (||w_i|| ||w_j||)``, the (rows, rows) cosine matrix (0 for a zero row);
- condensation score ``mean_{i != j} |C_ij|`` in [0, 1]: 1 when all rows lie on one line
  (including blocks of opposite sign, the typical condensed picture), ~1/k for k equal blocks of
  mutually orthogonal directions, and for i.i.d. Gaussian rows in R^d its expectation is
  ``E|cos| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)) ~ sqrt(2 / (pi d))`` (0.050 at d = 256);
- top-direction share ``sigma_1^2 / ||W||_F^2 = 1 / stable rank`` in (0, 1]: the share of the
  squared Frobenius norm in the leading singular direction.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from megatron_gamma.diagnostics.spectral import stable_rank


def _check_matrix(w: torch.Tensor) -> None:
    if w.dim() != 2 or w.size(0) < 2 or w.size(1) < 1:
        raise ValueError(
            f"weight of shape {tuple(w.shape)}: expected a 2-D matrix with at least 2 rows. "
            "Fix: pass one (out, in) weight matrix"
        )


def _unit_rows(w: torch.Tensor) -> torch.Tensor:
    """float64 (rows, cols): each row of the checked matrix ``w`` scaled to unit norm, a zero
    row left zero."""
    _check_matrix(w)
    x = w.detach().double()
    norms = x.norm(dim=1, keepdim=True)
    return torch.where(norms > 0, x / norms.clamp_min(torch.finfo(torch.float64).tiny), 0.0)


def sample_rows(num_rows: int, max_rows: Optional[int], seed: int = 0) -> torch.Tensor:
    """A fixed, sorted, seeded subset of row indices (all rows when ``max_rows`` is None or
    at least ``num_rows``). The same arguments always give the same rows, so scores of one
    matrix are comparable over training.

    Returns:
        int64 tensor (k,) of row indices in increasing order.
    """
    if max_rows is None or max_rows >= num_rows:
        return torch.arange(num_rows)
    if max_rows < 2:
        raise ValueError(f"max_rows={max_rows}: need at least 2 rows. Fix: use e.g. 256")
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(num_rows, generator=gen)[:max_rows].sort().values


def row_cosine_similarity(w: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every pair of rows.

    Args:
        w: (rows, cols) weight matrix, any float dtype.

    Returns:
        float64 (rows, rows) matrix ``C_ij`` in [-1, 1], 1 on the diagonal of non-zero rows; a
        zero row has cosine 0 with every row.

    Raises:
        ValueError: ``w`` not 2-D with at least 2 rows.
    """
    unit = _unit_rows(w)
    return (unit @ unit.T).clamp_(-1.0, 1.0)


def condensation_score_from_cosine(cos: torch.Tensor) -> float:
    """``mean_{i != j} |C_ij|`` of a (rows, rows) cosine matrix (see module docstring)."""
    n = cos.size(0)
    off = cos.abs().sum() - cos.diagonal().abs().sum()
    return float(off / (n * (n - 1)))


def condensation_score(w: torch.Tensor, *, max_rows: Optional[int] = None, seed: int = 0) -> float:
    """Mean absolute cosine similarity over distinct row pairs, in [0, 1].

    Args:
        w: (rows, cols) weight matrix.
        max_rows: score a fixed seeded sample of this many rows (see :func:`sample_rows`); the
            sample mean is an unbiased estimate of the all-pairs mean. None: all rows.
        seed: seed of the row sample.

    Returns:
        The score (dimensionless). Gaussian reference: ``gaussian_cosine_baseline(cols)``.

    Raises:
        ValueError: ``w`` not 2-D with at least 2 rows.
    """
    _check_matrix(w)
    rows = sample_rows(w.size(0), max_rows, seed)
    return condensation_score_from_cosine(row_cosine_similarity(w[rows.to(w.device)]))


def gaussian_cosine_baseline(dim: int) -> float:
    """``E|cos(x, y)|`` for independent isotropic Gaussian x, y in R^dim:
    ``Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))`` (about sqrt(2 / (pi d))); the condensation score of
    an unstructured matrix with ``dim`` columns."""
    if dim < 1:
        raise ValueError(f"dim={dim}: must be >= 1")
    return math.exp(math.lgamma(dim / 2) - math.lgamma((dim + 1) / 2)) / math.sqrt(math.pi)


def top_direction_share(w: torch.Tensor) -> float:
    """``sigma_1^2 / ||W||_F^2 = 1 / stable_rank(W)``: share of the squared Frobenius norm in
    the leading singular direction, in (0, 1] (0 for a zero matrix)."""
    sr = stable_rank(w)
    return 1.0 / sr if sr > 0 else 0.0


def condensation_order(w: torch.Tensor) -> torch.Tensor:
    """Row order for a cosine heatmap that makes condensed blocks visible.

    Each row is projected on the top two right singular vectors ``v_1, v_2`` and rows are
    sorted by the angle ``atan2(<w_i, v_2>, <w_i, v_1>)`` of that projection, with the circle
    cut at the widest angular gap. Rows along ``+v_1`` and ``-v_1`` (or along different
    directions in the top plane) thus form contiguous blocks, and rows within a block are
    adjacent.

    Args:
        w: (rows, cols) weight matrix.

    Returns:
        int64 permutation (rows,): ``C[order][:, order]`` is the ordered heatmap.

    Raises:
        ValueError: ``w`` not 2-D with at least 2 rows.
    """
    unit = _unit_rows(w)
    _, _, vh = torch.linalg.svd(unit, full_matrices=False)
    proj = unit @ vh[: min(2, vh.size(0))].T
    if proj.size(1) == 1:
        proj = torch.cat([proj, torch.zeros_like(proj)], dim=1)
    angle = torch.atan2(proj[:, 1], proj[:, 0])
    order = torch.argsort(angle, stable=True)
    sorted_angle = angle[order]
    gaps = torch.diff(sorted_angle, append=sorted_angle[:1] + 2 * math.pi)
    start = int(torch.argmax(gaps)) + 1
    return torch.roll(order, -start)
