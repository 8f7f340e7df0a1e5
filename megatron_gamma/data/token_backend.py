"""Tokenizer backends for preprocessing: ``gigatoken`` when it gives the ids of HF ``tokenizers``,
HF ``tokenizers`` otherwise (``--tokenizer-backend auto|gigatoken|hf``).

Both backends encode a batch of texts into one flat id array plus offsets, so everything after
tokenization is shared and the bytes written depend only on the ids. The contract is HF
``tokenizers``' encoding of a ``tokenizer.json`` with ``encode_special_tokens = True`` (a literal
``<|endoftext|>`` inside a document is plain text) and no added special tokens; ``gigatoken``
(PyPI, the tokenizer of Megatron-LM's ``tools/preprocess_data_fast.py``) reaches it by loading
the same ``tokenizer.json`` with its special added tokens removed, so it never matches them in
text. The run's own EOD, PAD and BOS (``plain``: e.g. ``</s>`` named by a
``tokenizer_config.json``) are treated as special added tokens by both, even where the
tokenizer.json marks them ``"special": false``, so their text in a document stays text too.

:func:`resolve_backend` decides at start-up. ``auto`` loads ``gigatoken`` and compares its ids
with HF ``tokenizers`` on :data:`PROBE_TEXTS` (mixed scripts, emoji, control characters, very long
words, special-token strings) and on a sample of the input; any difference, a tokenizer.json
``gigatoken`` cannot load, or ``gigatoken`` not installed makes it fall back to ``hf`` and say
why. ``gigatoken`` requires the same check to pass and raises ``ConfigError`` otherwise; ``hf``
skips it. So the backend never changes the output bytes on what was checked, and it is not part of
a run's resume fingerprint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from itertools import chain

import numpy as np
import orjson

from megatron_gamma.config import ConfigError

BACKENDS = ("auto", "gigatoken", "hf")
PROBE_TEXTS = (
    "Hello, world! 你好，世界！混合 mixed 文本 with numbers 12345 and 3.14159.",
    "Ελληνικά, кириллица, العربية, עברית, हिन्दी, 日本語のかな, 한국어, ไทย.",
    "emoji 😀👍🏽👨‍👩‍👧‍👦🇨🇳🇺🇸 and symbols ∑∫√ ©®™ ←→ ♠♣",
    "control \x00\x01\x07\x08\x0b\x0c\x1b[31m\x7f\x85 \u200b\u200d\ufeff\u2028\u2029 end",
    "a <|endoftext|> b <|pad|><|bos|> c <|endoftext|>",
    "  leading spaces\n\n\ttabs\r\nCRLF   trailing   ",
    "x" * 5000 + " " + "汉" * 3000 + " " + "ab1" * 2000,
    "Supercalifragilisticexpialidocious" * 50 + "pneumonoultramicroscopicsilicovolcanoconiosis",
    "https://example.org/a/b?c=d&e=f#g /usr/lib/x86_64-linux-gnu/libc.so.6 $HOME ~/.bashrc",
    "don't won't I'm you're it's 'quoted' \"double\" `code` 's 't 're 've 'm 'll 'd",
    "",
)
MAX_SAMPLE_CHARS = 64 * 1024
CACHE_MIB = 128
"""Memory growth (MiB) after which :class:`GigatokenBackend` rebuilds its tokenizer."""


def _tokenizer_doc(path: str, plain: Sequence[str] = ()) -> tuple[dict, bool]:
    """The ``tokenizer.json`` document with the added tokens whose text is in ``plain`` marked
    special, and whether any was not already (what ``parsed`` of :class:`HFBackend` and
    :class:`GigatokenBackend` takes: the check parses the file once for both, 0.16 CPU-s for a
    100k vocabulary's 8.6 MB)."""
    with open(path, "rb") as f:
        doc = orjson.loads(f.read())
    marked = False
    for token in doc.get("added_tokens") or []:
        if token.get("content") in plain and not token.get("special"):
            token["special"], marked = True, True
    return doc, marked


def is_byte_level_bpe(tokenizer_json: dict) -> bool:
    """True when a ``tokenizer.json`` (parsed) is a BPE with a ByteLevel pre-tokenizer and no
    normalizer: its tokens' bytes, concatenated, are the text's UTF-8 bytes."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    return (
        tokenizer_json.get("normalizer") is None
        and (tokenizer_json.get("model") or {}).get("type") == "BPE"
        and any(p.get("type") == "ByteLevel" for p in parts)
    )


class HFBackend:
    """HF ``tokenizers`` (``encode_batch_fast``: the Rust side, no offsets).

    Args:
        tokenizer_path: a ``tokenizer.json``.
        plain: token texts to encode as text even where the tokenizer.json does not mark them
            special (the run's EOD, PAD and BOS; module docstring).
        parsed: ``_tokenizer_doc(tokenizer_path, plain)``, where the caller has it (read from
            the file otherwise); not changed.
        hf_tokenizer: a ``tokenizers.Tokenizer`` already read from ``tokenizer_path`` (the run's
            :attr:`~megatron_gamma.data.tokenizer.BilingualTokenizer.hf_tokenizer`), used
            instead of reading it again (0.4 CPU-s for a 100k vocabulary) unless a text of
            ``plain`` must be marked special. Each :meth:`encode_batch` sets its
            ``encode_special_tokens`` for the call and restores it, so its other users (none
            encode during preprocessing) see it unchanged.
    """

    name = "hf"

    def __init__(
        self,
        tokenizer_path: str,
        plain: Sequence[str] = (),
        parsed: tuple[dict, bool] | None = None,
        hf_tokenizer=None,
    ):
        from tokenizers import Tokenizer

        if parsed is None:
            parsed = _tokenizer_doc(tokenizer_path, plain) if plain else (None, False)
        doc, marked = parsed
        if marked:
            self.tok = Tokenizer.from_str(orjson.dumps(doc).decode())
        else:
            self.tok = hf_tokenizer or Tokenizer.from_file(tokenizer_path)

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of ``texts`` (no special tokens added).

        Returns:
            (ids, offsets): ids (T,) uint32, all texts' ids in order; offsets (len(texts) + 1,)
            int64, text i's ids are ``ids[offsets[i]:offsets[i + 1]]``.
        """
        before, self.tok.encode_special_tokens = self.tok.encode_special_tokens, True
        try:
            encodings = self.tok.encode_batch_fast(list(texts), add_special_tokens=False)
        finally:
            self.tok.encode_special_tokens = before
        seqs = [e.ids for e in encodings]
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, seqs), np.int64, len(seqs)), out=offsets[1:])
        ids = np.fromiter(chain.from_iterable(seqs), np.uint32, int(offsets[-1]))
        return ids, offsets


class GigatokenBackend:
    """``gigatoken`` (PyPI) on the same ``tokenizer.json``, special added tokens removed.

    Encodes on the calling thread (``parallel=False``): one core per preprocessing worker.
    ``gigatoken`` keeps every distinct pretoken it has encoded in a cache with no size limit
    (about 90 bytes each, measured: 4.1 M distinct words grew a process by 363 MiB), so on a
    long run of fresh text memory would grow with the input. When the process's resident memory
    has grown by ``cache_mib`` during this tokenizer's encode calls (growth between calls, such as
    an import or the caller's own arrays, is not the cache's and does not count), it is built
    again, which empties the cache; the ids do not change (``tests/test_token_backend.py``), only
    the next texts' encoding starts cold.

    Args:
        tokenizer_path: a ``tokenizer.json``.
        cache_mib: growth of resident memory (MiB) after which the tokenizer is rebuilt
            (default :data:`CACHE_MIB`; 0 rebuilds after every batch).
        plain: token texts removed with the special added tokens (:class:`HFBackend`).
        parsed: as for :class:`HFBackend`; not changed.

    Attributes:
        rebuilds: how many times this process rebuilt the tokenizer.
        grown: bytes of resident memory gained during encode calls since the last build.
        byte_level_bpe: the tokenizer.json is a byte-level BPE without normalizer
            (:func:`is_byte_level_bpe`).

    Raises:
        ImportError: gigatoken is not installed.
        ValueError: ``cache_mib`` < 0.
        Exception: whatever gigatoken raises for a tokenizer.json it does not support.
    """

    name = "gigatoken"

    def __init__(
        self,
        tokenizer_path: str,
        cache_mib: float | None = None,
        plain: Sequence[str] = (),
        parsed: tuple[dict, bool] | None = None,
    ):
        import gigatoken
        import psutil

        cache_mib = CACHE_MIB if cache_mib is None else cache_mib
        if cache_mib < 0:
            raise ValueError(f"cache_mib={cache_mib}: must be >= 0. Fix: e.g. {CACHE_MIB}")
        doc = (parsed or _tokenizer_doc(tokenizer_path, plain))[0]
        added = [t for t in doc.get("added_tokens") or [] if not t.get("special")]
        doc = dict(doc, added_tokens=added)
        self.byte_level_bpe = is_byte_level_bpe(doc)
        self._psutil, self._process = psutil, None
        self._from_json, self._json = gigatoken.Tokenizer.from_json, orjson.dumps(doc)
        self.cache_bytes, self.rebuilds = cache_mib * 2**20, 0
        self._build()

    def _rss(self) -> int:
        pid = os.getpid()
        if self._process is None or self._process.pid != pid:  # a forked worker measures its own
            self._process = self._psutil.Process(pid)
        return self._process.memory_info().rss

    def _build(self) -> None:
        self.tok = None  # the old cache is freed before the new tokenizer is made
        self.tok = self._from_json(self._json)
        self.grown = 0

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Same contract as :meth:`HFBackend.encode_batch`."""
        if not texts:
            return np.zeros(0, np.uint32), np.zeros(1, np.int64)
        before = self._rss()
        layout = self.tok.encode_batch(list(texts), parallel=False).layout
        self.grown += self._rss() - before
        offsets = np.asarray(layout.offsets.data, dtype=np.int64)
        ids = np.asarray(layout.content.data)[offsets[0] : offsets[-1]]
        if not self.cache_bytes or self.grown >= self.cache_bytes:
            self._build()
            self.rebuilds += 1
        return ids.astype(np.uint32, copy=False), offsets - offsets[0]


def make_backend(
    name: str, tokenizer_path: str, plain: Sequence[str] = (), hf_tokenizer=None
) -> HFBackend | GigatokenBackend:
    """The backend called ``name`` ('gigatoken' or 'hf'), as :func:`resolve_backend` chose it
    (``hf_tokenizer``: as for :class:`HFBackend`)."""
    if name == "hf":
        return HFBackend(tokenizer_path, plain, hf_tokenizer=hf_tokenizer)
    if name == "gigatoken":
        return GigatokenBackend(tokenizer_path, plain=plain)
    raise ConfigError(f"tokenizer_backend={name!r}: not a resolved backend. Fix: 'gigatoken'/'hf'")


def first_difference(
    texts: Sequence[str], hf: HFBackend, other: GigatokenBackend
) -> tuple[int, list[int], list[int]] | None:
    """(index, HF ids, other ids) of the first text the two backends encode differently, else
    None."""
    a_ids, a_off = hf.encode_batch(texts)
    b_ids, b_off = other.encode_batch(texts)
    for i in range(len(texts)):
        a = a_ids[a_off[i] : a_off[i + 1]]
        b = b_ids[b_off[i] : b_off[i + 1]]
        if not np.array_equal(a, b):
            return i, a.tolist(), b.tolist()
    return None


@contextlib.contextmanager
def _noting_interrupts() -> Iterator[list[int]]:
    """Note each SIGINT received in the block (the list it yields), then handle it as before.

    A Ctrl-C that lands while native code runs (``gigatoken`` calls back into Python to build
    its result) can surface as another exception, or none, once that code has swallowed the
    ``KeyboardInterrupt``: a user's interrupt must never read as "this backend failed". Outside
    the main thread (where no signal handler can be set) the block runs unchanged."""
    seen: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or threading.current_thread() is not threading.main_thread():
        yield seen  # a handler not set from Python, or a thread that cannot set one
        return

    def note(signum, frame):
        seen.append(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, note)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def resolve_backend(
    requested: str,
    tokenizer_path: str,
    sample: Sequence[str],
    loaded: dict[str, HFBackend | GigatokenBackend] | None = None,
    plain: Sequence[str] = (),
    hf_tokenizer=None,
) -> tuple[str, str]:
    """Choose the backend for a run (module docstring).

    Args:
        requested: 'auto', 'gigatoken' or 'hf'.
        tokenizer_path: the run's ``tokenizer.json``.
        sample: input texts to compare on, besides :data:`PROBE_TEXTS` (truncated to
            :data:`MAX_SAMPLE_CHARS` characters in all).
        loaded: if given, receives the backends the check loaded, by name, so that the run
            encodes with them instead of loading the tokenizer again.
        plain: the run's special token texts (:class:`HFBackend`); one more probe text holds
            them.
        hf_tokenizer: as for :class:`HFBackend`: the run's ``tokenizers.Tokenizer`` of
            ``tokenizer_path``, where it has one.

    Returns:
        (backend, reason): 'gigatoken' or 'hf', and one line saying why.

    Raises:
        ConfigError: ``requested`` is unknown, or is 'gigatoken' and gigatoken cannot load the
            tokenizer or gives other ids.
        KeyboardInterrupt: a SIGINT arrived during the check, even where the native code it
            interrupted raised another error instead (:func:`_noting_interrupts`).
    """
    if requested not in BACKENDS:
        raise ConfigError(
            f"tokenizer_backend={requested!r}: unknown. Fix: one of {', '.join(BACKENDS)}"
        )
    if requested == "hf":
        return "hf", "hf: requested (--tokenizer-backend hf)"
    texts, total = list(PROBE_TEXTS), 0
    if plain:
        texts.append(f"a {' b '.join(plain)} c {''.join(plain)}")
    probes = len(texts)
    for text in sample:
        if total + len(text) > MAX_SAMPLE_CHARS:
            break
        texts.append(text)
        total += len(text)
    inputs = len(texts) - probes
    if inputs:
        checked = f"{probes} probe texts and {inputs} input text{'s' if inputs > 1 else ''}"
    elif sample:
        checked = (
            f"{probes} probe texts and no input text: the first is longer than the "
            f"{MAX_SAMPLE_CHARS:,}-character sample"
        )
    else:
        checked = f"{probes} probe texts and no input text: the first records read hold none"
    loaded = {} if loaded is None else loaded
    with _noting_interrupts() as interrupts:
        try:
            parsed = _tokenizer_doc(tokenizer_path, plain)
            loaded["hf"] = HFBackend(tokenizer_path, plain, parsed, hf_tokenizer)
            loaded["gigatoken"] = GigatokenBackend(tokenizer_path, plain=plain, parsed=parsed)
            diff = first_difference(texts, loaded["hf"], loaded["gigatoken"])
        except ImportError as e:
            why = f"gigatoken is not importable ({e}); install it: pip install gigatoken==0.10.0"
        except Exception as e:  # noqa: BLE001  (any failure to load or encode means: not usable)
            if interrupts:  # a Ctrl-C that native code turned into another error
                raise KeyboardInterrupt from e
            why = f"gigatoken cannot tokenize with {tokenizer_path!r}: {type(e).__name__}: {e}"
        else:
            why = None
    if interrupts:  # a Ctrl-C that native code swallowed whole
        raise KeyboardInterrupt
    if why is None:
        if diff is None:
            return "gigatoken", f"gigatoken: ids identical to HF tokenizers on {checked}"
        i, a, b = diff
        kind = "probe" if i < probes else "input"
        why = (
            f"gigatoken ids differ from HF tokenizers on {kind} text {texts[i][:40]!r}...: "
            f"hf {a[:8]}... vs gigatoken {b[:8]}..."
        )
    if requested == "gigatoken":
        raise ConfigError(
            f"tokenizer_backend='gigatoken': {why}. Fix: --tokenizer-backend auto (falls back to "
            "hf) or hf"
        )
    return "hf", f"hf: auto fell back because {why}"
