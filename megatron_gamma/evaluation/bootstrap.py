"""Paired bootstrap of a score difference between two models on the same items.

Efron & Tibshirani, *An Introduction to the Bootstrap* (1993), ch. 13 (percentile interval);
the paired form resamples items, keeping each item's two scores together, as in Koehn,
"Statistical Significance Tests for Machine Translation Evaluation" (EMNLP 2004).
"""

from __future__ import annotations

import numpy as np

_CHUNK = 1000


def paired_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    *,
    num_samples: int = 10000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict:
    """Mean difference mean(a) - mean(b) over items and its percentile bootstrap interval.

    Each bootstrap replicate draws n item indices with replacement
    (``numpy.random.default_rng(seed).integers(0, n, n)``, replicate after replicate) and takes
    the mean of (a - b) over them; the interval is the (1 - confidence)/2 and (1 + confidence)/2
    quantiles of the replicates (numpy's default linear interpolation).

    Args:
        a: (n,) per-item scores of model A (e.g. 0/1 accuracy), float.
        b: (n,) per-item scores of model B on the same items, same order.
        num_samples: bootstrap replicates.
        confidence: interval coverage in (0, 1).
        seed: generator seed (the interval is reproducible).

    Returns:
        {'a', 'b', 'diff', 'low', 'high', 'n', 'num_samples', 'confidence'}: the two means, their
        difference and the interval bounds as floats.

    Raises:
        ValueError: shapes differ, no items, num_samples < 1, or confidence outside (0, 1).
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(
            f"scores: a {a.shape} and b {b.shape} must be equal-length non-empty vectors. Fix: "
            "score both models on the same items"
        )
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples}: must be >= 1")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence}: must lie in (0, 1), e.g. 0.95")
    d, n = a - b, a.size
    rng = np.random.default_rng(seed)
    means = np.empty(num_samples)
    for start in range(0, num_samples, _CHUNK):
        stop = min(start + _CHUNK, num_samples)
        means[start:stop] = d[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return {
        "a": float(a.mean()),
        "b": float(b.mean()),
        "diff": float(d.mean()),
        "low": float(low),
        "high": float(high),
        "n": int(n),
        "num_samples": int(num_samples),
        "confidence": float(confidence),
    }
