#!/usr/bin/env bash
# GPU acceptance run on one GPU in at most 8 minutes: CUDA kernel tests, RMSNorm bandwidth, and
# the 0.1B recipe's tokens/s, TFLOP/s and MFU for our spec, its ablations and megatron-core's
# stock spec. Writes OUT_DIR/gpu_acceptance.{json,md} after every step (partial results if time
# runs out). Installs only from PyPI (pip). See tools/gpu_acceptance.py for the steps.
#
#   bash tools/gpu_acceptance.sh OUT_DIR              # on a GPU machine
#   bash tools/gpu_acceptance.sh OUT_DIR --dry-run    # on CPU: check every step's command
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: bash tools/gpu_acceptance.sh OUT_DIR [--dry-run] [--budget-s 480]" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" tools/gpu_acceptance.py "$@"
