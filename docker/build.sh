#!/usr/bin/env bash
# Build the megatron-gamma GPU image from docker/Dockerfile (context: the repository root), and
# optionally push it or convert it to an enroot squashfs for pyxis.
#
# Tag scheme:  IMAGE:VERSION-ngcNGC-gSHA[-dirty]    e.g. megatron-gamma:0.1.0-ngc25.09-g1a2b3c4
#   VERSION  the package version in setup.py
#   NGC      the NVIDIA PyTorch release of the base image (nvcr.io/nvidia/pytorch:NGC-py3)
#   SHA      the git commit (7 hex digits); "-dirty" when the checkout has uncommitted changes
# The image is also tagged IMAGE:VERSION-ngcNGC, which moves to the newest build.
#
# usage: docker/build.sh [--print-tag] [--dry-run] [--push] [--enroot FILE.sqsh] [-- ARGS...]
#   --print-tag  print the full tag and exit (needs neither docker nor a GPU)
#   --dry-run    print the commands instead of running them
#   --push       docker push both tags (IMAGE must then name a registry, e.g. nvcr.io/acme/mg)
#   --enroot F   convert the built image into the squashfs F with `enroot import`
#   ARGS         passed to `docker build` (e.g. --build-arg BASE_IMAGE=...)
# env:   IMAGE (default megatron-gamma)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${IMAGE:-megatron-gamma}

PRINT_TAG=0 DRY=0 PUSH=0 SQSH="" EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --print-tag) PRINT_TAG=1 ;;
    --dry-run) DRY=1 ;;
    --push) PUSH=1 ;;
    --enroot) SQSH=${2:?--enroot needs a FILE.sqsh}; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "build.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done

VERSION=$(sed -n 's/^ *version="\([^"]*\)".*/\1/p' "$ROOT/setup.py" | head -n 1)
BASE=$(sed -n 's/^ARG BASE_IMAGE=//p' "$ROOT/docker/Dockerfile")
for arg in "${EXTRA[@]}"; do  # a --build-arg BASE_IMAGE=... override changes the NGC part
  case "$arg" in BASE_IMAGE=*) BASE=${arg#BASE_IMAGE=} ;; esac
done
NGC=$(echo "$BASE" | sed -n 's/.*:\([0-9][0-9]\.[0-9][0-9]\)-py3$/\1/p')
if [ -z "$VERSION" ] || [ -z "$NGC" ]; then
  echo "build.sh: cannot read the version from setup.py ('$VERSION') or the NGC release from" \
    "BASE_IMAGE ('$BASE', expected nvcr.io/nvidia/pytorch:YY.MM-py3)" >&2
  exit 1
fi
if SHA=$(git -C "$ROOT" rev-parse --short=7 HEAD 2>/dev/null); then
  [ -z "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ] || SHA="$SHA-dirty"
else
  SHA=nogit
fi
TAG="$VERSION-ngc$NGC-g$SHA"
MOVING="$VERSION-ngc$NGC"
if [ "$PRINT_TAG" = 1 ]; then
  echo "$IMAGE:$TAG"
  exit 0
fi

run() {
  echo "+ $*"
  if [ "$DRY" = 0 ]; then "$@"; fi
}
run docker build -f "$ROOT/docker/Dockerfile" -t "$IMAGE:$TAG" -t "$IMAGE:$MOVING" \
  "${EXTRA[@]}" "$ROOT"
if [ "$PUSH" = 1 ]; then
  run docker push "$IMAGE:$TAG"
  run docker push "$IMAGE:$MOVING"
fi
if [ -n "$SQSH" ]; then
  run enroot import -o "$SQSH" "dockerd://$IMAGE:$TAG"
fi
echo "image: $IMAGE:$TAG"
