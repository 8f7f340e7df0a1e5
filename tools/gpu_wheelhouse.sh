#!/usr/bin/env bash
# Offline wheelhouse for the lent GPU machine (no package registry there; at most 64 MiB of files
# travel with each command). Run here, with the package registry:
#
#   bash tools/gpu_wheelhouse.sh DIR
#
# Downloads, with --no-deps and each needed dependency named, every runtime dependency of
# megatron-gamma that the lent machine lacks, pinned to docker/constraints.txt (the tested set):
#   DIR/cp312/  CPython 3.12 manylinux x86-64 (the lent machine's python3)
#   DIR/cpXY/   this machine's Python (${PYTHON:-python}), for the CPU rehearsal
#               (bash tools/gpu_acceptance.sh OUT --dry-run --wheelhouse DIR)
#   DIR/lent-packages.txt  the lent machine's package list below, which the rehearsal models
# then checks that every Requires-Dist of every wheel, and megatron-gamma's install_requires, is
# met by a wheel of the set or by the lent machine's list (version-checked where the list records
# a version), and prints each directory's size (fails above 48 MiB: one travels per command). Installed there by
# tools/gpu_acceptance.py's install step: pip install --no-index --no-deps --target.
set -euo pipefail
if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: bash tools/gpu_wheelhouse.sh DIR" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
dir=$(mkdir -p "$1" && cd "$1" && pwd)
python=${PYTHON:-python}

# The lent machine (nvidia-h200, image 'cuda', python3 = CPython 3.12.3), as read there on
# 2026-11-17 (names) and 2026-11 (versions, where known); /work/.library/device/KINDS.md.
LENT_DATE=2026-11-17
LENT_PACKAGES=(
  absl-py accelerate==1.15.0 aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
  attrs botorch==0.18.1 build certifi charset-normalizer chex click cloudpickle cmake colorama
  contourpy coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x==14.2.0
  cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
  formulaic frozenlist fsspec gpytorch==1.15.2 grpcio h11 h5py hf-xet httpcore httpx
  huggingface-hub==1.33.0 humanize hypothesis idna imageio iniconfig interface-meta jax==0.11.2
  jax-cuda13-pjrt==0.11.2 jax-cuda13-plugin==0.11.2 jaxlib==0.11.2 jaxtyping==0.3.11 jinja2
  joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
  markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
  multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
  numpy==2.5.2 numpyro==0.21.0 nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
  nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
  nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
  nvidia-nvshmem-cu13 nvidia-nvtx onnx==1.23.1 onnx-ir==1.0.0 onnxruntime==1.30.0
  onnxscript==0.7.2 opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
  orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
  prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
  pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
  pytest-xdist python-dateutil pytorch-lightning==2.6.6 pyyaml regex requests rich sacrebleu
  safetensors==0.8.0 scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece==0.2.2
  sentence-transformers==6.0.1 setuptools shellingham simplejson six sortedcontainers statsmodels
  sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
  tiktoken==0.14.0 timm tokenizers==0.23.2 toolz torch==2.11.0 torchaudio==2.11.0
  torchdiffeq==0.2.5 torch-geometric==2.8.0.post1 torchmetrics==1.9.0 torchvision==0.26.0 tqdm
  transformers==5.17.0 treescope triton==3.6.0 typer typing-extensions typing-inspect urllib3
  uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
)
# Pinned in docker/constraints.txt, missing there: megatron-core gigatoken awkward nltk zstandard
# orjson isal.
PINNED=(megatron-core gigatoken awkward nltk zstandard orjson isal)
# Their needs that the lent machine lacks (versions of the tested environment).
CLOSURE=(awkward-cpp==57 defusedxml==0.7.1)
# Needed below Python 3.12 only (awkward), for the rehearsal on this machine's Python.
CLOSURE_BELOW_312=(importlib-metadata==10.2.0 lazy-importer==0.1.0)

wanted=()
for name in "${PINNED[@]}"; do
  pin=$(grep -E "^${name}==" docker/constraints.txt) || {
    echo "gpu_wheelhouse: ${name} is not pinned in docker/constraints.txt. Fix: pin it there" >&2
    exit 1
  }
  wanted+=("$pin")
done
wanted+=("${CLOSURE[@]}")

download() {  # download PYVER (e.g. 3.12) into DIR/cpXY
  local ver=$1 tag=cp${1/./}
  local names=("${wanted[@]}")
  [[ "$ver" == 3.1[01] ]] && names+=("${CLOSURE_BELOW_312[@]}")
  rm -rf "${dir:?}/$tag"
  echo "gpu_wheelhouse: ${#names[@]} wheels for CPython $ver -> $dir/$tag"
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$ver" \
    --implementation cp --abi "$tag" --abi abi3 --abi none --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$dir/$tag" "${names[@]}"
}

here=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
download 3.12
[[ "$here" != 3.12 ]] && download "$here"
printf '%s\n' "# lent machine's packages (python3 = CPython 3.12), read ${LENT_DATE}" \
  "${LENT_PACKAGES[@]}" >"$dir/lent-packages.txt"

"$python" - "$dir" setup.py <<'EOF'
"""Every requirement of every wheel (and of megatron-gamma) is met by the set or the lent list."""
import ast
import glob
import os
import sys
import zipfile

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

wheelhouse, setup_py = sys.argv[1:]
lent = {}
for line in open(os.path.join(wheelhouse, "lent-packages.txt")):
    if line.strip() and not line.startswith("#"):
        name, _, version = line.strip().partition("==")
        lent[canonicalize_name(name)] = version or None
tree = ast.parse(open(setup_py).read())
ours = next(
    [ast.literal_eval(e) for e in kw.value.elts]
    for node in ast.walk(tree) if isinstance(node, ast.Call)
    for kw in node.keywords if kw.arg == "install_requires"
)
problems = []
limit = 48 * 2**20
for sub in sorted(glob.glob(os.path.join(wheelhouse, "cp3*"))):
    tag = os.path.basename(sub)
    env = dict(default_environment(), python_version=f"3.{tag[3:]}", python_full_version=f"3.{tag[3:]}.0",
               sys_platform="linux", platform_machine="x86_64", extra="")  # fmt: skip
    wheels, total = {}, 0
    for path in sorted(glob.glob(os.path.join(sub, "*.whl"))):
        name, version, _, _ = parse_wheel_filename(os.path.basename(path))
        if name in wheels:
            problems.append(f"{tag}: two wheels of {name}. Fix: keep one version")
        wheels[name] = (version, path)
        total += os.path.getsize(path)
    needs = [("megatron-gamma", Requirement(r)) for r in ours]
    for name, (_, path) in wheels.items():
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            for line in z.read(meta).decode().splitlines():
                if line.startswith("Requires-Dist:"):
                    needs.append((name, Requirement(line.split(":", 1)[1].strip())))
    unverified = set()
    for who, req in needs:
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name in wheels:
            if not req.specifier.contains(wheels[name][0], prereleases=True):
                problems.append(f"{tag}: {who} needs {req}, the wheelhouse has {wheels[name][0]}")
        elif name in lent:
            if lent[name] and not req.specifier.contains(lent[name], prereleases=True):
                problems.append(f"{tag}: {who} needs {req}, the lent machine has {lent[name]}")
            elif req.specifier and not lent[name]:
                unverified.add(str(req))
        else:
            problems.append(f"{tag}: {who} needs {req}: neither in the wheelhouse nor on the lent "
                            "machine. Fix: add it to CLOSURE in tools/gpu_wheelhouse.sh")  # fmt: skip
    if total > limit:
        problems.append(f"{tag}: {total / 2**20:.1f} MiB > {limit / 2**20:.0f} MiB (64 MiB travel)")
    print(f"gpu_wheelhouse: {tag}: {len(wheels)} wheels, {total / 2**20:.1f} MiB, requirements met"
          + (f" (lent versions not recorded for: {', '.join(sorted(unverified))})"
             if unverified else ""))  # fmt: skip
if problems:
    sys.exit("gpu_wheelhouse: incomplete:\n  " + "\n  ".join(problems))
EOF
