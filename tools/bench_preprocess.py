"""Benchmark preprocessing: tokens/s per worker, scaling, peak memory, core-hours for 1e12 tokens,
against the straightforward per-document path of Megatron-LM's ``tools/preprocess_data.py``.

    python tools/bench_preprocess.py                       # demo corpus (+ debian corpus if found)
    python tools/bench_preprocess.py --corpus DIR --workers 1 2 4

Two implementations on the same files, each run in a fresh process (imports not timed):

* ``batched``: ``megatron_gamma.data.preprocess.preprocess``: chunks of records, one
  ``encode_batch_fast`` call per chunk (Rust side, no offsets), numpy arrays, one write per chunk;
* ``per-doc``: Megatron-LM's loop: ``Pool(workers).imap(encode, lines, 32)`` where ``encode`` does
  ``json.loads``, one ``Tokenizer.encode`` and one Python list per document, and the main
  process calls ``IndexedDatasetBuilder.add_document`` per document.

"Per core" is tokens per CPU-second (user + system time of the main process and its workers), so
it does not depend on how busy the machine is; "wall" throughput and the worker scaling ratio do.
Peak memory is ``ru_maxrss`` of the main process and of the largest worker. With the large corpus,
the batched path is also run over the corpus repeated 3 times (symlinks) to show that peak memory
does not grow with the input. Both paths must write identical bytes; the tool checks it. Last, the
tokenizer alone (``encode`` per document vs ``encode_batch_fast``, texts in memory) bounds what
any pipeline can gain per core.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRILLION = 1e12


def _usage() -> dict:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "cpu": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
        "rss_main_mib": me.ru_maxrss / 1024,
        "rss_worker_mib": kids.ru_maxrss / 1024,
    }


def _open_lines(path: str):
    if path.endswith(".gz"):
        import gzip

        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


_TOK = None
_EOD = 0


def _per_doc_init(tokenizer_path: str, eod: int) -> None:
    global _TOK, _EOD
    from tokenizers import Tokenizer

    _TOK, _EOD = Tokenizer.from_file(tokenizer_path), eod


def _per_doc_encode(line: str):
    text = json.loads(line)["text"]
    ids = _TOK.encode(text, add_special_tokens=False).ids
    ids.append(_EOD)
    return ids, len(line)


def _child_per_doc(files: list[str], tokenizer_path: str, prefix: str, workers: int) -> dict:
    """Megatron-LM's preprocess_data.py loop (one encode and one list per document)."""
    import multiprocessing as mp

    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    from megatron_gamma.data.tokenizer import BilingualTokenizer

    tok = BilingualTokenizer(tokenizer_path)
    start = time.time()
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(tok.vocab_size))
    tokens = 0
    pool = mp.get_context("fork").Pool(workers, _per_doc_init, (tokenizer_path, tok.eod))
    for path in files:
        with _open_lines(path) as fin:
            lines = (line for line in fin if line.strip())
            for ids, _ in pool.imap(_per_doc_encode, lines, 32):
                builder.add_document(ids, [len(ids)])
                tokens += len(ids)
    builder.finalize(prefix + ".idx")
    pool.close()
    pool.join()
    return {"tokens": tokens, "wall": time.time() - start}


def _child_batched(files: list[str], tokenizer_path: str, prefix: str, workers: int) -> dict:
    from megatron_gamma.data.preprocess import preprocess

    start = time.time()
    r = preprocess(files, tokenizer_path, prefix, workers=workers, progress=False)
    return {"tokens": r.tokens, "wall": time.time() - start, "prefix": r.prefix}


def _child_floor(files: list[str], tokenizer_path: str, prefix: str, workers: int) -> dict:
    """The tokenizer alone on texts already in memory: ``encode`` per document vs
    ``encode_batch_fast`` per 256 documents (CPU seconds of this process)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    texts = []
    for path in files:
        with _open_lines(path) as fin:
            texts += [json.loads(line)["text"] for line in fin if line.strip()]
    t0 = time.process_time()
    tokens = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
    t1 = time.process_time()
    for i in range(0, len(texts), 256):
        tok.encode_batch_fast(texts[i : i + 256], add_special_tokens=False)
    t2 = time.process_time()
    return {"tokens": tokens, "encode": tokens / (t1 - t0), "batch": tokens / (t2 - t1)}


def _run_child(mode: str, files: list[str], tokenizer: str, prefix: str, workers: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--tokenizer", tokenizer]
    cmd += ["--prefix", prefix, "--workers", str(workers), "--files", *files]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["TOKENIZERS_PARALLELISM"] = "false"
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result.setdefault("prefix", prefix)
    return result


def _fmt(r: dict) -> str:
    return (
        f"{r['tokens']:>11,d} tok {r['wall']:7.2f} s wall {r['tokens'] / r['wall']:>10,.0f} tok/s"
        f"   {r['cpu']:7.2f} CPU-s {r['tokens'] / r['cpu']:>10,.0f} tok/CPU-s"
        f"   RSS main {r['rss_main_mib']:6.0f} MiB, worker {r['rss_worker_mib']:6.0f} MiB"
    )


def bench_corpus(name: str, files: list[str], tokenizer: str, workers: list[int], tmp: str):
    print(f"\n== {name}: {len(files)} files, {sum(map(os.path.getsize, files)) / 1e6:.1f} MB")
    results: dict = {}
    for w in workers:
        for mode in ("batched", "per-doc"):
            prefix = os.path.join(tmp, f"{name}-{mode}-w{w}")
            r = _run_child(mode, files, tokenizer, prefix, w)
            results[(mode, w)] = r
            print(f"  {mode:8s} workers={w}: {_fmt(r)}")
    for w in workers:
        fast, slow = results[("batched", w)], results[("per-doc", w)]
        same = all(
            filecmp.cmp(fast["prefix"] + ext, slow["prefix"] + ext, shallow=False)
            for ext in (".bin", ".idx")
        )
        ratio = (fast["tokens"] / fast["cpu"]) / (slow["tokens"] / slow["cpu"])
        wall = (fast["tokens"] / fast["wall"]) / (slow["tokens"] / slow["wall"])
        print(
            f"  workers={w}: batched / per-doc = {ratio:.2f}x tokens per CPU-second, "
            f"{wall:.2f}x wall tokens/s; identical outputs: {'yes' if same else 'NO'}"
        )
    for mode in ("batched", "per-doc"):
        base = results[(mode, workers[0])]
        for w in workers[1:]:
            r = results[(mode, w)]
            scale = (r["tokens"] / r["wall"]) / (base["tokens"] / base["wall"])
            print(f"  {mode}: wall scaling {workers[0]} -> {w} workers = {scale:.2f}x")
    for mode in ("batched", "per-doc"):
        per_core = max(r["tokens"] / r["cpu"] for (m, _), r in results.items() if m == mode)
        print(f"  {mode}: 1e12 tokens = {TRILLION / per_core / 3600:,.0f} core-hours")
    floor = _run_child("floor", files, tokenizer, os.path.join(tmp, f"{name}-floor"), 1)
    best = max(r["tokens"] / r["cpu"] for (m, _), r in results.items() if m == "batched")
    print(
        f"  tokenizer alone: encode {floor['encode']:,.0f} tok/CPU-s, encode_batch_fast "
        f"{floor['batch']:,.0f} tok/CPU-s ({floor['batch'] / floor['encode']:.2f}x); the batched "
        f"path runs at {best / floor['batch']:.0%} of encode_batch_fast alone"
    )
    return results


def bench_memory(name: str, files: list[str], tokenizer: str, tmp: str, copies: int) -> None:
    folder = os.path.join(tmp, f"{name}-x{copies}")
    os.makedirs(folder)
    linked = []
    for c in range(copies):
        for f in files:
            link = os.path.join(folder, f"{c}-{os.path.basename(f)}")
            os.symlink(os.path.abspath(f), link)
            linked.append(link)
    one = _run_child("batched", files, tokenizer, os.path.join(tmp, f"{name}-m1"), 1)
    many = _run_child("batched", linked, tokenizer, os.path.join(tmp, f"{name}-m{copies}"), 1)
    print(
        f"  peak RSS, batched, 1 worker: {one['rss_main_mib']:.0f} MiB for {one['tokens']:,d} "
        f"tokens; {many['rss_main_mib']:.0f} MiB for {many['tokens']:,d} tokens ({copies}x input)"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--corpus", nargs="*", default=None, help="directories of zh/en jsonl(.gz)")
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    p.add_argument(
        "--tokenizer", default=os.path.join(ROOT, "megatron_gamma/data/demo/tokenizer.json")
    )
    p.add_argument("--memory-copies", type=int, default=3)
    p.add_argument("--child", choices=["batched", "per-doc", "floor"], help=argparse.SUPPRESS)
    p.add_argument("--prefix", help=argparse.SUPPRESS)
    p.add_argument("--files", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        run = {"batched": _child_batched, "per-doc": _child_per_doc, "floor": _child_floor}[
            args.child
        ]
        import megatron_gamma.data.preprocess  # noqa: F401  (imports are not timed)

        before = _usage()
        result = run(args.files, args.tokenizer, args.prefix, args.workers[0])
        after = _usage()
        after["cpu"] -= before["cpu"]
        print(json.dumps(result | after))
        return
    from megatron_gamma.data.readers import expand_inputs

    corpora = args.corpus
    if corpora is None:
        corpora = [os.path.join(ROOT, "megatron_gamma/data/demo")]
        big = os.path.join(ROOT, "..", "shared", "data", "debian-docs-bilingual")
        if os.path.isdir(big):
            corpora.append(os.path.normpath(big))
    print(f"tokenizer {args.tokenizer}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench_preprocess_") as tmp:
        for corpus in corpora:
            files = expand_inputs([corpus])
            name = os.path.basename(corpus.rstrip("/"))
            bench_corpus(name, files, args.tokenizer, args.workers, tmp)
            if sum(map(os.path.getsize, files)) > 5e6:
                bench_memory(name, files, args.tokenizer, tmp, args.memory_copies)


if __name__ == "__main__":
    main()
