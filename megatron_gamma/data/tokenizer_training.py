"""``train-tokenizer`` at scale: sample (:mod:`.sampling`), train a byte-level BPE
(:func:`~megatron_gamma.data.tokenizer.train_bpe`), write the loader metadata
(:func:`~megatron_gamma.data.tokenizer.write_metadata`) and measure characters per token on the
held-out documents of each language, written to ``{tokenizer stem}.report.json``.
"""

from __future__ import annotations

import logging
import os

from megatron_gamma.data.readers import expand_inputs
from megatron_gamma.data.resume import check_output_dir
from megatron_gamma.data.sampling import Sample, sample_corpus
from megatron_gamma.data.stats import write_json
from megatron_gamma.data.tokenizer import (
    LOADER_FILES,
    BilingualTokenizer,
    train_bpe,
    write_metadata,
)

log = logging.getLogger(__name__)


def chars_per_token(tok: BilingualTokenizer, texts: dict[str, list[str]]) -> dict[str, dict]:
    """``{lang: {documents, characters, tokens, chars_per_token}}`` of ``texts`` (no EOD)."""
    out = {}
    for lang, docs in sorted(texts.items()):
        chars = sum(map(len, docs))
        tokens = sum(len(ids) for ids in tok.tokenize_batch(docs)) if docs else 0
        out[lang] = {
            "documents": len(docs),
            "characters": chars,
            "tokens": tokens,
            "chars_per_token": round(chars / tokens, 4) if tokens else None,
        }
    return out


def tokenizer_output(output: str) -> str:
    """The tokenizer.json that ``--output`` names: ``output``, or ``output/tokenizer.json`` for a
    directory (an existing one, or a path ending in ``/``), the file ``--tokenizer-model DIR``
    reads.

    Raises:
        ValueError: ``output`` does not exist, does not end in ``/`` and is not named
            ``*.json``: meant as a directory, it would become a file of that name, with its
            loader files and report written into its parent folder; the message names it and
            both fixes.
    """
    if output.endswith(os.sep) or os.path.isdir(output):
        return os.path.join(output, "tokenizer.json")
    if not os.path.lexists(output) and not output.lower().endswith(".json"):
        folder = os.path.dirname(output) or "."
        raise ValueError(
            f"output={output!r}: neither an existing directory nor a .json file name; "
            f"train-tokenizer would write a file named {os.path.basename(output)!r} and put "
            f"its loader files ({', '.join(LOADER_FILES)}) into {folder!r}. Fix: --output "
            f"{output}/ for a directory holding tokenizer.json, or a path ending in .json "
            f"(e.g. {output}.json)"
        )
    return output


def report_path(output: str) -> str:
    """The report ``train-tokenizer`` writes beside ``output`` (``tokenizer.report.json`` for
    ``tokenizer.json``)."""
    return os.path.splitext(output)[0] + ".report.json"


def _refuse_existing_siblings(output: str) -> None:
    """Refuse to write ``output``'s loader files or report over files already there.

    Raises:
        ValueError: one of them exists (another tokenizer's ``tokenizer_config.json`` would lose
            its EOD, PAD and BOS); the message names it and the fix.
    """
    folder = os.path.dirname(os.path.abspath(output))
    for path in [os.path.join(folder, name) for name in LOADER_FILES] + [report_path(output)]:
        if os.path.lexists(path):
            raise ValueError(
                f"output={output!r}: {path} already exists, and train-tokenizer writes that "
                "file beside the tokenizer.json it trains; it does not overwrite it (it may "
                "belong to another tokenizer in that folder, whose EOD, PAD and BOS it names). "
                "Fix: pass an --output in a folder of its own, e.g. "
                f"{os.path.join(folder, 'new', 'tokenizer.json')}"
            )


def train_tokenizer(
    inputs: list[str],
    output: str,
    vocab_size: int,
    proportions: dict[str, float],
    sample_chars: int,
    progress: bool = True,
    **sample_kwargs,
) -> dict:
    """Sample, train, write tokenizer.json + metadata + report; return the report.

    Args:
        inputs: files, directories or globs.
        output: the tokenizer.json to write (name it ``tokenizer.json`` for the HF and
            megatron-core loaders, which look for that name in its directory), or a directory
            to write it into (:func:`tokenizer_output`).
        vocab_size: vocabulary size including bytes and special tokens.
        proportions: ``{lang: share}`` of the training characters.
        sample_chars: training characters in all.
        progress: show a bar while sampling.
        **sample_kwargs: the other arguments of :func:`~megatron_gamma.data.sampling.sample_corpus`
            (seed, sample_rate, heldout_fraction, heldout_chars, json_keys, lang_key, nfkc,
            punct_width, on_error).

    Returns:
        The report: sample composition, budgets and held-out characters per token by language.

    Raises:
        ValueError: ``output``, its loader files or its report already exist (checked before
            any input is read; preprocessed data may have been made with them) or cannot be
            written
            (:func:`~megatron_gamma.data.resume.check_output_dir`, a ``ConfigError``), no
            training document was sampled, or a bad parameter.
    """
    output = tokenizer_output(output)
    if os.path.lexists(output):
        raise ValueError(
            f"output={output!r}: already exists; train-tokenizer overwrites no file (were it "
            "a tokenizer, data preprocessed with it would no longer match). Fix: pass another "
            "--output path, or delete the existing file first"
        )
    _refuse_existing_siblings(output)
    check_output_dir("--output", output)
    files = expand_inputs(inputs)
    sample: Sample = sample_corpus(
        files, proportions, sample_chars, progress=progress, **sample_kwargs
    )
    if not sample.train:
        raise ValueError(
            f"no training documents sampled from {len(files)} file(s) for languages "
            f"{sorted(proportions)}. Fix: check --lang-proportions and --json-keys"
        )
    texts = [t for lang in sorted(sample.train) for t in sample.train[lang]]
    train_bpe(texts, vocab_size, output)
    if os.path.basename(output) != "tokenizer.json":
        log.warning("%s: HF and megatron-core loaders look for 'tokenizer.json'", output)
    write_metadata(output)
    tok = BilingualTokenizer(output)
    train_chars = sample.chars("train")
    report = {
        "vocab_size": tok.vocab_size,
        "special_tokens": {"eod": tok.eod, "pad": tok.pad, "bos": tok.bos},
        "tokenizer_sha256": tok.sha256,
        "documents_read": sample.documents_read,
        "errors": sample.errors,
        "budget_chars": sample.budgets,
        "train": {
            lang: {
                "documents": len(sample.train.get(lang, [])),
                "characters": train_chars.get(lang, 0),
            }
            for lang in sample.budgets
        },
        "heldout": chars_per_token(tok, sample.heldout),
    }
    short = {k: b for k, b in sample.budgets.items() if train_chars.get(k, 0) < b}
    if short:
        total = sum(train_chars.values())
        got = ", ".join(f"{k} {train_chars.get(k, 0) / total:.2f}" for k in sample.budgets)
        want = ", ".join(
            f"{k} {v / sum(sample.budgets.values()):.2f}" for k, v in sample.budgets.items()
        )
        log.warning(
            "the input ran out before the budget of %s: trained on %d characters with "
            "proportions %s (requested %s)",
            "/".join(short),
            total,
            got,
            want,
        )
    write_json(report_path(output), report)
    return report
