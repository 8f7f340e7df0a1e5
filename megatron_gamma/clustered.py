"""Small-sample degrees of freedom of a token mean clustered into documents.

Numpy only, a room below both users: the study's fits (:mod:`megatron_gamma.study.fits`, which
import no torch) and the token diagnostics (:mod:`megatron_gamma.diagnostics.tokens`) share this
one definition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def document_df(counts: Sequence[int] | np.ndarray) -> float:
    """Bell–McCaffrey degrees of freedom of a mean over tokens clustered into documents of
    ``counts`` tokens, with its CR2 variance
    (:func:`~megatron_gamma.diagnostics.tokens.document_interval`).

    Design-based (it depends on the token counts, not on the values): the Satterthwaite df of
    the CR2 variance under working independence (tokens of equal variance, uncorrelated), the
    small-sample df of Bell & McCaffrey (2002) and Imbens & Kolesár (2016). For the mean, with
    p_g = n_g / n the documents' token shares, it has the closed form

        df = 1 / (Σ_g p_g² (1 − 2 p_g) / (1 − p_g)² + (Σ_g p_g² / (1 − p_g))²),

    G − 1 for G documents of equal size, towards 1 as one document holds most tokens (7
    documents of 1474, 1236, 4482, 189, 298, 307, 206 tokens: 2.20). Derivation: the CR2 variance
    is yᵀBy with B = (I − H) Σ_g a_g a_gᵀ (I − H), H = 11ᵀ/n, a_g = 1_g / (n √(1 − p_g)); the
    G × G matrix M = [a_gᵀ (I − H) a_h] = (diag(p/(1 − p)) − q qᵀ) / n, q_g = p_g / √(1 − p_g),
    has trace 1/n, and df = (tr M)² / tr(M²).

    Args:
        counts: (G,) tokens per document, each >= 1.

    Returns:
        The df (float, in [1, G − 1] up to rounding); NaN for fewer than 2 documents.

    Raises:
        ValueError: a count below 1.
    """
    n = np.asarray(counts, dtype=np.float64).reshape(-1)
    if np.any(n < 1):
        raise ValueError(f"document token counts {n.tolist()}: each must be >= 1")
    if n.size < 2:
        return math.nan
    p = n / n.sum()
    odds = p**2 / (1 - p)
    return float(1 / (np.sum(odds * (1 - 2 * p) / (1 - p)) + np.sum(odds) ** 2))
