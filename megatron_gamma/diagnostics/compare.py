"""``megatron-gamma compare CKPT_A CKPT_B --data-path PREFIX``: where one model beats the other.

Both checkpoints (any saved parallel layout) are loaded into single-rank models built from their
runs' configs (:func:`megatron_gamma.rundir.loader.run_config`); both score the same token
windows of an indexed dataset; per token we get
``log p_A``, ``log p_B``, Delta_sym and difficulty (definitions in
:mod:`megatron_gamma.diagnostics.tokens`), aggregated into equal-count difficulty bins.

Prints which checkpoint is A and which B, both losses and the mean Delta_sym with its interval
and what its sign means (:func:`summary_lines`), and writes into ``--output-dir``:

- ``delta_sym_by_difficulty.png``: mean Delta_sym per bin with its 95% interval clustered by
  document, coloured for A or B only where the interval excludes 0, and the share of tokens
  where A is better;
- ``delta_sym_by_difficulty.csv``: the bin table;
- ``compare.json``: the table, both losses, the inputs; ``tokens.npz``: per-token arrays
  (tokens, targets, logp_a, logp_b, delta_sym, difficulty, and document: the index of the
  document each target token belongs to, for document-level resampling).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from types import SimpleNamespace
from typing import Optional

import numpy as np
import torch
from tqdm import tqdm

from megatron_gamma.atomic import atomic_open, atomic_path
from megatron_gamma.config import ConfigError
from megatron_gamma.data.indexed import short_dataset
from megatron_gamma.diagnostics.tokens import (
    document_interval,
    gap_by_difficulty,
    symmetric_gap,
    target_log_probs,
    token_difficulty,
)
from megatron_gamma.rundir import checkpoint, layout, loader
from megatron_gamma.rundir.paths import check_replaced_dir, replaced_dir

CAVEATS = (
    "one checkpoint pair: the intervals cover these token windows (95%, clustered by document: "
    "CR2 with Bell-McCaffrey df, documents - 1 only where documents are equally long, fewer "
    "where a few hold most tokens), not other seeds or the method in general; difficulty is the "
    "mean loss of the same two models, so noise alone makes the profile slope towards B on hard "
    "tokens (regression to the mean): judge where gains sit with difficulty from independent "
    "models (the study's claim 8 takes it from the other seeds)"
)
"""What ``compare``'s numbers do not say, written into compare.json and printed."""


def token_windows(prefix: str, num_sequences: int, seq_length: int) -> torch.Tensor:
    """The first ``num_sequences`` windows of ``seq_length + 1`` consecutive tokens of an indexed
    dataset (documents concatenated in order, as GPTDataset does).

    Returns:
        int64 (n, seq_length + 1); n < num_sequences when the dataset is short.

    Raises:
        ConfigError: missing .bin/.idx, or fewer tokens than one window.
    """
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    for ext in (".bin", ".idx"):
        if not os.path.isfile(prefix + ext):
            raise ConfigError(
                f"data_path={prefix!r}: {prefix + ext} does not exist. Fix: give the prefix "
                "written by `megatron-gamma preprocess` (no extension)"
            )
    ds = IndexedDataset(prefix)
    need = num_sequences * seq_length + 1
    parts, have = [], 0
    for i in range(len(ds)):
        doc = np.asarray(ds[i], dtype=np.int64)
        parts.append(doc)
        have += len(doc)
        if have >= need:
            break
    tokens = torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dtype=torch.long)
    n = min(num_sequences, (len(tokens) - 1) // seq_length)
    if n < 1:
        raise ConfigError(short_dataset(prefix, len(tokens), seq_length))
    starts = torch.arange(n) * seq_length
    return torch.stack([tokens[s : s + seq_length + 1] for s in starts.tolist()])


def window_documents(prefix: str, num_windows: int, seq_length: int) -> np.ndarray:
    """Document index (in the dataset's order) of every target token of the first
    ``num_windows`` windows of :func:`token_windows`.

    Returns:
        int64 (num_windows, seq_length).
    """
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix)  # its lengths view its memory map: keep it open while read
    ends = np.cumsum(np.array(ds.sequence_lengths, dtype=np.int64))
    del ds
    pos = np.arange(num_windows)[:, None] * seq_length + np.arange(1, seq_length + 1)[None, :]
    return np.searchsorted(ends, pos, side="right").astype(np.int64)


@torch.no_grad()
def score_tokens(model: torch.nn.Module, windows: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``log p(target)`` of every next-token position, (n, seq_length) float32 nats."""
    device = next(model.parameters()).device
    out = []
    seq = windows.size(1) - 1
    position_ids = torch.arange(seq, device=device).unsqueeze(0)
    for start in range(0, windows.size(0), batch_size):
        w = windows[start : start + batch_size].to(device)
        logits = model(w[:, :-1], position_ids.expand(w.size(0), -1), None)
        out.append(target_log_probs(logits, w[:, 1:]).cpu())
    return torch.cat(out)


def _label(ckpt: str, cfg) -> str:
    """``RUN iter N (γ=…, ε=…, gated-MODE|no gate)``: the checkpoint's run and iteration with the
    settings ``analyze``'s legends name (:func:`~megatron_gamma.diagnostics.plots.run_label`),
    the gate included, so a gap is not read as γ's and ε's alone."""
    from megatron_gamma.diagnostics.analyze import run_summary
    from megatron_gamma.diagnostics.plots import run_label

    run = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(ckpt))))
    it = layout.checkpoint_iteration(ckpt)
    return run_label(SimpleNamespace(name=f"{run} iter {it}", summary=run_summary(cfg)))


SIGN = "delta_sym = (p_A - p_B)/(p_A + p_B) per token: negative = B better, positive = A better"
"""What the sign of Delta_sym means, on compare's console line."""


def summary_lines(summary: dict) -> list[str]:
    """The lines ``compare`` prints: which checkpoint is A and which B (label and path), then the
    token count, both losses (nats/token) and the mean Delta_sym with its 95% interval
    clustered by document and what its sign means (:data:`SIGN`), then the caveats.

    Args:
        summary: :func:`compare`'s result (or ``compare.json``).
    """
    iv = summary["mean_delta_sym_interval"]
    interval = (
        f" [{iv[0]:+.4f}, {iv[1]:+.4f}] (95%, df {summary['mean_delta_sym_df']:.1f})" if iv else ""
    )
    a, b = summary["a"], summary["b"]
    return [
        f"A = {a['label']}: {a['checkpoint']}",
        f"B = {b['label']}: {b['checkpoint']}",
        f"{summary['tokens']} tokens of {summary['documents']} documents: loss A "
        f"{a['mean_loss']:.4f}, loss B {b['mean_loss']:.4f} nats/token, mean delta_sym "
        f"{summary['mean_delta_sym']:+.4f}{interval}; {SIGN}",
        f"note: {summary['caveats']}",
    ]


def compare(
    ckpt_a: str,
    ckpt_b: str,
    data_path: str,
    output_dir: str,
    *,
    config_a: Optional[str] = None,
    config_b: Optional[str] = None,
    num_sequences: int = 64,
    seq_length: Optional[int] = None,
    batch_size: int = 4,
    num_bins: int = 10,
    progress: bool = True,
) -> dict:
    """Score the same tokens with two checkpoints and bin Delta_sym by difficulty.

    Args:
        ckpt_a: checkpoint (``SAVE/iter_N``), checkpoint root or run directory of model A.
        ckpt_b: same for model B.
        data_path: indexed-dataset prefix (held-out text) to score.
        output_dir: where the plot, table and numbers go, written whole: an earlier compare
            output there moves aside to ``OUTPUT_DIR.superseded-N``
            (:func:`~megatron_gamma.rundir.paths.replaced_dir`).
        config_a: A's config.yaml (default: the checkpoint's own, else the config.yaml of its
            run, :func:`~megatron_gamma.rundir.loader.run_config`).
        config_b: B's config.yaml.
        num_sequences: token windows to score.
        seq_length: window length (default: the shorter of the two models' seq_length).
        batch_size: sequences per forward pass.
        num_bins: equal-count difficulty bins.
        progress: show a progress bar.

    Returns:
        The summary written to ``compare.json`` plus ``"files"``: {name: path}.

    Raises:
        ConfigError: missing checkpoints/configs/data, different tokenizers, a checkpoint
            trained with another tokenizer than its config's
            (:func:`~megatron_gamma.rundir.loader.check_tokenizer`), or a seq_length beyond a
            model's maximum; an ``output_dir`` that is a file or holds files compare does not
            write (:func:`~megatron_gamma.rundir.paths.check_replaced_dir`).
    """
    check_replaced_dir(output_dir, "compare")
    paths = [layout.resolve_checkpoint(ckpt_a), layout.resolve_checkpoint(ckpt_b)]
    if os.path.realpath(paths[0]) == os.path.realpath(paths[1]):
        print(
            f"compare: warning: CKPT_A and CKPT_B are the same checkpoint ({paths[0]}): every "
            "delta_sym is 0, and no token has p_A > p_B",
            file=sys.stderr,
        )
    cfgs = [
        loader.run_config(ckpt, given)
        for ckpt, given in zip(paths, (config_a, config_b), strict=True)
    ]
    for ckpt, path, cfg, given, flag in zip(
        (ckpt_a, ckpt_b), paths, cfgs, (config_a, config_b), ("--config-a", "--config-b"),
        strict=True,
    ):  # fmt: skip
        recorded = None if given is not None else loader.recorded_paths(ckpt)
        checkpoint.tokenizer_file(cfg, given or path, recorded, flag)
    if loader.tokenizer_digest(cfgs[0]) != loader.tokenizer_digest(cfgs[1]):
        raise ConfigError(
            f"the runs use different tokenizers ({loader.tokenizer_path(cfgs[0])} vs "
            f"{loader.tokenizer_path(cfgs[1])}): per-token probabilities are not comparable. "
            "Fix: compare runs trained with the same tokenizer"
        )
    for ckpt, cfg, flag in zip(paths, cfgs, ("--config-a", "--config-b"), strict=True):
        warning = loader.check_tokenizer(
            ckpt,
            cfg,
            f"pass {flag} with a config.yaml that selects the checkpoint's tokenizer ({{flags}})",
        )
        if warning:
            print(f"compare: {warning}", file=sys.stderr)
    limit = min(c.model.max_position_embeddings for c in cfgs)
    seq = seq_length or min(c.model.seq_length for c in cfgs)
    if not 1 <= seq <= limit:
        raise ConfigError(f"seq_length={seq}: must lie in [1, {limit}] (the models' maximum)")
    if num_sequences < 1 or batch_size < 1 or num_bins < 1:
        raise ConfigError("num_sequences, batch_size and num_bins must be >= 1")
    windows = token_windows(data_path, num_sequences, seq)
    logps = []
    with loader.single_process(cfgs[0]):
        bar = tqdm(
            zip(paths, cfgs, strict=True),
            total=2,
            desc="compare",
            unit="model",
            disable=None if progress else True,
            file=sys.stderr,
        )
        for ckpt, cfg in bar:
            model = loader.model_for_run(cfg, ckpt)
            loader.load_weights(model, ckpt)
            logps.append(score_tokens(model, windows, batch_size))
            del model
    logp_a, logp_b = logps
    delta = symmetric_gap(logp_a, logp_b)
    difficulty = token_difficulty(logp_a, logp_b)
    documents = window_documents(data_path, windows.size(0), seq)
    bins = gap_by_difficulty(
        delta, difficulty, num_bins=num_bins, logp_a=logp_a, logp_b=logp_b, documents=documents
    )
    mean, _, low, high, count, df = document_interval(delta.numpy(), documents)
    labels = (_label(paths[0], cfgs[0]), _label(paths[1], cfgs[1]))
    summary = {
        "a": {
            "checkpoint": os.path.abspath(paths[0]),
            "label": labels[0],
            "mean_loss": float(-logp_a.double().mean()),
        },
        "b": {
            "checkpoint": os.path.abspath(paths[1]),
            "label": labels[1],
            "mean_loss": float(-logp_b.double().mean()),
        },
        "data_path": data_path,
        "sequences": int(windows.size(0)),
        "seq_length": seq,
        "tokens": int(delta.numel()),
        "documents": count,
        "mean_delta_sym": mean,
        "mean_delta_sym_interval": None if count < 2 else [low, high],
        "mean_delta_sym_df": None if count < 2 else df,
        "definition": "delta_sym = (p_A - p_B) / (p_A + p_B); difficulty = (loss_A + loss_B) / 2",
        "caveats": CAVEATS,
        "bins": [b.as_dict() for b in bins],
    }
    files = _write(
        summary, bins, labels, windows, logp_a, logp_b, delta, difficulty, documents, output_dir
    )
    summary["files"] = files
    return summary


def _write(
    summary, bins, labels, windows, logp_a, logp_b, delta, difficulty, documents, out_dir
) -> dict:
    with replaced_dir(out_dir, "compare") as tmp:
        files = _write_files(
            summary, bins, labels, windows, logp_a, logp_b, delta, difficulty, documents, tmp
        )
    return {name: os.path.join(out_dir, os.path.basename(p)) for name, p in files.items()}


def _write_files(
    summary, bins, labels, windows, logp_a, logp_b, delta, difficulty, documents, out_dir
) -> dict:
    from megatron_gamma.diagnostics.plots import plot_compare

    files = {
        "json": os.path.join(out_dir, "compare.json"),
        "csv": os.path.join(out_dir, "delta_sym_by_difficulty.csv"),
        "tokens": os.path.join(out_dir, "tokens.npz"),
    }
    with atomic_open(files["json"], "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, ensure_ascii=False)
    with atomic_open(files["csv"], "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(bins[0].as_dict()))
        writer.writeheader()
        for b in bins:
            writer.writerow(b.as_dict())
    with atomic_path(files["tokens"]) as tmp:
        np.savez_compressed(
            tmp,
            tokens=windows[:, :-1].numpy(),
            targets=windows[:, 1:].numpy(),
            logp_a=logp_a.numpy(),
            logp_b=logp_b.numpy(),
            delta_sym=delta.numpy(),
            difficulty=difficulty.numpy(),
            document=documents,
        )
    note = f" ({summary['tokens']} tokens, {len(bins)} bins)"
    files["plot"] = plot_compare(
        bins, labels, os.path.join(out_dir, "delta_sym_by_difficulty.png"), note
    )
    return files
