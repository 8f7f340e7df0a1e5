"""Attention-sink share: how much attention probability goes to the first token.

Paper: *Scaling Limitation*, *Attention Sink*: small initialization intensifies the tendency of
heads to put most of their probability on the first token; gated attention mitigates it.

Definition (exact softmax, no approximation)::

    P_h[i, j] = softmax_j(scale * <q_h[i], k_g(h)[j]> + mask[i, j])        (per batch row)
    sink_h    = mean over batch rows b and query positions i >= 1 of P_h[i, 0]

Query position 0 is left out by default because under a causal mask it can only attend to
itself (its share is 1 by construction). ``g(h) = h // (np / ng)``: query head ``h`` reads
key/value group ``g(h)`` (grouped-query attention, megatron-core's and SDPA's layout).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

_MAX_SCORES = 1 << 24
"""Score elements materialized at once (64 MiB in float32): queries are processed in chunks."""


@torch.no_grad()
def attention_sink_share(
    query: torch.Tensor,
    key: torch.Tensor,
    softmax_scale: Optional[float] = None,
    attention_mask: Optional[torch.Tensor] = None,
    *,
    skip_first_query: bool = True,
) -> torch.Tensor:
    """Mean attention probability on key position 0, per query head.

    Args:
        query: (sq, b, np, hn) queries after RoPE (megatron-core core-attention layout), the
            ``np`` heads of this tensor-parallel rank.
        key: (sk, b, ng, hn) keys after RoPE; ``ng`` divides ``np``.
        softmax_scale: score scale; None means ``1 / sqrt(hn)``.
        attention_mask: None for a causal mask (requires sq == sk), else a bool tensor
            broadcastable to (b, np, sq, sk), True where attention is *masked out* (megatron-core
            convention).
        skip_first_query: leave query position 0 out of the mean (see module docstring).

    Returns:
        float64 (np,) tensor: the sink share of each local head, in [0, 1] (a probability).
        Concatenating the results of all tensor-parallel ranks in rank order gives the global
        heads in order.

    Raises:
        ValueError: shapes that do not match, ng not dividing np, a causal mask with sq != sk,
            or fewer than 2 query positions with ``skip_first_query``.
    """
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(
            f"query {tuple(query.shape)} / key {tuple(key.shape)}: expected (s, b, heads, hn)"
        )
    sq, b, nh, hn = query.shape
    sk, bk, ng, hk = key.shape
    if bk != b or hk != hn or ng < 1 or nh % ng:
        raise ValueError(
            f"query {tuple(query.shape)} and key {tuple(key.shape)} do not match: need equal "
            "batch and head dim, and key groups dividing query heads"
        )
    if attention_mask is None and sq != sk:
        raise ValueError(f"causal mask needs sq == sk, got sq={sq}, sk={sk}. Fix: pass the mask")
    first = 1 if skip_first_query else 0
    if sq <= first:
        raise ValueError(f"sq={sq}: need at least {first + 1} query positions")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(hn)
    per_group = nh // ng
    # (s, b, n, h) -> (b, n, s, h)
    q = query.permute(1, 2, 0, 3).float()
    k = key.permute(1, 2, 0, 3).float().repeat_interleave(per_group, dim=1)
    mask = None
    if attention_mask is not None:
        mask = attention_mask.to(torch.bool).expand(b, nh, sq, sk)
    total = torch.zeros(nh, dtype=torch.float64, device=query.device)
    chunk = max(1, _MAX_SCORES // max(1, b * nh * sk))
    for start in range(first, sq, chunk):
        stop = min(sq, start + chunk)
        scores = torch.einsum("bnid,bnjd->bnij", q[:, :, start:stop], k) * scale  # (b, n, c, sk)
        if mask is None:
            pos_q = torch.arange(start, stop, device=query.device).view(-1, 1)
            masked = torch.arange(sk, device=query.device).view(1, -1) > pos_q
        else:
            masked = mask[:, :, start:stop]
        scores = scores.masked_fill(masked, float("-inf"))
        log_p0 = scores[..., 0] - torch.logsumexp(scores, dim=-1)  # (b, n, c)
        p0 = torch.nan_to_num(log_p0.double().exp(), nan=0.0)  # fully masked rows give 0
        total += p0.sum(dim=(0, 2))
    return total / (b * (sq - first))


def uniform_sink_share(seq_length: int) -> float:
    """Sink share of uniform causal attention over ``seq_length`` tokens (the reference a
    measured share is read against): the mean over query positions i = 1..s-1 of 1 / (i + 1);
    1.0 for s <= 1."""
    return float(np.mean(1.0 / (np.arange(1, seq_length) + 1.0))) if seq_length > 1 else 1.0
