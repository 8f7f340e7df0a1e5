"""Text hygiene in preprocessing: a UTF-8 byte-order mark, C0 control characters and very long
documents. Each output is checked byte for byte against preprocessing the text a user would
have written by hand (no mark, no controls, the first N characters), and each count in
``stats.json`` against the number planted."""

import codecs
import json

from helpers import DEMO_TOKENIZER

from megatron_gamma.cli import main
from megatron_gamma.data.encode import EncodeOptions
from megatron_gamma.data.filters import Filters
from megatron_gamma.data.preprocess import preprocess


def _run(tmp_path, name: str, texts: list[str], prefix: bytes = b"", **filters):
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(prefix + b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts))
    opts = EncodeOptions(per_language=True, filters=Filters(**filters))
    r = preprocess([str(path)], DEMO_TOKENIZER, str(tmp_path / name), options=opts, progress=False)
    data = {n: open(f"{p}.bin", "rb").read() for n, p in r.prefixes.items()}
    return data, r.stats


def test_byte_order_mark_is_stripped_and_counted(tmp_path):
    texts = ["The first line starts the file.", "Second line.", "第三行。"]
    got, stats = _run(tmp_path, "bom", texts, prefix=codecs.BOM_UTF8)
    want, ref_stats = _run(tmp_path, "plain", texts)
    assert got == want
    assert stats["byte_order_marks"] == 1 and ref_stats["byte_order_marks"] == 0
    assert stats["errors"]["malformed_json"] == 0


def test_control_characters_are_removed_and_counted_per_language(tmp_path):
    dirty = ["Hello\x00 wor\x07ld\tstays\r\nhere\x1b.", "你好\x01世界\x00。", "Clean text."]
    clean = ["Hello world\tstays\r\nhere.", "你好世界。", "Clean text."]
    got, stats = _run(tmp_path, "dirty", dirty)
    want, _ = _run(tmp_path, "clean", clean)
    assert got == want
    assert stats["languages"]["en"]["control_characters"] == 3
    assert stats["languages"]["zh"]["control_characters"] == 2


def test_long_document_is_cut_to_max_document_chars_and_counted(tmp_path):
    long = " ".join(f"word{i}" for i in range(600))  # 4,089 characters
    short = "A short document."
    got, stats = _run(tmp_path, "long", [long, short], max_document_chars=1000)
    want, _ = _run(tmp_path, "cut", [long[:1000], short])
    assert got == want
    assert stats["languages"]["en"]["truncated"] == 1
    assert stats["languages"]["en"]["documents"] == 2


def test_the_console_summary_counts_truncated_documents_and_removed_controls(tmp_path, capsys):
    """What stats.json counts, the printed summary says: a cut document is not 'dropped', so
    'dropped: none' alone hid it."""
    path = tmp_path / "in.jsonl"
    texts = ["x" * 3000 + " tail", "Bell\x07 and\x00 nul.", "你好\x01世界。", "Short."]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "o"
    args = ["preprocess", "--input", str(path), "--tokenizer-model", DEMO_TOKENIZER]
    args += ["--output-prefix", str(out), "--max-document-chars", "1000", "--no-progress"]
    assert main(args) == 0
    summary = capsys.readouterr().out
    stats = json.loads((tmp_path / "o.stats.json").read_text())
    assert stats["languages"]["en"]["truncated"] == 1
    assert stats["languages"]["en"]["control_characters"] == 2
    assert stats["languages"]["zh"]["control_characters"] == 1
    en = next(line for line in summary.splitlines() if line.startswith("  en: "))
    zh = next(line for line in summary.splitlines() if line.startswith("  zh: "))
    assert en.endswith(
        "dropped: none; truncated to --max-document-chars: 1; control characters removed: 2"
    ), en
    assert zh.endswith("dropped: none; control characters removed: 1"), zh
