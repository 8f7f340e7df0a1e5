"""Benchmark peak memory of preprocessing one very long document, with and without the
``--max-document-chars`` cap (:mod:`megatron_gamma.data.filters`).

    python tools/bench_long_document.py                   # 3.6M characters, cap 1,000,000
    python tools/bench_long_document.py --chars 8000000 --cap 500000

Each run is a fresh process (``workers=1``: the document is tokenized in the process that
reports); peak memory is that process's ``ru_maxrss``, with the same process's baseline after the
imports (before reading any input) subtracted and reported separately. The uncapped run is the
reference: its peak grows with the document, the capped one stays bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = """
import json, resource, sys
from megatron_gamma.data.encode import EncodeOptions
from megatron_gamma.data.filters import Filters
from megatron_gamma.data.preprocess import preprocess
from megatron_gamma.data import demo_dir
import os
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
opts = EncodeOptions(filters=Filters(max_document_chars=int(sys.argv[3])))
r = preprocess([sys.argv[1]], os.path.join(demo_dir(), "tokenizer.json"), sys.argv[2],
               options=opts, progress=False)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_kib": base, "peak_kib": peak, "tokens": r.tokens}))
"""


def _run(path: str, out: str, cap: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, path, out, str(cap)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--chars", type=int, default=3_600_000, help="length of the one document")
    p.add_argument("--cap", type=int, default=1_000_000, help="--max-document-chars to test")
    args = p.parse_args(argv)
    words = " ".join(f"word{i % 9973} 文本{i % 97}" for i in range(args.chars // 10 + 1))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "long.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": words[: args.chars]}, ensure_ascii=False) + "\n")
        rows = {
            "uncapped": _run(path, os.path.join(tmp, "a"), args.chars + 1),
            f"cap {args.cap:,}": _run(path, os.path.join(tmp, "b"), args.cap),
        }
    print(f"one document of {args.chars:,} characters, workers=1")
    for name, r in rows.items():
        print(
            f"  {name:>16}: peak RSS {r['peak_kib'] / 2**20:.2f} GiB "
            f"(after imports {r['base_kib'] / 2**20:.2f} GiB), {r['tokens']:,} tokens"
        )
    ratio = rows["uncapped"]["peak_kib"] / rows[f"cap {args.cap:,}"]["peak_kib"]
    print(f"  peak RSS uncapped / capped: {ratio:.2f}x")


if __name__ == "__main__":
    main()
