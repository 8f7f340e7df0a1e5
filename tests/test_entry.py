"""A Ctrl-C during the start-up of any command (while :mod:`megatron_gamma.cli`'s module-level
imports run, before its ``main`` catches interrupts) printed a bare ``KeyboardInterrupt``
traceback; the console script (:mod:`megatron_gamma.entry`) now ends it as a later one ends:
``megatron-gamma COMMAND: interrupted``, exit status 130.

The interrupt is made deterministic: rather than a SIGINT sent after a delay (which lands
before, during or after those imports depending on the machine's load), a ``sitecustomize``
module on the child's ``PYTHONPATH`` adds an import hook that raises ``KeyboardInterrupt`` at
the import of ``megatron_gamma.config``, the first project module ``megatron_gamma.cli``
imports: what Python does when SIGINT arrives there.
"""

import os
import re
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTRL_C_AT_IMPORT = """
import sys


class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "megatron_gamma.config":
            raise KeyboardInterrupt
        return None


sys.meta_path.insert(0, CtrlC())
"""
CONSOLE_SCRIPT = "import sys; from megatron_gamma.{} import main; sys.exit(main())"
"""What pip's generated ``megatron-gamma`` script runs, for an entry point in that module."""


def _start(tmp_path, module: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(CTRL_C_AT_IMPORT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    return subprocess.run(
        [sys.executable, "-c", CONSOLE_SCRIPT.format(module), "pretrain", "--config", "x.yaml"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path):
    proc = _start(tmp_path, "entry")
    assert (proc.returncode, proc.stderr) == (130, "megatron-gamma pretrain: interrupted\n")
    assert proc.stdout == ""


def test_the_old_entry_point_gave_a_traceback(tmp_path):
    """The hook does interrupt the start-up: through megatron_gamma.cli:main, the console
    script's entry point before, the same interrupt is a traceback, and Python ends the process
    by SIGINT (exit status -2 to subprocess)."""
    proc = _start(tmp_path, "cli")
    assert proc.returncode == -signal.SIGINT
    assert proc.stderr.startswith("Traceback (most recent call last):")
    assert proc.stderr.rstrip().endswith("KeyboardInterrupt")


def test_the_console_script_is_the_entry_module():
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        scripts = re.findall(r'"console_scripts": \[(.*?)\]', f.read())
    assert scripts == ['"megatron-gamma=megatron_gamma.entry:main"']
    with open(os.path.join(ROOT, "megatron_gamma", "entry.py"), encoding="utf-8") as f:
        imports = re.findall(r"^(?:from|import) (\S+)", f.read(), re.M)
    assert imports == ["__future__", "sys"]  # nothing of the project before the try
