"""Token-level comparison of two models on the same tokens: symmetric gap and difficulty.

Paper: *Analysis Metrics* and *Token-Level Gains*: the gains of small initialization
concentrate on moderately-to-highly difficult tokens. The seeds name the symmetric probability
gap Delta_sym and token difficulty (average loss) without defining them; **our definitions**:

- ``p_M(t)``: model M's probability of the target token t given its prefix;
- ``Delta_sym = (p_A - p_B) / (p_A + p_B)`` in [-1, 1]; positive when A is better. Computed
  as ``tanh((log p_A - log p_B) / 2)``, which is the same quantity and stays exact when both
  probabilities underflow;
- difficulty ``d = (loss_A + loss_B) / 2 = -(log p_A + log p_B) / 2`` in nats, the mean loss
  of the two models on the token (symmetric, so swapping A and B changes neither d nor the bins).

Two cautions for reading a profile. Tokens of one document are not independent, so intervals
are clustered by document (:func:`document_interval`: CR2, with the Bell–McCaffrey df of
:func:`~megatron_gamma.clustered.document_df`, G − 1 only for documents of equal length), not
per token. And
difficulty computed from the same two models shares their noise with Δsym: where A and B
differ only by noise, the tokens B happened to get wrong sort into the hard bins, so the
profile slopes towards "B better on hard tokens" with no real difference (regression to the
mean). A claim about where the gains sit needs difficulty from models independent of the pair
(the study's claim 8 takes it from the other seeds' pairs).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple, Optional

import numpy as np
import torch

from megatron_gamma.clustered import document_df


def target_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log p(target)`` of each position, log-softmax in float32.

    Args:
        logits: (..., vocab) unnormalized scores.
        targets: (...) int64 target token ids.

    Returns:
        float32 tensor shaped like ``targets``, in nats (<= 0).

    Raises:
        ValueError: shape mismatch or a target id outside the vocabulary.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)}: logits must be "
            "targets' shape plus a vocabulary dimension"
        )
    vocab = logits.size(-1)
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(f"target ids must lie in [0, {vocab}); check the tokenizer/vocab size")
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def _check_pair(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"A has shape {tuple(a.shape)}, B {tuple(b.shape)}: need the same tokens")


def symmetric_gap(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """``Delta_sym = (p_A - p_B) / (p_A + p_B) = tanh((log p_A - log p_B) / 2)``.

    Args:
        logp_a: (...) log-probabilities of the targets under model A (nats).
        logp_b: same tokens under model B.

    Returns:
        float64 tensor in [-1, 1]; 0 where the models agree, antisymmetric in (A, B).
    """
    _check_pair(logp_a, logp_b)
    return torch.tanh((logp_a.double() - logp_b.double()) / 2)


def token_difficulty(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Mean loss of the two models on each token, ``-(log p_A + log p_B) / 2``, float64 nats."""
    _check_pair(logp_a, logp_b)
    return -(logp_a.double() + logp_b.double()) / 2


class DocumentInterval(NamedTuple):
    """A token mean with its interval clustered by document (:func:`document_interval`)."""

    mean: float
    se: float
    low: float
    high: float
    documents: int
    df: float


def document_interval(
    values: torch.Tensor | np.ndarray, documents: torch.Tensor | np.ndarray, level: float = 0.95
) -> DocumentInterval:
    """Mean of per-token ``values`` with a cluster-robust interval, documents as clusters.

    ``SE² = Σ_g (Σ_{i∈g} (x_i − x̄))² / (n² (1 − n_g/n))``, the CR2 (bias-reduced
    linearization, Bell & McCaffrey 2002) estimator of a mean's variance, unbiased where tokens
    are independent with equal variance; interval ``x̄ ± t_{(1+level)/2, df} · SE`` with the
    Bell–McCaffrey df of :func:`~megatron_gamma.clustered.document_df`, which is G − 1 only
    where the documents hold equally many tokens (with a few large documents the sum rests on
    those few, and CR1 with G − 1 is too narrow). Tokens within a document may be correlated,
    documents are taken as independent.

    Args:
        values: (n,) per-token values (any shape, flattened), n >= 1.
        documents: same shape, the document of each token (any integer labels).
        level: confidence level in (0, 1).

    Returns:
        :class:`DocumentInterval` (mean, se, low, high, documents G, df); se, low, high and df
        are NaN for G < 2.

    Raises:
        ValueError: shape mismatch or no values.
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    g = np.asarray(documents).reshape(-1)
    if x.shape != g.shape or x.size == 0:
        raise ValueError(f"values {x.shape} and documents {g.shape}: need equal, non-empty")
    labels, inverse, counts = np.unique(g, return_inverse=True, return_counts=True)
    mean, count = float(x.mean()), labels.size
    if count < 2:
        return DocumentInterval(mean, math.nan, math.nan, math.nan, count, math.nan)
    sums = np.bincount(inverse, weights=x - mean, minlength=count)
    se = math.sqrt(float(np.sum(sums**2 / (1 - counts / x.size)))) / x.size
    df = document_df(counts)
    from scipy import stats  # here: 1 CPU-s of import that a training rank does not need

    half = float(stats.t.ppf((1 + level) / 2, df)) * se
    return DocumentInterval(mean, se, mean - half, mean + half, count, df)


@dataclass
class DifficultyBin:
    """Delta_sym over the tokens of one difficulty bin.

    Attributes:
        lo: lower difficulty edge (nats, inclusive).
        hi: upper difficulty edge (nats; exclusive except for the last bin).
        count: tokens in the bin.
        mean_difficulty: mean difficulty of those tokens (nats).
        mean_delta: mean Delta_sym.
        sem_delta: standard error of that mean: clustered by document when documents were given
            (:func:`document_interval`), else per token (tokens taken as independent, which
            understates it); None when it cannot be computed (one document, or one token).
        low, high: the 95% interval of ``mean_delta`` (t with ``df``) when documents were given
            and the bin has at least 2; else None.
        documents: distinct documents in the bin, when documents were given; else None.
        df: that interval's degrees of freedom (:func:`~megatron_gamma.clustered.document_df`
            of the bin's tokens per document: documents − 1 only where they hold equally
            many); else None.
        a_better: fraction of tokens with Delta_sym > 0.
        mean_loss_a: A's mean loss on the bin's tokens (nats), when log-probs were given.
        mean_loss_b: B's mean loss on the bin's tokens (nats), when log-probs were given.
    """

    lo: float
    hi: float
    count: int
    mean_difficulty: float
    mean_delta: float
    sem_delta: Optional[float]
    a_better: float
    mean_loss_a: Optional[float] = None
    mean_loss_b: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    documents: Optional[int] = None
    df: Optional[float] = None

    def as_dict(self) -> dict:
        return asdict(self)


def gap_by_difficulty(
    delta: torch.Tensor,
    difficulty: torch.Tensor,
    num_bins: int = 10,
    edges: Optional[Sequence[float]] = None,
    logp_a: Optional[torch.Tensor] = None,
    logp_b: Optional[torch.Tensor] = None,
    documents: Optional[torch.Tensor | np.ndarray] = None,
) -> list[DifficultyBin]:
    """Delta_sym aggregated by token difficulty.

    Bins are equal-count (difficulty quantiles) unless ``edges`` are given; the outer edges are
    the minimum and maximum difficulty, so every token falls in exactly one bin. Repeated
    quantile edges (ties) are merged, so fewer than ``num_bins`` bins may come back; empty bins
    are dropped.

    Args:
        delta: (n,) or any shape, Delta_sym per token.
        difficulty: same shape, difficulty per token (nats).
        num_bins: number of quantile bins.
        edges: explicit increasing inner edges in nats (overrides ``num_bins``).
        logp_a: optional, same shape: A's log-probabilities, for per-bin mean losses.
        logp_b: optional, same shape: B's log-probabilities.
        documents: optional, same shape: the document of each token, for intervals clustered
            by document (:func:`document_interval`).

    Returns:
        One :class:`DifficultyBin` per non-empty bin, easiest first; counts sum to n.

    Raises:
        ValueError: shape mismatch, no tokens, num_bins < 1 or non-increasing edges.
    """
    _check_pair(delta, difficulty)
    d = difficulty.double().reshape(-1)
    x = delta.double().reshape(-1)
    losses = [None if lp is None else -lp.double().reshape(-1) for lp in (logp_a, logp_b)]
    for lp in (logp_a, logp_b):
        if lp is not None:
            _check_pair(lp, delta)
    docs = None if documents is None else np.asarray(documents).reshape(-1)
    if docs is not None and docs.size != x.numel():
        raise ValueError(f"documents has {docs.size} entries for {x.numel()} tokens")
    if d.numel() == 0:
        raise ValueError("no tokens to bin")
    lo, hi = float(d.min()), float(d.max())
    if edges is None:
        if num_bins < 1:
            raise ValueError(f"num_bins={num_bins}: must be >= 1")
        qs = torch.linspace(0, 1, num_bins + 1, dtype=torch.float64)[1:-1]
        inner = torch.quantile(d, qs).tolist() if num_bins > 1 else []
    else:
        inner = [float(e) for e in edges]
        if any(b <= a for a, b in itertools.pairwise(inner)):
            raise ValueError(f"edges={list(edges)}: must be strictly increasing")
        inner = [e for e in inner if lo < e < hi]
    bounds = sorted({lo, hi, *inner})
    inner_t = torch.tensor(bounds[1:-1], dtype=torch.float64)
    index = torch.bucketize(d, inner_t, right=True)  # bin i: bounds[i] <= d < bounds[i + 1]
    bins = []
    for i in range(max(1, len(bounds) - 1)):
        sel = index == i
        n = int(sel.sum())
        if n == 0:
            continue
        xs = x[sel]
        low = high = count = df = None
        if docs is not None:
            _, sem, low, high, count, df = document_interval(xs.numpy(), docs[sel.numpy()])
            if math.isnan(sem):
                sem = low = high = df = None
        else:
            sem = float(xs.std(unbiased=True) / n**0.5) if n > 1 else None
        bins.append(
            DifficultyBin(
                lo=bounds[i],
                hi=bounds[min(i + 1, len(bounds) - 1)],
                count=n,
                mean_difficulty=float(d[sel].mean()),
                mean_delta=float(xs.mean()),
                sem_delta=sem,
                a_better=float((xs > 0).double().mean()),
                mean_loss_a=None if losses[0] is None else float(losses[0][sel].mean()),
                mean_loss_b=None if losses[1] is None else float(losses[1][sel].mean()),
                low=low,
                high=high,
                documents=count,
                df=df,
            )
        )
    return bins
