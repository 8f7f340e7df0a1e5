"""Start-up audit of the initialization: expected vs. measured sigma of every parameter.

Each parameter's measured statistics are summed over all of its shards (tensor- and
expert-parallel), counting each shard once (data-parallel replicas and TP-replicated parameters
are skipped), so the numbers describe the global tensor whatever the layout. Expected sigma is
the gamma rule's fan_in^-gamma (:mod:`megatron_gamma.model.init`), or megatron-core's
``init_method_std`` (divided by sqrt(2 num_layers) for the registry's depth-scaled roles:
attn_out / fc2 / expert_fc2 / shared_fc2) for ``--init-method normal``. A row is flagged when
measured sigma differs from the expectation by more than max(``tolerance``, 4 / sqrt(2 n))
relative — the second term is four standard errors of
a sigma estimated from n samples, so that small matrices (a 4 x 64 headwise gate) are not
flagged for sampling noise — when a constant-initialized parameter is not that constant, or when
a matrix's fan-in in the role table differs from the one read off its own global shape (so a
wrong table entry, which the init and the expectation would share, is still caught).

The statistics stream: each shard is summed in float64 chunks of :data:`CHUNK` elements on its
own device, or in one pass of the C++ kernel ``moments`` on CPU (no float64 copy of a whole
tensor; one host sync per parameter). ``--init-audit summary`` measures only the parameters
outside the decoder layers and those of the first and last decoder layer, which hold every role
at a cost that does not grow with depth.
"""

from __future__ import annotations

import json
import math
import os

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from megatron_gamma import ops
from megatron_gamma.atomic import atomic_open
from megatron_gamma.config import Config
from megatron_gamma.model.init import drawn_init, global_name, global_shape, tp_size_rank
from megatron_gamma.model.roles import Group, WeightRole, layer_and_expert, role_of
from megatron_gamma.rundir.layout import INIT_AUDIT


def _expected(cfg: Config, name: str, vocab_size: int) -> dict:
    init = drawn_init(name, cfg, vocab_size)
    row = {"role": init.role, "fan_in": init.fan_in, "gamma": init.gamma}
    if init.constant is not None:
        row.update(expected_sigma=0.0, expected_mean=init.constant)
    else:
        row.update(expected_sigma=init.sigma, expected_mean=0.0)
    return row


def _shape_fan_in(role: str, shape: list[int], embedding_policy: str) -> int:
    """fan-in read off a matrix's own global shape: megatron-core stores a linear layer as
    [out, in] and an embedding as [rows, hidden]; the 'vocab' policy counts the rows."""
    if role in ("embedding", "pos_embedding") and embedding_policy == "vocab":
        return shape[0]
    return shape[1]


CHUNK = 1 << 20
"""Elements per float64 partial sum (an 8 MiB float64 working set)."""


def shard_sums(x: torch.Tensor, chunk: int = CHUNK) -> tuple[float, float]:
    """(sum, sum of squares) of every element of ``x``, accumulated in float64 over chunks of
    ``chunk`` elements on ``x``'s device: O(chunk) extra memory, one host sync. On CPU with the
    extension built, one pass of ``torch.ops.megatron_gamma.moments`` (float64 partial sums per
    2^16 elements, no copy)."""
    flat = x.detach().reshape(-1)
    if ops.uses_cpu_kernels(flat.device):
        total, squares = torch.ops.megatron_gamma.moments(flat.contiguous()).tolist()
        return total, squares
    acc = torch.zeros(2, dtype=torch.float64, device=flat.device)
    for start in range(0, flat.numel(), chunk):
        part = flat[start : start + chunk].double()
        acc[0] += part.sum()
        acc[1] += torch.dot(part, part)
    total, squares = acc.tolist()
    return total, squares


def in_scope(gname: str, scope: str, num_layers: int) -> bool:
    """True when the audit of ``scope`` ('full' or 'summary') measures global parameter
    ``gname``: everything for 'full'; for 'summary' the parameters outside the decoder layers
    and those of global layers 0 and num_layers - 1.

    Raises:
        ValueError: an unknown scope.
    """
    if scope not in ("full", "summary"):
        raise ValueError(f"init_audit={scope!r}: not an audit scope. Fix: 'full' or 'summary'")
    layer, _ = layer_and_expert(gname)
    return scope == "full" or layer is None or layer in (0, num_layers - 1)


def owns_shard(role: WeightRole) -> bool:
    """True on exactly one rank per distinct shard of a parameter of ``role`` (its group's
    data-parallel rank 0; among TP ranks all of a sharded role, rank 0 of a replicated one)."""
    expert = role.group is Group.EXPERT
    dp_rank = (
        parallel_state.get_expert_data_parallel_rank()
        if expert
        else parallel_state.get_data_parallel_rank()
    )
    if dp_rank != 0:
        return False
    return role.partition_dim is not None or tp_size_rank(role)[1] == 0


@torch.no_grad()
def audit_init(
    models: list, cfg: Config, vocab_size: int, tolerance: float = 0.05, scope: str = "full"
) -> list[dict]:
    """Measure every parameter (``scope='full'``; see :func:`in_scope` for 'summary') across all
    ranks and compare with its expected init.

    Collective: every rank must call it. Returns the rows on every rank, sorted by name; each
    row has name, shape (global), role, fan_in (from the role table), gamma, expected_sigma,
    measured_sigma, expected_mean, measured_mean, numel, flagged; matrices also have
    shape_fan_in, the fan-in read off the global shape ([out, in]; embedding rows under
    ``--embedding-fan-in vocab``), and are flagged when it differs from the table's fan_in.

    Args:
        models: this rank's unwrapped GPTModel chunks.
        cfg: run config.
        vocab_size: padded vocabulary size.
        tolerance: relative sigma deviation that flags a row.
        scope: 'full' or 'summary' (``--init-audit``).

    Raises:
        ValueError: an unknown scope.
    """
    local: dict[str, list] = {}
    for model in models:
        for name, param in model.named_parameters():
            role = role_of(name)
            if not owns_shard(role):
                continue
            gname = global_name(name, model)
            if not in_scope(gname, scope, cfg.model.num_layers):
                continue
            total, squares = shard_sums(param)
            stats = local.setdefault(gname, [0.0, 0.0, 0, list(global_shape(param, role))])
            stats[0] += total
            stats[1] += squares
            stats[2] += param.numel()
    gathered = [None] * dist.get_world_size() if dist.is_initialized() else [local]
    if dist.is_initialized():
        dist.all_gather_object(gathered, local)
    total: dict[str, list] = {}
    for part in gathered:
        for gname, (s, sq, n, shape) in part.items():
            acc = total.setdefault(gname, [0.0, 0.0, 0, shape])
            acc[0] += s
            acc[1] += sq
            acc[2] += n
    rows = []
    for gname in sorted(total):
        s, sq, n, shape = total[gname]
        mean = s / n
        sigma = math.sqrt(max(sq / n - mean * mean, 0.0))
        row = {"name": gname, "shape": shape, **_expected(cfg, gname, vocab_size)}
        row.update(measured_sigma=sigma, measured_mean=mean, numel=n)
        if row["expected_sigma"] == 0.0:
            row["flagged"] = sigma > 1e-6 or abs(mean - row["expected_mean"]) > 1e-6
        else:
            allowed = max(tolerance, 4.0 / math.sqrt(2.0 * n))
            row["shape_fan_in"] = _shape_fan_in(row["role"], shape, cfg.init.embedding_fan_in)
            row["flagged"] = (
                abs(sigma / row["expected_sigma"] - 1.0) > allowed
                or row["shape_fan_in"] != row["fan_in"]
            )
        rows.append(row)
    return rows


def _relative_deviation(row: dict) -> float:
    """|measured / expected - 1| of sigma; for a constant-initialized row (expected sigma 0) the
    largest absolute deviation, of sigma or of the mean from the constant."""
    if row["expected_sigma"] == 0.0:
        return max(row["measured_sigma"], abs(row["measured_mean"] - row["expected_mean"]))
    return abs(row["measured_sigma"] / row["expected_sigma"] - 1.0)


def summarize_audit(rows: list[dict]) -> list[dict]:
    """One row per role (per distinct fan_in and expected sigma within a role, which
    ``--init-gamma-overrides`` or a mixed layout could split), in the order the roles first
    appear in ``rows``.

    Each summary row has role, count (parameters), fan_in (None for constants),
    expected_sigma, worst_sigma (the measured sigma of the parameter that deviates most from
    the expectation: :func:`_relative_deviation`), worst_deviation (that deviation), worst_name
    and flagged (how many of the role's parameters are flagged).

    Args:
        rows: :func:`audit_init`'s per-parameter rows.
    """
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        key = (row["role"], row["fan_in"], row["expected_sigma"], row["expected_mean"])
        groups.setdefault(key, []).append(row)
    out = []
    for (role, fan, sigma, _), members in groups.items():
        worst = max(members, key=_relative_deviation)
        out.append(
            {
                "role": role,
                "count": len(members),
                "fan_in": fan,
                "expected_sigma": sigma,
                "worst_sigma": worst["measured_sigma"],
                "worst_deviation": _relative_deviation(worst),
                "worst_name": worst["name"],
                "flagged": sum(bool(r["flagged"]) for r in members),
            }
        )
    return out


def format_summary(summary: list[dict]) -> str:
    """:func:`summarize_audit` as a fixed-width table (one line per role)."""
    head = (
        f"{'role':<13} {'count':>5} {'fan_in':>7} {'sigma exp':>10} {'sigma worst':>11} "
        f"{'deviation':>9}  flagged"
    )
    lines = [head, "-" * len(head)]
    for r in summary:
        fan = str(r["fan_in"]) if r["fan_in"] else ""
        flags = f"{r['flagged']} FLAG" if r["flagged"] else ""
        lines.append(
            f"{r['role']:<13} {r['count']:>5} {fan:>7} {r['expected_sigma']:>10.3e} "
            f"{r['worst_sigma']:>11.3e} {r['worst_deviation']:>9.2e}  {flags}"
        )
    return "\n".join(lines)


def format_audit(rows: list[dict]) -> str:
    """The audit as a fixed-width table (one line per parameter)."""
    head = (
        f"{'parameter':<58} {'shape':<14} {'role':<13} {'fan_in':>7} {'gamma':>5} "
        f"{'sigma exp':>10} {'sigma meas':>10}  flag"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        gamma = "" if r["gamma"] in (None, 0.0) else f"{r['gamma']:.2f}"
        fan = str(r["fan_in"]) if r["fan_in"] else ""
        lines.append(
            f"{r['name'][-58:]:<58} {'x'.join(map(str, r['shape'])):<14} {r['role']:<13} "
            f"{fan:>7} {gamma:>5} {r['expected_sigma']:>10.3e} {r['measured_sigma']:>10.3e}  "
            f"{'FLAG' if r['flagged'] else ''}"
        )
    return "\n".join(lines)


def write_audit(rows: list[dict], run_dir: str) -> str:
    """Write ``run_dir/init_audit.json`` atomically; return its path."""
    path = os.path.join(run_dir, INIT_AUDIT)
    with atomic_open(path, "w") as f:
        json.dump(rows, f, indent=1)
    return path
