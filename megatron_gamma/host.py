"""The machine a measurement ran on, as the reports and benchmarks name it."""

from __future__ import annotations

import contextlib
import platform


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name: the first ``model name`` line of Linux's ``cpuinfo``, else
    :func:`platform.processor`, else :func:`platform.machine`, else 'unknown CPU'.

    Args:
        cpuinfo: the file to read (Linux's ``/proc/cpuinfo``); unreadable or without a
            ``model name`` line (e.g. on aarch64), the fallbacks answer.

    Returns:
        e.g. 'AMD EPYC 7763 64-Core Processor'.
    """
    with contextlib.suppress(OSError), open(cpuinfo, encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"
