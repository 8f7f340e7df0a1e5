"""Megatron-LM-style entry point; same as `megatron-gamma merge` (see megatron_gamma.cli)."""

import sys

from megatron_gamma.cli import main

if __name__ == "__main__":
    sys.exit(main(["merge", *sys.argv[1:]]))
