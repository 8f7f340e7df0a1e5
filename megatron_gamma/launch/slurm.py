"""Render and submit SLURM jobs: multi-node pretraining and array-parallel preprocessing.

``megatron-gamma submit`` freezes the resolved config into ``<run_dir>/slurm/config.yaml`` (not
over an earlier submission's with other settings: :func:`check_frozen_config`), renders
``templates/pretrain.sbatch.j2`` into ``<run_dir>/slurm/pretrain.sbatch`` and calls
``sbatch --parsable``. ``megatron-gamma submit-preprocess`` renders
``templates/preprocess_array.sbatch.j2`` next to the output prefix and submits it twice: as a job
array (one task per shard) and as the merge job that depends on it (``afterok``). Every check runs
before ``sbatch``; a bad submission raises :class:`SubmitError` (a :class:`ConfigError`) naming the
bad value and the fix. The templates are plain bash with ``#SBATCH`` lines and their settings as
variables at the top; ``examples/slurm/`` holds renderings of them
(``tools/render_slurm_examples.py``).

Every value that reaches a script is checked before anything is written: no control character
(a newline would end its ``#SBATCH`` line or shell assignment and run the rest as a command, and
sbatch reads no directive after the first command line): :func:`check_script_value`. Directive
values are escaped as sbatch reads them back (:func:`sbatch_value`), shell values are quoted
(``shlex.quote``). A script holding the config's ``cluster.env`` or ``--env`` values is written
with mode 0700, any other with 0777, both less the user's umask; saved configs hold those values
redacted (:func:`megatron_gamma.config.redacted_dict`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import resources
from typing import Optional

import jinja2
import yaml

from megatron_gamma.atomic import atomic_path
from megatron_gamma.config import (
    REDACTED,
    Config,
    ConfigError,
    changed_fields,
    check_run_dir_outputs,
    load_config,
    own_output_path,
    parse_env,
    redacted_dict,
    save_config,
    validate_layout,
)

LAUNCHERS = ("srun", "torchrun")
SLURM_SUBDIR = "slurm"
# sbatch --dependency: 'singleton', or TYPE:JOBID[:JOBID...] items joined by ',' (all) or '?' (any)
_DEPENDENCY_ITEM = r"(singleton|after(any|ok|notok|corr|burstbuffer)?(:\d+(\+\d+)?)+)"
_DEPENDENCY = re.compile(rf"{_DEPENDENCY_ITEM}([,?]{_DEPENDENCY_ITEM})*")
# account, QOS and partition names as SLURM keeps them (a comma-separated list of several)
_SLURM_NAMES = re.compile(r"[A-Za-z0-9_.\-]+(,[A-Za-z0-9_.\-]+)*")
# C0 control characters and DEL: a newline or carriage return ends a script line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# sbatch reads a directive's value up to unquoted whitespace (a backslash does not escape it) or
# an unescaped '#' (even a quoted one in older versions), taking '\' as an escape and '"' / "'"
# as quotes (src/sbatch/opt.c, the argument scanner): such a value is written in double quotes
# with '#', quotes and backslashes escaped.
_SBATCH_SPECIAL = re.compile(r"""[ #"'\\]""")
_SBATCH_ESCAPED = re.compile(r"""([#"'\\])""")
# sbatch starts a heterogeneous-job component at every directive line holding one of these words
# (case-insensitive, anywhere in the line, quoted or not).
_HETJOB_WORDS = re.compile("hetjob|packjob", re.IGNORECASE)
# Settings of a frozen config that do not change the run its jobs train: the job's shape and
# environment (the cluster section, which pretrain does not read) and --overwrite.
_JOB_ONLY = ("cluster", "checkpoint.overwrite")
# Exported in every job before the user's env block (which may override them).
BASE_ENV = {"PYTHONFAULTHANDLER": "1"}
# Exported in pretraining jobs: NCCL warnings in the log, no info flood.
PRETRAIN_ENV = {"NCCL_DEBUG": "WARN"}


class SubmitError(ConfigError):
    """A job that cannot run as asked; raised before anything is submitted."""


def _fail(key: str, value, why: str, fix: str) -> None:
    raise SubmitError(f"{key}={value!r}: {why}. Fix: {fix}")


def check_script_value(key: str, value) -> None:
    """Refuse a value bound for an sbatch script (a directive or a shell line) that holds a
    control character: a newline or carriage return would end the line, the rest would run as a
    shell command in the job, and sbatch would read no ``#SBATCH`` line after it.

    Args:
        key: the flag or field the value comes from (named in the error).
        value: the value; ``None`` passes, others are checked as ``str(value)``.

    Raises:
        SubmitError: the value holds a control character (newline, carriage return, tab, ...).
    """
    text = "" if value is None else str(value)
    if match := _CONTROL.search(text):
        _fail(
            key,
            text,
            f"holds the control character {match.group()!r}, which would end its line of the "
            "sbatch script and run the rest as a shell command",
            "remove it (values in a SLURM script are single-line)",
        )


def check_env(env: dict, source: str = "env") -> None:
    """Check environment variables bound for a script's ``export`` lines: names that are shell
    variable names (the whole name, no trailing newline), values without a control character.
    A value is never shown in the error (it may be a secret).

    Args:
        env: ``{NAME: VALUE}``.
        source: where they come from (``env``, ``cluster.env``), for the message.

    Raises:
        SubmitError: a bad name, or a value with a control character.
    """
    for name, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            _fail(source, name, "not a shell variable name", "use letters, digits and _ only")
        if match := _CONTROL.search(value):
            raise SubmitError(
                f"{source}: the value of {name} holds the control character "
                f"{match.group()!r} (value not shown), which would end its line of the sbatch "
                f"script. Fix: give {name} a single-line value"
            )


def sbatch_value(key: str, value) -> str:
    """``value`` written for ``#SBATCH --OPTION=VALUE`` so that sbatch reads back exactly
    ``value``: one with a space, ``#``, quote or backslash is written in double quotes, each
    ``#``, quote and backslash escaped with a backslash. Public for the launch code of other
    commands (``sweep --slurm``).

    Args:
        key: the flag or field the value comes from (named in an error).
        value: the value (``str(value)`` is written).

    Returns:
        The escaped text.

    Raises:
        SubmitError: a control character (:func:`check_script_value`), or the word ``hetjob`` /
            ``packjob``, where sbatch would split the script into heterogeneous-job components
            whatever the quoting.
    """
    check_script_value(key, value)
    text = str(value)
    if match := _HETJOB_WORDS.search(text):
        _fail(
            key,
            text,
            f"holds {match.group()!r}: sbatch starts a heterogeneous-job component at any "
            "#SBATCH line holding it, quoted or not",
            "choose a name or directory without 'hetjob' and 'packjob'",
        )
    if not _SBATCH_SPECIAL.search(text):
        return text
    return '"' + _SBATCH_ESCAPED.sub(r"\\\1", text) + '"'


def check_log_dir(key: str, path: str) -> None:
    """Refuse a ``%`` in the directory of a job's ``--output`` file, where SLURM would read it as
    a filename pattern (``%j``: the job id) and write the log elsewhere.

    Raises:
        SubmitError: the path holds ``%``.
    """
    if "%" in path:
        _fail(
            key,
            path,
            "holds '%', which SLURM reads as a filename pattern in the job's --output path",
            "choose a directory without '%'",
        )


def warn(message: str, command: str = "submit") -> None:
    """One ``megatron-gamma COMMAND: warning: ...`` line on stderr (the job is still rendered);
    ``command``: ``submit`` or ``submit-preprocess``."""
    print(f"megatron-gamma {command}: warning: {message}", file=sys.stderr, flush=True)


def time_limit_seconds(text: str) -> int:
    """Seconds in a SLURM time limit (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``).

    Raises:
        SubmitError: not one of those forms.
    """
    days, rest = text.split("-", 1) if "-" in text else ("0", text)
    parts = rest.split(":")
    if not days.isdigit() or not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        _fail("time", text, "not a SLURM time limit", "use MINUTES, HH:MM:SS or D-HH:MM:SS")
    nums = [int(p) for p in parts]
    if "-" in text:  # D-H, D-H:M, D-H:M:S
        h, m, s = (nums + [0, 0])[:3]
    elif len(nums) == 3:  # H:M:S
        h, m, s = nums
    else:  # M or M:S
        h, (m, s) = 0, (nums + [0])[:2]
    return ((int(days) * 24 + h) * 60 + m) * 60 + s


@dataclass
class ClusterOptions:
    """sbatch settings shared by every job."""

    account: Optional[str] = None
    """SLURM account to charge (``--account``; default: the user's default account)."""
    qos: Optional[str] = None
    """Quality of service (``--qos``; default: the account's)."""
    partition: Optional[str] = None
    """SLURM partition (default: the cluster's default partition)."""
    time: Optional[str] = None
    """Time limit (default: the partition's)."""
    dependency: Optional[str] = None
    """``--dependency``: ``singleton`` (one job of this name and user runs at a time: chain a
    run's resubmissions) or ``afterok:JOBID`` style expressions."""
    env: dict = field(default_factory=dict)
    """Extra ``KEY: VALUE`` exported in the job after the defaults (which it may override)."""
    container_image: Optional[str] = None
    """pyxis/enroot image (registry name or .sqsh file); None runs on the host."""
    container_mounts: Optional[str] = None
    """pyxis ``--container-mounts`` (host:container,...); needs container_image."""

    def __post_init__(self) -> None:
        for key in ("account", "qos", "partition"):
            value = getattr(self, key)
            if value is not None:
                sbatch_value(key, value)
            if value is not None and not _SLURM_NAMES.fullmatch(value):
                _fail(
                    key,
                    value,
                    "not a SLURM name (letters, digits, '_', '-' and '.'; several comma-separated)",
                    "pass the name as `sinfo -s` (partitions) or `sacctmgr show assoc "
                    "user=$USER` (accounts, QOS) lists it",
                )
        for key in ("container_image", "container_mounts"):
            check_script_value(key, getattr(self, key))
        if self.time is not None:
            time_limit_seconds(self.time)
        if self.dependency is not None and not _DEPENDENCY.fullmatch(self.dependency):
            _fail(
                "dependency",
                self.dependency,
                "not a SLURM dependency",
                "use 'singleton' or e.g. 'afterok:1234' (see sbatch --dependency)",
            )
        self.env = parse_env(self.env)
        check_env(self.env)
        if self.container_mounts and not self.container_image:
            _fail(
                "container_mounts",
                self.container_mounts,
                "given without container_image",
                "add --container-image IMAGE or drop --container-mounts",
            )


@dataclass
class PretrainJob(ClusterOptions):
    """Shape of a pretraining job."""

    nodes: Optional[int] = None
    """Nodes to allocate (None: the config's ``cluster.slurm_nodes``)."""
    gpus_per_node: Optional[int] = None
    """GPUs (= training processes) per node (None: the config's ``cluster.slurm_gpus_per_node``)."""
    launcher: str = "srun"
    """'srun' (one task per GPU) or 'torchrun' (one torchrun per node)."""
    warning_seconds: int = 300
    """SIGUSR1 this many seconds before the time limit (checkpoint, then requeue)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nodes is not None and self.nodes < 1:
            _fail("nodes", self.nodes, "must be >= 1", "pass --nodes 1 or more")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            _fail("gpus_per_node", self.gpus_per_node, "must be >= 1", "pass --gpus-per-node 1+")
        if self.launcher not in LAUNCHERS:
            _fail("launcher", self.launcher, "unknown launcher", "use 'srun' or 'torchrun'")
        if self.warning_seconds < 1:
            _fail("warning_seconds", self.warning_seconds, "must be >= 1", "use e.g. 300")
        if self.time is not None and self.warning_seconds >= time_limit_seconds(self.time):
            _fail(
                "warning_seconds",
                self.warning_seconds,
                f"not shorter than the time limit {self.time}",
                "lower --warning-seconds or raise --time",
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def with_cluster_defaults(self, cluster) -> PretrainJob:
        """This job with ``nodes``/``gpus_per_node`` taken from a config's ``cluster:`` section
        where not given.

        Raises:
            SubmitError: no node count in either.
        """
        nodes = self.nodes if self.nodes is not None else cluster.slurm_nodes
        if nodes is None:
            _fail(
                "nodes",
                None,
                "neither --nodes nor the config's cluster.slurm_nodes is set",
                "pass --nodes N or set cluster.slurm_nodes in the config",
            )
        gpus = self.gpus_per_node if self.gpus_per_node is not None else cluster.slurm_gpus_per_node
        return dataclasses.replace(self, nodes=nodes, gpus_per_node=gpus)


@dataclass
class PreprocessJob(ClusterOptions):
    """A sharded preprocessing run: ``num_shards`` array tasks, then one merge job."""

    inputs: list = field(default_factory=list)
    """Input files, directories or globs, in order (``preprocess --input``)."""
    options: list = field(default_factory=list)
    """The other ``preprocess`` arguments of every task (the tokenizer's among them), e.g.
    ``["--tokenizer-model=tok.json", "--json-keys", "text", "title"]``."""
    output_prefix: str = ""
    """``preprocess --output-prefix``: the shards are written beside it, then merged into it."""
    num_shards: int = 1
    """Array tasks (shards of the input documents)."""
    workers: int = 1
    """Tokenizer processes (and CPUs) per array task."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_shards < 1:
            _fail("num_shards", self.num_shards, "must be >= 1", "pass --num-shards 1 or more")
        if self.workers < 1:
            _fail("workers", self.workers, "must be >= 1", "pass --workers 1 or more")
        if not self.inputs:
            _fail("input", self.inputs, "no input files", "pass --input FILE.jsonl ...")
        if not self.output_prefix:
            _fail("output_prefix", self.output_prefix, "empty", "pass --output-prefix PATH")
        for path in self.inputs:
            check_script_value("input", path)
        for option in self.options:
            check_script_value("options", option)
        sbatch_value("output_prefix", self.output_prefix)
        check_log_dir("output_prefix", os.path.dirname(self.output_prefix))


@dataclass
class Submission:
    """What was (or, for a dry run, would be) submitted."""

    script_path: str
    script: str
    """The script; a dry run's with the environment values it was given redacted."""
    job_ids: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files("megatron_gamma.launch") / "templates")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        # bash uses {# (e.g. ${#ARRAY[@]}); keep it out of Jinja's comment syntax
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters["q"] = lambda value: shlex.quote("" if value is None else str(value))
    env.filters["sbatch"] = lambda value, key: sbatch_value(key, value)
    return env


def _check_values(key: str, value) -> None:
    """:func:`check_script_value` on every string in ``value`` (nested in lists, tuples and
    dicts)."""
    if isinstance(value, dict):
        for item in (*value.keys(), *value.values()):
            _check_values(key, item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_values(key, item)
    elif isinstance(value, str):
        check_script_value(key, value)


def render(template: str, **values) -> str:
    """Render ``templates/<template>`` with ``values`` (every placeholder must be given).

    Every string value is checked first (an ``env`` mapping by :func:`check_env`, its values not
    shown; any other by :func:`check_script_value`, named by its placeholder), and every
    ``#SBATCH`` value is written through :func:`sbatch_value`.

    Raises:
        SubmitError: a value with a control character, or a directive value sbatch would misread.
        jinja2.UndefinedError: a placeholder without a value.
    """
    for key, value in values.items():
        if key == "env":
            check_env(value)
        else:
            _check_values(key, value)
    return _environment().get_template(template).render(**values)


def _cluster_values(job: ClusterOptions) -> dict:
    """The template values every sbatch script takes from :class:`ClusterOptions`."""
    return {
        "account": job.account,
        "qos": job.qos,
        "partition": job.partition,
        "time": job.time,
        "dependency": job.dependency,
        "container_image": job.container_image,
        "container_mounts": job.container_mounts,
    }


def pretrain_env(job: PretrainJob, cfg: Optional[Config] = None) -> dict[str, str]:
    """Environment of a pretraining job, in export order: the defaults (``PYTHONFAULTHANDLER=1``,
    ``NCCL_DEBUG=WARN``; ``CUDA_DEVICE_MAX_CONNECTIONS=1`` when the config uses tensor or sequence
    parallelism, which megatron-core's TP communication needs on pre-Blackwell GPUs so that its
    kernels are issued in order), then the config's ``cluster.env``, then ``job.env``.

    Raises:
        SubmitError: a ``cluster.env`` value that a saved config holds redacted
            (:data:`~megatron_gamma.config.REDACTED`) and ``job.env`` does not give again, or a
            value with a control character.
    """
    env = {**BASE_ENV, **PRETRAIN_ENV}
    if cfg is not None:
        if cfg.parallel.tensor_model_parallel_size > 1 or cfg.parallel.sequence_parallel:
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
        check_env(cfg.cluster.env, "cluster.env")
        for name, value in cfg.cluster.env.items():
            if value == REDACTED and name not in job.env:
                raise SubmitError(
                    f"cluster.env: {name}={REDACTED}: the config was saved by megatron-gamma, "
                    f"which does not write environment values. Fix: pass --env {name}=VALUE, or "
                    "submit the config file that holds the value"
                )
        env.update(cfg.cluster.env)
    env.update(job.env)
    return env


def render_pretrain(
    job: PretrainJob,
    config: str,
    checkpoints: str,
    log: str,
    job_name: str,
    workdir: Optional[str] = None,
    header: tuple[str, ...] = (),
    env: Optional[dict] = None,
) -> str:
    """The pretraining sbatch script for ``job`` (see templates/pretrain.sbatch.j2).

    ``env`` is the job's whole environment block (default: :func:`pretrain_env` without a
    config).
    """
    return render(
        "pretrain.sbatch.j2",
        env=pretrain_env(job) if env is None else env,
        **_cluster_values(job),
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        tasks_per_node=job.gpus_per_node if job.launcher == "srun" else 1,
        launcher=job.launcher,
        warning_seconds=job.warning_seconds,
        config=config,
        checkpoints=checkpoints,
        log=log,
        job_name=job_name,
        workdir=workdir,
        header=header,
    )


def render_preprocess(
    job: PreprocessJob,
    log_dir: str,
    job_name: str,
    workdir: Optional[str] = None,
    header: tuple[str, ...] = (),
) -> str:
    """The array + merge sbatch script for ``job`` (see templates/preprocess_array.sbatch.j2)."""
    return render(
        "preprocess_array.sbatch.j2",
        env={**BASE_ENV, **job.env},
        **_cluster_values(job),
        inputs=job.inputs,
        options=job.options,
        output_prefix=job.output_prefix,
        num_shards=job.num_shards,
        workers=job.workers,
        log_dir=log_dir,
        job_name=job_name,
        workdir=workdir,
        header=header,
    )


def check_layout(cfg: Config, job: PretrainJob) -> int:
    """Check that ``nodes x gpus_per_node`` processes fit the config's parallel layout.

    Returns:
        The data-parallel size.

    Raises:
        SubmitError: the world size does not fit TP x PP or the batch sizes, or a tensor-parallel
            group would span nodes (TP must divide gpus_per_node).
    """
    tp = cfg.parallel.tensor_model_parallel_size
    if job.gpus_per_node % tp:
        _fail(
            "gpus_per_node",
            job.gpus_per_node,
            f"not divisible by tensor_model_parallel_size={tp} (a tensor-parallel group must stay "
            "inside one node)",
            f"use a multiple of {tp} GPUs per node or a smaller TP size",
        )
    try:
        return validate_layout(cfg, job.world_size, "--nodes x --gpus-per-node")
    except ConfigError as e:
        raise SubmitError(
            f"nodes x gpus_per_node = {job.nodes} x {job.gpus_per_node} = {job.world_size} "
            f"processes do not fit the parallel layout: {e}"
        ) from e


_NO_CONTROLLER = (
    "configuration source",
    "slurm controller",
    "resolve_ctls",
    "slurm_load_ctl_conf",
    "connection refused",
)
"""Lower-case fragments of sbatch's messages when it cannot reach a controller or read the
cluster's configuration (the job's settings are then not what is wrong)."""


def sbatch(*args: str) -> str:
    """Run ``sbatch --parsable ARGS``; return the job id.

    Raises:
        SubmitError: sbatch refused the job; the message holds sbatch's own and a fix that
            fits it: submit from a machine of the cluster when sbatch could not reach its
            controller or configuration (:data:`_NO_CONTROLLER`), else correct the setting
            sbatch names.
    """
    try:
        out = subprocess.run(
            ["sbatch", "--parsable", *args], capture_output=True, text=True, check=True
        ).stdout
    except subprocess.CalledProcessError as e:
        said = e.stderr.strip()
        if any(part in said.lower() for part in _NO_CONTROLLER):
            script = next((a for a in args if a.endswith(".sbatch")), "the script")
            fix = (
                "sbatch cannot reach the cluster's controller or configuration from this "
                "machine: submit from a login node of the cluster (`sinfo` there answers), or "
                f"run the same `sbatch` on {script} there (the file written here holds the "
                "--env values; a --dry-run printout shows them redacted)"
            )
        else:
            fix = "correct the setting sbatch names (partition, time, nodes, GPUs) and submit again"
        raise SubmitError(
            f"sbatch {' '.join(args)}: refused (exit code {e.returncode}): {said}. Fix: {fix}"
        ) from e
    return out.strip().split(";")[0]


def require_sbatch() -> None:
    """Check that ``sbatch`` is on PATH.

    Raises:
        SubmitError: it is not.
    """
    if shutil.which("sbatch") is None:
        _fail("sbatch", None, "not found on PATH", "run on a SLURM login node, or use --dry-run")


def write_executable(path: str, text: str, private: bool = False) -> None:
    """Write ``text`` to ``path`` through a temporary name and a rename, executable, with mode
    0777 (0700 when ``private``: the script holds environment values, which may be secrets)
    less the user's umask."""
    with atomic_path(path) as tmp:  # a fresh name: os.open's O_EXCL and mode apply
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700 if private else 0o777)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)


def _missing_host_paths(cfg: Config) -> list[str]:
    """Dataset files (``.bin``/``.idx`` of every blend prefix), the tokenizer and the
    pretrained checkpoint that do not exist on this host."""
    paths = []
    for key in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
        items = getattr(cfg.data, key)
        prefixes = items if len(items) == 1 else items[1::2]  # 'P' or 'W1 P1 W2 P2 ...'
        paths += [p + ext for p in prefixes for ext in (".bin", ".idx")]
    if cfg.data.tokenizer_model:
        paths.append(cfg.data.tokenizer_model)
    if cfg.checkpoint.pretrained_checkpoint:
        paths.append(cfg.checkpoint.pretrained_checkpoint)
    return [p for p in paths if not os.path.exists(p)]


def _container_workdir(job: ClusterOptions, command: str) -> str:
    """The job's working directory (this one); warns, as ``command`` (:func:`warn`), when a
    container would not see it."""
    workdir = os.getcwd()
    if job.container_image and not _mounted(workdir, job.container_mounts):
        warn(
            f"the working directory {workdir} is not in "
            + (
                f"--container-mounts {job.container_mounts!r}"
                if job.container_mounts
                else "the container (no --container-mounts)"
            )
            + "; the job runs there inside the container. Fix: add "
            f"--container-mounts {workdir}:{workdir}",
            command,
        )
    return workdir


def _mounted(path: str, mounts: Optional[str]) -> bool:
    """Whether a pyxis ``--container-mounts`` list (``host[:container[:flags]],...``) makes
    ``path`` visible at the same place inside the container."""
    for mount in filter(None, (mounts or "").split(",")):
        host, _, rest = mount.partition(":")
        inside = rest.partition(":")[0] or host
        if host == inside and os.path.commonpath([path, os.path.abspath(host)]) == os.path.abspath(
            host
        ):
            return True
    return False


def _finetune_as_pretrained_checkpoint(cfg: Config, checkpoints: str) -> Config:
    """``--finetune --load SRC`` (SRC not the job's save directory) as ``--pretrained-checkpoint
    SRC``: the same weights-only start, but a requeued job resumes from its own checkpoints
    instead of restarting from SRC at iteration 0 (Megatron-LM's ``--finetune`` reloads SRC on
    every start). Says so on stderr.

    Raises:
        SubmitError: ``--pretrained-checkpoint`` given as well (two weight sources), or SRC is
            the save directory (every requeue would restart from its newest checkpoint).
    """
    ck = cfg.checkpoint
    if not (ck.finetune and ck.load):
        return cfg
    if os.path.abspath(ck.load) == checkpoints:
        _fail(
            "finetune",
            True,
            f"with --load the job's own save directory {checkpoints}: every requeue would take "
            "the weights of its newest checkpoint again at iteration 0, with a fresh optimizer "
            "and schedule",
            "point --pretrained-checkpoint at the checkpoint to start from (outside the save "
            "directory) and drop --finetune",
        )
    if ck.pretrained_checkpoint:
        _fail(
            "pretrained_checkpoint",
            ck.pretrained_checkpoint,
            f"given with --finetune --load {ck.load}: two checkpoints to take the weights from",
            "keep one: --pretrained-checkpoint DIR alone (what a SLURM job should use)",
        )
    warn(
        f"--finetune --load {ck.load}: submitted as --pretrained-checkpoint {ck.load} (weights "
        f"only, iteration 0); a requeued job resumes from {checkpoints} instead of restarting "
        "from the pretrained weights"
    )
    return cfg.replace(finetune=False, pretrained_checkpoint=os.path.abspath(ck.load), load=None)


def _redaction_note(names, command: str, path: str) -> tuple[str, ...]:
    """Header lines of a dry run's printout whose environment values ``names`` are shown as
    ``<redacted>``: not a script to submit as printed, and where the real one goes."""
    if not names:
        return ()
    return (
        f"DRY RUN: the values of {', '.join(sorted(names))} are printed as {REDACTED};",
        "do not submit this printout. `megatron-gamma "
        f"{command}` without --dry-run writes the script",
        f"with them to {path}.",
    )


def _own_directories(cfg: Config, config_path: Optional[str | list[str]]) -> str:
    """The flags that give a submission its own run directory beside ``cfg``'s: ``--run-dir``
    named after the last ``--config`` file where several are layered (an ablation:
    ``runs/gpt-0.3b-gamma-0.5``), else ``RUN_DIR-2``, with ``--save`` and ``--load`` moved
    as ``pretrain`` moves them (:func:`~megatron_gamma.config.own_output_path`), shell-quoted."""
    files = [config_path] if isinstance(config_path, str) else config_path or []
    run_dir = os.path.normpath(cfg.logging.run_dir)
    layer = os.path.splitext(os.path.basename(files[-1]))[0] if len(files) > 1 else "2"
    new = f"{run_dir}-{layer}"
    flags = ["--run-dir", new]
    for key in ("save", "load"):
        if value := getattr(cfg.checkpoint, key):
            flags += [f"--{key}", own_output_path(value, run_dir, new)]
    return shlex.join(flags)


def check_frozen_config(frozen: str, script: str, cfg: Config, own_directories: str) -> None:
    """Refuse to replace an earlier submission's frozen config with one that trains other
    settings. A pending job of that submission, or one SLURM requeues, reads ``frozen`` when
    it starts (the script names it; sbatch keeps its own copy of the script, not of the
    config), so it would train this submission's settings under its own name, run directory
    and checkpoints. The same config again (a resubmission), or one that differs only in the
    job's shape and environment (the ``cluster`` section) or in ``overwrite``, passes; with
    ``cfg.checkpoint.overwrite`` (``--overwrite``) a differing one passes with a warning.

    Args:
        frozen: ``<run_dir>/slurm/config.yaml``; absent, nothing is checked.
        script: ``<run_dir>/slurm/pretrain.sbatch``, which a submission writes and a dry run
            does not; absent, ``frozen`` is a dry run's, which no job reads, and nothing is
            checked (trial 16: a dry run then blocked the real submission).
        cfg: the config this submission freezes there.
        own_directories: the flags that give this submission a run directory of its own
            (:func:`_own_directories`), for the fix.

    Raises:
        SubmitError: ``frozen`` holds other settings (each named with both values; the first
            eight), and no ``--overwrite``.
    """
    if not (os.path.isfile(frozen) and os.path.isfile(script)):
        return
    with open(frozen, encoding="utf-8") as f:
        try:
            then = yaml.safe_load(f)
        except yaml.YAMLError:
            then = None  # unreadable: every setting counts as changed
    now = yaml.safe_load(yaml.safe_dump(redacted_dict(cfg)))
    changes = [
        f"{name.split('.', 1)[-1]}={new!r} (it holds {old!r})"
        for name, old, new in changed_fields(then if isinstance(then, dict) else {}, now)
        if not any(name == key or name.startswith(f"{key}.") for key in _JOB_ONLY)
    ]
    if not changes:
        return
    listed = ", ".join(changes[:8]) + (f" and {len(changes) - 8} more" if len(changes) > 8 else "")
    if cfg.checkpoint.overwrite:
        warn(
            f"--overwrite: {frozen}, the config of an earlier submission, is replaced with "
            f"other settings: {listed}; a pending or requeued job of it trains these now"
        )
        return
    _fail(
        "run_dir",
        os.path.dirname(os.path.dirname(frozen)),
        f"{frozen} holds the config of an earlier submission, which this one would replace "
        f"with other settings: {listed}. A pending or requeued job of that submission reads it "
        "when it starts, so it would train these settings under its name, run directory and "
        "checkpoints",
        f"pass {own_directories} to submit a run of its own, or add --overwrite to replace "
        "that submission's config (its jobs then train this one, resuming from the "
        f"checkpoints in {cfg.checkpoint.save})",
    )


def submit_pretrain(
    config_path: Optional[str | list[str]],
    overrides: dict,
    job: PretrainJob,
    dry_run: bool = False,
) -> Submission:
    """Freeze the config, render the sbatch script into ``<run_dir>/slurm/`` and submit it.

    The job passes ``--save`` and ``--load`` the same checkpoint directory (``checkpoint.save``,
    default ``<run_dir>/checkpoints``), so a requeued or resubmitted job resumes automatically.
    Nodes and GPUs per node not given in ``job`` come from the config's ``cluster:`` section;
    the frozen config records the job's (``cluster.slurm_nodes``, ``slurm_gpus_per_node``).

    Args:
        config_path: YAML config file(s), layered in order (as for ``pretrain``).
        overrides: ``{field: value}`` Megatron-named overrides (as for ``pretrain``).
        job: nodes, GPUs, launcher and cluster options.
        dry_run: render the script (the values of ``cluster.env`` and ``job.env`` redacted)
            and write the resolved config it references (``<run_dir>/slurm/config.yaml``,
            refused as a submission's is where it would replace an earlier submission's other
            settings: :func:`check_frozen_config`); submit nothing. Dataset and tokenizer paths
            that do not exist on this host (they may live on the cluster's file system) are
            warnings.

    Returns:
        The script, its path, and (unless ``dry_run``) the job id and log path.

    Raises:
        ConfigError: a missing or invalid config, a reused run config's output paths under a
            new ``--run-dir`` (:func:`~megatron_gamma.config.check_run_dir_outputs`), or (unless
            ``dry_run`` or with a container image) dataset files that do not exist on this host.
        SubmitError: no node count, the job does not fit the config's layout, a frozen config
            of an earlier submission in ``<run_dir>/slurm/`` with other settings, unless
            ``--overwrite`` (:func:`check_frozen_config`; nothing is written), ``checkpoint.load``
            differs from ``checkpoint.save`` (except with ``--finetune``: see
            :func:`_finetune_as_pretrained_checkpoint`), (unless ``dry_run`` or with a container
            image) a pretrained checkpoint that does not exist on this host, ``sbatch`` is
            missing or rejects the script.
    """
    cfg = load_config(config_path, overrides)
    check_run_dir_outputs(cfg, config_path, overrides)
    job = job.with_cluster_defaults(cfg.cluster)
    check_layout(cfg, job)
    run_dir = os.path.abspath(cfg.logging.run_dir)
    sbatch_value("run_dir", run_dir)  # in the job's --output (and, its name, --job-name)
    check_log_dir("run_dir", run_dir)
    checkpoints = os.path.abspath(cfg.checkpoint.save or os.path.join(run_dir, "checkpoints"))
    check_script_value("save", checkpoints)
    cfg = _finetune_as_pretrained_checkpoint(cfg, checkpoints)
    if dry_run:
        for path in _missing_host_paths(cfg):
            warn(f"{path} does not exist on this host; the job needs it on the cluster")
    elif not job.container_image:
        cfg.data.blend()
        pretrained = cfg.checkpoint.pretrained_checkpoint
        if pretrained and not os.path.exists(pretrained):
            _fail(
                "pretrained_checkpoint",
                pretrained,
                "does not exist",
                "give the checkpoint directory the job starts from (or --dry-run to render "
                "a script for another host)",
            )
    workdir = _container_workdir(job, "submit")
    if cfg.checkpoint.load and os.path.abspath(cfg.checkpoint.load) != checkpoints:
        _fail(
            "load",
            cfg.checkpoint.load,
            f"differs from the save directory {checkpoints}; a requeued job resumes from --load",
            f"pass --load {shlex.quote(checkpoints)} (the job resumes from its own save "
            "directory), or --save the same path as load (to continue that run); a --load given "
            "only to start from other weights is --pretrained-checkpoint",
        )
    own_directories = _own_directories(cfg, config_path)
    cfg = cfg.replace(
        run_dir=run_dir,
        save=checkpoints,
        load=checkpoints,
        slurm_nodes=job.nodes,
        slurm_gpus_per_node=job.gpus_per_node,
    )
    slurm_dir = os.path.join(run_dir, SLURM_SUBDIR)
    frozen = os.path.join(slurm_dir, "config.yaml")
    path = os.path.join(slurm_dir, "pretrain.sbatch")
    check_frozen_config(frozen, path, cfg, own_directories)
    log = os.path.join(slurm_dir, "%x-%j.out")
    job_name = f"mg-{os.path.basename(run_dir)}"
    env = pretrain_env(job, cfg)
    header = (
        "Written by `megatron-gamma submit`; the config is frozen in CONFIG. Resubmit with",
        "`sbatch THIS_FILE`: the job resumes from the newest checkpoint in CHECKPOINTS.",
    )
    redacted = {*cfg.cluster.env, *job.env}
    if dry_run:  # printed: the given values (secrets, maybe) stay out of terminals and CI logs
        env = {k: REDACTED if k in redacted else v for k, v in env.items()}
        header += _redaction_note(redacted, "submit", path)
    script = render_pretrain(
        job,
        config=frozen,
        checkpoints=checkpoints,
        log=log,
        job_name=job_name,
        workdir=workdir,
        header=header,
        env=env,
    )
    result = Submission(path, script)
    if not dry_run:
        require_sbatch()
    os.makedirs(slurm_dir, exist_ok=True)
    save_config(cfg, frozen)
    if dry_run:
        return result
    write_executable(path, script, private=bool(cfg.cluster.env or job.env))
    job_id = sbatch(path)
    result.job_ids.append(job_id)
    result.logs.append(log.replace("%x", job_name).replace("%j", job_id))
    return result


def submit_preprocess(job: PreprocessJob, dry_run: bool = False) -> Submission:
    """Render the array + merge script next to the output prefix and submit both jobs.

    The outputs are those of ``preprocess --num-shards N`` on one machine: array task i runs
    ``preprocess --shard-index i``, writing ``<output_prefix>-shard<iiiii>-of-<nnnnn>_*``, and the
    merge job (``afterok`` on the whole array, cancelled if a shard fails) runs ``merge
    --output-prefix <output_prefix> --num-shards N``: the merged datasets, their statistics and
    blend. With one shard, its task writes ``output_prefix`` and no merge job is submitted.

    Returns:
        The script (a dry run's with the ``env`` values redacted), its path, and (unless
        ``dry_run``) the array and merge job ids and the logs.

    The inputs, options and output prefix are the caller's to check (``megatron-gamma
    submit-preprocess`` checks them as ``preprocess`` does:
    :func:`megatron_gamma.data.commands.check_submit_preprocess`).

    Raises:
        SubmitError: ``sbatch`` missing or rejecting a job.
    """
    job = dataclasses.replace(
        job,
        inputs=[os.path.abspath(p) for p in job.inputs],
        output_prefix=os.path.abspath(job.output_prefix),
    )
    base = os.path.basename(job.output_prefix)
    slurm_dir = os.path.join(os.path.dirname(job.output_prefix), SLURM_SUBDIR)
    job_name = f"mg-prep-{base}"
    path = os.path.join(slurm_dir, f"preprocess-{base}.sbatch")
    header = ("Written by `megatron-gamma submit-preprocess`.",)
    script = render_preprocess(
        dataclasses.replace(job, env=dict.fromkeys(job.env, REDACTED)) if dry_run else job,
        log_dir=slurm_dir,
        job_name=job_name,
        workdir=_container_workdir(job, "submit-preprocess"),
        header=header + (_redaction_note(job.env, "submit-preprocess", path) if dry_run else ()),
    )
    result = Submission(path, script)
    if dry_run:
        return result
    require_sbatch()
    os.makedirs(slurm_dir, exist_ok=True)
    write_executable(path, script, private=bool(job.env))
    array_id = sbatch(
        f"--array=0-{job.num_shards - 1}", f"--output={slurm_dir}/%x-%A_%a.out", path, "shard"
    )
    result.job_ids.append(array_id)
    result.logs.append(os.path.join(slurm_dir, f"{job_name}-{array_id}_<i>.out"))
    if job.num_shards == 1:
        return result
    try:
        merge_id = sbatch(
            f"--dependency=afterok:{array_id}",
            "--kill-on-invalid-dep=yes",
            f"--output={slurm_dir}/%x-merge-%j.out",
            path,
            "merge",
        )
    except SubmitError:
        subprocess.run(["scancel", array_id], check=False)
        raise
    result.job_ids.append(merge_id)
    result.logs.append(os.path.join(slurm_dir, f"{job_name}-merge-{merge_id}.out"))
    return result


def example_scripts() -> dict[str, str]:
    """``examples/slurm/`` file name -> text: the templates rendered with example values."""
    pretrain = render_pretrain(
        PretrainJob(nodes=2, gpus_per_node=8, partition="batch", time="04:00:00"),
        config="examples/configs/demo.yaml",
        checkpoints="runs/demo/checkpoints",
        log="%x-%j.out",
        job_name="megatron-gamma",
        header=(
            "Example: edit the #SBATCH lines and the variables below, then",
            "`sbatch examples/slurm/pretrain.sbatch` from the repository root.",
            "`megatron-gamma submit --config FILE.yaml --nodes N --gpus-per-node G` writes this",
            "script from a config (templates/pretrain.sbatch.j2 in megatron_gamma/launch/).",
        ),
    )
    preprocess = render_preprocess(
        PreprocessJob(
            inputs=[f"corpus/{lang}-{i:02d}.jsonl" for lang in ("en", "zh") for i in range(4)],
            options=["--tokenizer-model=megatron_gamma/data/demo/tokenizer.json"],
            output_prefix="data/corpus",
            num_shards=8,
            workers=4,
            partition="cpu",
            time="02:00:00",
        ),
        log_dir="logs",
        job_name="megatron-gamma-preprocess",
        header=(
            "Example: edit the variables below, then `bash examples/slurm/preprocess_array.sbatch`",
            "from the repository root.",
            "`megatron-gamma submit-preprocess` writes and submits this script for you.",
        ),
    )
    return {"pretrain.sbatch": pretrain, "preprocess_array.sbatch": preprocess}
