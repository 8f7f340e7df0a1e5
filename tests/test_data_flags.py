"""Megatron-LM's data and tokenizer flags: --num-workers, --reset-position-ids,
--reset-attention-mask, --eod-mask-loss, --mock-data, --tokenizer-type GPT2BPETokenizer with
--vocab-file/--merge-file, and the tokenizer fingerprint that preprocessing writes beside the data
and pretraining checks."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from distributed import run_distributed
from helpers import DEMO_INPUTS, DEMO_TOKENIZER, TINY_MODEL, demo_texts, read_metrics, run_cli
from megatron.core.datasets.indexed_dataset import IndexedDataset
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from workers.common import build, make_config

from megatron_gamma.cli import main
from megatron_gamma.config import ConfigError, load_config
from megatron_gamma.data.datasets import build_datasets, micro_batches
from megatron_gamma.data.merge import merge_datasets
from megatron_gamma.data.preprocess import preprocess
from megatron_gamma.data.tokenizer import EOD, BilingualTokenizer, write_metadata
from megatron_gamma.data.tokenizer_fingerprint import SUFFIX, check_datasets, fingerprint
from megatron_gamma.data.tokenizer_types import gpt2_bpe_tokenizer
from megatron_gamma.rundir import loader
from megatron_gamma.training.loop import preflight

TEXTS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "深度学习中的小初始化很重要。",
    "  two  spaces\nand a newline",
    "emoji 🙂 and a<|endoftext|>inside",
]


@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
    """A tiny GPT-2-format vocab.json + merges.txt (byte-level BPE with <|endoftext|>)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=[EOD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS * 10 + [open(p).read()[:20000] for p in DEMO_INPUTS], trainer)
    folder = tmp_path_factory.mktemp("gpt2")
    vocab, merges = tok.model.save(str(folder))
    return vocab, merges


def _cfg(tmp_path, data_prefix, **overrides):
    return load_config(
        None,
        {
            "data_path": [data_prefix],
            "run_dir": str(tmp_path / "run"),
            "seq_length": 64,
            "micro_batch_size": 2,
            "global_batch_size": 4,
            "train_iters": 6,
            "eval_iters": 1,
            "split": "95,5,0",
            **overrides,
        },
    )


def test_num_workers_batches_equal_in_process_reads_and_dataset_order(tmp_path, demo_prefix):
    cfg = _cfg(tmp_path, demo_prefix)
    train = build_datasets(cfg, BilingualTokenizer(DEMO_TOKENIZER))[0]
    # data-parallel rank 1 of 2, resuming at sample 4: samples 6,7 then 10,11, ...
    zero = list(micro_batches(train, 4, 2, 1, 2, num_workers=0))
    two = list(micro_batches(train, 4, 2, 1, 2, num_workers=2))
    assert len(zero) == len(two) == (len(train) - 6 - 2) // 4 + 1
    for i, (a, b) in enumerate(zip(zero, two, strict=True)):
        assert a.keys() == b.keys() == {"tokens", "labels", "loss_mask", "position_ids"}
        for key in a:
            assert torch.equal(a[key], b[key]), (i, key)
        first = 6 + 4 * i
        for j in range(2):
            assert torch.equal(a["tokens"][j], train[first + j]["tokens"])


def _closed_form(tokens: list[int], eod: int):
    """(loss_mask, position_ids, masked) of one sample by definition: EOD positions carry no
    loss; positions restart at 0 after each EOD; token i attends to j <= i of its document."""
    n = len(tokens)
    loss = [0.0 if t == eod else 1.0 for t in tokens]
    pos, p = [], 0
    for t in tokens:
        pos.append(p)
        p = 0 if t == eod else p + 1
    doc = np.cumsum([0] + [t == eod for t in tokens[:-1]])  # document index of each position
    masked = [[j > i or doc[j] != doc[i] for j in range(n)] for i in range(n)]
    return loss, pos, masked


def test_eod_flags_give_the_closed_form_masks_and_positions(tmp_path, demo_prefix):
    flags = {"reset_position_ids": True, "reset_attention_mask": True, "eod_mask_loss": True}
    cfg = _cfg(tmp_path, demo_prefix, **flags)
    tok = BilingualTokenizer(DEMO_TOKENIZER)
    train = build_datasets(cfg, tok)[0]
    batches = micro_batches(train, 0, 2, 0, 1, num_workers=0)
    eods = 0
    for _ in range(4):
        batch = next(batches)
        assert batch["attention_mask"].shape == (2, 1, 64, 64)
        for j in range(2):
            tokens = batch["tokens"][j].tolist()
            loss, pos, masked = _closed_form(tokens, tok.eod)
            eods += tokens[:-1].count(tok.eod)
            assert batch["loss_mask"][j].tolist() == loss
            assert batch["position_ids"][j].tolist() == pos
            assert batch["attention_mask"][j, 0].tolist() == masked
    assert eods > 0  # the samples cross document boundaries
    plain = build_datasets(_cfg(tmp_path, demo_prefix), tok)[0]
    batch = next(micro_batches(plain, 0, 2, 0, 1))
    assert "attention_mask" not in batch and bool(batch["loss_mask"].all())
    assert batch["position_ids"].tolist() == [list(range(64))] * 2


def _document_isolation(spec: str, gate: str) -> dict:
    """Logits of the second document (after an EOD at position 5) for two different first
    documents, with the per-document mask and with the plain causal mask."""
    model = dict(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, seq_length=16
    )
    models, _ = build(make_config(dict(model, layer_spec=spec, gated_attention=gate), {}))
    net = models[0].eval()
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(1, 256, (1, 16), generator=gen)
    a[0, 5] = 0  # EOD
    b = a.clone()
    b[0, :5] = torch.randint(1, 256, (5,), generator=gen)
    doc = (torch.arange(16) > 5).long()
    i, j = torch.arange(16)[:, None], torch.arange(16)[None, :]
    mask = ((j > i) | (doc[None, :] != doc[:, None]))[None, None]
    pos = torch.arange(16)[None]
    with torch.no_grad():
        out = {}
        for name, m in (("reset", mask), ("causal", None)):
            la, lb = (net(t, pos, m)[0, 6:] for t in (a, b))
            out[name] = float((la - lb).abs().max())
    return out


ISOLATION_CASES = [("gamma", "elementwise"), ("gamma", "none"), ("local", "none")]


def _document_isolation_cases(cases: list[tuple[str, str]]) -> dict:
    return {case: _document_isolation(*case) for case in cases}


@pytest.fixture(scope="module")
def isolation() -> dict:
    """{(spec, gate): _document_isolation} for every case, built in one spawned process."""
    return run_distributed(_document_isolation_cases, 1, ISOLATION_CASES)[0]


@pytest.mark.parametrize("spec, gate", ISOLATION_CASES)
def test_reset_attention_mask_isolates_documents_in_the_model(isolation, spec, gate):
    out = isolation[spec, gate]
    assert out["reset"] == 0.0  # nothing of the first document reaches the second
    assert out["causal"] > 1e-4  # without the mask it does


def test_gpt2_bpe_tokenizer_equals_transformers(gpt2_files):
    from transformers import GPT2TokenizerFast

    vocab, merges = gpt2_files
    hf = GPT2TokenizerFast.from_pretrained(os.path.dirname(vocab))
    ours = gpt2_bpe_tokenizer(vocab, merges)
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=False).ids == hf.encode(
            text, add_special_tokens=False
        )
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text
    assert ours.token_to_id(EOD) == hf.eos_token_id


def test_tokenizer_flag_errors_name_the_fix(tmp_path, gpt2_files):
    vocab, merges = gpt2_files
    with pytest.raises(ConfigError, match="merge_file=None:.*--merge-file merges.txt"):
        load_config(None, {"tokenizer_type": "GPT2BPETokenizer", "vocab_file": vocab})
    with pytest.raises(ConfigError, match="vocab_file=.*add --tokenizer-type GPT2BPETokenizer"):
        load_config(None, {"tokenizer_type": "HuggingFaceTokenizer", "vocab_file": vocab})
    with pytest.raises(ConfigError, match="merge_file=None:"):  # vocab alone: GPT-2, as Megatron
        load_config(None, {"vocab_file": vocab})
    with pytest.raises(ConfigError, match="mock_data=True: .*data_path"):
        load_config(None, {"mock_data": True, "data_path": ["x"]})
    (tmp_path / "novocab.json").write_text('{"a": 0}')
    (tmp_path / "m.txt").write_text("#version: 0.2\n")
    with pytest.raises(ConfigError, match="no <\\|endoftext\\|> token"):
        gpt2_bpe_tokenizer(str(tmp_path / "novocab.json"), str(tmp_path / "m.txt"))


def test_a_tokenizer_file_of_the_wrong_kind_is_named_with_the_fix(tmp_path, gpt2_files, capsys):
    """Another JSON file as --tokenizer-model, a tokenizer.json as GPT-2's --vocab-file: each
    is named with HF tokenizers' reason and the fix, before anything is written; the fix works."""
    _, merges = gpt2_files
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(DEMO_TOKENIZER, folder / "tokenizer.json")
    write_metadata(str(folder / "tokenizer.json"))  # tokenizer_config.json and others beside it
    out = tmp_path / "o" / "p"
    args = ["preprocess", "--input", DEMO_INPUTS[1], "--output-prefix", str(out), "--no-progress"]
    assert main([*args, "--tokenizer-model", str(folder / "tokenizer_config.json")]) == 2
    err = capsys.readouterr().err
    assert (
        f"tokenizer_model={str(folder / 'tokenizer_config.json')!r}: not a tokenizer.json that HF "
        "tokenizers can read (expected `,` or `}` at line"
    ) in err
    tok = folder / "tokenizer.json"
    assert f"Fix: --tokenizer-model {tok}, the tokenizer.json beside it" in err
    assert main([*args, "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(tok),
                 "--merge-file", merges]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "not GPT-2's vocab.json and merges.txt (Error while initializing BPE: Token" in err
    assert (
        f"Fix: {tok} is a tokenizer.json: pass --tokenizer-type HuggingFaceTokenizer "
        f"--tokenizer-model {tok} instead"
    ) in err
    assert not out.parent.exists()
    assert main([*args, "--tokenizer-model", str(tok)]) == 0  # the fix
    with open(DEMO_INPUTS[1], encoding="utf-8") as f:
        first = json.loads(f.readline())["text"]
    hf = Tokenizer.from_file(DEMO_TOKENIZER)
    want = hf.encode(first, add_special_tokens=False).ids + [hf.token_to_id(EOD)]
    dataset = IndexedDataset(f"{out}_text_document")  # held: item 0 is a view of its memory map
    assert dataset[0].tolist() == want


def test_preprocess_gpt2_bpe_writes_its_ids_and_fingerprint(tmp_path, gpt2_files):
    from transformers import GPT2TokenizerFast

    vocab, merges = gpt2_files
    out = tmp_path / "gpt2data"
    proc = run_cli(
        ["preprocess", "--input", DEMO_INPUTS[1], "--output-prefix", str(out), "--no-progress",
         "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    prefix = f"{out}_text_document"
    hf = GPT2TokenizerFast.from_pretrained(os.path.dirname(vocab))
    with open(DEMO_INPUTS[1], encoding="utf-8") as f:
        first = json.loads(f.readline())["text"]
    dataset = IndexedDataset(prefix)  # held: item 0 is a view of its memory map
    ids = dataset[0].tolist()
    assert ids == hf.encode(first, add_special_tokens=False) + [hf.eos_token_id]
    doc = json.loads(open(prefix + SUFFIX).read())
    assert doc["tokenizer_type"] == "GPT2BPETokenizer"
    assert doc["source"] == [os.path.abspath(vocab), os.path.abspath(merges)]


def test_pretrain_refuses_data_made_with_another_tokenizer(tmp_path, demo_prefix, gpt2_files):
    vocab, merges = gpt2_files
    assert os.path.isfile(demo_prefix + SUFFIX)
    demo = preflight(_cfg(tmp_path, demo_prefix))  # the default, the demo tokenizer: accepted
    folder = preflight(_cfg(tmp_path, demo_prefix, tokenizer_model=os.path.dirname(demo.path)))
    assert folder.path == demo.path == os.path.abspath(DEMO_TOKENIZER)
    other = {"tokenizer_type": "GPT2BPETokenizer", "vocab_file": vocab, "merge_file": merges}
    with pytest.raises(ConfigError) as e:
        preflight(_cfg(tmp_path, demo_prefix, **other))
    msg = str(e.value)
    assert f"data_path={demo_prefix!r}: tokenized with HuggingFaceTokenizer" in msg
    assert DEMO_TOKENIZER in msg and vocab in msg
    assert "Fix: pass the tokenizer the data was made with (--tokenizer-type " in msg
    assert f"--tokenizer-model {os.path.abspath(DEMO_TOKENIZER)}" in msg
    # With a split too small as well, the tokenizer is named first (trial 11): the split error
    # alone, with the data's own tokenizer, is the control.
    with pytest.raises(ConfigError, match=r"seq_length=200000: the train split \(--split 95,5,0"):
        preflight(_cfg(tmp_path, demo_prefix, seq_length=200000))
    with pytest.raises(ConfigError, match=f"data_path={demo_prefix!r}: tokenized with Hugging"):
        preflight(_cfg(tmp_path, demo_prefix, seq_length=200000, **other))
    # A dataset from before fingerprints: a warning, not an error.
    old = str(tmp_path / "old")
    for ext in (".bin", ".idx"):
        shutil.copyfile(demo_prefix + ext, old + ext)
    preflight(_cfg(tmp_path, old, **other))
    # Merging datasets of two tokenizers is refused.
    gpt2 = preprocess(
        DEMO_INPUTS[1:], None, str(tmp_path / "g"), progress=False, tokenizer_type=other[
            "tokenizer_type"], vocab_file=vocab, merge_file=merges,
    ).prefix  # fmt: skip
    # Omitting the tokenizer flags for data not made with the demo tokenizer: the named error.
    with pytest.raises(ConfigError) as e:
        preflight(_cfg(tmp_path, gpt2))
    assert f"tokenized with GPT2BPETokenizer {vocab}, {merges}" in str(e.value)
    assert f"--tokenizer-type GPT2BPETokenizer --vocab-file {vocab} --merge-file {merges}" in str(
        e.value
    )
    with pytest.raises(ConfigError, match="cannot merge .* Fix: preprocess them with the same"):
        merge_datasets([demo_prefix, gpt2], str(tmp_path / "both"), progress=False)


def test_fingerprint_error_tells_a_replaced_tokenizer_from_another_one(tmp_path):
    """Data tokenized with a tokenizer file since replaced at the same path: the error says the
    file changed (both digests) and a fix that works, not "pass --tokenizer-model" with the same
    path. Data made with a tokenizer at another path keeps naming that path's flags."""
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    shutil.copyfile(DEMO_TOKENIZER, path)
    tok = BilingualTokenizer(str(path))
    prefix = str(tmp_path / "data_text_document")
    made = dict(fingerprint(tok), sha256="0123456789ab" + "0" * 52, canonical_sha256="f" * 64)
    with open(prefix + SUFFIX, "w") as f:
        json.dump(made, f)
    with pytest.raises(ConfigError) as e:
        check_datasets([prefix], tok)
    assert str(e.value) == (
        f"data_path={prefix!r}: the tokenizer at {path} changed since the data was tokenized "
        f"(sha256 0123456789ab then, {tok.sha256[:12]} now). Fix: restore the original "
        "tokenizer file there, or preprocess the data again with the current one"
    )
    with open(prefix + SUFFIX, "w") as f:
        json.dump(dict(made, source=[str(tmp_path / "old" / "tokenizer.json")]), f)
    with pytest.raises(ConfigError) as e:
        check_datasets([prefix], tok)
    old, msg = tmp_path / "old" / "tokenizer.json", str(e.value)
    assert f"tokenized with HuggingFaceTokenizer {old} (sha256 0123456789ab)" in msg
    assert "changed since" not in msg
    assert "Fix: pass the tokenizer the data was made with (--tokenizer-type Hugging" in msg
    assert f"--tokenizer-model {old})" in msg


def _demo_variant(folder, edit) -> str:
    """The demo tokenizer.json with ``edit`` applied to its parsed JSON, written to
    ``folder/tokenizer.json`` (another layout: indent 1); its path."""
    with open(DEMO_TOKENIZER, encoding="utf-8") as f:
        doc = json.load(f)
    edit(doc)
    os.makedirs(folder)
    path = os.path.join(folder, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    return path


def _encodings(path: str, texts: list[str]) -> list[tuple]:
    """(ids, type ids) of each text alone and of each pair of neighbours, with the special
    tokens the tokenizer's post-processor adds (``add_special_tokens=True``), and the ids
    without them, as HF tokenizers gives them."""
    tok = Tokenizer.from_file(path)
    out = [(e.ids, e.type_ids) for e in tok.encode_batch(texts)]
    out += [
        (e.ids, e.type_ids) for e in tok.encode_batch(list(zip(texts[:-1], texts[1:], strict=True)))
    ]
    return out + [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def test_a_tokenizer_saved_again_by_transformers_reads_the_data_of_the_original(
    tmp_path, demo_prefix
):
    """trial 14: the demo tokenizer saved again by transformers (``PreTrainedTokenizerFast(
    tokenizer_file=...).save_pretrained``) gains a post-processor that adds no token; its
    SHA-256 changed and the data made with the original was refused. Its canonical fingerprint
    is the original's, the ids (and type ids) on the demo corpus are identical, with and without
    special tokens; pretrain accepts the data, and compare a run of each. A fingerprint written
    before the canonical one existed is compared by its SHA-256 alone, as before: accepted for
    the original, refused for the copy, naming both."""
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_file=DEMO_TOKENIZER).save_pretrained(tmp_path / "resaved")
    resaved = str(tmp_path / "resaved" / "tokenizer.json")
    with open(DEMO_TOKENIZER, encoding="utf-8") as f:
        original = json.load(f)
    with open(resaved, encoding="utf-8") as f:
        again = json.load(f)
    assert original["post_processor"] is None
    assert again.pop("post_processor") == {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {},
    }
    assert again == {k: v for k, v in original.items() if k != "post_processor"}  # all it did
    ours, theirs = BilingualTokenizer(DEMO_TOKENIZER), BilingualTokenizer(resaved)
    assert ours.sha256 != theirs.sha256 and ours.canonical_sha256 == theirs.canonical_sha256
    texts = demo_texts()
    assert _encodings(resaved, texts) == _encodings(DEMO_TOKENIZER, texts)
    assert theirs.tokenize_batch(texts) == ours.tokenize_batch(texts)
    relaid = _demo_variant(tmp_path / "relaid", lambda doc: None)  # only the layout differs
    assert BilingualTokenizer(relaid).canonical_sha256 == ours.canonical_sha256
    assert preflight(_cfg(tmp_path, demo_prefix, tokenizer_model=resaved)).sha256 == theirs.sha256
    assert check_datasets([demo_prefix], theirs) == []
    digest = loader.tokenizer_digest  # compare's test that two runs share a tokenizer
    assert digest(_cfg(tmp_path, demo_prefix, tokenizer_model=resaved)) == digest(
        _cfg(tmp_path, demo_prefix)
    )
    old = str(tmp_path / "old_text_document")  # fingerprinted before canonical_sha256 existed
    with open(old + SUFFIX, "w") as f:
        json.dump({k: v for k, v in fingerprint(ours).items() if k != "canonical_sha256"}, f)
    assert check_datasets([old], ours) == []
    with pytest.raises(ConfigError) as e:
        check_datasets([old], theirs)
    assert str(e.value).startswith(
        f"data_path={old!r}: tokenized with HuggingFaceTokenizer {DEMO_TOKENIZER} (sha256 "
        f"{ours.sha256[:12]}), but this run's tokenizer is HuggingFaceTokenizer {resaved} "
        f"(sha256 {theirs.sha256[:12]}). Fix: pass the tokenizer the data was made with"
    )


def _bos_post_processor(doc: dict) -> None:
    doc["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [2], "tokens": ["<|bos|>"]}},
    }  # fmt: skip


def _first_merge_dropped(doc: dict) -> None:
    del doc["model"]["merges"][0]


@pytest.mark.parametrize("edit", [_bos_post_processor, _first_merge_dropped])
def test_a_tokenizer_with_other_ids_does_not_read_the_data(tmp_path, demo_prefix, edit):
    """A post-processor that adds a BOS, or one merge fewer: other ids on the demo corpus (as HF
    tokenizers encodes it), another canonical fingerprint, and the data made with the demo
    tokenizer is refused, naming both tokenizers."""
    path = _demo_variant(tmp_path / "tok", edit)
    ours, theirs = BilingualTokenizer(DEMO_TOKENIZER), BilingualTokenizer(path)
    texts = demo_texts()
    assert _encodings(path, texts) != _encodings(DEMO_TOKENIZER, texts)
    assert theirs.canonical_sha256 != ours.canonical_sha256
    digest = loader.tokenizer_digest
    assert digest(_cfg(tmp_path, demo_prefix, tokenizer_model=path)) != digest(
        _cfg(tmp_path, demo_prefix)
    )
    with pytest.raises(ConfigError) as e:
        check_datasets([demo_prefix], theirs)
    assert str(e.value).startswith(
        f"data_path={demo_prefix!r}: tokenized with HuggingFaceTokenizer {DEMO_TOKENIZER} (sha256 "
        f"{ours.sha256[:12]}), but this run's tokenizer is HuggingFaceTokenizer {path} (sha256 "
        f"{theirs.sha256[:12]}). Fix: pass the tokenizer the data was made with"
    )
    other = str(tmp_path / "other")  # the same tokens, fingerprinted with the other tokenizer
    for ext in (".bin", ".idx"):
        shutil.copyfile(demo_prefix + ext, other + ext)
    with open(other + SUFFIX, "w") as f:
        json.dump(fingerprint(theirs), f)
    with pytest.raises(ConfigError, match="cannot merge .* Fix: preprocess them with the same"):
        merge_datasets([demo_prefix, other], str(tmp_path / "both"), progress=False)


def test_the_canonical_digest_is_of_the_bytes_the_tokenizer_read(tmp_path):
    """The canonical digest is read on first use: a tokenizer.json replaced since the tokenizer
    read it (its sha256) is an error naming both digests, not a fingerprint of two files."""
    path = _demo_variant(tmp_path / "tok", lambda doc: None)
    tok = BilingualTokenizer(path)
    replaced = _demo_variant(tmp_path / "other", _first_merge_dropped)
    shutil.copyfile(replaced, path)
    now = BilingualTokenizer(path).sha256
    with pytest.raises(ConfigError) as e:
        fingerprint(tok)
    assert str(e.value) == (
        f"tokenizer_model={path!r}: changed while in use (sha256 {tok.sha256[:12]} when read, "
        f"{now[:12]} now). Fix: leave the tokenizer files unchanged while a command runs, and run "
        "it again"
    )


def test_old_dataset_warning_is_printed(tmp_path, demo_prefix, capsys):
    old = str(tmp_path / "old")
    for ext in (".bin", ".idx"):
        shutil.copyfile(demo_prefix + ext, old + ext)
    preflight(_cfg(tmp_path, old))
    assert f"WARNING: {old} has no tokenizer fingerprint" in capsys.readouterr().out


@pytest.mark.slow
def test_mock_data_smoke_run_with_the_eod_flags_and_workers(tmp_path):
    run_dir = tmp_path / "mock"
    proc = run_cli(
        ["pretrain", "--mock-data", "--run-dir", str(run_dir), *TINY_MODEL, "--train-iters", "3",
         "--eval-interval", "3", "--reset-attention-mask", "--eod-mask-loss", "--num-workers",
         "2", "--log-diagnostics-interval", "0", "--init-audit", "off"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    assert sorted(metrics["train"]) == [1, 2, 3] and 3 in metrics["valid"]


class _RunsCode:
    """Unpickling it writes MARKER: what a crafted index cache would do."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickled_index_cache_is_refused_before_it_runs_code(tmp_path, demo_prefix):
    """megatron-core reads its .npy index caches with numpy.load(allow_pickle=True), which
    unpickles a file that is a pickle: a run directory's data_cache/ from elsewhere ran code
    (trust audit, 2026-12-06). The caches now load without pickle: a crafted one is refused,
    naming the file and the fix, and the code does not run; megatron-core's own caches still
    load, and give the samples a fresh build gives."""
    import pickle

    cfg = _cfg(tmp_path, demo_prefix)
    tok = BilingualTokenizer(DEMO_TOKENIZER)
    fresh = build_datasets(cfg, tok)[0]
    cached = build_datasets(cfg, tok)[0]  # read back from the caches just written
    for i in (0, len(fresh) - 1):
        assert torch.equal(fresh[i]["tokens"], cached[i]["tokens"])
    index = sorted((tmp_path / "run" / "data_cache").rglob("*document_index.npy"))[0]
    marker = tmp_path / "ran"
    with open(index, "wb") as f:
        pickle.dump(_RunsCode(str(marker)), f)
    with pytest.raises(ConfigError) as err:
        build_datasets(cfg, tok)
    assert not marker.exists()
    assert f"index cache {str(index)!r}: holds pickled Python objects" in str(err.value)
    assert f"Fix: delete {str(index.parent)!r} (the next run rebuilds its caches)" in str(err.value)
