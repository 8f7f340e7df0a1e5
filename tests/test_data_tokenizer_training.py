"""Tokenizer training at scale: bounded seeded sampling with explicit language proportions, byte
fallback, loader metadata read back by megatron-core, and the committed demo tokenizer."""

import filecmp
import json
import os
import re

import pytest

from megatron_gamma.cli import main, parse_args
from megatron_gamma.data import demo_dir
from megatron_gamma.data.sampling import parse_proportions, sample_corpus
from megatron_gamma.data.tokenizer import BilingualTokenizer
from megatron_gamma.data.tokenizer_training import train_tokenizer

DEMO = [os.path.join(demo_dir(), "zh.jsonl"), os.path.join(demo_dir(), "en.jsonl")]


def _records():
    out = []
    for path in DEMO:
        with open(path, encoding="utf-8") as f:
            out += [json.loads(line) for line in f]
    return out


def _split_demo(folder, n=8):
    """The demo corpus as n files, so that file order and sampling spread are exercised."""
    recs = _records()
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i in range(n):
        path = os.path.join(folder, f"part{i}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs[i::n])
        paths.append(path)
    return paths


def test_sample_is_bounded_seeded_order_free_and_proportioned(tmp_path):
    files = _split_demo(tmp_path / "in")
    longest = max(len(r["text"]) for r in _records())
    kw = dict(sample_chars=40_000, heldout_fraction=0.2, heldout_chars=1_000, progress=False)
    props = parse_proportions("zh=0.25,en=0.75")
    s = sample_corpus(files, props, seed=7, **kw)
    chars = s.chars("train")
    assert s.budgets == {"zh": 10_000, "en": 30_000}
    for lang, budget in s.budgets.items():
        assert budget <= chars[lang] < budget + longest
        assert 1_000 <= s.chars("heldout")[lang] < 1_000 + longest
    for lang in ("zh", "en"):
        assert not set(s.train[lang]) & set(s.heldout[lang])
    assert s.documents_read < len(_records())  # stopped once the budgets were full
    assert sample_corpus(files, props, seed=7, **kw).train == s.train
    other = sample_corpus(files, props, seed=8, **kw)
    assert other.train != s.train
    by_text = {r["text"]: r["lang"] for r in _records()}
    assert all(by_text[t] == lang for lang, ts in s.train.items() for t in ts)
    # the draw is a property of each document, not of the file order: with budgets larger than
    # the corpus, any file order gives the same sets
    big = dict(kw, sample_chars=10**9, heldout_chars=10**9)
    a = sample_corpus(files, props, seed=7, **big)
    b = sample_corpus(files[::-1], props, seed=7, **big)
    assert {k: set(v) for k, v in a.train.items()} == {k: set(v) for k, v in b.train.items()}


def test_parse_proportions_rejects_bad_specs():
    assert parse_proportions("zh=0.6,en=0.4,mixed=0") == {"zh": 0.6, "en": 0.4}
    assert parse_proportions("zh=0.1,en=0.2,mixed=0.7") == {"zh": 0.1, "en": 0.2, "mixed": 0.7}
    for bad in ("zh=0.5,fr=0.5", "zh:0.5", "zh=-1,en=1", "zh=1,zh=1"):
        with pytest.raises(ValueError, match="lang_proportions"):
            parse_proportions(bad)


def test_parse_proportions_refuses_shares_not_summing_to_one(tmp_path, capsys):
    """Shares are not rescaled: zh=0.5,en=0.6 would otherwise train on 0.45 / 0.55 silently."""
    for spec, total in (("zh=0.5,en=0.6", "1.1"), ("zh=1,en=3", "4"), ("zh=0,en=0", "0")):
        with pytest.raises(ValueError) as e:
            parse_proportions(spec)
        assert str(e.value) == (
            f"lang_proportions={spec!r}: the shares sum to {total}, not 1. Fix: give shares that "
            "sum to 1, e.g. 'zh=0.5,en=0.5'"
        )
    thirds = parse_proportions("zh=0.333,en=0.333,mixed=0.333")  # 0.999: shares to 3 decimals
    assert thirds == {"zh": 0.333, "en": 0.333, "mixed": 0.333}
    with pytest.raises(ValueError, match="sum to 0.998, not 1"):
        parse_proportions("zh=0.333,en=0.333,mixed=0.332")
    args = ["train-tokenizer", "--input", *DEMO, "--lang-proportions", "zh=0.5,en=0.6",
            "--output", str(tmp_path / "tokenizer.json"), "--no-progress"]  # fmt: skip
    assert main(args) == 2
    assert "the shares sum to 1.1, not 1" in capsys.readouterr().err


def test_committed_demo_tokenizer_is_what_the_tool_trains(tmp_path):
    out = tmp_path / "tok" / "tokenizer.json"
    args = ["train-tokenizer", "--input", *DEMO, "--lang-key", "lang", "--vocab-size", "4096",
            "--heldout-fraction", "0", "--output", str(out), "--no-progress"]  # fmt: skip
    assert main(args) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "tokenizer_metadata.json", "tokenizer.report.json"):  # fmt: skip
        assert filecmp.cmp(out.parent / name, os.path.join(demo_dir(), name), shallow=False), name


def test_held_out_chars_per_token_and_byte_fallback(tmp_path):
    out = str(tmp_path / "tokenizer.json")
    report = train_tokenizer(DEMO, out, 1024, {"zh": 0.5, "en": 0.5}, 10**9, progress=False,
                             heldout_fraction=0.2, lang_key="lang")  # fmt: skip
    tok = BilingualTokenizer(out)
    assert (tok.eod, tok.pad, tok.bos) == (0, 1, 2) and tok.vocab_size == 1024
    trained = {lang: t["documents"] for lang, t in report["train"].items()}
    for lang in ("zh", "en"):
        h = report["heldout"][lang]
        assert h["documents"] > 0 and trained[lang] > 0
        assert h["documents"] + trained[lang] == 52
        assert h["chars_per_token"] == pytest.approx(h["characters"] / h["tokens"], abs=1e-4)
    assert report["heldout"]["en"]["chars_per_token"] > report["heldout"]["zh"]["chars_per_token"]
    unseen = "𠀀𪚥 😀 Жизнь ℵ₀ \x00\x7f é"
    ids = tok.tokenize(unseen)
    assert tok.detokenize(ids) == unseen
    assert len(ids) >= 10  # spelled with byte tokens, no unknown token exists


@pytest.mark.timeout(300)
def test_megatron_core_tokenizer_loader_reads_the_metadata():
    pytest.importorskip("transformers", reason="megatron-core's HF tokenizer library needs it")
    from megatron.core.tokenizers import MegatronTokenizer

    ours = BilingualTokenizer(os.path.join(demo_dir(), "tokenizer.json"))
    theirs = MegatronTokenizer.from_pretrained(demo_dir())
    assert type(theirs).__name__ == "GPTTokenizer"
    assert (theirs.eod, theirs.pad, theirs.bos) == (ours.eod, ours.pad, ours.bos)
    for rec in _records()[::13] + [{"text": "中文《书名》，e.g. 3.14 😀"}]:
        assert theirs.tokenize(rec["text"]) == ours.tokenize(rec["text"])


def test_train_tokenizer_refuses_an_existing_output_before_reading_input(tmp_path, capsys):
    """An existing tokenizer (which preprocessed data may have been made with) is never replaced:
    the refusal names the path and the fix, before any input is read (the input here does not
    exist, so reading it would fail with another error)."""
    out = tmp_path / "tokenizer.json"
    out.write_text("the tokenizer existing data was made with")
    args = ["train-tokenizer", "--input", str(tmp_path / "missing.jsonl"), "--vocab-size", "300",
            "--output", str(out), "--no-progress"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    said = "already exists; train-tokenizer overwrites no file (were it a tokenizer, data "
    assert f"output={str(out)!r}: {said}" in err
    assert "Fix: pass another --output path, or delete the existing file first" in err
    assert out.read_text() == "the tokenizer existing data was made with"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]


@pytest.mark.parametrize(
    "existing", ["tokenizer_config.json", "special_tokens_map.json", "tokenizer_metadata.json",
                 "other.report.json"],
)  # fmt: skip
def test_train_tokenizer_refuses_to_overwrite_the_files_it_writes_beside_its_output(
    tmp_path, capsys, existing
):
    """--output DIR/other.json beside another tokenizer's files: its loader files and report
    would replace theirs (a tokenizer_config.json names that tokenizer's EOD), so the run is
    refused before any input is read, naming the file, and nothing in DIR changes."""
    (tmp_path / existing).write_text("another tokenizer's")
    out = tmp_path / "other.json"
    args = ["train-tokenizer", "--input", str(tmp_path / "missing.jsonl"), "--vocab-size", "300",
            "--output", str(out), "--no-progress"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / existing} already exists, and train-tokenizer writes that file" in err
    assert f"Fix: pass an --output in a folder of its own, e.g. {tmp_path}/new/" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]
    assert (tmp_path / existing).read_text() == "another tokenizer's"


def test_train_tokenizer_output_as_a_directory_writes_its_tokenizer_json(tmp_path, capsys):
    """--output DIR/ (or an existing DIR) writes DIR/tokenizer.json, which --tokenizer-model DIR
    reads, with its metadata beside it; a DIR holding one already is refused as a file is."""
    base = ["train-tokenizer", "--input", *DEMO, "--vocab-size", "300", "--sample-chars",
            "20000", "--no-progress", "--output"]  # fmt: skip
    assert main([*base, str(tmp_path / "ref" / "tokenizer.json")]) == 0
    capsys.readouterr()
    (tmp_path / "existing").mkdir()
    for folder in (str(tmp_path / "new") + "/", str(tmp_path / "existing")):
        assert main([*base, folder]) == 0
        want = os.path.join(folder, "tokenizer.json")
        assert capsys.readouterr().out.startswith(f"wrote {want} (300 tokens)")
        for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.report.json"):
            ref = tmp_path / "ref" / name
            assert filecmp.cmp(os.path.join(folder, name), ref, shallow=False), name
    assert main([*base, str(tmp_path / "existing")]) == 2
    want = str(tmp_path / "existing" / "tokenizer.json")
    assert f"output={want!r}: already exists" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["tok4", "tok4.model"])
def test_train_tokenizer_refuses_an_output_that_is_no_directory_and_no_json(
    tmp_path, capsys, monkeypatch, name
):
    """--output ../w/tok4 (meant as a folder: no trailing '/', not there yet, no .json) wrote a
    file named tok4 and put tokenizer_config.json and the other loader files into ../w itself.
    Refused before any input is read, naming the path and both fixes; nothing is written."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("w")
    args = ["train-tokenizer", "--input", *DEMO, "--vocab-size", "300", "--no-progress",
            "--output", f"w/{name}"]  # fmt: skip
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"megatron-gamma train-tokenizer: error: output='w/{name}': neither an existing "
        f"directory nor a .json file name; train-tokenizer would write a file named '{name}' "
        "and put its loader files (tokenizer_config.json, special_tokens_map.json, "
        f"tokenizer_metadata.json) into 'w'. Fix: --output w/{name}/ for a directory holding "
        f"tokenizer.json, or a path ending in .json (e.g. w/{name}.json)\n"
    )
    assert os.listdir("w") == []
    with pytest.raises(ValueError, match=r"output='tok': neither .* into '\.'\. Fix:"):
        train_tokenizer(DEMO, "tok", 300, {"en": 1.0}, 20000)
    assert sorted(os.listdir(".")) == ["w"]


def test_train_tokenizer_help_shows_the_default_of_each_option(capsys):
    """Each option's help ends with the default the parser gives it (the sampling budgets were
    shown without theirs)."""
    with pytest.raises(SystemExit):
        main(["train-tokenizer", "--help"])
    text = capsys.readouterr().out
    defaults = parse_args(["train-tokenizer", "--input", "x", "--output", "y"])
    flags = ("--vocab-size", "--lang-proportions", "--sample-chars", "--sample-rate",
             "--heldout-fraction", "--heldout-chars", "--seed")  # fmt: skip
    for flag in flags:
        entry = re.search(rf"\n  {flag} [A-Z_]+(?: +|\n {{10,}})(.*?)(?=\n  -|\Z)", text, re.S)
        assert entry is not None, f"{flag}: no help"
        entry = entry.group(1)
        value = getattr(defaults, flag[2:].replace("-", "_"))
        assert " ".join(entry.split()).endswith(f"(default: {value})"), (flag, entry)
    assert (defaults.vocab_size, defaults.sample_chars, defaults.seed) == (4096, 500_000_000, 1234)


def test_a_lang_key_no_record_has_is_warned_when_sampling(caplog):
    """train-tokenizer --lang-key language on records whose field is 'lang': the sample is the
    one tagging by script gives, and a warning says the field was never found."""
    kwargs = dict(progress=False, heldout_fraction=0.1)
    by_script = sample_corpus(DEMO, {"zh": 0.5, "en": 0.5}, 30_000, **kwargs)
    with caplog.at_level("WARNING"):
        typo = sample_corpus(DEMO, {"zh": 0.5, "en": 0.5}, 30_000, lang_key="language", **kwargs)
    assert (typo.train, typo.heldout) == (by_script.train, by_script.heldout)
    assert caplog.messages == [
        "--lang-key 'language': no record read had that field (or it was null in every one), so "
        "every document was tagged by script. Fix: check the field's name, or drop --lang-key to "
        "tag by script"
    ]
