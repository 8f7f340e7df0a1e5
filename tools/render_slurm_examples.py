"""Regenerate examples/slurm/*.sbatch from the templates in megatron_gamma/launch/templates/.

The examples are renderings of the same templates that `megatron-gamma submit` and
`submit-preprocess` use, with the example values of
:func:`megatron_gamma.launch.slurm.example_scripts`; tests/test_launch.py checks they are current.

    python tools/render_slurm_examples.py
"""

import os
import sys

from megatron_gamma.atomic import atomic_path
from megatron_gamma.launch.slurm import example_scripts

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def main() -> int:
    folder = os.path.join(EXAMPLES, "slurm")
    os.makedirs(folder, exist_ok=True)
    for name, text in example_scripts().items():
        path = os.path.join(folder, name)
        with atomic_path(path) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o755)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
