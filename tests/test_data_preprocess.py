"""Preprocessing pipeline: bytes against megatron-core's own per-document path, formats, workers,
shards and merge, round trips, filters, statistics, bad input, resume and crash safety.

The reference for every output is megatron-core's ``IndexedDatasetBuilder.add_document`` fed one
document at a time with ``tokenizers.Tokenizer.encode`` ids (the straightforward path of
Megatron-LM's ``preprocess_data.py``), built in the test from the packaged demo corpus.
"""

import gzip
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import unicodedata

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import megatron_core_dataset, read_dataset, run_cli
from megatron.core.datasets.indexed_dataset import IndexedDataset

from megatron_gamma.cli import main
from megatron_gamma.config import ConfigError, DataConfig
from megatron_gamma.data import demo_dir
from megatron_gamma.data.encode import ChunkEncoder, EncodeOptions
from megatron_gamma.data.filters import Filters
from megatron_gamma.data.indexed import ChunkWriter
from megatron_gamma.data.merge import merge_datasets, merge_shards
from megatron_gamma.data.normalize import normalize
from megatron_gamma.data.preprocess import UNCHECKED, format_summary, preprocess
from megatron_gamma.data.readers import InputError
from megatron_gamma.data.sentences import split_sentences
from megatron_gamma.data.tokenizer import BilingualTokenizer

TOKENIZER = os.path.join(demo_dir(), "tokenizer.json")
MAIN = os.getpid()
FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet")


def demo_records() -> list[dict]:
    out = []
    for lang in ("zh", "en"):
        with open(os.path.join(demo_dir(), f"{lang}.jsonl"), encoding="utf-8") as f:
            out += [json.loads(line) for line in f]
    return out


def write_file(path: str, records: list[dict]) -> str:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    if path.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=7)
    elif path.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    elif path.endswith(".zst"):
        with open(path, "wb") as f:
            f.write(zstandard.ZstdCompressor().compress(data))
    else:
        with open(path, "wb") as f:
            f.write(data)
    return path


def write_parts(folder, records: list[dict], n: int) -> list[str]:
    """``records`` in ``n`` contiguous files cycling through all formats (sorted = in order)."""
    os.makedirs(folder, exist_ok=True)
    bounds = np.linspace(0, len(records), n + 1).astype(int)
    return [
        write_file(os.path.join(folder, f"{i:02d}-part.{FORMATS[i % 4]}"), records[a:b])
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
    ]


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """The demo corpus (zh then en) as 6 files in jsonl, .gz, .zst and parquet."""
    folder = tmp_path_factory.mktemp("parts")
    return write_parts(str(folder / "in"), demo_records(), 6)


@pytest.fixture(scope="module")
def ref_prefix(tmp_path_factory):
    return megatron_core_dataset(
        [r["text"] for r in demo_records()], str(tmp_path_factory.mktemp("ref") / "r")
    )


def test_output_equals_megatron_core_per_document_path_for_all_formats(tmp_path, parts, ref_prefix):
    r = preprocess([os.path.dirname(parts[0])], TOKENIZER, str(tmp_path / "out"), progress=False)
    assert r.prefix == str(tmp_path / "out_text_document")
    assert read_dataset(r.prefix) == read_dataset(ref_prefix)
    assert r.documents == len(demo_records())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bytes_identical_for_workers_and_shards_and_merge(tmp_path, parts, ref_prefix):
    stats = set()
    for workers in (1, 2):
        for shards in (1, 3):
            out = str(tmp_path / f"w{workers}s{shards}" / "corpus")
            r = preprocess(parts, TOKENIZER, out, workers=workers, num_shards=shards,
                           chunk_size=5, progress=False)  # fmt: skip
            assert read_dataset(r.prefix) == read_dataset(ref_prefix), (workers, shards)
            stats.add(open(out + ".stats.json").read().replace(out, "P"))
    assert len(stats) == 1
    # SLURM array style: shard tasks run in any order, then one merge
    out = str(tmp_path / "array" / "corpus")
    for i in (2, 0, 1):
        r = preprocess(
            parts, TOKENIZER, out, workers=2, shard_index=i, num_shards=3, progress=False
        )
        assert r.prefix == f"{out}-shard{i:05d}-of-00003_text_document"
    assert main(["merge", "--output-prefix", out, "--no-progress"]) == 0
    assert read_dataset(out + "_text_document") == read_dataset(ref_prefix)
    assert open(out + ".stats.json").read().replace(out, "P") in stats
    # per-language outputs: shard 0 holds only zh, shard 2 only en; merge takes what exists
    opts = EncodeOptions(per_language=True)
    one = preprocess(parts, TOKENIZER, str(tmp_path / "l1" / "c"), options=opts, progress=False)
    three = preprocess(parts, TOKENIZER, str(tmp_path / "l3" / "c"), options=opts, num_shards=3,
                       workers=2, progress=False)  # fmt: skip
    names = ["en_text_document", "zh_text_document"]
    assert sorted(one.prefixes) == sorted(three.prefixes) == names
    for name in one.prefixes:
        assert read_dataset(one.prefixes[name]) == read_dataset(three.prefixes[name])


def test_round_trip_sentences_eod_and_per_language_stats(tmp_path, parts):
    options = EncodeOptions(split_sentences=True, per_language=True, nfkc=True, punct_width="cjk")
    r = preprocess(parts, TOKENIZER, str(tmp_path / "c"), options=options, progress=False)
    tok = BilingualTokenizer(TOKENIZER)
    assert sorted(r.prefixes) == ["en_text_sentence", "zh_text_sentence"]
    for lang in ("zh", "en"):
        texts = [normalize(x["text"], True, "cjk") for x in demo_records() if x["lang"] == lang]
        ds = IndexedDataset(r.prefixes[f"{lang}_text_sentence"])
        assert len(ds.document_indices) - 1 == len(texts)
        for d, text in enumerate(texts):
            a, b = ds.document_indices[d], ds.document_indices[d + 1]
            seqs = [ds[s] for s in range(a, b)]
            flat = np.concatenate(seqs)
            assert flat[-1] == tok.eod and (flat[:-1] != tok.eod).all()
            assert tok.detokenize(flat[:-1]) == text
            pieces = split_sentences(text)
            assert len(seqs) == len(pieces) > 0
            decoded = [tok.detokenize(s) for s in seqs[:-1]] + [tok.detokenize(seqs[-1][:-1])]
            assert decoded == pieces
        entry = r.stats["languages"][lang]
        assert entry["documents"] == len(texts)
        assert entry["sequences"] == len(ds) and entry["tokens"] == int(ds.sequence_lengths.sum())
        assert entry["characters"] == sum(map(len, texts))
    blend = r.stats["data_path"]
    prefixes, weights = DataConfig(data_path=blend).blend()
    tokens = [r.stats["outputs"][os.path.basename(p)[2:]]["tokens"] for p in prefixes]
    assert weights == pytest.approx([t / sum(tokens) for t in tokens], abs=1e-6)


def test_a_lang_key_no_record_has_is_warned_once_per_run(tmp_path, parts, caplog):
    """--lang-key language on records whose field is 'lang': every document is tagged by
    script, as without the flag, and one warning per run (not per shard) says so."""
    by_script = preprocess(parts, TOKENIZER, str(tmp_path / "s"), progress=False,
                           options=EncodeOptions(per_language=True))  # fmt: skip
    opts = EncodeOptions(per_language=True, lang_key="language")
    with caplog.at_level("WARNING"):
        typo = preprocess(parts, TOKENIZER, str(tmp_path / "t"), num_shards=2, options=opts,
                          progress=False)  # fmt: skip
    warned = [m for m in caplog.messages if m.startswith("--lang-key")]
    assert warned == [
        "--lang-key 'language': no record read had that field (or it was null in every one), so "
        "every document was tagged by script. Fix: check the field's name, or drop --lang-key to "
        "tag by script"
    ]
    assert typo.stats["languages"] == by_script.stats["languages"]
    for name, prefix in typo.prefixes.items():
        assert read_dataset(prefix) == read_dataset(by_script.prefixes[name])
    caplog.clear()
    with caplog.at_level("WARNING"):
        preprocess(parts, TOKENIZER, str(tmp_path / "l"), progress=False,
                   options=EncodeOptions(lang_key="lang"))  # fmt: skip
    assert not [m for m in caplog.messages if m.startswith("--lang-key")]


def test_special_token_strings_in_text_stay_text(tmp_path):
    text = "Megatron appends <|endoftext|> after each document; <|pad|> pads."
    write_file(str(tmp_path / "s.jsonl"), [{"text": text}])
    r = preprocess([str(tmp_path / "s.jsonl")], TOKENIZER, str(tmp_path / "o"), progress=False)
    tok = BilingualTokenizer(TOKENIZER)
    ds = IndexedDataset(r.prefix)  # keep it: item views die with the dataset's mmap
    ids = ds[0]
    assert ids[-1] == tok.eod and not np.isin(ids[:-1], [tok.eod, tok.pad, tok.bos]).any()
    assert tok.detokenize(ids[:-1]) == text


def test_filters_drop_and_count_like_an_independent_check(tmp_path, parts):
    tok = BilingualTokenizer(TOKENIZER)
    filters = Filters(min_chars=300, min_tokens=250, max_symbol_ratio=0.125)
    expected = {"zh": {}, "en": {}}
    kept = []
    for rec in demo_records():
        text, lang = rec["text"], rec["lang"]
        visible = [c for c in text if not c.isspace()]
        ratio = sum(unicodedata.category(c)[0] in "PS" for c in visible) / len(visible)
        if len(text) < 300:
            reason = "min_chars"
        elif ratio > 0.125:
            reason = "max_symbol_ratio"
        elif len(tok.tokenize(text)) < 250:
            reason = "min_tokens"
        else:
            kept.append(text)
            continue
        expected[lang][reason] = expected[lang].get(reason, 0) + 1
    for reason in ("min_chars", "max_symbol_ratio", "min_tokens"):  # each filter is exercised
        assert sum(e.get(reason, 0) for e in expected.values()) > 0
    r = preprocess(parts, TOKENIZER, str(tmp_path / "f"), options=EncodeOptions(filters=filters),
                   progress=False)  # fmt: skip
    for lang in ("zh", "en"):
        dropped = {k: v for k, v in r.stats["languages"][lang]["dropped"].items() if v}
        assert dropped == expected[lang]
    assert read_dataset(r.prefix) == read_dataset(
        megatron_core_dataset(kept, str(tmp_path / "ref"))
    )


BAD_CASES = [
    ("a.jsonl", b'{"text": "ok"}\n{not json\n', "malformed_json", r"a\.jsonl:2: malformed JSON"),
    ("a.jsonl", b'{"text": "ok"}\n\n[1, 2]\n', "malformed_json", r"a\.jsonl:3: malformed JSON"),
    ("a.jsonl", b'{"text": "ok"}\n{"text": "abc\n{"text": "x"}\n', "malformed_json",
     r"a\.jsonl:2: malformed JSON \(Unterminated string starting at column 10\)"),
    ("a.jsonl", b'{"text": "a\x01"}\n', "malformed_json",
     r"a\.jsonl:1: malformed JSON \(Invalid control character at column 12\)"),
    ("a.jsonl", b'{"text": "ok"}\n{"body": "x"}\n', "missing_key", r"a\.jsonl:2: no key 'text'"),
    ("a.jsonl", b'{"text": null}\n', "missing_key",
     r"a\.jsonl:1: 'text' is null, not a string: the record has no text\. Fix: give it a text"),
    ("a.parquet", [{"text": "ok"}, {"text": None}], "missing_key",
     r"a\.parquet:2: 'text' is null, not a string"),
    ("a.jsonl", b'{"text": 5}\n', "bad_value", r"a\.jsonl:1: 'text' is an int, not a string"),
    ("a.jsonl", b'{"text": "ok"}\n{"text": "\xff\xfe"}\n', "invalid_utf8",
     r"a\.jsonl:2: invalid UTF-8 \(byte 0xff at byte 11"),
    ("a.jsonl", b'{"text": "a\\ud800b"}\n', "invalid_utf8",
     r"a\.jsonl:1: 'text' holds a lone surrogate '\\ud800', from a JSON escape: the line is "
     r"valid UTF-8, but the escape encodes no character, so the text cannot be written as UTF-8 "
     r"\(counted as invalid_utf8\)\. Fix: repair the escape \(\\ud800-\\udbff must be followed by "
     r"\\udc00-\\udfff\), or --on-error skip$"),
    ("a.jsonl", b'{"text": "x", "lang": "fr"}\n', "bad_value", r"a\.jsonl:1: lang='fr' is not"),
    ("a.jsonl.gz", b"\x1f\x8b\x08\x00garbage", "unreadable_file",
     r"a\.jsonl\.gz: unreadable after line 0"),
    ("a.jsonl.zst", b"not zstd at all", "unreadable_file", r"a\.jsonl\.zst: unreadable after"),
    ("a.parquet", b"PAR1 but no", "unreadable_file", r"a\.parquet: unreadable parquet file"),
]  # fmt: skip


@pytest.mark.parametrize("name,content,kind,message", BAD_CASES)
def test_bad_input_stops_with_file_and_line_and_writes_nothing(
    tmp_path, name, content, kind, message
):
    bad = tmp_path / "in" / name
    bad.parent.mkdir()
    if isinstance(content, list):  # records
        write_file(str(bad), content)
    else:
        bad.write_bytes(content)
    opts = EncodeOptions(lang_key="lang")
    with pytest.raises(InputError, match=message) as e:
        preprocess([str(bad)], TOKENIZER, str(tmp_path / "out" / "x"), options=opts, progress=False)
    assert e.value.kind == kind
    assert not (tmp_path / "out").exists()  # nor the directory it would have made


@pytest.mark.parametrize("workers", [2, 3])
def test_the_first_bad_record_is_reported_whichever_process_encodes_it(tmp_path, workers):
    """At one record per chunk, lines 2 and 3 are bad; line 2's chunk goes to a worker, line
    3's to a worker or the main process as timing has it: the error names line 2, as with one
    process (:mod:`megatron_gamma.data.workers` tests the order with every placement)."""
    bad = tmp_path / "a.jsonl"
    bad.write_bytes(b'{"text": "ok"}\n{not json\n[1, 2]\n{"text": "fine"}\n')
    with pytest.raises(InputError, match=r"a\.jsonl:2: malformed JSON"):
        preprocess(
            [str(bad)], TOKENIZER, str(tmp_path / "out" / "x"), workers=workers, chunk_size=1,
            progress=False,
        )  # fmt: skip
    assert not (tmp_path / "out").exists()  # nor the directory it would have made


def test_more_workers_than_cores_is_warned_with_the_fix(tmp_path, monkeypatch, caplog):
    """--workers above the cores this process may run on (its CPU affinity, here one core)
    warns with the count that fits; the run goes on and writes what one worker writes."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    inputs = [os.path.join(demo_dir(), "zh.jsonl")]
    for workers in (1, 2):
        with caplog.at_level(logging.WARNING, logger="megatron_gamma.data"):
            preprocess(inputs, TOKENIZER, str(tmp_path / f"w{workers}"), workers=workers,
                       progress=False)  # fmt: skip
        warned = [r.getMessage() for r in caplog.records if "core(s)" in r.getMessage()]
        caplog.clear()
        want = "--workers 2: more than the 1 core(s) this process may run on"
        assert [w.split(";")[0] for w in warned] == ([want] if workers == 2 else [])
    assert warned[0].endswith("Fix: --workers 1")
    for ext in (".bin", ".idx"):
        one, two = (tmp_path / f"w{w}_text_document{ext}" for w in (1, 2))
        assert one.read_bytes() == two.read_bytes()


def test_truncated_gzip_and_broken_link_are_unreadable(tmp_path):
    data = gzip.compress(b"".join(b'{"text": "line %d"}\n' % i for i in range(5000)))
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut\.jsonl\.gz: unreadable after line ([1-9]\d*)") as e:
        preprocess([str(tmp_path / "cut.jsonl.gz")], TOKENIZER, str(tmp_path / "o"), progress=False)
    lines = e.value.stopped["records"]
    assert f"or --on-error skip to keep its {lines} complete lines before the break" in str(e.value)
    os.symlink(tmp_path / "gone.jsonl", tmp_path / "link.jsonl")
    with pytest.raises(InputError, match=r"link\.jsonl: cannot be read") as e:
        preprocess([str(tmp_path / "link.jsonl")], TOKENIZER, str(tmp_path / "o"), progress=False)
    assert e.value.kind == "unreadable_file"


def test_a_symbolic_link_loop_is_unreadable_with_its_own_fix(tmp_path):
    """A link to itself fails with ELOOP, not a permission problem: the fix says to replace it."""
    (tmp_path / "in").mkdir()
    write_file(str(tmp_path / "in" / "a.jsonl"), [{"text": "alpha doc"}])
    os.symlink("self.jsonl", tmp_path / "in" / "self.jsonl")
    with pytest.raises(InputError) as e:
        preprocess([str(tmp_path / "in")], TOKENIZER, str(tmp_path / "o"), progress=False)
    loop = str(tmp_path / "in" / "self.jsonl")
    assert str(e.value) == (
        f"{loop}: cannot be read (Too many levels of symbolic links). Fix: {loop} is a symbolic "
        "link (to 'self.jsonl') that leads back to itself, never to a file: replace it with the "
        "file it should stand for, or remove it"
    )
    assert e.value.kind == "unreadable_file"
    assert not (tmp_path / "o.stats.json").exists()


def test_on_error_skip_counts_each_kind_and_keeps_the_good_documents(tmp_path):
    good = [r["text"] for r in demo_records()[:6]]
    folder = tmp_path / "in"
    folder.mkdir()
    lines = [json.dumps({"text": t}).encode() + b"\n" for t in good]
    bad = [b"{not json\n", b'{"body": 1}\n', b'{"text": "\xff"}\n', b'{"text": 5}\n']
    (folder / "a.jsonl").write_bytes(lines[0] + bad[0] + lines[1] + bad[1] + lines[2])
    (folder / "b.jsonl").write_bytes(bad[2] + lines[3] + bad[3] + lines[4] + bad[0] + lines[5])
    (folder / "c.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    opts = EncodeOptions(on_error="skip")
    r = preprocess([str(folder)], TOKENIZER, str(tmp_path / "o"), options=opts, progress=False)
    assert r.stats["errors"] == {
        "bad_value": 1, "invalid_utf8": 1, "malformed_json": 2, "missing_key": 1,
        "unreadable_file": 1, "line_too_long": 0, "json_too_deep": 0,
    }  # fmt: skip
    assert read_dataset(r.prefix) == read_dataset(
        megatron_core_dataset(good, str(tmp_path / "ref"))
    )
    assert main(["preprocess", "--input", str(folder), "--tokenizer-model", TOKENIZER,
                 "--output-prefix", str(tmp_path / "cli"), "--no-progress"]) == 2  # fmt: skip


def test_a_rerun_with_on_error_skip_keeps_the_shards_finished_under_stop(tmp_path):
    """A shard finished under 'stop' met no bad record, so its bytes are those 'skip' writes:
    the rerun the error suggests keeps it. Not the reverse: a shard finished under 'skip' may
    have skipped records, and a rerun under 'stop' is refused."""
    texts = [r["text"] for r in demo_records()[:6]]
    good, late = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    good.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:3]))
    late.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[3:]) + "{bad\n")
    # backend hf: auto's sample of every file would meet the bad line before shard 0 starts
    run = dict(inputs=[str(good), str(late)], tokenizer_path=TOKENIZER,
               output_prefix=str(tmp_path / "o"), num_shards=2, tokenizer_backend="hf",
               progress=False)  # fmt: skip
    with pytest.raises(InputError, match=r"b\.jsonl:4: malformed JSON .* or --on-error skip"):
        preprocess(**run)
    r = preprocess(**run, options=EncodeOptions(on_error="skip"))
    assert r.skipped == 1 and r.stats["errors"]["malformed_json"] == 1
    ref = megatron_core_dataset(texts, str(tmp_path / "ref"))
    assert read_dataset(r.prefix) == read_dataset(ref)
    with pytest.raises(
        ConfigError, match=r"o-shard00001-of-00002.done.json: .*\(differs in: options\.on_error\)"
    ):
        preprocess(**run)


def test_skip_warnings_come_in_line_order_across_kinds(tmp_path, caplog):
    """Parse errors and key/value errors of one chunk are logged by line, not by kind."""
    bad = tmp_path / "a.jsonl"
    bad.write_bytes(b'{"text": "ok"}\n{"nokey": 1}\n{bad\n{"text": 5}\n{bad2\n{"text": "x"}\n')
    opts = EncodeOptions(on_error="skip")
    with caplog.at_level("WARNING"):
        preprocess([str(bad)], TOKENIZER, str(tmp_path / "x"), options=opts, progress=False)
    skipped = [m for m in caplog.messages if m.startswith("skipped")]
    assert [int(m.split("a.jsonl:")[1].split(":")[0]) for m in skipped] == [2, 3, 4, 5]
    assert all("--on-error skip" not in m and "Fix: " in m for m in skipped)


def test_a_skipped_broken_stream_says_which_lines_were_kept(tmp_path, caplog):
    whole = gzip.compress(b'{"text": "one"}\n{"text": "two"}\n' * 2000)
    (tmp_path / "b.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    opts = EncodeOptions(on_error="skip")
    with caplog.at_level("WARNING"):
        r = preprocess([str(tmp_path / "b.jsonl.gz")], TOKENIZER, str(tmp_path / "x"),
                       options=opts, progress=False)  # fmt: skip
    kept = r.stats["unreadable_files"][str(tmp_path / "b.jsonl.gz")]["records"]
    [message] = [m for m in caplog.messages if m.startswith("skipped")]
    assert message.endswith(f"re-fetch it (its {kept} complete lines before the break are kept)")


def test_a_directory_of_bare_json_files_says_they_are_skipped_on_purpose(tmp_path):
    """A directory's expansion skips bare .json files (more often configs than data): the error
    says so, not that it holds no .json files, and names them; naming them is the fix."""
    folder = tmp_path / "in"
    folder.mkdir()
    write_file(str(folder / "a.json"), [{"text": "alpha doc"}])
    out = str(tmp_path / "o")
    with pytest.raises(InputError) as e:
        preprocess([str(folder)], TOKENIZER, out, progress=False)
    assert str(e.value) == (
        f"input directory {str(folder)!r} holds no .jsonl/.jsonl.gz/.json.gz/.jsonl.zst/.json.zst/"
        f".parquet files, only 1 bare .json file(s) (e.g. {str(folder / 'a.json')!r}), which a "
        "directory's expansion skips on purpose: they are more often configs than data. Fix: "
        f"name them (--input {folder / 'a.json'}), or rename them to .jsonl"
    )
    r = preprocess([str(folder / "a.json")], TOKENIZER, out, progress=False)
    assert read_dataset(r.prefix) == read_dataset(megatron_core_dataset(["alpha doc"], out + "r"))


def test_a_directory_names_the_files_it_skips_and_why_before_reading(tmp_path, caplog):
    """A directory's expansion reads its data files only: one warning line, before any record is
    read, names each skipped file (relative to the directory) with the reason; the run is
    otherwise unchanged."""
    folder = tmp_path / "mixed"
    (folder / "sub").mkdir(parents=True)
    write_file(str(folder / "a.jsonl"), [{"text": "alpha doc"}])
    write_file(str(folder / "b.json"), [{"text": "beta doc"}])
    (folder / "c.txt").write_text("gamma doc\n")
    (folder / "sub" / "e.csv").write_text("text\n")
    with caplog.at_level("INFO", logger="megatron_gamma.data"):
        r = preprocess([str(folder)], TOKENIZER, str(tmp_path / "o"), progress=False)
    assert caplog.messages[0] == (
        f"skipped 3 files in {folder}: b.json (bare .json: name such files in --input, or rename "
        "them to .jsonl); c.txt, sub/e.csv (not a supported data file: .jsonl, .json, .jsonl.gz, "
        ".json.gz, .jsonl.zst, .json.zst, .parquet)"
    )
    assert caplog.records[0].levelname == "WARNING"
    assert read_dataset(r.prefix) == read_dataset(
        megatron_core_dataset(["alpha doc"], r.prefix + "r")
    )


def test_empty_inputs_are_clear_errors_and_write_nothing(tmp_path):
    (tmp_path / "in").mkdir()
    empty = tmp_path / "in" / "empty.jsonl"
    empty.write_text("\n \n")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"no documents to write: 1 input file.* hold no records"):
        preprocess([str(empty)], TOKENIZER, str(out / "x"), progress=False)
    short = tmp_path / "in" / "short.jsonl"
    short.write_text('{"text": "hi"}\n{"text": "  "}\n')
    opts = EncodeOptions(filters=Filters(min_chars=10))
    with pytest.raises(ValueError) as e:
        preprocess([str(short)], TOKENIZER, str(out / "x"), options=opts, progress=False)
    assert str(e.value).endswith(
        "dropped or skipped (empty: 1, min_chars: 1). Fix: the text is empty or blank: check "
        "--json-keys names the text field; lower --min-chars"
    )
    # trial 7: a wrong --json-keys once got "loosen --min-chars/--min-tokens/--max-symbol-ratio"
    (tmp_path / "keyed").mkdir()
    keyed = tmp_path / "keyed" / "keyed.jsonl"
    keyed.write_text('{"body": "one"}\n{"body": "two"}\nnot json\n')
    skip = EncodeOptions(on_error="skip")
    with pytest.raises(ValueError) as e:
        preprocess([str(keyed)], TOKENIZER, str(out / "x"), options=skip, progress=False)
    assert str(e.value).endswith(
        "dropped or skipped (malformed_json: 1, missing_key: 2). Fix: pass the field that holds "
        "the text as --json-keys (the skipped records' messages list each record's keys); repair "
        "the input (the skipped records' messages name each bad line)"
    )
    assert not out.exists()
    with pytest.raises(InputError, match="no such file and no glob match"):
        preprocess([str(tmp_path / "in" / "*.zst")], TOKENIZER, str(out / "x"), progress=False)
    with pytest.raises(ConfigError, match="num_shards=3: more shards than the 2 input files"):
        preprocess([str(tmp_path / "in")], TOKENIZER, str(out / "x"), num_shards=3)
    with pytest.raises(ConfigError, match=r"--shard-index 1 without --num-shards.*--num-shards N"):
        preprocess([str(tmp_path / "in")], TOKENIZER, str(out / "x"), shard_index=1)
    assert not out.exists()


@pytest.mark.parametrize(
    "prefix,message",
    [
        ("out/", r"'.*/out/' names a directory.*Fix: a name inside it, e.g. .*/out/corpus"),
        ("out/..", r"names a directory"),
        ("afile/sub/x", r"'.*afile' is a file, not a directory. Fix: an --output-prefix in an"),
        ("afile/x", r"'.*afile' is a file, not a directory"),
    ],
)  # fmt: skip
def test_an_unwritable_output_prefix_is_refused_before_any_work(tmp_path, prefix, message):
    """Refused by preprocess and both merges before reading input, and nothing is created."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n')
    prefix = f"{tmp_path}/{prefix}"  # keeps a final "/"
    before = listing(tmp_path)
    with pytest.raises(ConfigError, match=message):
        preprocess([str(tmp_path / "missing.jsonl")], TOKENIZER, prefix, progress=False)
    with pytest.raises(ConfigError, match=message):
        merge_datasets([str(tmp_path / "missing")], prefix, progress=False)
    with pytest.raises(ConfigError, match=message):
        merge_shards(prefix, 2, progress=False)
    assert listing(tmp_path) == before


def test_an_output_directory_that_is_a_link_to_nothing_is_refused_and_the_fix_works(
    tmp_path, capsys
):
    """``ln -s nowhere d``: preprocess, both merges and train-tokenizer name the link and the
    fix before any work (they raised FileExistsError from makedirs, train-tokenizer after
    sampling); once its target exists the same command writes there."""
    os.symlink("nowhere", tmp_path / "d")
    src = write_file(str(tmp_path / "a.jsonl"), [{"text": "fine"}])
    link = str(tmp_path / "d")
    message = f"{link!r} is a symbolic link to 'nowhere', which does not exist. Fix: create"
    runs = [
        ["preprocess", "--input", src, "--tokenizer-model", TOKENIZER, "--output-prefix",
         f"{link}/p", "--no-progress"],
        ["merge", "--input", str(tmp_path / "a"), "--output-prefix", f"{link}/m"],
        ["merge", "--output-prefix", f"{link}/p", "--num-shards", "2"],
        ["train-tokenizer", "--input", src, "--output", f"{link}/tokenizer.json", "--no-progress"],
    ]  # fmt: skip
    for args in runs:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert os.readlink(link) == "nowhere" and listing(tmp_path) == ["a.jsonl", "d"]
    os.mkdir(tmp_path / "nowhere")  # the fix
    assert main(runs[0]) == 0
    ref = megatron_core_dataset(["fine"], str(tmp_path / "ref"))
    assert read_dataset(str(tmp_path / "nowhere" / "p_text_document")) == read_dataset(ref)


def test_an_output_prefix_in_a_directory_without_write_permission_is_refused(tmp_path, monkeypatch):
    """As a user without write permission there (``os.access`` says no: this suite runs as root,
    for whom it says yes), the nearest existing directory is named."""
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ConfigError, match=rf"'{tmp_path}' is not writable \(.*permission\)\. Fix"):
        preprocess([str(tmp_path / "a.jsonl")], TOKENIZER, str(tmp_path / "new" / "x"))
    assert listing(tmp_path) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_an_output_prefix_under_proc_is_refused_even_where_os_access_says_writable():
    """/proc takes no new entries, even from root, for whom ``os.access`` says it is writable:
    the error names /proc and the fix, where it once was a bare '[Errno 2]' from the mkdir."""
    with pytest.raises(ConfigError, match=r"nothing can be created in '/proc' \(.+\)\. Fix: an"):
        preprocess(["/nonexistent.jsonl"], TOKENIZER, "/proc/megatron-gamma-test/x")
    with pytest.raises(ConfigError, match=r"nothing can be created in '/proc'"):
        merge_shards("/proc/megatron-gamma-test/x", 2, progress=False)
    assert not os.path.exists("/proc/megatron-gamma-test")


def test_a_failed_shard_keeps_the_finished_ones_and_their_directory(tmp_path):
    """Shard 0 of 2 is written, shard 1 stops at a bad line: shard 0's outputs stay, and so does
    the directory made for them (the hf backend: no start-up check reads the bad line first)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "fine"}\n')
    (tmp_path / "in" / "b.jsonl").write_text("{not json\n")
    out = tmp_path / "out" / "deep"
    with pytest.raises(InputError, match=r"b\.jsonl:1: malformed JSON"):
        preprocess(
            [str(tmp_path / "in")], TOKENIZER, str(out / "x"), num_shards=2, progress=False,
            tokenizer_backend="hf",
        )  # fmt: skip
    assert "x-shard00000-of-00002_text_document.bin" in listing(out)


def _other_tokenizer(folder) -> str:
    """The demo tokenizer with the ids of two ordinary tokens swapped: another tokenizer."""
    with open(TOKENIZER, encoding="utf-8") as f:
        doc = json.load(f)
    vocab = doc["model"]["vocab"]
    a, b = (t for t, i in vocab.items() if i in (300, 301))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    return path


def test_a_shard_of_another_tokenizer_than_its_finished_siblings_is_refused_at_start(
    tmp_path, parts, monkeypatch
):
    """Trial 14: a shard preprocessed with another tokenizer into a sharded run's prefix was
    refused only by merge, after every task had run. It is refused before it tokenizes
    anything, naming the sibling shard and both tokenizers (files, sha256 of the file's
    bytes); merge's refusal of the same two datasets is the reference, and both fixes work."""
    other = _other_tokenizer(str(tmp_path / "tok2"))
    out = str(tmp_path / "c")
    preprocess(parts, TOKENIZER, out, shard_index=0, num_shards=3, progress=False)
    shard = [f"{out}-shard{i:05d}-of-00003" for i in range(3)]

    def sha(path):
        return hashlib.sha256(open(path, "rb").read()).hexdigest()[:12]

    def no_tokenizing(*args):
        raise AssertionError("tokenization started")

    with monkeypatch.context() as m:
        m.setattr("megatron_gamma.data.preprocess._choose_backend", no_tokenizing)
        with pytest.raises(ConfigError) as e:
            preprocess(parts, other, out, shard_index=1, num_shards=3, progress=False)
    assert str(e.value) == (
        f"output_prefix={out!r}: this shard would be tokenized with HuggingFaceTokenizer "
        f"{other} (sha256 {sha(other)}), but 1 finished shard(s) of the same 3-shard run (0) "
        f"were tokenized with another tokenizer: shard 0 ({shard[0]}_text_document) with "
        f"HuggingFaceTokenizer {TOKENIZER} (sha256 {sha(TOKENIZER)}). merge refuses shards of two "
        f"tokenizers. Fix: give this shard the finished shards' tokenizer (--tokenizer-type "
        f"HuggingFaceTokenizer --tokenizer-model {TOKENIZER}); or, if this run's is the right "
        f"one, delete {shard[0]}.done.json and rerun preprocess with it for shard(s) 0 "
        "(--shard-index I --num-shards 3), then merge"
    )
    assert not any(name.startswith("c-shard00001") for name in listing(tmp_path))
    # the reference: merge refuses that shard's dataset beside one made with the other tokenizer
    made = preprocess(parts[2:4], other, str(tmp_path / "o"), progress=False).prefix
    with pytest.raises(ConfigError, match=r"cannot merge .*Fix: preprocess them with the same"):
        merge_datasets([f"{shard[0]}_text_document", made], str(tmp_path / "m"), progress=False)

    # the first fix: the siblings' tokenizer; then shard 2 of the other names shards 0 and 1,
    # and so does the whole run in one call (every shard in turn), before any tokenization
    preprocess(parts, TOKENIZER, out, shard_index=1, num_shards=3, progress=False)
    with monkeypatch.context() as m:
        m.setattr("megatron_gamma.data.preprocess._choose_backend", no_tokenizing)
        for index, this in ((2, "this shard"), (None, "this run")):
            with pytest.raises(ConfigError) as e:
                preprocess(parts, other, out, shard_index=index, num_shards=3, progress=False)
            assert f": {this} would be tokenized with " in str(e.value)
            assert "but 2 finished shard(s) of the same 3-shard run (0, 1)" in str(e.value)
    # the second fix: the finished shards redone with the other tokenizer, then merged
    for i in (0, 1):
        os.remove(f"{shard[i]}.done.json")
    for i in range(3):
        preprocess(parts, other, out, shard_index=i, num_shards=3, progress=False)
    merged = merge_shards(out, progress=False)
    whole = preprocess(parts, other, str(tmp_path / "whole"), progress=False)
    assert read_dataset(f"{out}_text_document") == read_dataset(whole.prefix)
    assert merged["outputs"]["text_document"]["documents"] == whole.documents


def test_merge_names_a_prefix_without_shards_and_several_shard_counts(tmp_path, parts, capsys):
    out = str(tmp_path / "s")
    with pytest.raises(ConfigError, match=r"no shard done-marker .*Fix: give the --output-prefix"):
        merge_shards(out)
    with pytest.raises(ConfigError, match=r"no shard of a 3-shard run .*nor of any other sharded"):
        merge_shards(out, 3)
    with pytest.raises(ConfigError, match=r"num_shards=0: must be >= 1\. Fix: "):
        merge_shards(out, 0)
    for n in (2, 3):
        preprocess(parts, TOKENIZER, out, shard_index=0, num_shards=n, progress=False)
    with pytest.raises(ConfigError) as e:
        merge_shards(out)
    assert str(e.value).endswith(
        ": a 2-shard run (1 of 2 shards finished), a 3-shard run (1 of 3 shards finished). "
        "Fix: pass --num-shards N to choose one"
    )
    with pytest.raises(ConfigError, match=r"shard 1 of 3 .* --shard-index 1 --num-shards 3"):
        merge_shards(out, 3)  # a 3-shard run is there: its missing shard is named
    with pytest.raises(ConfigError) as e:
        merge_shards(out, 4)
    assert str(e.value) == (
        f"output_prefix={out!r}: no shard of a 4-shard run has finished there "
        f"(s-shardIIIII-of-00004.done.json) in {str(tmp_path)!r}; what is there: a 2-shard run "
        "(1 of 2 shards finished), a 3-shard run (1 of 3 shards finished). Fix: pass "
        "--num-shards 2 or --num-shards 3 to merge that run, or run preprocess --num-shards 4 "
        "--shard-index I for I = 0..3 first"
    )


def test_merge_with_a_shard_count_no_run_has_names_the_run_that_is_there(tmp_path, parts, capsys):
    """Trial 14: with only a 2-shard run at the prefix, ``merge --num-shards 3`` said shard 0 of
    3 was not complete and told to rerun preprocess for it. It now says that no 3-shard run is
    there and that a 2-shard one is; its fix, --num-shards 2, merges the run."""
    out = str(tmp_path / "c")
    for i in range(2):
        preprocess(parts, TOKENIZER, out, shard_index=i, num_shards=2, progress=False)
    assert main(["merge", "--no-progress", "--output-prefix", out, "--num-shards", "3"]) == 2
    err = capsys.readouterr().err
    assert "no shard of a 3-shard run has finished there" in err
    assert "what is there: a 2-shard run (2 of 2 shards finished). Fix: pass --num-shards 2" in err
    assert "shard 0 of 3" not in err and not os.path.exists(f"{out}.done.json")
    assert main(["merge", "--no-progress", "--output-prefix", out, "--num-shards", "2"]) == 0
    whole = preprocess(parts, TOKENIZER, str(tmp_path / "whole"), progress=False)
    assert read_dataset(f"{out}_text_document") == read_dataset(whole.prefix)


def test_rerun_skips_completed_redoes_damaged_and_refuses_other_settings(
    tmp_path, parts, caplog, monkeypatch
):
    out = str(tmp_path / "r")
    first = preprocess(parts, TOKENIZER, out, num_shards=2, progress=False)
    shard1 = f"{out}-shard00001-of-00002_text_document.bin"
    mtime = os.stat(first.prefix + ".bin").st_mtime_ns
    with monkeypatch.context() as m:  # nothing to tokenize: no tokenizer backend is chosen
        m.setattr("megatron_gamma.data.preprocess.resolve_backend", "not callable")
        again = preprocess(parts, TOKENIZER, out, num_shards=2, progress=False)
    assert again.skipped == 2 and os.stat(first.prefix + ".bin").st_mtime_ns == mtime
    assert again.tokenizer_backend == UNCHECKED
    assert format_summary(first).startswith("wrote ") and " tokens/s; " in format_summary(first)
    summary = format_summary(again)
    assert summary.startswith(f"already complete, nothing redone: {out}_text_document.bin/.idx")
    assert "2 of 2 shard(s) were already complete" in summary and "tokens/s" not in summary
    good = open(shard1, "rb").read()
    with open(f"{out}-shard00001-of-00002.done.json", encoding="utf-8") as f:
        entry = json.load(f)["files"]["_text_document.bin"]  # hashed while writing
    assert entry == {"bytes": len(good), "sha256": hashlib.sha256(good).hexdigest()}
    with open(shard1, "r+b") as f:
        f.truncate(100)
    with caplog.at_level("WARNING"):
        redo = preprocess(parts, TOKENIZER, out, num_shards=2, progress=False)
    assert redo.skipped == 1 and open(shard1, "rb").read() == good
    assert format_summary(redo).startswith("wrote ") and "tokens/s" not in format_summary(redo)
    assert "missing or changed" in caplog.text
    assert read_dataset(redo.prefix) == read_dataset(first.prefix)
    marker = f"{out}-shard00000-of-00002.done.json"
    with pytest.raises(
        ConfigError, match=rf"\(differs in: options\.append_eod\)\. Fix: .*delete {marker}"
    ):
        preprocess(parts, TOKENIZER, out, num_shards=2, progress=False,
                   options=EncodeOptions(append_eod=False))  # fmt: skip
    os.remove(marker)
    with pytest.raises(ConfigError, match=r"shard 0 of 2 .* --shard-index 0 --num-shards 2"):
        merge_shards(out, 2)


def test_shards_redone_after_an_input_changed_are_merged_again(tmp_path, caplog):
    """The merged output is made from the shards alone: when a shard was redone with other
    bytes (its input edited, its marker deleted as the refusal says), it is merged again."""
    records = demo_records()
    files = write_parts(str(tmp_path / "in"), records, 4)
    out = str(tmp_path / "o")
    preprocess(files, TOKENIZER, out, num_shards=2, progress=False)
    last = int(np.linspace(0, len(records), 5)[3])  # where write_parts starts the last part
    write_file(files[3], records[last:-1])  # which loses its last record
    marker = f"{out}-shard00001-of-00002.done.json"
    stamp = r"[\d,]+ bytes, modified \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} UTC"
    part = re.escape(repr(os.path.abspath(files[3])))
    now = rf"entry 2 is now {part} \({stamp}\), was "
    with pytest.raises(ConfigError, match=rf"differs in: inputs \({now}.*{marker}"):
        preprocess(files, TOKENIZER, out, num_shards=2, progress=False)
    os.remove(marker)  # the fix the refusal names
    with caplog.at_level("WARNING"):
        again = preprocess(files, TOKENIZER, out, num_shards=2, progress=False)
    assert f"{out}: its shards changed since they were merged; redoing it" in caplog.text
    ref = megatron_core_dataset([r["text"] for r in records[:-1]], str(tmp_path / "ref"))
    assert again.documents == len(records) - 1
    assert read_dataset(again.prefix) == read_dataset(ref)


def test_a_merge_is_found_done_however_its_prefix_is_spelled(tmp_path, monkeypatch, caplog):
    """A sharded run's merge recorded its shards as the prefix was typed, a dataset merge its
    inputs likewise: the same run given an absolute prefix (as the SLURM script writes it), or
    run from another directory, was refused for 'merge_of'. Both are found done and skipped."""
    records = demo_records()
    files = [os.path.abspath(f) for f in write_parts(str(tmp_path / "in"), records, 2)]
    monkeypatch.chdir(tmp_path)
    first = preprocess(files, TOKENIZER, "o/c", num_shards=2, progress=False)
    merged = read_dataset(str(tmp_path / first.prefix))
    with open("o/c.done.json") as f:  # the shards as the older code recorded them: as typed
        marker = json.load(f)
    for entry in marker["fingerprint"]["merge_of"]:
        entry[0] = os.path.join("o", entry[0])
    with open("o/c.done.json", "w") as f:
        json.dump(marker, f)
    os.makedirs("elsewhere")
    monkeypatch.chdir("elsewhere")
    with caplog.at_level("INFO"):
        again = preprocess(
            files, TOKENIZER, str(tmp_path / "o" / "c"), num_shards=2, progress=False
        )
    assert again.skipped == 2 and f"{tmp_path}/o/c: already merged, skipped" in caplog.text
    assert read_dataset(again.prefix) == merged

    monkeypatch.chdir(tmp_path)
    merge_datasets(["o/c_text_document"], "m/all", progress=False)
    monkeypatch.chdir("elsewhere")
    caplog.clear()
    with caplog.at_level("INFO"):
        merge_datasets([str(tmp_path / "o" / "c_text_document")], "../m/all", progress=False)
    assert "m/all: already merged, skipped" in caplog.text
    assert read_dataset(str(tmp_path / "m" / "all")) == merged


def test_merge_datasets_concatenates_prefixes_in_the_given_order(tmp_path):
    texts = [r["text"] for r in demo_records()]
    a = megatron_core_dataset(texts[:10], str(tmp_path / "a"))
    b = megatron_core_dataset(texts[10:30], str(tmp_path / "b"))
    out = merge_datasets([b, a], str(tmp_path / "m"), progress=False)
    assert read_dataset(out) == read_dataset(
        megatron_core_dataset(texts[10:30] + texts[:10], str(tmp_path / "ref"))
    )


def test_merge_refuses_an_output_prefix_that_is_one_of_its_inputs(tmp_path, capsys, monkeypatch):
    """The merge would replace that input with the merged dataset: refused before any work
    however the two are spelled (relative and absolute, with .bin, through a linked directory,
    a directory of inputs), naming the input; the input keeps its bytes."""
    (tmp_path / "o").mkdir()
    a = megatron_core_dataset(["alpha doc"], str(tmp_path / "o" / "a"))
    b = megatron_core_dataset(["beta doc", "gamma doc"], str(tmp_path / "b"))
    (tmp_path / "link").symlink_to(tmp_path / "o")
    kept = {ext: open(a + ext, "rb").read() for ext in (".bin", ".idx")}
    monkeypatch.chdir(tmp_path)
    link_a = str(tmp_path / "link" / "a")
    for inputs, output, named in (
        ([a, b], "o/a", a),
        ([b, "o/a.bin"], a, "o/a"),
        ([link_a + ".idx", b], a, link_a),
        ([b, "o"], link_a, os.path.join("o", "a")),
    ):
        args = ["merge", "--no-progress", "--input", *inputs, "--output-prefix", output]
        assert main(args) == 2
        assert (
            f"error: --output-prefix {output!r} is the input dataset {named!r}: the merge would "
            f"replace that input with the merged dataset. Fix: a new --output-prefix, e.g. "
            f"{output}_merged\n"
        ) in capsys.readouterr().err
    assert {ext: open(a + ext, "rb").read() for ext in (".bin", ".idx")} == kept
    assert listing(tmp_path / "o") == ["a.bin", "a.idx"]
    assert main(["merge", "--no-progress", "--input", a, b, "--output-prefix", "o/a_merged"]) == 0
    ref = megatron_core_dataset(["alpha doc", "beta doc", "gamma doc"], str(tmp_path / "ref"))
    assert read_dataset("o/a_merged") == read_dataset(ref)


def test_merge_refuses_a_dataset_given_twice(tmp_path, capsys, monkeypatch):
    """Its documents would be in the output twice: refused however the second is spelled (the
    same prefix, with .bin, through a symbolic link to its files), naming it; nothing written."""
    a = megatron_core_dataset(["alpha doc"], str(tmp_path / "a"))
    b = megatron_core_dataset(["beta doc"], str(tmp_path / "b"))
    (tmp_path / "l").mkdir()
    for ext in (".bin", ".idx"):
        (tmp_path / "l" / f"a{ext}").symlink_to(a + ext)
    monkeypatch.chdir(tmp_path)
    for inputs, given in (
        (["a", b, "a"], "input 'a' is given twice"),
        (["a", "a.bin"], "input 'a' is given twice"),
        ([a, "l/a"], f"inputs {a!r} and 'l/a' are the same dataset"),
    ):
        assert main(["merge", "--no-progress", "--input", *inputs, "--output-prefix", "m/x"]) == 2
        assert (
            f"error: {given}: the output would hold its documents twice. Fix: name each dataset "
            "once (to sample one more often, weight it in the --data-path blend)\n"
        ) in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def _cli_two_shards(tmp_path, monkeypatch) -> tuple[list[str], str]:
    """The arguments of a 2-shard preprocess of the demo corpus, and its output prefix; the log
    goes to this test's stderr (a handler an earlier test added writes to that test's)."""
    monkeypatch.setattr(logging.getLogger("megatron_gamma.data"), "handlers", [])
    files = write_parts(str(tmp_path / "in"), demo_records(), 2)
    out = str(tmp_path / "o" / "c")
    args = ["preprocess", "--input", *files, "--tokenizer-model", TOKENIZER, "--output-prefix",
            out, "--num-shards", "2", "--no-progress"]  # fmt: skip
    return args, out


def test_a_killed_worker_is_its_message_and_exit_status_1_without_a_traceback(
    tmp_path, capsys, monkeypatch
):
    """SIGKILL (the out-of-memory killer's) of a worker: the error names its exit code and the
    fix, main returns 1 instead of raising; the rerun writes the bytes of a clean run."""
    args, out = _cli_two_shards(tmp_path, monkeypatch)
    encode = ChunkEncoder.__call__

    def killed_in_a_worker(self, chunk):
        if os.getpid() != MAIN:
            os.kill(os.getpid(), signal.SIGKILL)
        return encode(self, chunk)

    with monkeypatch.context() as m:
        m.setattr(ChunkEncoder, "__call__", killed_in_a_worker)
        assert main([*args, "--workers", "2", "--chunk-size", "1"]) == 1
    err = capsys.readouterr().err
    assert re.search(
        r"megatron-gamma preprocess: error: worker process \d+ exited with code -9 \(negative: "
        r"killed by that signal.*\)\. Fix: give the job more memory or fewer --workers",
        err,
    ), err
    assert "Traceback" not in err
    assert main(args) == 0
    ref = megatron_core_dataset([r["text"] for r in demo_records()], str(tmp_path / "ref"))
    assert read_dataset(f"{out}_text_document") == read_dataset(ref)


@pytest.fixture
def python_ctrl_c():
    """Python's own SIGINT handling, unblocked, as a fresh ``megatron-gamma`` process has it,
    whatever an earlier test in this pytest process left (once, in a full run, the SIGINT the
    test below sends was not acted on, and the run finished; alone the test passed). What was
    found is printed, so a failure shows it."""
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    print(f"SIGINT before the test: handler {handler!r}, blocked {sorted(mask)}")
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(signal.SIGINT, handler)


def test_ctrl_c_is_a_message_and_exit_status_130_and_keeps_the_finished_shard(
    tmp_path, capsys, monkeypatch, python_ctrl_c
):
    """SIGINT while shard 1 is written: 'interrupted' and what is kept, no traceback; shard 0
    stays complete, nothing of shard 1 is left, and the rerun finishes with a clean run's bytes."""
    args, out = _cli_two_shards(tmp_path, monkeypatch)
    add = ChunkWriter.add

    def interrupted_in_shard_1(self, *a):
        if "shard00001" in self.prefix:
            os.kill(os.getpid(), signal.SIGINT)
        return add(self, *a)

    with monkeypatch.context() as m:
        m.setattr(ChunkWriter, "add", interrupted_in_shard_1)
        assert main(args) == 130
    err = capsys.readouterr().err
    assert err.endswith(
        "megatron-gamma preprocess: interrupted; finished outputs are kept, nothing half-written: "
        "rerun the same command to go on\n"
    )
    assert "Traceback" not in err
    kept = listing(os.path.dirname(out))
    assert kept == [f"c-shard00000-of-00002{s}" for s in
                    (".done.json", ".stats.json", "_text_document.bin", "_text_document.idx",
                     "_text_document.tokenizer_fingerprint.json")]  # fmt: skip
    assert main(args) == 0
    ref = megatron_core_dataset([r["text"] for r in demo_records()], str(tmp_path / "ref"))
    assert read_dataset(f"{out}_text_document") == read_dataset(ref)


def test_merge_datasets_again_after_an_input_was_rewritten_to_the_same_sizes(tmp_path, caplog):
    """'x y' and 'y x' are two tokens each: the rewritten dataset keeps its .bin and .idx
    sizes, and only the modification times tell the merge that its output is stale."""
    a = megatron_core_dataset(["alpha doc"], str(tmp_path / "a"))
    b = megatron_core_dataset(["x y"], str(tmp_path / "b"))
    out = merge_datasets([a, b], str(tmp_path / "m"), progress=False)
    sizes = [os.path.getsize(b + ext) for ext in (".bin", ".idx")]
    megatron_core_dataset(["y x"], b)
    assert [os.path.getsize(b + ext) for ext in (".bin", ".idx")] == sizes
    later = os.stat(b + ".bin").st_mtime_ns + 10**9
    os.utime(b + ".bin", ns=(later, later))
    with caplog.at_level("WARNING"):
        merge_datasets([a, b], out, progress=False)
    assert f"{out}: its inputs changed since they were merged" in caplog.text
    ref = megatron_core_dataset(["alpha doc", "y x"], str(tmp_path / "ref"))
    assert read_dataset(out) == read_dataset(ref)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_killed_run_leaves_no_partial_final_file_and_rerun_matches_clean_run(tmp_path):
    """SIGKILL a 2-worker run in the middle of its second shard, then rerun it."""
    records = demo_records() * 4
    files = write_parts(str(tmp_path / "in"), records, 6)
    clean = preprocess(files, TOKENIZER, str(tmp_path / "clean" / "c"), workers=2, progress=False)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = ["preprocess", "--input", *files, "--tokenizer-model", TOKENIZER, "--output-prefix",
            str(out_dir / "c"), "--num-shards", "3", "--workers", "2", "--chunk-size", "4",
            "--no-progress"]  # fmt: skip
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1")
    proc = subprocess.Popen([sys.executable, "-m", "megatron_gamma.cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    partial = out_dir / ".c-shard00001-of-00003.partial" / "c-shard00001-of-00003_text_document.bin"
    seen: dict[str, set[int]] = {}
    workers = []
    try:
        deadline = time.time() + 180
        while not (partial.exists() and partial.stat().st_size > 0):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
            for name in listing(out_dir):
                if not name.startswith("."):
                    seen.setdefault(name, set()).add(os.path.getsize(out_dir / name))
            time.sleep(0.002)
        workers = psutil.Process(proc.pid).children()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, "workers outlived the killed main process"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in workers:
            if w.is_running():
                w.kill()
        proc.stderr.close()
    finals = [n for n in listing(out_dir) if not n.startswith(".")]
    assert all(n.startswith("c-shard00000-of-00003") for n in finals), finals
    for name in finals:
        seen.setdefault(name, set()).add(os.path.getsize(out_dir / name))
    shard0 = {n: os.path.getsize(out_dir / n) for n in finals}
    assert {n: {s} for n, s in shard0.items()} == {n: seen[n] for n in shard0}  # only whole files
    rerun = preprocess(files, TOKENIZER, str(out_dir / "c"), workers=2, num_shards=3, chunk_size=4,
                       progress=False)  # fmt: skip
    assert rerun.skipped == 1
    assert read_dataset(rerun.prefix) == read_dataset(clean.prefix)
    assert not any(n.startswith(".") for n in listing(out_dir))


def test_off_a_terminal_progress_is_logged_every_log_interval_documents(tmp_path, capsys):
    """stderr a pipe (a SLURM log, nohup, CI): no bar, but Megatron-LM's 'Processed N documents'
    line each time the documents written pass a multiple of --log-interval, with the tokens
    written by then; one record per chunk, so the lines fall on the multiples exactly."""
    inputs = [os.path.join(demo_dir(), f) for f in ("zh.jsonl", "en.jsonl")]
    out = str(tmp_path / "o")
    args = ["preprocess", "--input", *inputs, "--tokenizer-model", TOKENIZER, "--output-prefix"]
    args += [out, "--chunk-size", "1", "--log-interval", "10"]
    proc = run_cli(args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = re.findall(
        r"^INFO: Processed (\d+) documents \(\d+ docs/s, [\d.]+ MB/s\), (\d+) tokens "
        r"\(\d+ tok/s\), [\d.]+ s elapsed$",
        proc.stderr,
        re.MULTILINE,
    )
    stats = json.loads(open(out + ".stats.json").read())["outputs"]["text_document"]
    assert stats["documents"] == 104
    assert [int(d) for d, _ in lines] == list(range(10, 101, 10)), proc.stderr
    dataset = IndexedDataset(out + "_text_document")  # kept: collecting it unmaps the lengths
    ends = np.cumsum(dataset.sequence_lengths)
    assert [int(t) for _, t in lines] == [int(ends[d - 1]) for d in range(10, 101, 10)]
    assert ends[-1] == stats["tokens"]
    assert "it/s" not in proc.stderr and "B/s]" not in proc.stderr  # no bar
    assert main([*args, "--log-interval", "0"]) == 2
    assert "log_interval=0: must be >= 1" in capsys.readouterr().err


def test_merge_refuses_inputs_holding_shards_and_their_merge_and_prints_counts(
    tmp_path, parts, capsys
):
    """A sharded run's directory holds the shards and their merge: `merge --input DIR` would
    hold every document twice."""
    out = tmp_path / "arr" / "deb"
    run = preprocess(parts, TOKENIZER, str(out), num_shards=3, progress=False)
    shards = [f"{out}-shard{i:05d}-of-00003_text_document" for i in range(3)]
    merge = ["merge", "--no-progress", "--output-prefix"]
    assert main([*merge, str(tmp_path / "m" / "all"), "--input", str(tmp_path / "arr")]) == 2
    err = capsys.readouterr().err
    assert (
        f"inputs '{shards[0]}' and '{run.prefix}' both hold the documents of '{shards[0]}'" in err
    )
    assert "Fix: give the merged dataset alone, or the datasets it was merged from" in err
    assert not (tmp_path / "m").exists()
    assert main([*merge, str(tmp_path / "m" / "all"), "--input", *shards]) == 0
    assert read_dataset(str(tmp_path / "m" / "all")) == read_dataset(run.prefix)
    want = run.stats["outputs"]["text_document"]
    assert capsys.readouterr().out == (
        f"{tmp_path}/m/all.bin/.idx: {want['documents']} documents, {want['tokens']} tokens\n"
    )
    assert want["documents"] == len(demo_records())
    # two merges of the same shards, and a merge with one of its own shards
    for inputs, shared in (
        ([run.prefix, str(tmp_path / "m" / "all")], shards[0]),
        ([str(tmp_path / "m"), shards[1]], shards[1]),
    ):
        assert main([*merge, str(tmp_path / "m2" / "x"), "--input", *inputs]) == 2
        assert f"both hold the documents of '{shared}'" in capsys.readouterr().err
