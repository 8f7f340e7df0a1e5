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
import os
import shlex
import sys

from megatron_gamma.config import TokenizerType
from megatron_gamma.data import CHUNK_BYTES, CHUNK_DOCS


def _log_to_stderr() -> None:
    logger = logging.getLogger("megatron_gamma.data")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _train_tokenizer(args: argparse.Namespace) -> None:
    from megatron_gamma.data.sampling import parse_proportions
    from megatron_gamma.data.tokenizer_training import tokenizer_output, train_tokenizer

    _log_to_stderr()
    output = tokenizer_output(args.output)
    report = train_tokenizer(
        args.input,
        output,
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
    print(f"wrote {output} ({report['vocab_size']} tokens) and its loader metadata")
    for lang, t in report["train"].items():
        print(f"  trained on {lang}: {t['documents']} documents, {t['characters']} characters")
    for lang, h in report["heldout"].items():
        print(
            f"  held-out {lang}: {h['chars_per_token']} characters/token "
            f"({h['documents']} documents, {h['characters']} characters)"
        )
    if not report["heldout"]:
        print("  no held-out documents (--heldout-fraction 0, or too little input)")


def _tokenizer_config(args: argparse.Namespace):
    """The tokenizer flags as a :class:`~megatron_gamma.config.DataConfig` (which checks that
    they fit the tokenizer type).

    Raises:
        ConfigError: no ``--tokenizer-model`` with HuggingFaceTokenizer, or flags of another type.
    """
    from megatron_gamma.config import ConfigError, DataConfig

    if args.tokenizer_type == "HuggingFaceTokenizer" and args.tokenizer_model is None:
        raise ConfigError(
            "preprocess: --tokenizer-model is required with --tokenizer-type "
            "HuggingFaceTokenizer. Fix: pass the tokenizer.json (or its directory)"
        )
    return DataConfig(
        tokenizer_type=args.tokenizer_type,
        tokenizer_model=args.tokenizer_model,
        vocab_file=args.vocab_file,
        merge_file=args.merge_file,
    )


def _encode_options(args: argparse.Namespace):
    """The text handling, filters and outputs of the flags, checked
    (:class:`~megatron_gamma.data.encode.EncodeOptions`)."""
    from megatron_gamma.data.encode import EncodeOptions
    from megatron_gamma.data.filters import Filters

    return EncodeOptions(
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


def _preprocess(args: argparse.Namespace) -> None:
    from megatron_gamma.data.preprocess import format_summary, preprocess

    _log_to_stderr()
    _tokenizer_config(args)
    result = preprocess(
        args.input,
        args.tokenizer_model,
        args.output_prefix,
        workers=args.workers,
        chunk_size=args.chunk_size,
        progress=not args.no_progress,
        options=_encode_options(args),
        shard_index=args.shard_index,
        num_shards=args.num_shards,
        tokenizer_backend=args.tokenizer_backend,
        tokenizer_type=args.tokenizer_type,
        vocab_file=args.vocab_file,
        merge_file=args.merge_file,
        log_interval=args.log_interval,
    )
    print(format_summary(result))


def _merge(args: argparse.Namespace) -> None:
    from megatron_gamma.data.merge import dataset_counts, merge_datasets, merge_shards
    from megatron_gamma.data.stats import counts_from_document, stats_document

    _log_to_stderr()
    if args.input:
        if args.num_shards is not None:
            from megatron_gamma.config import ConfigError

            raise ConfigError(
                "merge: --input and --num-shards exclude each other. Fix: --input PREFIX... for "
                "any datasets, or --num-shards N for the shards of --output-prefix"
            )
        out = merge_datasets(args.input, args.output_prefix, progress=not args.no_progress)
        c = dataset_counts(out)
        print(f"{out}.bin/.idx: {c['documents']} documents, {c['tokens']} tokens")
        return
    doc = merge_shards(args.output_prefix, args.num_shards, progress=not args.no_progress)
    # the prefixes as given now: the stats file records them as given when it was written
    doc = stats_document(args.output_prefix, counts_from_document(doc))
    for o in doc["outputs"].values():
        print(f"{o['prefix']}.bin/.idx: {o['documents']} documents, {o['tokens']} tokens")
    blend = shlex.join(doc["data_path"])
    print(f"{args.output_prefix}.stats.json; blend: --data-path {blend}")


def _train_punkt(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from megatron_gamma.config import ConfigError
    from megatron_gamma.data.readers import expand_inputs, iter_chunks, iter_records, record_text
    from megatron_gamma.data.resume import check_output_dir
    from megatron_gamma.data.sentences import save_punkt_params, train_punkt

    if os.path.lexists(args.output):
        raise ConfigError(
            f"--output={args.output!r}: already exists; train-punkt overwrites no file (were it "
            "Punkt parameters, data split into sentences with them would no longer match). Fix: "
            "pass another --output path, or delete the existing file first"
        )
    check_output_dir("--output", args.output)
    files = expand_inputs(args.input)

    def texts():
        for path in files:
            for chunk in iter_chunks(path, columns=[args.json_key]):
                for rec in iter_records(chunk, "stop", {}, []):
                    yield record_text(path, rec, args.json_key)

    docs = tqdm(texts(), desc="train-punkt", unit="doc", disable=True if args.no_progress else None)
    params = train_punkt(docs)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    save_punkt_params(params, args.output)
    print(
        f"wrote {args.output}: {len(params.abbrev_types)} abbreviations, "
        f"{len(params.collocations)} collocations, {len(params.sent_starters)} sentence starters"
    )


def check_submit_preprocess(args: argparse.Namespace, container: bool) -> None:
    """What ``preprocess --num-shards N`` refuses before any work, refused by
    ``submit-preprocess`` before anything is written or submitted, with the same functions: an
    output prefix that names a directory or cannot be written
    (:func:`~megatron_gamma.data.resume.check_output_prefix`), out-of-range settings
    (:func:`~megatron_gamma.data.preprocess.check_run_settings`), text and filter options
    (:class:`~megatron_gamma.data.encode.EncodeOptions`), tokenizer flags that do not fit the
    tokenizer type or name files that do not exist or do not load
    (:func:`~megatron_gamma.data.tokenizer_types.tokenizer_vocab_size`), inputs that do not exist
    or are not data files (:func:`~megatron_gamma.data.readers.expand_inputs`), and more shards
    than input files (:func:`~megatron_gamma.data.sharding.check_shards`).

    Args:
        args: ``submit-preprocess``'s flags (:func:`add_preprocess_flags` and ``--num-shards``).
        container: the job runs in a container image; the tokenizer files, and inputs that this
            host does not have, are then left to the job's own check (they may be the
            container's paths).

    Raises:
        ConfigError, InputError, ValueError: as ``preprocess``, with its messages.
    """
    from megatron_gamma.data.preprocess import check_run_settings
    from megatron_gamma.data.readers import InputError, expand_inputs
    from megatron_gamma.data.resume import check_output_prefix
    from megatron_gamma.data.sharding import check_shards
    from megatron_gamma.data.tokenizer_types import tokenizer_vocab_size

    check_output_prefix(args.output_prefix)
    check_run_settings(args.workers, args.chunk_size, args.log_interval, args.tokenizer_backend)
    _encode_options(args)
    tokenizer = _tokenizer_config(args)
    if not container:
        tokenizer_vocab_size(tokenizer)
    try:
        files = expand_inputs(args.input)
    except InputError:
        if not container:
            raise
        return
    check_shards(len(files), None, args.num_shards)


_TASK_VARIABLES = ("input", "output_prefix", "workers")
"""Flags of :func:`add_preprocess_flags` that the sbatch script holds as variables of its own."""
_PATHS = ("tokenizer_model", "vocab_file", "merge_file")


def task_flags(args: argparse.Namespace) -> list[str]:
    """The flags of :func:`add_preprocess_flags` that ``args`` sets to other than their defaults,
    as arguments of one ``preprocess`` task (``--flag=value``, a list as ``--flag V1 V2``, file
    paths made absolute); ``--input``, ``--output-prefix`` and ``--workers`` are left out (the
    script's own variables)."""
    argv = []
    for action in add_preprocess_flags(argparse.ArgumentParser(add_help=False)):
        value = getattr(args, action.dest)
        if action.dest in _TASK_VARIABLES or value == action.default:
            continue
        if action.dest in _PATHS:
            value = os.path.abspath(value)
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(action.option_strings[0 if value else 1])
        elif action.nargs == 0:
            argv.append(action.option_strings[0])
        elif isinstance(value, list):
            argv += [action.option_strings[0], *value]
        else:
            argv.append(f"{action.option_strings[0]}={value}")
    return argv


def _input_flags(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """--input and the text flags of train-tokenizer and preprocess, added to ``p``."""
    actions = []

    def flag(*names, **kwargs) -> None:
        actions.append(p.add_argument(*names, **kwargs))

    flag(
        "--input", nargs="+", required=True, help="files (.jsonl/.json[.gz|.zst], .parquet), "
        "directories or globs, read in the order given (a directory: its data files but bare "
        ".json, sorted, and a warning names the files it skipped; a glob: sorted)",
    )  # fmt: skip
    flag(
        "--json-keys", "--json-key", dest="json_keys", nargs="+", default=["text"],
        help="record fields holding text; one output per key (default: text)",
    )  # fmt: skip
    flag(
        "--lang-key", default=None,
        help="record field with the language (zh*/en*/mixed); default: tag by script",
    )  # fmt: skip
    flag("--nfkc", action="store_true", help="Unicode NFKC normalization (default off)")
    flag(
        "--punct-width", choices=["keep", "half", "cjk"], default="keep",
        help="full/half-width mapping (megatron_gamma.data.normalize; default keep)",
    )  # fmt: skip
    flag(
        "--on-error", choices=["stop", "skip"], default="stop",
        help="bad records/files: stop with file:line (default), or count and skip",
    )  # fmt: skip
    return actions


def add_preprocess_flags(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags of one ``preprocess`` task, added to ``p``: the one definition of ``preprocess``
    and ``submit-preprocess``, which passes them to every array task (:func:`task_flags`). The
    shard flags and ``--no-progress`` are each command's own.

    Returns:
        The actions added.
    """
    actions = _input_flags(p)

    def flag(*names, **kwargs) -> None:
        actions.append(p.add_argument(*names, **kwargs))

    flag(
        "--tokenizer-type", default="HuggingFaceTokenizer",  # validated with the fix: DataConfig
        metavar="{" + ",".join(t.value for t in TokenizerType) + "}",
        help="HuggingFaceTokenizer: --tokenizer-model; GPT2BPETokenizer: --vocab-file and "
        "--merge-file (Megatron-LM's flags)",
    )  # fmt: skip
    flag(
        "--tokenizer-model", default=None,
        help="tokenizer.json, or a directory holding one (HuggingFaceTokenizer)",
    )  # fmt: skip
    flag("--vocab-file", default=None, help="GPT-2 vocab.json (GPT2BPETokenizer)")
    flag("--merge-file", default=None, help="GPT-2 merges.txt (GPT2BPETokenizer)")
    flag(
        "--output-prefix", required=True,
        help="where the outputs go: PREFIX_text_document.bin/.idx (Megatron-LM's naming), "
        "PREFIX.stats.json, PREFIX.done.json",
    )  # fmt: skip
    flag(
        "--workers", type=int, default=1,
        help="encoding processes, one core each: this process plus WORKERS - 1 worker processes "
        "(default: 1; submit-preprocess: per array task, and its --cpus-per-task)",
    )  # fmt: skip
    flag(
        "--tokenizer-backend", choices=["auto", "gigatoken", "hf"], default="auto",
        help="auto: gigatoken when its ids equal HF tokenizers' on probe texts and an input "
        "sample (whole texts, 65,536 characters in all: none when the first is longer; the log "
        "says how many), else hf (says why); gigatoken: required (error if it differs); hf: HF "
        "tokenizers",
    )  # fmt: skip
    flag(
        "--chunk-size",
        type=int,
        default=CHUNK_DOCS,
        help=f"records per work item at most; a work item also stops at about "
        f"{CHUNK_BYTES >> 20} MiB of text (default: {CHUNK_DOCS})",
    )
    flag("--per-language", action="store_true", help="one output per language tag (zh, en, mixed)")
    flag(
        "--split-sentences", action="store_true",
        help="one sequence per sentence (Punkt for English, rules for Chinese), for "
        "sentence-level consumers (BERT/T5); GPT pretraining wants documents: megatron-core's "
        "GPTDataset would treat each sentence as a document",
    )  # fmt: skip
    flag(
        "--keep-newlines", action="store_true",
        help="Megatron-LM's flag to keep the newlines between split sentences; accepted and "
        "changes nothing: --split-sentences always keeps the text between sentences (pieces "
        "join back to the document; the whitespace opens the next sentence)",
    )  # fmt: skip
    flag(
        "--keep-sequential-samples", action="store_true",
        help="Megatron-LM's flag to keep the documents' order across partitions; accepted and "
        "changes nothing: the output is always in input order, whatever the workers or shards",
    )  # fmt: skip
    flag(
        "--append-eod", action=argparse.BooleanOptionalAction, default=True,
        help="end each document with EOD (default on)",
    )  # fmt: skip
    flag("--min-chars", type=int, default=0, help="drop shorter documents")
    flag("--min-tokens", type=int, default=0, help="drop documents with fewer tokens")
    flag(
        "--max-symbol-ratio", type=float, default=1.0,
        help="drop documents whose share of punctuation/symbol characters exceeds this",
    )  # fmt: skip
    flag(
        "--max-document-chars", type=int, default=1_000_000,
        help="cut longer documents to this many characters (counted as 'truncated'; default "
        "1,000,000); bounds a worker's memory. A jsonl line longer than 6 bytes per character "
        "(per --json-keys text) + 1 MiB is not cut but refused unread (skipped with --on-error "
        "skip)",
    )  # fmt: skip
    flag(
        "--log-interval", type=int, default=1000,
        help="without the progress bar, log 'Processed N documents (docs/s, MB/s), tokens, "
        "elapsed' every this many documents (Megatron-LM's flag; default: 1000)",
    )  # fmt: skip
    return actions


def add_data_commands(sub) -> None:
    """Register train-tokenizer, train-punkt, preprocess and merge on ``sub`` (argparse
    subparsers)."""
    p = sub.add_parser("train-tokenizer", help="sample a zh + en corpus and train a byte-level BPE")
    _input_flags(p)
    p.add_argument(
        "--vocab-size", type=int, default=4096,
        help="tokens, bytes and special tokens included (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--output", required=True,
        help="tokenizer.json to write (metadata beside it); a directory (existing, or ending in "
        "/): DIR/tokenizer.json, what --tokenizer-model DIR reads; a new path that is neither "
        "is refused",
    )  # fmt: skip
    p.add_argument(
        "--lang-proportions", default="zh=0.5,en=0.5",
        help="shares of the training characters per language tag, summing to 1, e.g. "
        "zh=0.6,en=0.4; mixed=... allowed (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--sample-chars", type=int, default=500_000_000,
        help="training characters in all (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--sample-rate", type=float, default=1.0,
        help="share of documents that are candidates; lower spreads the sample over more files "
        "(default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--heldout-fraction", type=float, default=0.01,
        help="share of documents held out for the characters-per-token report "
        "(default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--heldout-chars", type=int, default=1_000_000,
        help="held-out characters per language, at most (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--seed", type=int, default=1234,
        help="seeds the file order and the document draw (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on a terminal only)"
    )
    p.set_defaults(func=_train_tokenizer)

    p = sub.add_parser("train-punkt", help="train nltk Punkt parameters on English jsonl")
    p.add_argument("--input", nargs="+", required=True, help="English jsonl files")
    p.add_argument("--json-key", default="text")
    p.add_argument(
        "--output", required=True, help="parameters JSON to write (an existing file is refused)"
    )
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on a terminal only)"
    )
    p.set_defaults(func=_train_punkt)

    p = sub.add_parser("preprocess", help="jsonl/gz/zst/parquet -> Megatron .bin/.idx")
    add_preprocess_flags(p)
    p.add_argument(
        "--shard-index", type=int, default=None,
        help="process only this shard (SLURM: $SLURM_ARRAY_TASK_ID); without it, all shards "
        "run in turn and are merged",
    )  # fmt: skip
    p.add_argument(
        "--num-shards", type=int, default=1, help="split the input file list into N shards"
    )
    p.add_argument(
        "--no-progress", action="store_true",
        help="no progress bar; the bar shows on a terminal only, and without it progress is "
        "logged every --log-interval documents",
    )  # fmt: skip
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
        "--input the merged dataset's prefix, which must not be one of the inputs",
    )  # fmt: skip
    p.add_argument(
        "--num-shards", type=int, default=None,
        help="merge the shards of --output-prefix (default: found from the done-markers)",
    )  # fmt: skip
    p.add_argument(
        "--input", nargs="+", default=None,
        help="instead: dataset prefixes or directories to concatenate in this order into the one "
        "pair OUTPUT_PREFIX.bin/.idx (Megatron-LM's merge_datasets.py naming; no .stats.json); "
        "a dataset given twice, and inputs holding a merged dataset and datasets it was "
        "merged from (a sharded run's directory holds its shards and their merge) are refused",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_merge)
