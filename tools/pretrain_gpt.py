"""Megatron-LM-style entry point; same as `megatron-gamma pretrain` (see megatron_gamma.cli)."""

import sys

from megatron_gamma.cli import main

if __name__ == "__main__":
    sys.exit(main(["pretrain", *sys.argv[1:]]))
