#!/usr/bin/env bash
# CI: compile and link the CUDA kernels of megatron_gamma._C, no GPU needed.
#
# A separate throw-away venv gets a CUDA build of torch (TORCH_CUDA_VERSION, default 2.14.1:
# CUDA 13, from pip's configured indexes), then setup.py builds the extension with the
# machine's nvcc (CUDA_HOME, else /usr/local/cuda, else nvcc on PATH) for TORCH_CUDA_ARCH_LIST
# (default "8.0;9.0") with MEGATRON_GAMMA_BUILD_EXT=1, so any compile or link error fails this
# script. Finally the built library is loaded and must register CPU and CUDA kernels for every
# op (an unresolved symbol fails here). Nothing is installed into the main environment and
# nothing is written into the repository. Takes about 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
torch_version=${TORCH_CUDA_VERSION:-2.14.1}
work=$(mktemp -d "${TMPDIR:-/tmp}/megatron-gamma-cuda-ci.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ -z "${CUDA_HOME:-}" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    CUDA_HOME=/usr/local/cuda
  elif nvcc_path=$(command -v nvcc); then
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")
  else
    echo "compile_cuda: nvcc not found. Fix: install the CUDA toolkit or set CUDA_HOME" >&2
    exit 1
  fi
fi
export CUDA_HOME
echo "compile_cuda: CUDA_HOME=$CUDA_HOME ($("$CUDA_HOME/bin/nvcc" --version | tail -n 2 | head -n 1))"

python -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --progress-bar off "torch==$torch_version"
"$work/venv/bin/python" -c \
  "import torch; assert torch.version.cuda, 'torch is not a CUDA build'; print('compile_cuda: torch', torch.__version__, 'CUDA', torch.version.cuda)"
echo "compile_cuda: venv ready after $(( $(date +%s) - start )) s"

MEGATRON_GAMMA_BUILD_EXT=1 \
  TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}" \
  MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
  "$work/venv/bin/python" setup.py --quiet build_ext --build-lib "$work/lib" --build-temp "$work/tmp"

"$work/venv/bin/python" - "$work/lib" <<'EOF'
import glob
import sys

import torch

(lib,) = glob.glob(f"{sys.argv[1]}/megatron_gamma/_C*.so")
torch.ops.load_library(lib)
ops = ("rms_norm_fwd", "rms_norm_bwd", "sigmoid_gate_fwd", "sigmoid_gate_bwd")
cpu_only = ("counter_normal_", "moments", "token_document_stats")  # gamma-init, preprocessing
wanted = [(op, key) for op in ops for key in ("CPU", "CUDA")] + [(op, "CPU") for op in cpu_only]
missing = [
    f"{op}[{key}]"
    for op, key in wanted
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"megatron_gamma::{op}", key)
]
if missing:
    sys.exit(f"compile_cuda: kernels not registered: {', '.join(missing)}")
print(f"compile_cuda: {lib.rsplit('/', 1)[-1]} links and registers CPU + CUDA kernels")
EOF
echo "compile_cuda: OK in $(( $(date +%s) - start )) s"
