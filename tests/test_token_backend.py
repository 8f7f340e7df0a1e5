"""Tokenizer backends of preprocessing: gigatoken's ids against HF ``tokenizers`` (the reference)
on the demo corpus, the Debian corpus and adversarial text, also when gigatoken is rebuilt to
empty its cache; ``auto``'s fallback and its message; output bytes identical across backends,
workers and shards."""

import gzip
import json
import os
import random
import signal
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer

from megatron_gamma.config import ConfigError
from megatron_gamma.data import demo_dir, token_backend
from megatron_gamma.data.encode import EncodeOptions
from megatron_gamma.data.filters import Filters
from megatron_gamma.data.preprocess import preprocess
from megatron_gamma.data.token_backend import (
    MAX_SAMPLE_CHARS,
    PROBE_TEXTS,
    GigatokenBackend,
    HFBackend,
    resolve_backend,
)
from megatron_gamma.data.tokenizer import BilingualTokenizer

TOKENIZER = os.path.join(demo_dir(), "tokenizer.json")
token_backend_doc = token_backend._tokenizer_doc  # the parse, before a test counts its calls
# The Debian documentation subset committed for the CPU study (examples/studies/data/NOTICE).
DEBIAN = os.path.join(os.path.dirname(__file__), "..", "examples", "studies", "data", "debian-docs")


def hf_ids(texts: list[str]) -> list[list[int]]:
    """The reference: one ``Tokenizer.encode`` per text, special-token strings as text."""
    tok = Tokenizer.from_file(TOKENIZER)
    tok.encode_special_tokens = True
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def split(ids: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def adversarial(n: int, seed: int = 0) -> list[str]:
    """Random strings over mixed scripts, emoji (with ZWJ and skin tones), control characters,
    combining marks, whitespace runs, digits and very long words."""
    ranges = [
        (0x00, 0x1F), (0x20, 0x7E), (0x7F, 0x9F), (0xC0, 0x24F), (0x300, 0x36F), (0x391, 0x3C9),
        (0x410, 0x44F), (0x5D0, 0x5EA), (0x620, 0x64A), (0x900, 0x97F), (0xE00, 0xE5B),
        (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF01, 0xFF5E),
        (0x1F300, 0x1F6FF), (0x1F3FB, 0x1F3FF), (0x20000, 0x2A6DF), (0x200B, 0x200F),
    ]  # fmt: skip
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(ranges)
            run = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12)))
            parts.append(run * rng.choice([1, 1, 1, 300]))
            parts.append(rng.choice([" ", "  ", "\n", "\t", "\r\n", "", "\u3000", "\u200d", "'s "]))
        out.append("".join(parts))
    return out


def test_gigatoken_ids_equal_hf_on_demo_probe_and_adversarial_text():
    texts = []
    for lang in ("zh", "en"):
        with open(os.path.join(demo_dir(), f"{lang}.jsonl"), encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f]
    special = len(texts) + 4  # PROBE_TEXTS[4] holds literal special-token strings
    texts += list(PROBE_TEXTS) + adversarial(300)
    reference = hf_ids(texts)
    assert split(*GigatokenBackend(TOKENIZER).encode_batch(texts)) == reference
    assert split(*HFBackend(TOKENIZER).encode_batch(texts)) == reference
    assert "<|endoftext|>" in texts[special] and 0 not in reference[special]  # text, not EOD


def test_gigatoken_ids_equal_hf_on_debian_sample():
    texts = []
    for name in ("en.jsonl.gz", "zh.jsonl.gz"):
        with gzip.open(os.path.join(DEBIAN, name), "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for _, line in zip(range(150), f, strict=False)]
    assert split(*GigatokenBackend(TOKENIZER).encode_batch(texts)) == hf_ids(texts)


def modified_tokenizer(tmp_path, **model) -> str:
    with open(TOKENIZER, encoding="utf-8") as f:
        doc = json.load(f)
    doc["model"].update(model)
    path = str(tmp_path / "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return path


def test_auto_picks_gigatoken_and_hf_is_taken_as_asked():
    backend, reason = resolve_backend("auto", TOKENIZER, ["你好 hello"])
    assert backend == "gigatoken"
    assert reason == "gigatoken: ids identical to HF tokenizers on 11 probe texts and 1 input text"
    assert resolve_backend("auto", TOKENIZER, ["a b", "c"])[1].endswith(
        "on 11 probe texts and 2 input texts"
    )
    # a first text over the sample checks no input text, and says why
    assert resolve_backend("auto", TOKENIZER, ["x" * (64 * 1024 + 1), "short"])[1].endswith(
        "on 11 probe texts and no input text: the first is longer than the 65,536-character sample"
    )
    assert resolve_backend("auto", TOKENIZER, [])[1].endswith(
        "on 11 probe texts and no input text: the first records read hold none"
    )
    assert resolve_backend("hf", TOKENIZER, []) == ("hf", "hf: requested (--tokenizer-backend hf)")


def test_auto_falls_back_saying_why_and_gigatoken_refuses(tmp_path, monkeypatch):
    # BPE dropout 1.0: HF drops every merge (byte tokens); gigatoken ignores dropout.
    differ = modified_tokenizer(tmp_path, dropout=1.0)
    backend, reason = resolve_backend("auto", differ, [])
    assert backend == "hf"
    assert reason.startswith("hf: auto fell back because gigatoken ids differ from HF tokenizers")
    assert "on probe text 'Hello, world!" in reason and "hf [" in reason and "gigatoken [" in reason
    with pytest.raises(ConfigError, match="tokenizer_backend='gigatoken': gigatoken ids differ"):
        resolve_backend("gigatoken", differ, [])
    monkeypatch.setitem(sys.modules, "gigatoken", None)  # as if not installed
    backend, reason = resolve_backend("auto", TOKENIZER, [])
    assert backend == "hf"
    assert "gigatoken is not importable" in reason and "pip install gigatoken==" in reason
    with pytest.raises(ConfigError, match="tokenizer_backend='fast': unknown"):
        resolve_backend("fast", TOKENIZER, [])


def test_a_ctrl_c_swallowed_by_native_code_during_the_check_is_not_a_fallback(monkeypatch):
    """Trial 7: a SIGINT that landed inside gigatoken's encode came back as "AttributeError:
    'list' object has no attribute 'layout'", and the check fell back to hf and finished the
    run. A fake encode receives a real SIGINT, swallows the KeyboardInterrupt as native code
    did and raises that AttributeError: the check now raises KeyboardInterrupt, and the
    process's SIGINT handler is back as it was; the same error without a SIGINT still falls
    back."""

    def swallowing(self, texts):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        raise AttributeError("'list' object has no attribute 'layout'")

    def failing(self, texts):
        raise AttributeError("'list' object has no attribute 'layout'")

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(token_backend.GigatokenBackend, "encode_batch", swallowing)
    with pytest.raises(KeyboardInterrupt) as e:
        resolve_backend("auto", TOKENIZER, [])
    assert isinstance(e.value.__cause__, AttributeError)
    assert signal.getsignal(signal.SIGINT) is before
    monkeypatch.setattr(token_backend.GigatokenBackend, "encode_batch", failing)
    backend, reason = resolve_backend("auto", TOKENIZER, [])
    assert backend == "hf" and reason.endswith(
        "AttributeError: 'list' object has no attribute 'layout'"
    )


def test_the_check_hands_over_the_backends_it_loaded():
    """The run encodes with the tokenizers the check loaded (no second load): the same ids as
    HF tokenizers' own ``encode``."""
    loaded: dict = {}
    texts = ["你好 hello", *adversarial(5, seed=3)]
    assert resolve_backend("auto", TOKENIZER, texts, loaded)[0] == "gigatoken"
    assert isinstance(loaded["gigatoken"], GigatokenBackend)
    assert isinstance(loaded["hf"], HFBackend)
    for backend in loaded.values():
        assert split(*backend.encode_batch(texts)) == hf_ids(texts)


def test_the_check_parses_the_tokenizer_json_once_and_leaves_it_as_parsed(monkeypatch):
    """Both backends of the check are built from one parse of the tokenizer.json (0.16 CPU-s
    each for a 100k vocabulary), which neither changes: gigatoken drops the special added
    tokens from its own copy, so HF still has them."""
    parses = []

    def parse(path, plain=()):
        parses.append(token_backend_doc(path, plain))
        return parses[-1]

    monkeypatch.setattr(token_backend, "_tokenizer_doc", parse)
    loaded: dict = {}
    texts = ["a <|endoftext|> b", *adversarial(5, seed=4)]
    plain = ("<|endoftext|>",)
    assert resolve_backend("auto", TOKENIZER, texts, loaded, plain=plain)[0] == "gigatoken"
    assert len(parses) == 1
    assert parses[0] == token_backend_doc(TOKENIZER, plain)
    assert any(t["special"] for t in parses[0][0]["added_tokens"])
    for backend in loaded.values():
        assert split(*backend.encode_batch(texts)) == hf_ids(texts)


def test_the_check_encodes_with_the_runs_tokenizer_and_leaves_it_as_it_was():
    """HF's side of the check is the run's own ``tokenizers.Tokenizer`` (no second read: 0.4
    CPU-s for a 100k vocabulary), with special-token strings encoded as text for the check's
    calls only: afterwards the run's ``tokenize`` still reads them as the special token. Where a
    text of ``plain`` must be marked special, the backend reads its own."""
    tok = BilingualTokenizer(TOKENIZER)
    text = "a <|endoftext|> b"
    assert tok.eod in tok.tokenize(text)
    loaded: dict = {}
    texts = [text, *adversarial(5, seed=5)]
    assert resolve_backend("auto", TOKENIZER, texts, loaded, hf_tokenizer=tok.hf_tokenizer)
    assert loaded["hf"].tok is tok.hf_tokenizer
    assert split(*loaded["hf"].encode_batch(texts)) == hf_ids(texts)
    assert tok.eod in tok.tokenize(text) and not tok.hf_tokenizer.encode_special_tokens
    doc = token_backend_doc(TOKENIZER)[0]
    own = HFBackend(TOKENIZER, ("x",), (doc, True), hf_tokenizer=tok.hf_tokenizer)
    assert own.tok is not tok.hf_tokenizer
    assert split(*own.encode_batch(texts)) == hf_ids(texts)


def test_the_check_samples_every_file_up_to_the_size_cap(tmp_path, monkeypatch):
    """Short records: each of 3 files gives texts until its share of MAX_SAMPLE_CHARS (not a
    fixed record count), interleaved file by file."""
    import megatron_gamma.data.preprocess as prep

    for i in range(3):
        with open(tmp_path / f"{i}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": f"file{i} record{j} " * 8}) + "\n" for j in range(900))
    seen = {}

    def capture(requested, path, sample, loaded=None, plain=(), hf_tokenizer=None):
        seen["sample"] = list(sample)
        return resolve_backend(requested, path, sample, loaded, plain, hf_tokenizer)

    monkeypatch.setattr(prep, "resolve_backend", capture)
    preprocess([str(tmp_path)], TOKENIZER, str(tmp_path / "out" / "x"), progress=False)
    sample = seen["sample"]
    assert [t.split()[0] for t in sample[:6]] == ["file0", "file1", "file2"] * 2
    share = MAX_SAMPLE_CHARS // 3
    for i in range(3):
        mine = [t for t in sample if t.startswith(f"file{i} ")]
        assert share <= sum(map(len, mine)) < share + 8 * max(map(len, mine)), i  # 8 per read


def test_auto_falls_back_on_a_tokenizer_gigatoken_cannot_load(tmp_path):
    from tokenizers import models

    tok = Tokenizer(models.WordLevel({"a": 0, "<|endoftext|>": 1}, unk_token="a"))
    path = str(tmp_path / "wordlevel.json")
    tok.save(path)
    backend, reason = resolve_backend("auto", path, [])
    assert backend == "hf"
    assert "gigatoken cannot tokenize" in reason and "WordLevel" in reason


def read(prefix: str) -> tuple[bytes, bytes]:
    with open(prefix + ".bin", "rb") as b, open(prefix + ".idx", "rb") as i:
        return b.read(), i.read()


@pytest.mark.parametrize(
    "options",
    [
        EncodeOptions(),
        EncodeOptions(per_language=True, filters=Filters(min_chars=3)),
        EncodeOptions(per_language=True, split_sentences=True, append_eod=False),
    ],
    ids=["documents", "per-language-min-chars", "per-language-sentences-no-eod"],
)
def test_outputs_identical_across_backends_workers_and_shards(tmp_path, options):
    records = []
    for lang in ("zh", "en"):
        with open(os.path.join(demo_dir(), f"{lang}.jsonl"), encoding="utf-8") as f:
            records += [json.loads(line) for line in f]
    records += [{"text": t} for t in adversarial(40, seed=1)] + [{"text": "  "}, {"text": "x"}]
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(4):
        with open(folder / f"{i}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[i::4])
    runs = {
        "hf-w1": dict(tokenizer_backend="hf"),
        "gigatoken-w1": dict(tokenizer_backend="gigatoken"),
        "gigatoken-w2": dict(tokenizer_backend="gigatoken", workers=2, chunk_size=7),
        "auto-shards": dict(tokenizer_backend="auto", num_shards=3, chunk_size=5),
    }
    results = {
        name: preprocess([str(folder)], TOKENIZER, str(tmp_path / name / "out"), progress=False,
                         options=options, **kw)
        for name, kw in runs.items()
    }  # fmt: skip
    assert results["gigatoken-w1"].tokenizer_backend.startswith("gigatoken: ids identical")
    assert results["hf-w1"].tokenizer_backend.startswith("hf: requested")
    base = results["hf-w1"]
    assert len(base.prefixes) == (3 if options.per_language else 1)

    def counts(r):
        return {
            k: {f: v for f, v in o.items() if f != "prefix"} for k, o in r.stats["outputs"].items()
        }

    for name, r in results.items():
        assert counts(r) == counts(base), name
        assert r.stats["languages"] == base.stats["languages"], name
        for key in base.prefixes:
            assert read(r.prefixes[key]) == read(base.prefixes[key]), (name, key)


def test_gigatoken_rebuilt_after_every_batch_keeps_the_ids_of_hf():
    texts = list(PROBE_TEXTS) + adversarial(60, seed=2)
    batches = [texts[i : i + 9] for i in range(0, len(texts), 9)]
    rebuilt = GigatokenBackend(TOKENIZER, cache_mib=0)
    got = [ids for batch in batches for ids in split(*rebuilt.encode_batch(batch))]
    assert got == hf_ids(texts)
    assert rebuilt.rebuilds == len(batches)
    assert GigatokenBackend(TOKENIZER).cache_bytes == token_backend.CACHE_MIB * 2**20


def test_only_growth_during_encode_calls_counts_towards_the_cache_budget(monkeypatch):
    """An import between two batches (torch, after the start-up check) grew a process by ~200 MiB
    and emptied a warm cache; now only the resident memory gained inside encode calls counts."""
    backend = GigatokenBackend(TOKENIZER, cache_mib=1)
    rss = iter([100, 100 + 2**19, 500 * 2**20, 500 * 2**20 + 2**19 + 1])  # (before, after) x 2
    monkeypatch.setattr(backend, "_rss", lambda: next(rss))
    texts = ["Hello, world!", "你好，世界！"]
    first = split(*backend.encode_batch(texts))
    assert (backend.rebuilds, backend.grown) == (0, 2**19)  # 0.5 MiB grown inside the call
    second = split(*backend.encode_batch(texts))  # ~500 MiB grew between the calls: not counted
    assert (backend.rebuilds, backend.grown) == (1, 0)  # 0.5 MiB + 0.5 MiB + 1 byte > 1 MiB
    assert first == second == hf_ids(texts)


def test_a_negative_cache_budget_is_refused():
    with pytest.raises(ValueError, match=r"cache_mib=-1: must be >= 0"):
        GigatokenBackend(TOKENIZER, cache_mib=-1)


@pytest.mark.slow
def test_outputs_identical_when_every_worker_rebuilds_gigatoken(tmp_path, monkeypatch):
    records = []
    for lang in ("zh", "en"):
        with open(os.path.join(demo_dir(), f"{lang}.jsonl"), encoding="utf-8") as f:
            records += [json.loads(line) for line in f]
    records += [{"text": t} for t in adversarial(40, seed=3)]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    hf = preprocess([str(path)], TOKENIZER, str(tmp_path / "hf" / "out"), progress=False,
                    tokenizer_backend="hf")  # fmt: skip
    monkeypatch.setattr(token_backend, "CACHE_MIB", 0)  # forked workers inherit it
    giga = preprocess([str(path)], TOKENIZER, str(tmp_path / "giga" / "out"), progress=False,
                      tokenizer_backend="gigatoken", workers=2, chunk_size=5)  # fmt: skip
    assert giga.tokens == hf.tokens > 0
    assert read(giga.prefix) == read(hf.prefix)
