"""Pure diagnostics functions against closed forms and float64 references (fast, one process)."""

from __future__ import annotations

import csv
import json
import math
import os
import threading

import numpy as np
import pytest
import torch
from scipy import stats as sp_stats

from megatron_gamma.clustered import document_df
from megatron_gamma.diagnostics.attention import attention_sink_share
from megatron_gamma.diagnostics.condensation import (
    condensation_order,
    condensation_score,
    gaussian_cosine_baseline,
    row_cosine_similarity,
    sample_rows,
    top_direction_share,
)
from megatron_gamma.diagnostics.gates import gate_statistics, gate_sums
from megatron_gamma.diagnostics.norm import rmsnorm_saturation
from megatron_gamma.diagnostics.probes import metric_key, parse_metric_key
from megatron_gamma.diagnostics.spectral import spectral_norm, stable_rank, top_singular_values_sq
from megatron_gamma.diagnostics.tokens import (
    document_interval,
    gap_by_difficulty,
    symmetric_gap,
    target_log_probs,
    token_difficulty,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- stable rank


@pytest.mark.parametrize("exact_max_work", [1 << 28, 0], ids=["direct", "iteration"])
def test_stable_rank_of_constructed_matrices(exact_max_work):
    kw = {"exact_max_work": exact_max_work}
    assert stable_rank(torch.eye(7), **kw) == pytest.approx(7.0, abs=1e-6)
    u = torch.randn(9, 1, generator=_gen(1), dtype=torch.float64)
    v = torch.randn(1, 5, generator=_gen(2), dtype=torch.float64)
    assert stable_rank(u @ v, **kw) == pytest.approx(1.0, abs=1e-6)
    # diag(3, 2, 1): ||W||_F^2 = 14, ||W||_2^2 = 9
    assert stable_rank(torch.diag(torch.tensor([3.0, 2.0, 1.0])), **kw) == pytest.approx(
        14 / 9, abs=1e-6
    )
    assert stable_rank(torch.zeros(3, 4)) == 0.0


@pytest.mark.parametrize("shape", [(200, 200), (300, 48), (40, 500), (64, 256)])
def test_subspace_iteration_matches_svd(shape):
    w = torch.randn(*shape, generator=_gen(shape[0]))
    exact = float(torch.linalg.matrix_norm(w.double(), ord=2))
    assert spectral_norm(w, exact_max_work=0) == pytest.approx(exact, rel=1e-4)
    assert stable_rank(w, exact_max_work=0) == pytest.approx(
        float(w.double().pow(2).sum()) / exact**2, rel=1e-4
    )


def _threaded_ranks(blocks_per_rank):
    """Run top_singular_values_sq on each 'rank' in its own thread with a real all-reduce
    (barrier + sum), as tensor-parallel ranks would."""
    n = len(blocks_per_rank)
    barrier = threading.Barrier(n)
    slots: list = [None] * n
    results: list = [None] * n

    def run(rank):
        def reduce(t):
            slots[rank] = t.clone()
            barrier.wait()
            total = sum(slots)
            barrier.wait()
            return total

        results[rank] = top_singular_values_sq(blocks_per_rank[rank], reduce)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_sharded_subspace_iteration_equals_full_svd():
    """Row shards (column-parallel layout) and column shards passed transposed (row-parallel
    layout) over two ranks give the full matrix's sigma_1^2."""
    a = torch.randn(96, 40, generator=_gen(3))
    b = torch.randn(30, 80, generator=_gen(4))
    a_rows = a.chunk(2, dim=0)
    b_cols = b.chunk(2, dim=1)
    results = _threaded_ranks([[a_rows[r], b_cols[r].T] for r in range(2)])
    assert results[0] == results[1]
    for got, full in zip(results[0], (a, b), strict=True):
        exact = float(torch.linalg.matrix_norm(full.double(), ord=2)) ** 2
        assert got == pytest.approx(exact, rel=1e-4)


def test_spectral_rejects_non_matrices():
    with pytest.raises(ValueError, match="expected a 2-D matrix"):
        stable_rank(torch.ones(3))
    with pytest.raises(ValueError, match="empty"):
        spectral_norm(torch.ones(0, 3))


# ---------------------------------------------------------------- condensation


def _two_blocks(n_per_block=20, dim=64, noise=0.02, seed=5):
    g = _gen(seed)
    u = torch.randn(dim, generator=g, dtype=torch.float64)
    u /= u.norm()
    scale = 0.5 + torch.rand(2 * n_per_block, 1, generator=g, dtype=torch.float64)
    sign = torch.cat([torch.ones(n_per_block), -torch.ones(n_per_block)]).double().view(-1, 1)
    w = (
        sign * scale * u
        + noise * torch.randn(2 * n_per_block, dim, generator=g).double() / dim**0.5
    )
    perm = torch.randperm(2 * n_per_block, generator=g)
    return w[perm], sign.view(-1)[perm]


def test_two_aligned_blocks_score_near_one_and_order_into_two_blocks():
    w, label = _two_blocks()
    assert condensation_score(w) > 0.99
    assert top_direction_share(w) > 0.99
    order = condensation_order(w)
    assert sorted(order.tolist()) == list(range(len(w)))
    ordered = label[order]
    assert int((ordered[1:] != ordered[:-1]).sum()) == 1  # one boundary: two contiguous blocks
    cos = row_cosine_similarity(w)[order][:, order]
    n = len(w) // 2
    assert float(cos[:n, :n].min()) > 0.99 and float(cos[n:, n:].min()) > 0.99
    assert float(cos[:n, n:].max()) < -0.99


def test_two_orthogonal_blocks_are_contiguous_in_the_order():
    g = _gen(6)
    q, _ = torch.linalg.qr(torch.randn(32, 2, generator=g, dtype=torch.float64))
    rows = torch.cat([q[:, 0].expand(15, -1), q[:, 1].expand(15, -1)])
    rows = rows + 0.01 * torch.randn(30, 32, generator=g, dtype=torch.float64)
    label = torch.cat([torch.zeros(15), torch.ones(15)])
    perm = torch.randperm(30, generator=g)
    order = condensation_order(rows[perm])
    ordered = label[perm][order]
    assert int((ordered[1:] != ordered[:-1]).sum()) == 1
    # mean |cos| = share of same-block pairs = 2 * 15 * 14 / (30 * 29)
    assert condensation_score(rows) == pytest.approx(2 * 15 * 14 / (30 * 29), abs=0.02)


def test_gaussian_matrix_scores_at_the_stated_baseline():
    w = torch.randn(256, 256, generator=_gen(7))
    base = gaussian_cosine_baseline(256)
    assert base == pytest.approx(math.sqrt(2 / (math.pi * 256)), rel=0.01)  # ~0.0499
    score = condensation_score(w)
    assert score == pytest.approx(base, rel=0.05)
    assert score < 0.06
    # a seeded row sample estimates the same mean
    assert condensation_score(w, max_rows=128) == pytest.approx(base, rel=0.1)


def test_cosine_matrix_against_definition_and_zero_rows():
    w = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [-2.0, 0.0]])
    cos = row_cosine_similarity(w)
    assert cos[0, 1] == pytest.approx(1 / math.sqrt(2))
    assert cos[0, 3] == pytest.approx(-1.0)
    assert torch.all(cos[2] == 0)
    assert sample_rows(10, 4, seed=1).tolist() == sample_rows(10, 4, seed=1).tolist()
    assert len(set(sample_rows(10, 4, seed=1).tolist())) == 4


# ---------------------------------------------------------------- attention sink


def test_sink_share_three_tokens_by_hand():
    # one head, hn = 2, scale 1: scores s_ij = q_i . k_j
    q = torch.tensor([[1.0, 0.0], [0.5, 1.0], [2.0, -1.0]]).view(3, 1, 1, 2)
    k = torch.tensor([[1.0, 1.0], [0.0, 2.0], [1.0, -1.0]]).view(3, 1, 1, 2)
    s = [
        [sum(a * b for a, b in zip(qi, kj, strict=True)) for kj in k.view(3, 2).tolist()]
        for qi in q.view(3, 2).tolist()
    ]
    p10 = math.exp(s[1][0]) / (math.exp(s[1][0]) + math.exp(s[1][1]))
    p20 = math.exp(s[2][0]) / sum(math.exp(s[2][j]) for j in range(3))
    got = attention_sink_share(q, k, softmax_scale=1.0)
    assert got.shape == (1,)
    assert float(got[0]) == pytest.approx((p10 + p20) / 2, abs=1e-7)
    with_first = attention_sink_share(q, k, softmax_scale=1.0, skip_first_query=False)
    assert float(with_first[0]) == pytest.approx((1 + p10 + p20) / 3, abs=1e-7)


def _reference_sink(q, k, scale):
    """Full fp64 softmax attention matrix, GQA by explicit head->group map."""
    sq, b, nh, hn = q.shape
    ng = k.size(2)
    out = torch.zeros(nh, dtype=torch.float64)
    causal = torch.ones(sq, sq, dtype=torch.bool).tril()
    for h in range(nh):
        g = h // (nh // ng)
        for bi in range(b):
            scores = (q[:, bi, h].double() @ k[:, bi, g].double().T) * scale
            probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            out[h] += probs[1:, 0].sum()
    return out / (b * (sq - 1))


def test_sink_share_gqa_matches_full_softmax_and_tp_split():
    g = _gen(8)
    q = torch.randn(12, 3, 4, 8, generator=g) * 2
    k = torch.randn(12, 3, 2, 8, generator=g) * 2
    full = attention_sink_share(q, k)  # default scale 1/sqrt(8)
    ref = _reference_sink(q, k, 1 / math.sqrt(8))
    torch.testing.assert_close(full, ref, rtol=1e-6, atol=1e-9)
    # tensor parallel: rank r holds heads 2r, 2r+1 and group r; concatenation = global heads
    pieces = [attention_sink_share(q[:, :, 2 * r : 2 * r + 2], k[:, :, r : r + 1]) for r in (0, 1)]
    torch.testing.assert_close(torch.cat(pieces), full, rtol=0, atol=1e-12)


def test_sink_share_explicit_mask_and_errors():
    g = _gen(9)
    q = torch.randn(5, 1, 2, 4, generator=g)
    k = torch.randn(5, 1, 2, 4, generator=g)
    causal_masked_out = torch.ones(5, 5, dtype=torch.bool).triu(1).view(1, 1, 5, 5)
    torch.testing.assert_close(
        attention_sink_share(q, k, None, causal_masked_out), attention_sink_share(q, k)
    )
    with pytest.raises(ValueError, match="do not match"):
        attention_sink_share(q, torch.randn(5, 1, 3, 4))
    with pytest.raises(ValueError, match="sq == sk"):
        attention_sink_share(q, torch.randn(6, 1, 2, 4))


# ---------------------------------------------------------------- RMSNorm saturation


def _hidden_with_mean_square(ms: float, tokens=64, hidden=128, seed=10):
    h = torch.randn(tokens, 1, hidden, generator=_gen(seed), dtype=torch.float64)
    h = h / h.pow(2).mean(-1, keepdim=True).sqrt() * math.sqrt(ms)
    return h.float()


@pytest.mark.parametrize("ms", [1e-6, 1e-8])
def test_saturation_small_init_scale_eps_1e5_vs_1e12(ms):
    h = _hidden_with_mean_square(ms)
    sat = rmsnorm_saturation(h, eps=1e-5)
    assert sat.saturated == 1.0 and sat.tokens == 64
    assert sat.log10_ms_p50 == pytest.approx(math.log10(ms), abs=1e-4)
    assert sat.eps_share == pytest.approx(1e-5 / (ms + 1e-5), rel=1e-4)
    assert rmsnorm_saturation(h, eps=1e-12).saturated == 0.0


def test_saturation_at_sigma2_1e14():
    """sigma^2 = 1e-14 is saturated for eps = 1e-5 and, since 1e-14 < eps, also for 1e-12."""
    h = _hidden_with_mean_square(1e-14)
    assert rmsnorm_saturation(h, eps=1e-5).saturated == 1.0
    assert rmsnorm_saturation(h, eps=1e-12).saturated == 1.0
    assert rmsnorm_saturation(h, eps=1e-16).saturated == 0.0


def test_saturation_mixed_tokens_and_histogram():
    h = torch.cat(
        [_hidden_with_mean_square(1e-8, tokens=30), _hidden_with_mean_square(1.0, tokens=10)]
    )
    sat = rmsnorm_saturation(h, eps=1e-5)
    assert sat.saturated == pytest.approx(30 / 40)
    assert sum(sat.histogram) == 40
    with pytest.raises(ValueError, match="eps"):
        rmsnorm_saturation(h, eps=0.0)


# ---------------------------------------------------------------- gates


def test_gate_statistics_from_logits_and_values():
    g = torch.tensor([0.05, 0.5, 0.95, 0.08]).view(1, 1, 4)
    logits = torch.log(g / (1 - g))
    for stats in (gate_statistics(logits=logits), gate_statistics(g)):
        assert stats.mean == pytest.approx(0.395, abs=1e-6)
        assert stats.closed == pytest.approx(0.5)
        assert stats.count == 4
    merged = gate_sums(logits=logits[..., :2]).add(gate_sums(logits=logits[..., 2:])).stats()
    assert merged.mean == pytest.approx(0.395, abs=1e-6)
    with pytest.raises(ValueError, match="exactly one"):
        gate_statistics(g, logits=logits)
    with pytest.raises(ValueError, match="outside"):
        gate_statistics(logits)


# ---------------------------------------------------------------- token-level comparison


def test_target_log_probs_equal_cross_entropy():
    logits = torch.randn(2, 5, 11, generator=_gen(11))
    targets = torch.randint(0, 11, (2, 5), generator=_gen(12))
    ce = torch.nn.functional.cross_entropy(logits.view(-1, 11), targets.view(-1), reduction="none")
    torch.testing.assert_close(target_log_probs(logits, targets), -ce.view(2, 5))
    with pytest.raises(ValueError, match=r"target ids must lie in \[0, 11\)"):
        target_log_probs(logits, targets + 11)


def test_delta_sym_definition_symmetry_and_bins():
    g = _gen(13)
    logp_a = -3 * torch.rand(1000, generator=g).double()
    logp_b = -3 * torch.rand(1000, generator=g).double()
    delta = symmetric_gap(logp_a, logp_b)
    pa, pb = logp_a.exp(), logp_b.exp()
    torch.testing.assert_close(delta, (pa - pb) / (pa + pb))
    assert torch.all(symmetric_gap(logp_a, logp_a) == 0)
    torch.testing.assert_close(symmetric_gap(logp_b, logp_a), -delta)
    diff = token_difficulty(logp_a, logp_b)
    torch.testing.assert_close(diff, token_difficulty(logp_b, logp_a))
    bins = gap_by_difficulty(delta, diff, num_bins=7, logp_a=logp_a, logp_b=logp_b)
    assert sum(b.count for b in bins) == 1000
    assert len(bins) == 7 and bins[0].lo == float(diff.min()) and bins[-1].hi == float(diff.max())
    for b, nxt in zip(bins, bins[1:], strict=False):
        assert b.hi == nxt.lo
    # each bin's stats from its own members (last bin closed on the right)
    for i, b in enumerate(bins):
        sel = (diff >= b.lo) & ((diff < b.hi) if i < len(bins) - 1 else (diff <= b.hi))
        assert int(sel.sum()) == b.count
        assert b.mean_delta == pytest.approx(float(delta[sel].mean()))
        assert b.mean_loss_a == pytest.approx(float(-logp_a[sel].mean()))
    swapped = gap_by_difficulty(-delta, diff, num_bins=7)
    assert [b.mean_delta for b in swapped] == pytest.approx([-b.mean_delta for b in bins])
    same = gap_by_difficulty(symmetric_gap(logp_a, logp_a), diff, num_bins=7)
    assert all(b.mean_delta == 0 and b.a_better == 0 for b in same)


def test_delta_sym_is_exact_where_probabilities_underflow():
    a, b = torch.tensor([-1000.0]), torch.tensor([-1001.0])
    assert float(symmetric_gap(a, b)) == pytest.approx(math.tanh(0.5))


def cr2_by_matrix(x: np.ndarray, docs: np.ndarray) -> tuple[float, float]:
    """(CR2 variance, Bell–McCaffrey df) of the mean of x clustered by docs, from the
    definitions in fp64 matrices (Bell & McCaffrey 2002; Imbens & Kolesár 2016), not from
    document_df's closed form: X = 1, H = X(XᵀX)⁻¹Xᵀ, A_g = (I − H_gg)^(−1/2) by
    eigendecomposition, V = Σ_g (XᵀX)⁻¹ X_gᵀ A_g e_g e_gᵀ A_g X_g (XᵀX)⁻¹ with e = (I − H) x,
    written V = xᵀBx; under working independence (Var x = I) its Satterthwaite df is
    (tr B)² / tr(B²)."""
    n = x.size
    X = np.ones((n, 1))
    bread = np.linalg.inv(X.T @ X)
    resid = np.eye(n) - X @ bread @ X.T
    B = np.zeros((n, n))
    for g in np.unique(docs):
        rows = np.flatnonzero(docs == g)
        w, v = np.linalg.eigh(np.eye(rows.size) - (X @ bread @ X.T)[np.ix_(rows, rows)])
        A = v @ np.diag(w**-0.5) @ v.T
        c = np.zeros((1, n))  # x ↦ (XᵀX)⁻¹ X_gᵀ A_g e_g
        c[:, rows] = bread @ X[rows].T @ A
        c = c @ resid
        B += c.T @ c
    return float(x @ B @ x), float(np.trace(B) ** 2 / np.trace(B @ B))


def _clustered_by_hand(x: np.ndarray, docs: np.ndarray) -> tuple[float, float, float]:
    """Mean and 95% interval of x with the document-clustered CR2 variance and its
    Bell–McCaffrey df (:func:`cr2_by_matrix`), t with that df."""
    var, df = cr2_by_matrix(x, docs)
    half = sp_stats.t.ppf(0.975, df) * math.sqrt(var)
    return x.mean(), x.mean() - half, x.mean() + half


def test_document_df_closed_form_against_the_matrices():
    """document_df's closed form of the Bell–McCaffrey df against the fp64 matrices; by hand,
    shares (1/4, 1/4, 1/2): 1 / (2 · (1/16)(1/2)/(9/16) + (2 · (1/16)/(3/4) + (1/4)/(1/2))²)
    = 1 / (1/9 + 4/9) = 1.8, and (1/6, 1/6, 1/6, 1/2): 1 / (3 · (2/3)/25 + (3/30 + 1/2)²)
    = 1 / 0.44 = 25/11; G documents of equal length: G − 1."""
    assert document_df([1, 1, 2]) == pytest.approx(1.8, rel=1e-12)
    assert document_df([1, 1, 1, 3]) == pytest.approx(25 / 11, rel=1e-12)
    assert document_df([9] * 7) == pytest.approx(6, rel=1e-12)
    assert math.isnan(document_df([5]))
    rng = np.random.default_rng(2)
    for counts in ([1, 1, 2], [15, 12, 45, 2, 3, 3, 2], [7, 7, 7, 7], [1, 30]):
        docs = np.repeat(np.arange(len(counts)), counts)
        x = rng.normal(0, 1, docs.size)
        var, df = cr2_by_matrix(x, docs)
        assert document_df(counts) == pytest.approx(df, rel=1e-9)
        got = document_interval(x, docs)
        assert (got.se**2, got.df) == pytest.approx((var, df), rel=1e-9)
    with pytest.raises(ValueError, match="each must be >= 1"):
        document_df([3, 0])


def test_document_intervals_cover_with_unequal_documents():
    """Trial 9 #6: 7 documents of very unequal length (the committed study's 1474, 1236, 4482,
    189, 298, 307 and 206 tokens, scaled by 1/10), independent N(0, 1) tokens, true mean 0,
    2000 draws (seed 0). CR1 with t(G − 1), the old interval, covered 0 in about 89% of draws;
    CR2 with the Bell–McCaffrey df (2.20 here) covers it in at least 95% (about 97.5%)."""
    counts = np.array([147, 124, 448, 19, 30, 31, 21])
    docs = np.repeat(np.arange(7), counts)
    rng = np.random.default_rng(0)
    new = old = 0
    for _ in range(2000):
        x = rng.normal(0, 1, docs.size)
        got = document_interval(x, docs)
        new += got.low <= 0 <= got.high
        sums = np.bincount(docs, weights=x - x.mean())
        se1 = math.sqrt(7 / 6 * float(sums @ sums)) / x.size
        old += abs(x.mean()) <= sp_stats.t.ppf(0.975, 6) * se1
    assert got.df == pytest.approx(document_df(counts)) and 2.1 < got.df < 2.3
    assert new / 2000 >= 0.95 and old / 2000 < 0.92


def test_intervals_are_clustered_by_document():
    """Tokens of one document share a shift: the per-token standard error understates the
    spread; the document-clustered interval (CR2, Bell–McCaffrey df) is checked against the
    matrices by hand, documents of unequal length."""
    rng = np.random.default_rng(5)
    docs = np.repeat(np.arange(12), np.arange(12) * 4 + 10)
    x = rng.normal(0, 0.3, 12)[docs] + rng.normal(0, 0.1, docs.size)
    mean, se, low, high, count, df = document_interval(x, docs)
    assert count == 12 and 1 < df < 11
    assert (mean, low, high) == pytest.approx(_clustered_by_hand(x, docs), rel=1e-10)
    assert se > 3 * x.std(ddof=1) / math.sqrt(x.size)
    one = document_interval(x[:10], docs[:10])
    assert one.documents == 1 and all(math.isnan(v) for v in (one.se, one.low, one.high, one.df))
    diff = torch.tensor(np.tile(np.linspace(0, 1, 2), docs.size // 2 + 1)[: docs.size])
    bins = gap_by_difficulty(torch.tensor(x), diff, num_bins=2, documents=docs)
    for b, sel in zip(bins, (diff.numpy() < 0.5, diff.numpy() >= 0.5), strict=True):
        _, lo, hi = _clustered_by_hand(x[sel], docs[sel])
        assert b.documents == 12 and (b.low, b.high) == pytest.approx((lo, hi), rel=1e-10)
        assert b.df == pytest.approx(cr2_by_matrix(x[sel], docs[sel])[1], rel=1e-9)
    plain = gap_by_difficulty(torch.tensor(x), diff, num_bins=2)[0]
    assert plain.low is None and plain.df is None


def test_bins_with_explicit_edges_and_ties():
    diff = torch.tensor([1.0, 1.0, 1.0, 1.0, 2.0, 3.0])
    delta = torch.tensor([0.1, 0.1, 0.1, 0.1, -0.2, 0.3])
    bins = gap_by_difficulty(delta, diff, num_bins=4)  # tied quantile edges merge
    assert sum(b.count for b in bins) == 6
    bins = gap_by_difficulty(delta, diff, edges=[1.5, 2.5])
    assert [b.count for b in bins] == [4, 1, 1]
    with pytest.raises(ValueError, match="strictly increasing"):
        gap_by_difficulty(delta, diff, edges=[2.0, 1.0])


def test_metric_keys_round_trip():
    key = metric_key("stable_rank", "qkv.q", 3)
    assert key == "stable_rank/qkv.q/layer_03"
    assert parse_metric_key(key) == {
        "metric": "stable_rank",
        "role": "qkv.q",
        "layer": 3,
        "head": None,
        "expert": None,
    }
    assert parse_metric_key(metric_key("sink_share", None, 12, 5)) == {
        "metric": "sink_share",
        "role": None,
        "layer": 12,
        "head": 5,
        "expert": None,
    }
    key = metric_key("condensation", "expert_fc1.up", 1, expert=7)
    assert key == "condensation/expert_fc1.up/layer_01/expert_07"
    assert parse_metric_key(key) == {
        "metric": "condensation",
        "role": "expert_fc1.up",
        "layer": 1,
        "head": None,
        "expert": 7,
    }


def test_aggregate_experts_means_over_a_layers_experts():
    from megatron_gamma.diagnostics.probes import aggregate_experts

    values = {
        "stable_rank/expert_fc2/layer_00/expert_00": 2.0,
        "stable_rank/expert_fc2/layer_00/expert_01": 5.0,
        "stable_rank/expert_fc2/layer_01/expert_00": 7.0,
        "stable_rank/router/layer_00": 3.0,
    }
    got = aggregate_experts(values)
    assert got["stable_rank/expert_fc2/layer_00"] == 3.5
    assert got["stable_rank/expert_fc2/layer_01"] == 7.0
    assert {k: got[k] for k in values} == values
    assert len(got) == len(values) + 2


# ---------------------------------------------------------------- probes on module trees


class _Layer(torch.nn.Module):
    """A transformer layer's outline: the gated attention's OutputGate where megatron-gamma's
    GatedSelfAttention keeps it (2 heads of 4 channels, elementwise gate)."""

    def __init__(self, number):
        from megatron_gamma.model.gated_attention import OutputGate

        super().__init__()
        self.layer_number = number
        self.self_attention = torch.nn.Module()
        self.self_attention.output_gate = OutputGate(2, 4)


def test_activation_probe_reads_output_gates_per_layer():
    from megatron_gamma.diagnostics.probes import ActivationProbe

    model = torch.nn.Module()
    model.decoder = torch.nn.Module()
    model.decoder.layers = torch.nn.ModuleList([_Layer(1), _Layer(2)])
    logits = [torch.randn(6, 2, 8, generator=_gen(20 + i)) * 3 for i in range(2)]
    with ActivationProbe([model]) as probe:
        for layer, z in zip(model.decoder.layers, logits, strict=True):
            layer.self_attention.output_gate(torch.ones_like(z), z)
            layer.self_attention.output_gate(torch.ones_like(z), z + 100)  # later calls ignored
    got = probe.results()
    for i, z in enumerate(logits):
        ref = gate_statistics(logits=z)
        assert got[f"gate_mean/layer_{i:02d}"] == pytest.approx(ref.mean)
        assert got[f"gate_closed/layer_{i:02d}"] == pytest.approx(ref.closed)
    # hooks are gone after the context
    assert not model.decoder.layers[0].self_attention.output_gate._forward_hooks


def test_loss_curves_come_from_metrics_jsonl_and_a_run_without_checkpoints_says_so(
    tmp_path, capsys
):
    """A run analysed at iteration 0 only (no checkpoints) gets loss.png from metrics.jsonl, and
    a note instead of single-point diagnostics plots."""
    from PIL import Image

    from megatron_gamma.diagnostics.analyze import RunAnalysis
    from megatron_gamma.diagnostics.plots import plot_analysis, read_losses

    rows = [{"iteration": i, "split": "train", "loss": 8.0 - 0.1 * i} for i in range(1, 11)]
    rows += [{"iteration": 5, "split": "valid", "loss": 7.7, "ppl": 2208.3}]
    rows += [{"iteration": 5, "split": "train", "loss": 7.45}]  # resumed run: last value wins
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"gamma": 1.0, "norm_epsilon": 1e-12, "gated_attention": "elementwise"}
    run = RunAnalysis(name="r", run_dir=str(tmp_path), summary=summary, iterations=[0])
    losses = read_losses(str(tmp_path))
    assert losses["train"][0].tolist() == list(range(1, 11))
    expected = [8.0 - 0.1 * i for i in range(1, 11)]
    expected[4] = 7.45
    assert losses["train"][1].tolist() == pytest.approx(expected, abs=1e-12)
    assert losses["valid"][0].tolist() == [5] and losses["valid"][1].tolist() == [7.7]
    written = plot_analysis([run], str(tmp_path / "out"))
    assert set(written) == {"loss"}
    assert "no checkpoints saved" in capsys.readouterr().err
    image = Image.open(written["loss"])
    assert image.info["Title"] == "Training and validation loss (metrics.jsonl)"
    assert image.size[0] > 200 and image.size[1] > 100


def test_analyze_checks_every_run_and_value_before_analysing_any(tmp_path, monkeypatch):
    """A heatmap iteration that only the second run lacks, or fewer than 2 sampled rows, is
    refused before the first run is analysed, naming the flag or the iterations."""
    from megatron_gamma.config import ConfigError
    from megatron_gamma.diagnostics import analyze as analyze_module

    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        run.mkdir()
    ckpts = {str(runs[0]): [(2, "x"), (4, "y")], str(runs[1]): [(2, "x")]}
    monkeypatch.setattr(analyze_module.loader, "run_config", lambda d, **_: None)
    monkeypatch.setattr(analyze_module.layout, "list_checkpoints", lambda d: ckpts[str(d)])

    def never(*_, **__):
        raise AssertionError("a run was analysed before the inputs were checked")

    monkeypatch.setattr(analyze_module, "analyze_run", never)
    dirs = [str(r) for r in runs]
    with pytest.raises(ConfigError, match=r"no checkpoint at \[4\]\. Fix: choose among \[0, 2\]"):
        analyze_module.analyze(dirs, str(tmp_path / "out"), heatmap_iterations=[4])
    for flag, key in (
        ("--heatmap-rows", "heatmap_rows"),
        ("--condensation-rows", "condensation_rows"),
    ):
        with pytest.raises(ConfigError, match=f"{flag} 1: need at least 2 rows"):
            analyze_module.analyze(dirs, str(tmp_path / "out"), **{key: 1})
    assert not (tmp_path / "out").exists()


def test_runs_of_one_study_get_labels_that_tell_them_apart(tmp_path, monkeypatch):
    """Two runs of a study both end in seed-1: analyze labelled both 'seed-1', so the CSV's run
    column could not tell them apart and one run's heatmaps overwrote the other's. Each label is
    now the fewest trailing path components that differ; one run given twice is refused."""
    import contextlib

    from megatron_gamma.config import ConfigError
    from megatron_gamma.diagnostics import analyze as analyze_module

    runs = [tmp_path / "study" / arm / "d64" / "seed-1" for arm in ("baseline", "gamma1")]
    for run in runs:
        run.mkdir(parents=True)

    def analyze_run(run_dir, **_):
        summary = {"gamma": 1.0, "norm_epsilon": 1e-12, "gated_attention": "none"}
        metrics = {"stable_rank/fc2/layer_00": [float(len(str(run_dir)))]}
        return analyze_module.RunAnalysis("x", str(run_dir), summary, [0], metrics)

    monkeypatch.setattr(analyze_module.loader, "run_config", lambda d, **_: None)
    monkeypatch.setattr(analyze_module.loader, "single_process", lambda _: contextlib.nullcontext())
    monkeypatch.setattr(analyze_module, "analyze_run", analyze_run)
    out = tmp_path / "out"
    analyze_module.analyze([str(r) for r in runs], str(out), progress=False)
    doc = json.loads((out / "analysis.json").read_text())
    assert [r["name"] for r in doc["runs"]] == ["baseline/d64/seed-1", "gamma1/d64/seed-1"]
    with open(out / "analysis.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert {(r["run"], float(r["value"])) for r in rows} == {
        ("baseline/d64/seed-1", float(len(str(runs[0])))),
        ("gamma1/d64/seed-1", float(len(str(runs[1])))),
    }
    (tmp_path / "again").symlink_to(runs[0])
    with pytest.raises(ConfigError, match=r"the same run as .*given twice\. Fix: give each"):
        analyze_module.analyze([str(runs[0]), str(tmp_path / "again")], str(tmp_path / "o2"))


@pytest.fixture
def analysed_by_hand(tmp_path, monkeypatch):
    """(the run directory, ``analyze`` of it, its analysed values): ``analyze_run`` gives a
    hand-made :class:`RunAnalysis` of iteration 0 with ``values`` (no model, no checkpoint); the
    checks and writers are the real ones."""
    import contextlib

    from megatron_gamma.diagnostics import analyze as analyze_module

    run = tmp_path / "run"
    run.mkdir()
    values = {"stable_rank/fc2/layer_00": [3.5]}

    def analyze_run(run_dir, **_):
        summary = {"gamma": 1.0, "norm_epsilon": 1e-12, "gated_attention": "none"}
        return analyze_module.RunAnalysis(
            "run", str(run_dir), summary, iterations=[0], metrics=dict(values)
        )

    monkeypatch.setattr(analyze_module.loader, "run_config", lambda d, **_: None)
    monkeypatch.setattr(analyze_module.loader, "single_process", lambda _: contextlib.nullcontext())
    monkeypatch.setattr(analyze_module, "analyze_run", analyze_run)
    return run, lambda **kw: analyze_module.analyze([str(run)], progress=False, **kw), values


def test_a_rerun_replaces_the_earlier_analysis_whole_and_sets_it_aside(analysed_by_hand, capsys):
    """The demo rerun: analyze, then a fresh start of the run (metrics.jsonl moved aside, so no
    loss curve yet), then analyze again: the new analysis holds no loss.png of the earlier run."""
    run, analyze, values = analysed_by_hand
    rows = [{"iteration": i, "split": "train", "loss": 8.0 - 0.1 * i} for i in range(1, 5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    adir = run / "analysis"
    assert analyze()["loss"] == str(adir / "loss.png")
    own = ["analysis.csv", "analysis.json", "heatmaps.npz"]
    assert sorted(p.name for p in adir.iterdir()) == [*own, "loss.png"]
    earlier = {p.name: p.read_bytes() for p in adir.iterdir()}

    (run / "metrics.jsonl").rename(run / "metrics.superseded-1.jsonl")
    values["stable_rank/fc2/layer_00"] = [2.25]
    capsys.readouterr()
    assert analyze() == {
        "json": str(adir / "analysis.json"),
        "csv": str(adir / "analysis.csv"),
        "heatmaps": str(adir / "heatmaps.npz"),
    }
    assert sorted(p.name for p in adir.iterdir()) == own
    aside = run / "analysis.superseded-1"
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == earlier
    assert f"{adir}: the earlier analysis moved to {aside}" in capsys.readouterr().out
    (result,) = json.loads((adir / "analysis.json").read_text())["runs"]
    assert (result["iterations"], result["metrics"]) == ([0], {"stable_rank/fc2/layer_00": [2.25]})
    assert sorted(p.name for p in run.iterdir()) == [
        "analysis", "analysis.superseded-1", "metrics.superseded-1.jsonl"
    ]  # fmt: skip


def test_analyze_refuses_an_output_dir_with_files_it_does_not_write(
    analysed_by_hand, tmp_path, monkeypatch
):
    """Refused before any run is analysed, naming the files; nothing is moved or written."""
    from megatron_gamma.config import ConfigError
    from megatron_gamma.diagnostics import analyze as analyze_module

    run, analyze, _ = analysed_by_hand

    def never(*_, **__):
        raise AssertionError("a run was analysed before the output directory was checked")

    monkeypatch.setattr(analyze_module, "analyze_run", never)
    adir = run / "analysis"
    adir.mkdir()
    (adir / "loss.png").write_bytes(b"\x89PNG")
    (adir / "notes.md").write_text("mine")
    with pytest.raises(ConfigError) as refused:
        analyze()
    assert str(refused.value) == (
        f"output_dir={str(adir)!r}: holds notes.md, which analyze does not write; it replaces "
        "its output directory whole (an earlier analysis is moved aside to DIR.superseded-N), "
        "so it will not mix its files with these. Fix: pass a new --output-dir DIR, or move "
        "those files out"
    )
    (run / "config.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"holds analysis, config\.yaml, which analyze does not"):
        analyze(output_dir=str(run))
    with pytest.raises(ConfigError, match=r"Fix: this is a run directory: leave out --output-dir"):
        analyze(output_dir=str(run))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"file'\: exists and is not a directory\. Fix: pass"):
        analyze(output_dir=str(tmp_path / "file"))
    assert sorted(p.name for p in adir.iterdir()) == ["loss.png", "notes.md"]
    assert sorted(p.name for p in run.iterdir()) == ["analysis", "config.yaml"]


def test_an_analysis_that_fails_to_write_leaves_the_earlier_one_as_it_was(
    analysed_by_hand, monkeypatch
):
    from megatron_gamma.diagnostics import plots

    run, analyze, values = analysed_by_hand
    analyze()
    adir = run / "analysis"
    earlier = {p.name: p.read_bytes() for p in adir.iterdir()}
    values["stable_rank/fc2/layer_00"] = [2.25]

    def broken(runs, out_dir):
        raise OSError("disk full")

    monkeypatch.setattr(plots, "plot_analysis", broken)
    with pytest.raises(OSError, match="disk full"):
        analyze()
    assert {p.name: p.read_bytes() for p in adir.iterdir()} == earlier
    assert sorted(p.name for p in run.iterdir()) == ["analysis"]  # no temporary left


def headline_from_csv(path) -> dict[str, dict[int, dict]]:
    """{run: {iteration: headline fields}} computed here from ``analysis.csv``, the per-key values
    analyze writes (rows without a head or expert: a layer's mean over heads and experts), the
    means by ``math.fsum``."""
    from collections import defaultdict

    values: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    with open(path, encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["head"] or r["expert"]:
                continue
            layer = f"layer_{int(r['layer']):02d}" if r["layer"] else ""
            matrix = "/".join(part for part in (r["role"], layer) if part)
            values[r["run"]][int(r["iteration"])][r["metric"]][matrix] = float(r["value"])

    def mean(metric: dict) -> float | None:
        return math.fsum(metric.values()) / len(metric) if metric else None

    out: dict = {}
    for run, iterations in values.items():
        out[run] = {}
        for it, at in iterations.items():
            ranks, cond = at["stable_rank"], at["condensation"]
            low, high = min(ranks, key=ranks.get), max(cond, key=cond.get)
            out[run][it] = {
                "stable_rank_mean": mean(ranks),
                "stable_rank_min": ranks[low],
                "stable_rank_min_matrix": low,
                "condensation_max": cond[high],
                "condensation_max_matrix": high,
                "sink_share": mean(at["sink_share"]),
                "saturated_share": mean(at["norm_saturated"]),
                "gate_mean": mean(at["gate_mean"]),
                "gate_closed": mean(at["gate_closed"]),
            }
    return out


def uniform_sink_reference(seq_length: int) -> float:
    """Uniform causal attention's sink share in exact fractions: (1/(s-1)) sum_{k=2..s} 1/k."""
    from fractions import Fraction

    total = sum(Fraction(1, k) for k in range(2, seq_length + 1))
    return float(total / (seq_length - 1))


def check_headline(stdout: str, json_path, csv_path) -> None:
    """The headline numbers in analysis.json's summaries and in ``stdout`` (at their printed
    precision) equal those computed from analysis.csv; the uniform sink share its closed form."""
    with open(json_path, encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    reference = headline_from_csv(csv_path)
    lines = stdout.splitlines()
    for run in runs:
        rows = run["summary"]["headline"]
        ref = reference[run["name"]]
        assert [r["iteration"] for r in rows] == run["iterations"]
        assert sorted(ref) == run["iterations"]
        (title,) = [i for i, ln in enumerate(lines) if ln.startswith(run["name"] + " (")]
        assert lines[title].endswith("headline diagnostics per analysed iteration")
        uniform = uniform_sink_reference(run["seq_length"]) if run["seq_length"] else None
        if uniform is not None:
            assert f"(uniform {uniform:.4f})" in lines[title + 2]
        for row, line in zip(rows, lines[title + 3 : title + 3 + len(rows)], strict=True):
            want = ref[row["iteration"]]
            for field, value in want.items():
                if isinstance(value, float):
                    assert row[field] == pytest.approx(value, rel=1e-12, abs=0), field
                else:
                    assert row[field] == value, field
            if want["sink_share"] is None:
                assert row["sink_share_uniform"] is None
            else:
                assert row["sink_share_uniform"] == pytest.approx(uniform, rel=1e-12)
            cells = line.split()
            assert int(cells[0]) == row["iteration"]
            assert cells[3] == want["stable_rank_min_matrix"]
            assert cells[5] == want["condensation_max_matrix"]
            printed = {
                "stable_rank_mean": (cells[1], 1, 2),
                "stable_rank_min": (cells[2], 1, 2),
                "condensation_max": (cells[4], 1, 3),
                "sink_share": (cells[6], 1, 4),
                "saturated_share": (cells[7], 100, 2),
            }
            gated = want["gate_mean"] is not None
            assert len(cells) == (10 if gated else 8)
            if gated:
                printed.update(gate_mean=(cells[8], 1, 3), gate_closed=(cells[9], 100, 2))
            for field, (cell, scale, decimals) in printed.items():
                if want[field] is None:
                    assert cell == "-", field
                else:
                    tolerance = 0.5 * 10**-decimals + 1e-9
                    assert float(cell) == pytest.approx(scale * want[field], abs=tolerance), field


def test_analyze_prints_and_records_the_headline_numbers_of_its_csv(tmp_path, monkeypatch, capsys):
    """Trial 15 #6: ``analyze`` printed only the files it wrote, and analysis.json's summary held
    only the config. Per run and analysed iteration it now prints, and records in the summary,
    the mean and lowest stable rank, the highest condensation score, the sink share beside
    uniform attention's, the saturated share and, for a gated run, the gate statistics: here
    against the same numbers computed from analysis.csv (hand-made runs: two layers, per-head
    and per-expert keys, which are left out, and an ungated run without an activation batch)."""
    import contextlib

    from megatron_gamma.cli import main
    from megatron_gamma.diagnostics import analyze as analyze_module

    rng = np.random.default_rng(7)
    iterations = [0, 10, 20]

    def series(low: float, high: float) -> list[float]:
        return rng.uniform(low, high, len(iterations)).tolist()

    def metrics(gated: bool, batch: bool) -> dict[str, list]:
        out = {}
        for layer in ("layer_00", "layer_01"):
            for role in ("qkv.q", "fc2", *(("gate",) if gated else ())):
                out[f"stable_rank/{role}/{layer}"] = series(1, 30)
                out[f"condensation/{role}/{layer}"] = series(0, 1)
            experts = [series(1, 30) for _ in range(2)]
            for e, values in enumerate(experts):
                out[f"stable_rank/expert_fc2/{layer}/expert_{e:02d}"] = values
            out[f"stable_rank/expert_fc2/{layer}"] = np.mean(experts, 0).tolist()
            if batch:
                heads = [series(0, 1) for _ in range(4)]
                for h, values in enumerate(heads):
                    out[f"sink_share/{layer}/head_{h:02d}"] = values
                out[f"sink_share/{layer}"] = np.mean(heads, 0).tolist()
                for norm in ("input_layernorm", "pre_mlp_layernorm"):
                    out[f"norm_saturated/{norm}/{layer}"] = series(0, 1)
                    for q in ("p05", "p50", "p95"):
                        out[f"norm_log10_ms_{q}/{norm}/{layer}"] = series(-14, 0)
            if gated and batch:
                out[f"gate_mean/{layer}"] = series(0, 1)
                out[f"gate_closed/{layer}"] = series(0, 1)
        for role in ("embedding", "output"):
            out[f"stable_rank/{role}"] = series(1, 30)
            out[f"condensation/{role}"] = series(0, 1)
        if batch:
            out["norm_saturated/final_layernorm"] = series(0, 1)
            for q in ("p05", "p50", "p95"):
                out[f"norm_log10_ms_{q}/final_layernorm"] = series(-14, 0)
        return out

    made = {"a": (True, True), "b": (False, False)}

    def analyze_run(run_dir, **_):
        gated, batch = made[os.path.basename(run_dir)]
        summary = {
            "gamma": 1.0,
            "norm_epsilon": 1e-12,
            "gated_attention": "headwise" if gated else "none",
        }
        return analyze_module.RunAnalysis(
            "x", str(run_dir), summary, list(iterations), metrics(gated, batch),
            seq_length=48 if batch else 0,
        )  # fmt: skip

    monkeypatch.setattr(analyze_module.loader, "run_config", lambda d, **_: None)
    monkeypatch.setattr(analyze_module.loader, "single_process", lambda _: contextlib.nullcontext())
    monkeypatch.setattr(analyze_module, "analyze_run", analyze_run)
    for name in made:
        (tmp_path / name).mkdir()
    out = tmp_path / "out"
    args = ["analyze", str(tmp_path / "a"), str(tmp_path / "b"), "--output-dir", str(out)]
    assert main([*args, "--no-progress"]) == 0
    stdout = capsys.readouterr().out
    check_headline(stdout, out / "analysis.json", out / "analysis.csv")
    doc = json.loads((out / "analysis.json").read_text())
    assert set(doc["headline_fields"]) == set(doc["runs"][0]["summary"]["headline"][0])
    assert "(uniform " not in stdout.split("b (")[1].splitlines()[2]
    assert "gate = sigmoid(z)" in stdout and "(uniform) = the same under uniform" in stdout
    assert stdout.index("wrote gates: ") < stdout.index("a (γ=1, ε=1e-12, ")


def test_compare_line_says_which_sign_favours_which_model():
    """Trial 15 #8: compare's console line, the one people paste, gave "mean delta_sym -0.1425
    [...]" without saying which model a negative value favours. It now names A and B and says
    the sign's meaning; here B gives every target more probability than A, so the mean is
    negative (fp64 by hand) and the line says negative means B better."""
    from megatron_gamma.diagnostics.compare import CAVEATS, summary_lines

    rng = np.random.default_rng(3)
    p_a = rng.uniform(0.05, 0.5, (4, 8))
    p_b = np.minimum(1.0, p_a * rng.uniform(1.2, 2.0, p_a.shape))
    documents = np.repeat(np.arange(8), 4).reshape(4, 8)
    logp_a, logp_b = torch.from_numpy(np.log(p_a)).float(), torch.from_numpy(np.log(p_b)).float()
    delta = symmetric_gap(logp_a, logp_b)
    mean, _, low, high, count, df = document_interval(delta.numpy(), documents)
    summary = {
        "a": {"checkpoint": "/r/a/checkpoints/iter_0000025", "label": "a iter 25 (γ=1)",
              "mean_loss": float(-logp_a.double().mean())},
        "b": {"checkpoint": "/r/b/checkpoints/iter_0000050", "label": "b iter 50 (γ=1)",
              "mean_loss": float(-logp_b.double().mean())},
        "tokens": delta.numel(), "documents": count, "mean_delta_sym": mean,
        "mean_delta_sym_interval": [low, high], "mean_delta_sym_df": df, "caveats": CAVEATS,
    }  # fmt: skip
    by_hand = float(np.mean((p_a - p_b) / (p_a + p_b)))
    assert by_hand < 0 and mean == pytest.approx(by_hand, abs=1e-6)
    lines = summary_lines(summary)
    assert lines[:2] == [
        "A = a iter 25 (γ=1): /r/a/checkpoints/iter_0000025",
        "B = b iter 50 (γ=1): /r/b/checkpoints/iter_0000050",
    ]
    loss_a, loss_b = -np.log(p_a).mean(), -np.log(p_b).mean()
    assert lines[2] == (
        f"32 tokens of 8 documents: loss A {loss_a:.4f}, loss B {loss_b:.4f} nats/token, mean "
        f"delta_sym {by_hand:+.4f} [{low:+.4f}, {high:+.4f}] (95%, df {df:.1f}); "
        "delta_sym = (p_A - p_B)/(p_A + p_B) per token: negative = B better, positive = A better"
    )
    assert lines[3] == f"note: {CAVEATS}"
