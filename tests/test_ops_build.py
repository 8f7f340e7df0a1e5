"""Building and loading the optional extension: a machine without a working compiler installs
the pure-torch fallback with a log line (never a failed install); a built extension loads.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import megatron_gamma.ops as ops

ROOT = Path(__file__).resolve().parents[1]
needs_source = pytest.mark.skipif(
    not (ROOT / "setup.py").exists(), reason="needs the source tree's setup.py"
)


def build_ext(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """`python setup.py build_ext` into tmp_path with extra environment variables."""
    cmd = [sys.executable, "setup.py", "build_ext"]
    cmd += ["--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")]
    return subprocess.run(
        cmd, cwd=ROOT, env=dict(os.environ, **env), capture_output=True, text=True, timeout=300
    )


def built_libraries(tmp_path: Path) -> list[Path]:
    return list(tmp_path.glob("lib/**/_C*.so"))


@needs_source
@pytest.mark.timeout(300)
def test_missing_compiler_builds_nothing_and_says_so(tmp_path):
    proc = build_ext(tmp_path, CXX=str(tmp_path / "no-such-c++"), MEGATRON_GAMMA_BUILD_EXT="auto")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no C++ compiler" in proc.stderr and "pure-torch kernels will be used" in proc.stderr
    assert built_libraries(tmp_path) == []


@pytest.mark.slow
@needs_source
@pytest.mark.timeout(300)
def test_failing_compile_builds_nothing_and_says_so(tmp_path):
    """A compiler that identifies itself but fails every compile (e.g. a broken toolchain)."""
    cxx = tmp_path / "broken-c++"
    cxx.write_text(
        '#!/bin/sh\ncase "$*" in *--version*|*-dumpversion*) exec c++ "$@";; esac\nexit 1\n'
    )
    cxx.chmod(0o755)
    proc = build_ext(tmp_path, CXX=str(cxx), MEGATRON_GAMMA_BUILD_EXT="auto", MAX_JOBS="1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "building megatron_gamma._C failed" in proc.stderr
    assert built_libraries(tmp_path) == []


@pytest.mark.slow
@needs_source
@pytest.mark.timeout(300)
def test_required_build_fails_without_compiler(tmp_path):
    proc = build_ext(tmp_path, CXX=str(tmp_path / "no-such-c++"), MEGATRON_GAMMA_BUILD_EXT="1")
    assert proc.returncode != 0 and "no C++ compiler" in proc.stderr


@pytest.mark.timeout(120)
def test_without_extension_ops_fall_back_with_a_log_line():
    script = (
        "import logging, sys, torch\n"
        "sys.modules['megatron_gamma._C'] = None  # as if it were not built\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "import megatron_gamma.ops as ops\n"
        "assert ops.backend('cpu') == 'reference', ops.backend('cpu')\n"
        "x = torch.zeros(2, 8)\n"
        "assert torch.equal(ops.rms_norm(x, torch.ones(8), 1e-12), x)\n"
        "with ops.use_backend('extension'):\n"
        "    try:\n"
        "        ops.rms_norm(x, torch.ones(8), 1e-12)\n"
        "    except RuntimeError as e:\n"
        "        print(e)\n"
    )
    env = dict(os.environ, MEGATRON_GAMMA_OPS="auto")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "megatron_gamma._C is not built; using pure-torch kernels" in proc.stderr
    assert "ops backend 'extension' requested but there are no compiled kernels" in proc.stdout


def test_built_extension_loads():
    """A built megatron_gamma._C must load (an ABI or link error would silently fall back).
    CI sets MEGATRON_GAMMA_REQUIRE_EXT=1 so that a build that failed is an error too."""
    built = importlib.util.find_spec("megatron_gamma._C") is not None
    if not built and os.environ.get("MEGATRON_GAMMA_REQUIRE_EXT") != "1":
        pytest.skip("extension not built")
    assert ops.backend("cpu") == "extension", ops.extension_status()


@pytest.mark.slow
@needs_source
@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", sorted(p.name for p in (ROOT / "csrc").glob("*.cpp")))
def test_cpu_sources_compile_as_cxx17(source):
    """torch 2.11 (the lent H200's) builds extensions with -std=c++17 and 2.13 with -std=c++20;
    setup.py supports torch 2.6-2.14, so a C++20-only construct (std::bit_cast, which broke the
    first GPU build) must fail here. torch's own headers only warn under C++17."""
    from torch.utils.cpp_extension import include_paths

    cxx = os.environ.get("CXX", "c++")
    if subprocess.run([cxx, "--version"], capture_output=True).returncode != 0:
        pytest.skip(f"no C++ compiler ({cxx})")
    import sysconfig

    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-w", "-fopenmp", "-DTORCH_EXTENSION_NAME=_C",
           "-DTORCH_API_INCLUDE_EXTENSION_H", f"-I{sysconfig.get_paths()['include']}",
           *(f"-I{p}" for p in include_paths()), str(ROOT / "csrc" / source)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
