"""Statistics of the sigmoid output gates of gated attention.

Paper: *Methodology*, *Gated Attention*: a query-dependent gate ``g = sigmoid(z)`` multiplies
each head's output, letting a head output ~0 instead of dumping probability on the first token
(the attention sink). Gates near 0 show heads that are switched off for a token.

Definitions: mean gate ``mean(g)`` and closed share ``mean(g < 0.1)`` over every gate value of
a layer (all tokens, heads and, for element-wise gates, channels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

CLOSED_BELOW = 0.1
"""A gate value below this counts as closed."""


@dataclass
class GateStats:
    """Gate statistics of one layer.

    Attributes:
        mean: mean gate value, in [0, 1].
        closed: fraction of gate values below the threshold, in [0, 1].
        count: number of gate values measured.
    """

    mean: float
    closed: float
    count: int


@dataclass
class GateSums:
    """Additive partial sums (mergeable across tensor-parallel ranks and micro-batches)."""

    total: float = 0.0
    closed: int = 0
    count: int = 0

    def add(self, other: GateSums) -> GateSums:
        return GateSums(
            self.total + other.total,
            self.closed + other.closed,
            self.count + other.count,
        )

    def stats(self) -> GateStats:
        if self.count == 0:
            raise ValueError("no gate values were recorded")
        return GateStats(self.total / self.count, self.closed / self.count, self.count)


def gate_sums(
    gates: Optional[torch.Tensor] = None,
    *,
    logits: Optional[torch.Tensor] = None,
    threshold: float = CLOSED_BELOW,
) -> GateSums:
    """Partial sums of gate values; give exactly one of ``gates`` or ``logits``.

    Args:
        gates: gate values ``g`` in [0, 1], any shape.
        logits: pre-sigmoid gate logits ``z`` (``g = sigmoid(z)``), any shape (e.g. (s, b,
            np * hn) element-wise or (s, b, np) head-wise).
        threshold: closed-gate threshold.

    Raises:
        ValueError: both or neither input given, or gate values outside [0, 1].
    """
    if (gates is None) == (logits is None):
        raise ValueError("give exactly one of gates= or logits=")
    if logits is not None:
        g = torch.sigmoid(logits.detach().double())
    else:
        g = gates.detach().double()
        if g.numel() and (float(g.min()) < 0.0 or float(g.max()) > 1.0):
            raise ValueError(
                "gate values outside [0, 1]: pass sigmoid outputs as gates=, raw values as logits="
            )
    return GateSums(float(g.sum()), int((g < threshold).sum()), int(g.numel()))


def gate_statistics(
    gates: Optional[torch.Tensor] = None,
    *,
    logits: Optional[torch.Tensor] = None,
    threshold: float = CLOSED_BELOW,
) -> GateStats:
    """Mean gate value and share of closed gates (``g < threshold``) of one layer.

    Args: as :func:`gate_sums`.

    Returns:
        :class:`GateStats` (dimensionless).

    Raises:
        ValueError: as :func:`gate_sums`, or no gate values.
    """
    return gate_sums(gates, logits=logits, threshold=threshold).stats()
