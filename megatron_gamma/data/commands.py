"""The data subcommands of ``megatron-gamma`` (Megatron-LM flag names where they exist):

    megatron-gamma train-tokenizer --input DIR_OR_GLOB ... --output tok/tokenizer.json
    megatron-gamma preprocess --input DIR_OR_GLOB ... --tokenizer-model tok/tokenizer.json \\
        --output-prefix data/corpus [--workers N] [--shard-index I --num-shards N]
        [--tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt]
    megatron-gamma merge --output-prefix data/corpus [--num-shards N]     # shards of a run
    megatron-gamma merge --input PREFIX|DIR ... --output-prefix data/all  # any datasets
    megatron-gamma train-punkt --input en.jsonl --output punkt.json

Each is a thin wrapper over :mod:`megatron_gamma.data`; ``tools/*.py`` call the same code.
"""

from __future__ import annotations

import argparse
import logging
import sys

from megatron_gamma.config import TokenizerType


def _log_to_stderr() -> None:
    logger = logging.getLogger("megatron_gamma.data")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _train_tokenizer(args: argparse.Namespace) -> None:
    from megatron_gamma.data.sampling import parse_proportions
    from megatron_gamma.data.tokenizer_training import train_tokenizer

    _log_to_stderr()
    report = train_tokenizer(
        args.input,
        args.output,
        args.vocab_size,
        parse_proportions(args.lang_proportions),
        args.sample_chars,
        progress=not args.no_progress,
        seed=args.seed,
        sample_rate=args.sample_rate,
        heldout_fraction=args.heldout_fraction,
        heldout_chars=args.heldout_chars,
        json_keys=tuple(args.json_keys),
        lang_key=args.lang_key,
        nfkc=args.nfkc,
        punct_width=args.punct_width,
        on_error=args.on_error,
    )
    print(f"wrote {args.output} ({report['vocab_size']} tokens) and its loader metadata")
    for lang, t in report["train"].items():
        print(f"  trained on {lang}: {t['documents']} documents, {t['characters']} characters")
    for lang, h in report["heldout"].items():
        print(
            f"  held-out {lang}: {h['chars_per_token']} characters/token "
            f"({h['documents']} documents, {h['characters']} characters)"
        )
    if not report["heldout"]:
        print("  no held-out documents (--heldout-fraction 0, or too little input)")


def _preprocess(args: argparse.Namespace) -> None:
    from megatron_gamma.config import ConfigError
    from megatron_gamma.data.encode import EncodeOptions
    from megatron_gamma.data.filters import Filters
    from megatron_gamma.data.preprocess import format_summary, preprocess

    _log_to_stderr()
    if args.tokenizer_type == "HuggingFaceTokenizer" and args.tokenizer_model is None:
        raise ConfigError(
            "preprocess: --tokenizer-model is required with --tokenizer-type "
            "HuggingFaceTokenizer. Fix: pass the tokenizer.json (or its directory)"
        )
    options = EncodeOptions(
        json_keys=tuple(args.json_keys),
        lang_key=args.lang_key,
        per_language=args.per_language,
        split_sentences=args.split_sentences,
        append_eod=args.append_eod,
        nfkc=args.nfkc,
        punct_width=args.punct_width,
        filters=Filters(
            args.min_chars, args.min_tokens, args.max_symbol_ratio, args.max_document_chars
        ),
        on_error=args.on_error,
    )
    result = preprocess(
        args.input,
        args.tokenizer_model,
        args.output_prefix,
        workers=args.workers,
        chunk_size=args.chunk_size,
        progress=not args.no_progress,
        options=options,
        shard_index=args.shard_index,
        num_shards=args.num_shards,
        tokenizer_backend=args.tokenizer_backend,
        tokenizer_type=args.tokenizer_type,
        vocab_file=args.vocab_file,
        merge_file=args.merge_file,
    )
    print(format_summary(result))


def _merge(args: argparse.Namespace) -> None:
    from megatron_gamma.data.merge import merge_datasets, merge_shards

    _log_to_stderr()
    if args.input:
        if args.num_shards is not None:
            from megatron_gamma.config import ConfigError

            raise ConfigError(
                "merge: --input and --num-shards exclude each other. Fix: --input PREFIX... for "
                "any datasets, or --num-shards N for the shards of --output-prefix"
            )
        out = merge_datasets(args.input, args.output_prefix, progress=not args.no_progress)
        print(f"wrote {out}.bin/.idx")
        return
    doc = merge_shards(args.output_prefix, args.num_shards, progress=not args.no_progress)
    for o in doc["outputs"].values():
        print(f"wrote {o['prefix']}.bin/.idx: {o['documents']} documents, {o['tokens']} tokens")
    print(f"wrote {args.output_prefix}.stats.json; blend: --data-path {' '.join(doc['data_path'])}")


def _train_punkt(args: argparse.Namespace) -> None:
    from megatron_gamma.data.readers import expand_inputs, iter_chunks, iter_records, record_text
    from megatron_gamma.data.sentences import save_punkt_params, train_punkt

    def texts():
        for path in expand_inputs(args.input):
            for chunk in iter_chunks(path, columns=[args.json_key]):
                for rec in iter_records(chunk, "stop", {}, []):
                    yield record_text(path, rec, args.json_key)

    params = train_punkt(texts())
    save_punkt_params(params, args.output)
    print(
        f"wrote {args.output}: {len(params.abbrev_types)} abbreviations, "
        f"{len(params.collocations)} collocations, {len(params.sent_starters)} sentence starters"
    )


def _input_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--input", nargs="+", required=True, help="files (.jsonl/.json[.gz|.zst], .parquet), "
        "directories or globs, read in the order given (a directory: its data files but bare "
        ".json, sorted; a glob: sorted)",
    )  # fmt: skip
    p.add_argument(
        "--json-keys", "--json-key", dest="json_keys", nargs="+", default=["text"],
        help="record fields holding text; one output per key (default: text)",
    )  # fmt: skip
    p.add_argument(
        "--lang-key", default=None,
        help="record field with the language (zh*/en*/mixed); default: tag by script",
    )  # fmt: skip
    p.add_argument("--nfkc", action="store_true", help="Unicode NFKC normalization (default off)")
    p.add_argument(
        "--punct-width", choices=["keep", "half", "cjk"], default="keep",
        help="full/half-width mapping (megatron_gamma.data.normalize; default keep)",
    )  # fmt: skip
    p.add_argument(
        "--on-error", choices=["stop", "skip"], default="stop",
        help="bad records/files: stop with file:line (default), or count and skip",
    )  # fmt: skip
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on a terminal only)"
    )


def add_data_commands(sub) -> None:
    """Register train-tokenizer, train-punkt, preprocess and merge on ``sub`` (argparse
    subparsers)."""
    p = sub.add_parser("train-tokenizer", help="sample a zh + en corpus and train a byte-level BPE")
    _input_flags(p)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--output", required=True, help="tokenizer.json to write (metadata beside it)")
    p.add_argument(
        "--lang-proportions", default="zh=0.5,en=0.5",
        help="shares of the training characters per language tag, summing to 1, e.g. zh=0.6,en=0.4 "
        "(mixed=... allowed)",
    )  # fmt: skip
    p.add_argument(
        "--sample-chars", type=int, default=500_000_000, help="training characters in all"
    )
    p.add_argument(
        "--sample-rate", type=float, default=1.0,
        help="share of documents that are candidates; lower spreads the sample over more files",
    )  # fmt: skip
    p.add_argument(
        "--heldout-fraction", type=float, default=0.01,
        help="share of documents held out for the characters-per-token report",
    )  # fmt: skip
    p.add_argument("--heldout-chars", type=int, default=1_000_000, help="per language, at most")
    p.add_argument("--seed", type=int, default=1234)
    p.set_defaults(func=_train_tokenizer)

    p = sub.add_parser("train-punkt", help="train nltk Punkt parameters on English jsonl")
    p.add_argument("--input", nargs="+", required=True, help="English jsonl files")
    p.add_argument("--json-key", default="text")
    p.add_argument("--output", required=True, help="parameters JSON to write")
    p.set_defaults(func=_train_punkt)

    p = sub.add_parser("preprocess", help="jsonl/gz/zst/parquet -> Megatron .bin/.idx")
    _input_flags(p)
    p.add_argument(
        "--tokenizer-type", default="HuggingFaceTokenizer",  # validated with the fix: DataConfig
        metavar="{" + ",".join(t.value for t in TokenizerType) + "}",
        help="HuggingFaceTokenizer: --tokenizer-model; GPT2BPETokenizer: --vocab-file and "
        "--merge-file (Megatron-LM's flags)",
    )  # fmt: skip
    p.add_argument(
        "--tokenizer-model", default=None,
        help="tokenizer.json, or a directory holding one (HuggingFaceTokenizer)",
    )  # fmt: skip
    p.add_argument("--vocab-file", default=None, help="GPT-2 vocab.json (GPT2BPETokenizer)")
    p.add_argument("--merge-file", default=None, help="GPT-2 merges.txt (GPT2BPETokenizer)")
    p.add_argument(
        "--output-prefix", required=True,
        help="where the outputs go: PREFIX_text_document.bin/.idx (Megatron-LM's naming), "
        "PREFIX.stats.json, PREFIX.done.json",
    )  # fmt: skip
    p.add_argument(
        "--workers", type=int, default=1,
        help="encoding processes, one core each: this process plus WORKERS - 1 worker processes "
        "(default: 1)",
    )  # fmt: skip
    p.add_argument(
        "--tokenizer-backend", choices=["auto", "gigatoken", "hf"], default="auto",
        help="auto: gigatoken when its ids equal HF tokenizers' on probe texts and an input "
        "sample, else hf (says why); gigatoken: required (error if it differs); hf: HF tokenizers",
    )  # fmt: skip
    p.add_argument(
        "--chunk-size", type=int, default=256, help="records per work item (default: 256)"
    )
    p.add_argument(
        "--per-language", action="store_true", help="one output per language tag (zh, en, mixed)"
    )
    p.add_argument(
        "--split-sentences", action="store_true",
        help="one sequence per sentence (Punkt for English, rules for Chinese), for "
        "sentence-level consumers (BERT/T5); GPT pretraining wants documents: megatron-core's "
        "GPTDataset would treat each sentence as a document",
    )  # fmt: skip
    p.add_argument(
        "--keep-newlines", action="store_true",
        help="Megatron-LM's flag to keep the newlines between split sentences; accepted and "
        "changes nothing: --split-sentences always keeps the text between sentences (pieces "
        "join back to the document; the whitespace opens the next sentence)",
    )  # fmt: skip
    p.add_argument(
        "--keep-sequential-samples", action="store_true",
        help="Megatron-LM's flag to keep the documents' order across partitions; accepted and "
        "changes nothing: the output is always in input order, whatever the workers or shards",
    )  # fmt: skip
    p.add_argument(
        "--append-eod", action=argparse.BooleanOptionalAction, default=True,
        help="end each document with EOD (default on)",
    )  # fmt: skip
    p.add_argument("--min-chars", type=int, default=0, help="drop shorter documents")
    p.add_argument("--min-tokens", type=int, default=0, help="drop documents with fewer tokens")
    p.add_argument(
        "--max-symbol-ratio", type=float, default=1.0,
        help="drop documents whose share of punctuation/symbol characters exceeds this",
    )  # fmt: skip
    p.add_argument(
        "--max-document-chars", type=int, default=1_000_000,
        help="cut longer documents to this many characters (counted as 'truncated'); bounds "
        "a worker's memory",
    )  # fmt: skip
    p.add_argument(
        "--shard-index", type=int, default=None,
        help="process only this shard (SLURM: $SLURM_ARRAY_TASK_ID); without it, all shards "
        "run in turn and are merged",
    )  # fmt: skip
    p.add_argument(
        "--num-shards", type=int, default=1, help="split the input file list into N shards"
    )
    p.set_defaults(func=_preprocess)

    p = sub.add_parser(
        "merge",
        help="merge shard outputs (or any datasets) in a fixed order",
        description="Merge the shards of a sharded preprocess run into its --output-prefix "
        "(outputs, statistics and blend), or, with --input, concatenate any datasets in the "
        "given order into one .bin/.idx pair (as Megatron-LM's tools/merge_datasets.py).",
    )  # fmt: skip
    p.add_argument(
        "--output-prefix", required=True,
        help="the sharded run's --output-prefix (its shards are found beside it), or with "
        "--input the merged dataset's prefix",
    )  # fmt: skip
    p.add_argument(
        "--num-shards", type=int, default=None,
        help="merge the shards of --output-prefix (default: found from the done-markers)",
    )  # fmt: skip
    p.add_argument(
        "--input", nargs="+", default=None,
        help="instead: dataset prefixes or directories to concatenate in this order into the one "
        "pair OUTPUT_PREFIX.bin/.idx (Megatron-LM's merge_datasets.py naming; no .stats.json)",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_merge)
