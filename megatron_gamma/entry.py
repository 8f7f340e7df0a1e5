"""The ``megatron-gamma`` console script (setup.py's ``console_scripts``).

It imports :mod:`megatron_gamma.cli` inside :func:`main`, so that a Ctrl-C during that module's
imports (the first second or more of every command) ends as a later one does: one line,
``megatron-gamma COMMAND: interrupted``, and exit status 130, instead of a traceback. Imports
nothing but the standard library, so that nothing of the project runs before that ``try``.
``python -m megatron_gamma.cli`` runs :func:`megatron_gamma.cli.main` directly.
"""

from __future__ import annotations

import sys


def main() -> int:
    """Import the command line and run it; returns its exit status (130 for a Ctrl-C during
    the import, with the same message :func:`megatron_gamma.cli.main` prints for one later)."""
    try:
        from megatron_gamma.cli import main as cli_main
    except KeyboardInterrupt:
        command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
        print(f"megatron-gamma{f' {command}' if command else ''}: interrupted", file=sys.stderr)
        return 130
    return cli_main()
