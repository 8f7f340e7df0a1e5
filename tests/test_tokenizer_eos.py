"""EOD of a Hugging Face tokenizer without ``<|endoftext|>``: the ``eos_token`` of the
``tokenizer_config.json`` beside its tokenizer.json, as Megatron-LM's ``HuggingFaceTokenizer``
takes it.

The tokenizer: a byte-level BPE trained here whose specials are ``<s>`` and ``</s>``, saved by
``transformers``' ``PreTrainedTokenizerFast(...).save_pretrained`` (tokenizer.json +
tokenizer_config.json with eos ``</s>``), as Llama-2 or Mistral come. The reference is
``transformers.AutoTokenizer.from_pretrained(DIR)``: its ``eos_token_id`` and its ``encode``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from helpers import DEMO_INPUTS, DEMO_TOKENIZER, demo_texts, pretrain
from megatron.core.datasets.indexed_dataset import IndexedDataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from megatron_gamma.config import ConfigError, load_config
from megatron_gamma.data.datasets import build_datasets, micro_batches
from megatron_gamma.data.preprocess import preprocess
from megatron_gamma.data.tokenizer import (
    BilingualTokenizer,
    copy_loader_file,
    files_sha256,
    train_bpe,
    write_metadata,
)
from megatron_gamma.data.tokenizer_fingerprint import SUFFIX, check_datasets, fingerprint
from megatron_gamma.data.tokenizer_types import load_tokenizer
from megatron_gamma.training.loop import preflight

DOCS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "深度学习中的小初始化很重要。",
    "  two  spaces\nand a newline",
    "a tokenizer paper quotes </s> and <s> as text: </s></s>",
    "<|endoftext|> is not special here",
]


def _save_eos_tokenizer(folder) -> str:
    """A byte-level BPE with specials <s>, </s>, saved by transformers into ``folder``."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(demo_texts()[::3] + DOCS * 5, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def eos_dir(tmp_path_factory) -> str:
    """The directory of the <s>/</s> tokenizer (tokenizer.json + tokenizer_config.json)."""
    return _save_eos_tokenizer(tmp_path_factory.mktemp("eos_tok"))


def _auto(folder: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _copy(eos_dir: str, dest) -> str:
    shutil.copytree(eos_dir, dest)
    return str(dest)


def _edit_config(folder: str, **changes) -> None:
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path) as f:
        doc = json.load(f)
    doc.update(changes)
    with open(path, "w") as f:
        json.dump(doc, f)


def test_the_eos_token_of_tokenizer_config_is_the_eod(eos_dir):
    """EOD, BOS and PAD are AutoTokenizer's, whether --tokenizer-model is the directory or its
    tokenizer.json; the config is part of the tokenizer's identity."""
    ref = _auto(eos_dir)
    assert ref.eos_token == "</s>" and ref.pad_token_id is None
    config = json.load(open(os.path.join(eos_dir, "tokenizer_config.json")))
    assert config["eos_token"] == "</s>"  # as transformers writes it
    for model in (eos_dir, os.path.join(eos_dir, "tokenizer.json")):
        tok = load_tokenizer(load_config(None, {"tokenizer_model": model}).data, eos_dir)
        assert (tok.eod, tok.bos, tok.pad) == (ref.eos_token_id, ref.bos_token_id, None)
        assert (tok.eos_token, tok.bos_token) == ("</s>", "<s>")
        tokenizer_json = os.path.join(eos_dir, "tokenizer.json")
        config_json = os.path.join(eos_dir, "tokenizer_config.json")
        assert tok.source == [tokenizer_json, config_json]
        specials = b'{"bos_token": "<s>", "eos_token": "</s>", "pad_token": null}'
        assert (
            tok.sha256 == hashlib.sha256(open(tokenizer_json, "rb").read() + specials).hexdigest()
        )
        assert fingerprint(tok)["eod"] == ref.eos_token_id


def test_an_added_token_dict_as_eos_token(eos_dir, tmp_path):
    folder = _copy(eos_dir, tmp_path / "tok")
    added = {"__type": "AddedToken", "content": "</s>", "lstrip": False, "rstrip": False}
    _edit_config(folder, eos_token=added, bos_token=dict(added, content="<s>"))
    ref = _auto(folder)
    tok = BilingualTokenizer(os.path.join(folder, "tokenizer.json"))
    assert (tok.eod, tok.bos) == (ref.eos_token_id, ref.bos_token_id) == (1, 0)


def test_an_eos_token_outside_the_vocabulary_is_named_with_the_fix(eos_dir, tmp_path):
    folder = _copy(eos_dir, tmp_path / "tok")
    _edit_config(folder, eos_token="<|im_end|>")
    config = os.path.join(folder, "tokenizer_config.json")
    with pytest.raises(ValueError) as e:
        BilingualTokenizer(os.path.join(folder, "tokenizer.json"))
    msg = str(e.value)
    assert f"{config}: eos_token '<|im_end|>' is not a token of" in msg
    assert f"Fix: set eos_token in {config} to one of its tokens (its special tokens: " in msg
    assert "</s>" in msg
    _edit_config(folder, eos_token="</s>", pad_token="<pad>")
    with pytest.raises(ValueError, match=r"pad_token '<pad>' is not a token of .*or remove it"):
        BilingualTokenizer(os.path.join(folder, "tokenizer.json"))


def test_no_eos_anywhere_names_the_config_fix(eos_dir, tmp_path):
    """No tokenizer_config.json beside a tokenizer.json without <|endoftext|>: the error says
    how to give its EOD."""
    folder = tmp_path / "bare"
    folder.mkdir()
    shutil.copyfile(os.path.join(eos_dir, "tokenizer.json"), folder / "tokenizer.json")
    with pytest.raises(ValueError, match=r"no <\|endoftext\|> token, its EOD by default, and no "):
        BilingualTokenizer(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    with pytest.raises(ValueError, match=r"Fix: set eos_token in .*tokenizer_config.json to"):
        BilingualTokenizer(str(folder / "tokenizer.json"))


def _legacy_dir(eos_dir: str, folder, config: dict | None, special_map: dict) -> str:
    """A tokenizer directory as transformers before 4.34 saved one: the tokenizer.json, a
    special_tokens_map.json, and (unless ``config`` is None) a tokenizer_config.json."""
    folder.mkdir()
    shutil.copyfile(os.path.join(eos_dir, "tokenizer.json"), folder / "tokenizer.json")
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "special_tokens_map.json").write_text(json.dumps(special_map))
    return str(folder)


ADDED = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
DECODER = {"0": dict(ADDED, content="<s>", special=True)}  # as transformers 4.34-4.x saved it


@pytest.mark.parametrize(
    "config",
    [
        None,
        {"eos_token": "<s>", "bos_token": "</s>"},
        {"eos_token": "<s>", "added_tokens_decoder": DECODER},
    ],
    ids=["map-only", "map-over-config", "config-with-added-tokens-decoder"],
)
def test_special_tokens_map_names_the_eod_where_transformers_reads_it(eos_dir, tmp_path, config):
    """EOD and BOS are AutoTokenizer's: a special_tokens_map.json alone names them; over a
    tokenizer_config.json without added_tokens_decoder it wins; one with it wins itself."""
    special_map = {"eos_token": dict(ADDED, content="</s>"), "bos_token": "<s>"}
    folder = _legacy_dir(eos_dir, tmp_path / "tok", config, special_map)
    ref = _auto(folder)
    tok = BilingualTokenizer(os.path.join(folder, "tokenizer.json"))
    assert (tok.eod, tok.bos) == (ref.eos_token_id, ref.bos_token_id)
    assert (tok.eos_token, tok.pad) == (ref.eos_token, None)
    by_map = config is None or "added_tokens_decoder" not in config
    assert tok.eos_token == ("</s>" if by_map else "<s>")
    named = os.path.join(folder, "special_tokens_map.json" if by_map else "tokenizer_config.json")
    assert tok.source == [os.path.join(folder, "tokenizer.json"), named]


def test_a_special_tokens_map_eos_outside_the_vocabulary_names_that_file(eos_dir, tmp_path):
    folder = _legacy_dir(eos_dir, tmp_path / "tok", {"bos_token": "<s>"}, {"eos_token": "<eos>"})
    special_map = os.path.join(folder, "special_tokens_map.json")
    with pytest.raises(ValueError) as e:
        BilingualTokenizer(os.path.join(folder, "tokenizer.json"))
    assert f"{special_map}: eos_token '<eos>' is not a token of" in str(e.value)
    assert f"Fix: set eos_token in {special_map} to one of its tokens" in str(e.value)


def _data_of_a_copy(eos_dir: str, tmp_path) -> tuple[str, str, BilingualTokenizer, str]:
    """A copy of the tokenizer directory, its tokenizer.json, the tokenizer, and the prefix of
    a dataset whose tokenizer fingerprint is that tokenizer's."""
    folder = _copy(eos_dir, tmp_path / "tok")
    path = os.path.join(folder, "tokenizer.json")
    before = BilingualTokenizer(path)
    prefix = str(tmp_path / "data_text_document")
    with open(prefix + SUFFIX, "w") as f:
        json.dump(fingerprint(before), f)
    return folder, path, before, prefix


def test_the_rest_of_tokenizer_config_is_not_the_identity(eos_dir, tmp_path):
    """A chat template added to the config, or the directory saved again by transformers (which
    adds keys of its own), changes no token id: the data tokenized before still serves."""
    folder, path, before, prefix = _data_of_a_copy(eos_dir, tmp_path)
    _edit_config(folder, chat_template="{{ messages }}", model_max_length=4096)
    assert BilingualTokenizer(path).sha256 == before.sha256
    assert check_datasets([prefix], BilingualTokenizer(path)) == []
    resaved = str(tmp_path / "resaved")
    _auto(folder).save_pretrained(resaved)
    again = BilingualTokenizer(os.path.join(resaved, "tokenizer.json"))
    assert (again.eod, again.sha256) == (before.eod, before.sha256)
    _edit_config(folder, pad_token="<s>")
    assert BilingualTokenizer(path).sha256 != before.sha256  # PAD masks the loss: identity


TROJAN = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import PreTrainedTokenizerFast
class Trojan(PreTrainedTokenizerFast):
    pass
"""


def _trojan_copy(eos_dir: str, dest, marker) -> str:
    """``eos_dir`` with a module beside it whose import writes ``marker``, and an ``auto_map``
    in its tokenizer_config.json that names a class of that module (trust audit, 2026-12-06)."""
    folder = _copy(eos_dir, dest)
    with open(os.path.join(folder, "trojan.py"), "w") as f:
        f.write(TROJAN.format(marker=str(marker)))
    _edit_config(folder, auto_map={"AutoTokenizer": [None, "trojan.Trojan"]})
    return folder


def _load_trusting(folder: str, tmp_path) -> subprocess.CompletedProcess:
    """``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)``, as lm-eval loads an
    exported model, in a fresh process with its own transformers module cache."""
    code = (
        "import sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True); "
        "print(type(t).__name__, t.eos_token)"
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "hf_modules")}
    return subprocess.run(
        [sys.executable, "-c", code, folder], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_copied_tokenizer_config_leaves_out_the_code_transformers_would_run(eos_dir, tmp_path):
    """An ``auto_map`` in a tokenizer_config.json makes transformers import a module under
    trust_remote_code=True (lm-eval's load of every exported model): the audit ran code that
    way through import-hf and evaluate --tasks. The copy that import-hf and export-hf make
    leaves it out and keeps the special tokens; transformers itself is the reference."""
    marker = tmp_path / "ran"
    trojan = _trojan_copy(eos_dir, tmp_path / "trojan", marker)
    live = _load_trusting(trojan, tmp_path)
    assert marker.exists(), live.stderr[-2000:]  # the payload is live in the original
    marker.unlink()
    clean = _copy(trojan, tmp_path / "clean")
    src, dst = (os.path.join(d, "tokenizer_config.json") for d in (trojan, clean))
    note = copy_loader_file(src, dst)
    assert note.startswith(f"left auto_map of {src} out of its copy: it names Python code")
    doc = json.load(open(src))
    assert json.load(open(dst)) == {k: v for k, v in doc.items() if k != "auto_map"}
    loaded = _load_trusting(clean, tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert not marker.exists() and loaded.stdout.split()[-1] == "</s>"
    before = open(os.path.join(eos_dir, "tokenizer_config.json"), "rb").read()
    assert copy_loader_file(os.path.join(eos_dir, "tokenizer_config.json"), dst) is None
    assert open(dst, "rb").read() == before  # no auto_map: copied byte for byte


def test_editing_the_eos_token_changes_the_identity(eos_dir, tmp_path):
    """Data tokenized with EOD </s> is refused once the config names another EOD, at the same
    path: the error says the tokenizer files there changed."""
    folder, path, before, prefix = _data_of_a_copy(eos_dir, tmp_path)
    assert check_datasets([prefix], before) == []
    _edit_config(folder, eos_token="<s>")
    after = BilingualTokenizer(path)
    assert after.eod == 0 and after.sha256 != before.sha256
    assert after.unique_identifiers != before.unique_identifiers  # megatron-core's cache key
    with pytest.raises(ConfigError, match=r"the tokenizer at .*tokenizer.json, .*tokenizer_config"
                       r".json changed since the data was tokenized .* Fix: restore the original "
                       r"tokenizer files there"):  # fmt: skip
        check_datasets([prefix], after)


def test_a_tokenizer_made_by_train_tokenizer_keeps_its_identity(tmp_path):
    """Its tokenizer_config.json names <|endoftext|>: ids, fingerprint, unique_identifiers and
    sha256 are those of the code before configs were read (values pinned from it for the demo
    tokenizer), and the config is no source file."""
    tok = BilingualTokenizer(DEMO_TOKENIZER)
    sha = "ad657c11563eda213a708e4ecdbad4b11cc64949acb77eaa78be3e8dd91b7fdb"
    with open(DEMO_TOKENIZER, encoding="utf-8") as f:  # no post-processor: only the layout
        canonical = json.dumps(
            json.load(f), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
    assert fingerprint(tok) == {
        "format": "megatron-gamma-tokenizer-fingerprint/1",
        "tokenizer_type": "HuggingFaceTokenizer",
        "source": [DEMO_TOKENIZER],
        "sha256": sha,
        "canonical_sha256": hashlib.sha256(canonical.encode()).hexdigest(),
        "vocab_size": 4096,
        "eod": 0,
    }
    assert tok.unique_identifiers == {"class": "BilingualTokenizer", "sha256": sha[:16]}
    assert (tok.eod, tok.pad, tok.bos) == (0, 1, 2)
    ids = [42, 528, 344, 14, 223, 3827, 237, 3, 223, 0, 1454]
    assert tok.tokenize("Hello, 世界! <|endoftext|> x") == ids
    # a freshly trained one: identity of the tokenizer.json alone
    path = str(tmp_path / "tok" / "tokenizer.json")
    train_bpe(demo_texts()[::8], vocab_size=512, output=path)
    write_metadata(path)
    fresh = BilingualTokenizer(path)
    assert fresh.source == [path] and fresh.sha256 == files_sha256([path])
    assert (fresh.eod, fresh.pad, fresh.bos) == (0, 1, 2)


def _write_docs(path, docs) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for text in docs:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return str(path)


@pytest.mark.parametrize("backend", ["hf", "gigatoken"])
def test_preprocess_ends_documents_with_the_config_eos(eos_dir, tmp_path, backend):
    """Documents end with AutoTokenizer's eos_token_id; a literal </s> or <s> in a document is
    text (AutoTokenizer with split_special_tokens), with either backend."""
    pytest.importorskip(backend if backend == "gigatoken" else "tokenizers")
    ref = _auto(eos_dir)
    texts = demo_texts()[:40] + DOCS
    src = _write_docs(tmp_path / "in.jsonl", texts)
    stats = preprocess(
        [src], eos_dir, str(tmp_path / "out"), progress=False, tokenizer_backend=backend
    )
    assert stats.tokenizer_backend.startswith(backend)
    ds = IndexedDataset(stats.prefix)
    assert len(ds) == len(texts)
    for i, text in enumerate(texts):
        ids = ds[i].tolist()
        if "</s>" not in text and "<s>" not in text:
            assert ids == ref.encode(text, add_special_tokens=False) + [ref.eos_token_id]
        split = ref(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert ids == split + [ref.eos_token_id], text
        assert ref.eos_token_id not in ids[:-1] and ref.bos_token_id not in ids
    with open(stats.prefix + SUFFIX) as f:
        assert json.load(f)["eod"] == ref.eos_token_id


def test_a_non_special_eos_in_a_document_stays_text(eos_dir, tmp_path):
    """The tokenizer.json marks </s> "special": false (so HF tokenizers would match it in
    text): as the run's EOD it is still encoded as text by both backends."""
    pytest.importorskip("gigatoken")
    folder = _copy(eos_dir, tmp_path / "tok")
    path = os.path.join(folder, "tokenizer.json")
    with open(path) as f:
        doc = json.load(f)
    for token in doc["added_tokens"]:
        token["special"] = False
    with open(path, "w") as f:
        json.dump(doc, f)
    ref = _auto(eos_dir)
    text = "quote </s> and <s> here"
    expected = ref(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    src = _write_docs(tmp_path / "in.jsonl", [text] * 3)
    for backend in ("hf", "gigatoken"):
        out = str(tmp_path / backend)
        stats = preprocess([src], folder, out, progress=False, tokenizer_backend=backend)
        ds = IndexedDataset(stats.prefix)
        assert [ds[i].tolist() for i in range(3)] == [expected + [1]] * 3, backend


@pytest.fixture(scope="module")
def eos_prefix(eos_dir, tmp_path_factory) -> str:
    """The demo corpus tokenized with the <s>/</s> tokenizer."""
    out = tmp_path_factory.mktemp("eos_data") / "demo"
    return preprocess(DEMO_INPUTS, eos_dir, str(out), progress=False).prefix


def test_eod_mask_loss_masks_the_config_eos(eos_dir, eos_prefix, tmp_path):
    """pretrain's GPTDataset (preflight's tokenizer) cuts documents at the config's EOD."""
    overrides = {
        "data_path": [eos_prefix],
        "tokenizer_model": eos_dir,
        "run_dir": str(tmp_path / "run"),
        "seq_length": 64,
        "micro_batch_size": 2,
        "global_batch_size": 4,
        "train_iters": 6,
        "eval_iters": 1,
        "split": "95,5,0",
        "eod_mask_loss": True,
        "reset_position_ids": True,
    }
    cfg = load_config(None, overrides)
    tok = preflight(cfg)
    eod = _auto(eos_dir).eos_token_id
    assert tok.eod == eod
    train = build_datasets(cfg, tok)[0]
    eods = 0
    for batch in micro_batches(train, 0, 2, 0, 1, num_workers=0):
        tokens = batch["tokens"]
        at = tokens == eod
        eods += int(at.sum())
        assert not bool(batch["loss_mask"][at].any())
        assert bool(batch["loss_mask"][~at].all())
        for row, pos in zip(tokens.tolist(), batch["position_ids"].tolist(), strict=True):
            starts = [0] + [i + 1 for i, t in enumerate(row[:-1]) if t == eod]
            assert all(pos[s] == 0 for s in starts)
        if eods > 4:
            break
    assert eods > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pretrain_export_import_evaluate_with_the_config_eos(eos_dir, eos_prefix, tmp_path):
    """A 2-iteration run on data tokenized with the </s> tokenizer (--tokenizer-model its
    directory); export-hf's config.json carries its eos_token_id and its tokenizer_config.json
    names </s>; import-hf gives back a run whose tokenizer has the same EOD and identity;
    evaluate reads the checkpoint."""
    from megatron_gamma.evaluation.evaluate import evaluate
    from megatron_gamma.hf.hf_export import export_hf
    from megatron_gamma.hf.hf_import import import_hf
    from megatron_gamma.rundir import checkpoint, loader

    run = tmp_path / "run"
    metrics = pretrain(
        run, eos_prefix, "--tokenizer-model", eos_dir, "--train-iters", "2",
        "--eval-interval", "100", "--log-diagnostics-interval", "0", "--eod-mask-loss",
        "--save", str(run / "checkpoints"),
    )  # fmt: skip
    assert sorted(metrics["train"]) == [1, 2]
    assert all(np.isfinite(v) for v in metrics["train"].values())
    ref = _auto(eos_dir)
    ours = BilingualTokenizer(os.path.join(eos_dir, "tokenizer.json"))

    out = tmp_path / "hf"
    export_hf(str(run), str(out))
    hf_config = json.load(open(out / "config.json"))
    assert hf_config["eos_token_id"] == ref.eos_token_id == 1
    assert hf_config["bos_token_id"] == ref.bos_token_id and hf_config["pad_token_id"] is None
    assert json.load(open(out / "generation_config.json"))["eos_token_id"] == 1
    exported = _auto(str(out))
    assert (exported.eos_token, exported.eos_token_id) == ("</s>", 1)
    assert exported.encode(DOCS[0], add_special_tokens=False) == ref.encode(
        DOCS[0], add_special_tokens=False
    )

    imported = import_hf(str(out), str(tmp_path / "imported"))
    cfg = loader.run_config(imported["checkpoint"])
    tok = loader.run_tokenizer(cfg)
    assert tok.eod == 1 and tok.sha256 == ours.sha256
    assert checkpoint.resolve(imported["checkpoint"]).path == imported["checkpoint"]
    assert check_datasets([eos_prefix], tok) == []

    result = evaluate(str(run), [eos_prefix], eval_tokens=4 * 64, seq_length=64)
    assert np.isfinite(result["loss"]) and result["tokens"] == 4 * 64
    assert torch.isfinite(torch.tensor(result["perplexity"]))

    # an auto_map in a model directory, or in the run's tokenizer directory, is not carried
    trojan = _trojan_copy(str(out), tmp_path / "hf_trojan", tmp_path / "ran")
    imported = import_hf(trojan, str(tmp_path / "imported_trojan"))
    doc = json.load(open(tmp_path / "imported_trojan" / "tokenizer_config.json"))
    assert "auto_map" not in doc and doc["eos_token"] == "</s>"
    raw = load_config(str(run / "config.yaml")).to_dict()
    raw["data"]["tokenizer_model"] = _trojan_copy(eos_dir, tmp_path / "tok_trojan", "unused")
    with open(tmp_path / "trojan.yaml", "w") as f:
        yaml.safe_dump(raw, f)
    export_hf(str(run), str(tmp_path / "hf2"), config=str(tmp_path / "trojan.yaml"))
    doc = json.load(open(tmp_path / "hf2" / "tokenizer_config.json"))
    assert "auto_map" not in doc and doc["eos_token"] == "</s>"
