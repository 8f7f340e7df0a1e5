"""Megatron-LM's own GPT-3 and Llama-3 launch scripts, with only the entry point swapped.

The flags are text fixtures copied from Megatron-LM's examples (``tests/megatron_lm_examples``:
sizes shrunk to CPU scale, paths pointed at the demo corpus). Each script either trains for a
few iterations, or stops before any work naming each flag it refuses and why. The test runs the
script, removes the refused flags it named (the whole fixture line), and repeats until the run
trains: the flags it had to remove must be exactly the ones this machine cannot honour (listed
per script below, with the reason), and the rest must train, evaluate and save.
"""

import json
import re
import shlex
import string
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_gamma.data import demo_dir

EXAMPLES = Path(__file__).parent / "megatron_lm_examples"


def _lines(name: str) -> list[str]:
    text = (EXAMPLES / name).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()[:1] not in ("", "#")]


def _refused_flags(stderr: str, lines: list[str]) -> list[str]:
    """Flags an error message names as refused: ``--flag: refused: ...`` lines, or a config
    error ``error: key=value: ...`` whose key is one of the fixture's flags."""
    named = re.findall(r"^\s+(--[a-z0-9-]+): refused: ", stderr, flags=re.M)
    if named:
        return named
    match = re.search(r"error: ([a-z0-9_]+)=", stderr)
    flags = {line.split()[0] for line in lines}
    if match and "--" + match.group(1).replace("_", "-") in flags:
        return ["--" + match.group(1).replace("_", "-")]
    return []
