#!/usr/bin/env bash
# GPU acceptance run on one GPU in at most 9 minutes: install from an offline wheelhouse, build
# the CUDA extension for this GPU, CUDA kernel tests, RMSNorm bandwidth, the counter-based init
# on the GPU (bit-for-bit parity with the CPU kernel; time for the 1.5B recipe against
# megatron-core's GPU init), and the 0.1B recipe's tokens/s, TFLOP/s and MFU for our spec, its
# ablations and megatron-core's stock spec, with the gate-fusion decision. Writes
# OUT_DIR/gpu_acceptance.{json,md} after every step (partial results if time runs out). See
# tools/gpu_acceptance.py for the steps and their budgets.
#
#   bash tools/gpu_wheelhouse.sh DIR                                 # here, with the registry
#   bash tools/gpu_acceptance.sh OUT_DIR --wheelhouse DIR            # on the GPU machine
#   bash tools/gpu_acceptance.sh OUT_DIR --dry-run                   # on CPU: every step's path
#   bash tools/gpu_acceptance.sh OUT_DIR --dry-run --wheelhouse DIR  # the same in a fresh
#       offline venv that models the lent machine (OUT_DIR/rehearsal-venv: only the lent
#       machine's packages, linked from this machine; the rest from the wheelhouse)
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: bash tools/gpu_acceptance.sh OUT_DIR [--dry-run] [--wheelhouse DIR] [--budget-s 540]" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" tools/gpu_acceptance.py "$@"
