"""megatron_gamma.mcore_import: megatron-core's first import inside
``megatron_core_without_wandb`` (every ``megatron-gamma`` command runs in one) leaves Weights &
Biases out, and a later ``import wandb`` still works; a wandb imported first (``pretrain
--wandb-project``) is megatron-core's.

Each case runs in a fresh interpreter that finds a stand-in ``wandb`` module first on its path, and
reports whether megatron-core's timers module got wandb, whether wandb is in ``sys.modules`` after
the block, whether the block's finder is left on ``sys.meta_path`` and which file a later
``import wandb`` loads.
"""

from helpers import run_with_stand_in_wandb

PROBE = """
import json, sys
{before}
from megatron_gamma.mcore_import import megatron_core_without_wandb
with megatron_core_without_wandb():
    import megatron.core.timers as timers
finders = [type(f).__name__ for f in sys.meta_path]
seen = {{"during": timers.wandb is not None, "after": "wandb" in sys.modules}}
seen["finder_left"] = "_OnImport" in finders
import wandb
seen["later"] = wandb.__file__
print(json.dumps(seen))
"""


def _probe(tmp_path, before: str = "") -> dict:
    return run_with_stand_in_wandb(tmp_path, PROBE.format(before=before))


def test_megatron_core_imported_in_the_block_has_no_wandb_and_wandb_stays_importable(tmp_path):
    seen = _probe(tmp_path)
    assert seen["during"] is False and seen["after"] is False
    assert seen["finder_left"] is False
    assert seen["later"] == seen["fake"]


def test_a_wandb_imported_first_is_megatron_cores(tmp_path):
    """The control (what ``pretrain --wandb-project`` does): the stand-in is on the path the
    probe's megatron-core sees, so ``during`` can be True."""
    seen = _probe(tmp_path, "import wandb")
    assert seen["during"] is True and seen["later"] == seen["fake"]


def test_outside_the_block_megatron_core_takes_wandb(tmp_path):
    """The control for the block itself: megatron-core imported before it gets wandb."""
    seen = _probe(tmp_path, "import megatron.core")
    assert seen["during"] is True and seen["after"] is True and seen["finder_left"] is False
