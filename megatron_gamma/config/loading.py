"""The whole run's :class:`Config` and how one is built: from a nested dict
(:func:`config_from_dict`), from YAML files and flag overrides (:func:`load_config`), rebuilt with
changes (:meth:`Config.replace`), and saved as ``config.yaml``."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import shlex
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from megatron_gamma.atomic import atomic_open
from megatron_gamma.config.choices import Choice, base_type, type_hints
from megatron_gamma.config.errors import ConfigError, fail
from megatron_gamma.config.file_kinds import keys_of_the_other_kind
from megatron_gamma.config.schedule import check_schedule_units, drop_alternatives
from megatron_gamma.config.sections import (
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    InitConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    TrainingConfig,
)


@dataclass(frozen=True)
class Config:
    """The whole run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    init: InitConfig = field(default_factory=InitConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        check_schedule_units(self)
        if self.parallel.use_distributed_optimizer and self.optimizer.optimizer == "sgd":
            fail(
                "use_distributed_optimizer",
                True,
                "megatron-core's DistributedOptimizer shards Adam's state only, and refuses "
                "optimizer='sgd' when it is built",
                "--optimizer adam, or leave out --use-distributed-optimizer",
            )

    def to_dict(self) -> dict:
        """Plain nested dict (what ``load_config`` reads back)."""
        return dataclasses.asdict(self)

    def replace(self, **fields: Any) -> Config:
        """A new validated Config with ``fields`` changed, keyed by field name (the flag name
        underscored, unique across sections): ``cfg.replace(tensor_model_parallel_size=1)``.

        The one way to rebuild a config: the config is rebuilt through :func:`config_from_dict`
        from :meth:`to_dict` (resolved values: a derived default such as ``ffn_hidden_size``
        keeps its value unless changed too), so every check of every section and of the whole
        config runs again (``dataclasses.replace`` on a section would re-check that section
        only, and an edited :meth:`to_dict` is this method spelled out); configs are frozen and
        never edited in place. A field of :data:`~megatron_gamma.config.schedule.UNIT_ALTERNATIVES`
        given a value replaces its alternatives, as the flag does in :func:`load_config`
        (``replace(train_samples=N)`` drops ``train_iters``; ``replace(train_samples=None)``
        keeps it).

        Raises:
            ConfigError: an unknown field, or a combination that fails validation.
        """
        changes = sectioned(fields)
        base = self.to_dict()
        drop_alternatives(base, changes)
        return config_from_dict(merge(base, changes))


def changed_fields(old: dict, new: dict, at: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted name, old value, new value) of every entry that differs between two nested
    dicts, descending into the dicts both hold, in sorted key order."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_fields(a, b, f"{at}{key}.")
        elif a != b:
            out.append((f"{at}{key}", a, b))
    return out


def merge(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` merged in, recursively for nested mappings (neither is
    modified): the dict step of :meth:`Config.replace`."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


CONFIG = "config.yaml"
"""The resolved config a run writes into its run directory (:func:`save_config`)."""


@functools.cache
def section_types() -> types.MappingProxyType:
    """Map section name -> its dataclass (read-only, computed once)."""
    hints = type_hints(Config)
    return types.MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(Config)})


@functools.cache
def field_index() -> types.MappingProxyType:
    """Map field name -> (section, Field, resolved type) (read-only, computed once)."""
    index = {}
    for section, cls in section_types().items():
        hints = type_hints(cls)
        for f in dataclasses.fields(cls):
            index[f.name] = (section, f, hints[f.name])
    return types.MappingProxyType(index)


def _unknown(
    key: str,
    known: list[str],
    where: str,
    keys: tuple[str, ...] = (),
    elsewhere: Optional[dict[str, str]] = None,
) -> None:
    """Raise the unknown-key error of ``key`` (at ``where``), suggesting the closest of ``known``
    or of ``elsewhere`` (other sections' keys: ``{key: section}``), the latter with its
    section."""
    close = difflib.get_close_matches(key, [*known, *(elsewhere or {})], n=1)
    if close and close[0] not in known:
        other = elsewhere[close[0]]
        hint = f"did you mean '{close[0]}', a setting of the {other}: section ({other}.{close[0]})?"
    elif close:
        hint = f"did you mean '{close[0]}'?"
    else:
        hint = f"known keys: {', '.join(sorted(known))}"
    raise ConfigError(f"{where}{key}: unknown key. Fix: remove it or correct it; {hint}", keys)


_EXAMPLES = {int: "an integer, e.g. 64", float: "a number, e.g. 3.0e-4", bool: "true or false"}


def typed_value(where: str, key: str, value: Any, tp: Any) -> Any:
    """``value`` as the field type ``tp`` wants it, or a ConfigError naming key and type.

    YAML 1.1 reads ``3e-4`` (no dot) as a string: a float field accepts any string that parses
    as a number, and an int where a float is wanted."""
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType)
    base = base_type(tp)
    base = typing.get_origin(base) or base
    if value is None and optional:
        return value
    if base is float and isinstance(value, int | str) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    elif base in (list, dict) and isinstance(value, str):
        return value
    elif base is str and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # e.g. YAML 'moe_layer_freq: 2'; the section checks it
    elif isinstance(base, type) and issubclass(base, Choice) and isinstance(value, str):
        return value  # the section's check_choices names the members
    elif base is dict and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value  # a repeated KEY=VALUE flag; the section parses it
    elif isinstance(value, base) and not (base is int and isinstance(value, bool)):
        return value
    expected = f"{base.__name__}{' or null' if optional else ''}"
    raise ConfigError(
        f"{where}{key}={value!r}: expected {expected}, got {type(value).__name__}. "
        f"Fix: write {key} as {_EXAMPLES.get(base, 'a ' + base.__name__)}",
        (key,),
    )


def config_from_dict(raw: dict) -> Config:
    """Build and validate a :class:`Config` from a nested dict (YAML layout).

    Raises:
        ConfigError: an unknown section or key, a value of the wrong type (naming the key and
            the expected type), or a value failing its section's checks.
    """
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config: expected a mapping of sections, got {type(raw).__name__}")
    types_, index = section_types(), field_index()
    kwargs = {}
    for section, values in raw.items():
        if section not in types_:
            _unknown(section, list(types_), "section ")
        cls = types_[section]
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values or {}:
            if key in index and key not in names:  # a key of another section (trial 15)
                other = index[key][0]
                raise ConfigError(
                    f"{section}.{key}: not a setting of the {section} section; {key} belongs in "
                    f"the {other}: section. Fix: move '{key}: {values[key]}' under '{other}:' "
                    f"({other}.{key})",
                    (f"{section}.{key}",),  # load_config names its file
                )
            if key not in names:  # load_config names its file
                elsewhere = {k: v[0] for k, v in index.items() if v[0] != section}
                _unknown(key, names, f"{section}.", (key,), elsewhere)
        hints = type_hints(cls)
        values = {k: typed_value(f"{section}.", k, v, hints[k]) for k, v in (values or {}).items()}
        try:
            kwargs[section] = cls(**values)
        except TypeError as e:
            raise ConfigError(f"{section}: {e}. Fix: check the value types") from e
    return Config(**kwargs)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data only) that refuses a key given twice in one mapping,
    where PyYAML keeps the last value silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *base': its keys may be given again, as YAML intends
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # PyYAML's own construct_mapping names the unhashable key
            line = key_node.start_mark.line + 1
            if key in first:
                raise ConfigError(
                    f"config={self.name!r}: line {line}: {key} is given twice in one mapping "
                    f"(first on line {first[key]}; YAML would keep the last silently). "
                    f"Fix: keep one {key} there"
                )
            first[key] = line
        return super().construct_mapping(node, deep=deep)


def _yaml_syntax_error(path: str, e: yaml.YAMLError) -> str:
    """The message for YAML that does not load: the file, the line and column PyYAML stopped at
    (its ``problem_mark``), what it found there, where the unclosed construct began, and the
    fix (the syntax, or a value that is not plain data)."""
    if not isinstance(e, yaml.MarkedYAMLError) or e.problem_mark is None:
        # a ReaderError: a character YAML does not allow, its position in the message
        return f"config={path!r}: not valid YAML ({e}). Fix: remove that character from the file"
    mark, begun = e.problem_mark, e.context_mark
    at = f"line {mark.line + 1}, column {mark.column + 1}"
    opened = (
        f" ({e.context} that began at line {begun.line + 1}, column {begun.column + 1})"
        if e.context and begun
        else ""
    )
    if isinstance(e, yaml.constructor.ConstructorError):  # parsed, but not plain data
        what = "write plain data there: no '!!' tag, only plain names as keys"
    else:
        what = (
            f"edit the file {'there or where that began' if opened else 'there'}: close "
            "brackets and quotes, indent with spaces (no tabs), write 'key: value' with a space "
            "after the colon"
        )
    return f"config={path!r}: not valid YAML at {at}: {e.problem}{opened}. Fix: {what}"


def read_yaml(path: str) -> dict:
    """The sections of a YAML config file, each a mapping (or empty).

    Raises:
        ConfigError: a missing file, bad YAML, a key given twice in one mapping (its line), a
            study file (:func:`~megatron_gamma.config.file_kinds.keys_of_the_other_kind`), or a
            top-level entry that is not a section (a setting named with its section)."""
    if os.path.isdir(path):
        inside = os.path.join(path, CONFIG)
        fix = f"pass {inside}, the run's resolved config" if os.path.isfile(inside) else (
            "pass a YAML file to --config"
        )  # fmt: skip
        fail("config", path, "is a directory", fix)
    if not os.path.isfile(path):
        fail("config", path, "file not found", "pass an existing YAML file to --config")
    with open(path, encoding="utf-8") as f:
        try:
            raw = yaml.load(f, Loader=_UniqueKeyLoader) or {}
        except yaml.YAMLError as e:
            raise ConfigError(_yaml_syntax_error(path, e)) from e
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config={path!r}: expected a mapping of sections, got {type(raw).__name__}. "
            "Fix: see examples/configs/demo.yaml"
        )
    sections, index = section_types(), field_index()
    study = keys_of_the_other_kind(raw, list(sections), "pretrain")
    if len(study) > 1:  # one could be a stray key: the unknown-key error below names it
        raise ConfigError(
            f"config={path!r}: keys {', '.join(study)} make it a study file, not a pretrain "
            f"config. Fix: run it with `megatron-gamma sweep {path} --output-dir DIR`, or pass "
            "--config a pretrain config (examples/configs/*.yaml)"
        )
    for key, value in raw.items():
        if isinstance(value, dict | None):
            continue
        if key in sections:
            raise ConfigError(
                f"config={path!r}: section {key}: expected a mapping of its settings, got "
                f"{value!r}. Fix: write each setting on its own indented line under '{key}:'"
            )
        if key in index:
            section = index[key][0]
            raise ConfigError(
                f"config={path!r}: {key}: a setting of the {section} section, given at the top "
                f"level. Fix: move it into its section, '{key}: {value}' indented under "
                f"'{section}:' ({section}.{key})"
            )
        named = {**{s: s for s in sections}, **{k: f"{index[k][0]}.{k}" for k in index}}
        close = difflib.get_close_matches(str(key), list(named), n=1)
        hint = f"did you mean {named[close[0]]!r}?" if close else f"sections: {', '.join(sections)}"
        raise ConfigError(
            f"config={path!r}: {key}: unknown key. Fix: remove it or correct it; {hint}"
        )
    return raw


def sectioned(overrides: dict) -> dict:
    """``{field name: value}`` overrides as a YAML layer, ``{section: {field name: value}}``.

    Raises:
        ConfigError: an unknown field name (with the closest known one).
    """
    index = field_index()
    layer: dict = {}
    for key, value in overrides.items():
        if key not in index:
            _unknown(key, list(index), "")
        layer.setdefault(index[key][0], {})[key] = value
    return layer


def layered(layers: list[dict]) -> dict:
    """The nested dict that YAML layers (``{section: {key: value}}``, e.g. :func:`read_yaml`'s,
    then :func:`sectioned` flags) give when laid over one another in order, key by key; a layer
    that gives one of Megatron-LM's alternatives (``train_samples`` for ``train_iters``, ...)
    drops the others from the layers under it (:func:`drop_alternatives`). The layers are not
    modified."""
    raw: dict = {}
    for layer in layers:
        drop_alternatives(raw, layer)
        for section, values in layer.items():
            raw.setdefault(section, {}).update(values or {})
    return raw


def load_config(path: Optional[str | list[str]], overrides: Optional[dict] = None) -> Config:
    """Read YAML config file(s) and apply ``{field_name: value}`` overrides (flag names,
    underscored).

    Args:
        path: a YAML file, a list of them (later files override earlier ones key by key, e.g. a
            recipe then an ablation file), or None for all defaults.
        overrides: values that replace the files', keyed by field name (unique across sections).
            A later file or an override that gives one of Megatron-LM's alternatives
            (:data:`UNIT_ALTERNATIVES`, e.g. ``train_samples``, ``lr_warmup_fraction``) replaces
            the others (``train_iters``; ``lr_warmup_iters``, ``lr_warmup_samples``) from the
            layers under it.

    Raises:
        ConfigError: missing file, bad YAML, unknown key, or an invalid value.
    """
    origin: dict[str, str] = {}
    layers = []
    for one in [path] if isinstance(path, str) else path or []:
        layers.append(read_yaml(one))
        for section, values in layers[-1].items():
            for k in values or {}:
                origin[k] = f"{section}.{k} of the YAML file {one!r}"
                origin[f"{section}.{k}"] = f"the YAML file {one!r}"
    flags = sectioned(overrides or {})
    origin.update({key: f"the flag --{key.replace('_', '-')}" for key in overrides or {}})
    try:
        return config_from_dict(layered([*layers, flags]))
    except ConfigError as e:
        where = ", ".join(f"{k} from {origin[k]}" for k in e.keys if k in origin)
        if not where:
            raise
        raise ConfigError(f"{e} ({where})", e.keys) from e


def check_load_origin(cfg: Config, path: Optional[str | list[str]], overrides: dict) -> None:
    """Refuse a resume that only a YAML file asks for: ``load`` given by a ``--config`` file
    (not by ``--load``) that is not this run's ``save``, without ``--finetune``.

    Every run's ``config.yaml`` records the ``load`` it ran with, so a run's config.yaml
    reused as ``--config`` for a new run (its own ``--run-dir`` and ``--save``) would otherwise
    resume the old run's checkpoints without a word. A file whose ``load`` is its run's own
    ``save`` (the ``--save X --load X`` automatic resume: ``sweep``'s ``study-config.yaml``, a
    recipe such as ``examples/configs/gpt-0.1b.yaml``), ``--load`` on the command line, and
    ``--finetune`` (``load`` is then the weights to start from, at iteration 0) are kept.
    Pure path arithmetic (relative paths from the working directory, as ``pretrain`` opens
    them): it runs before torch and megatron-core are imported.

    Args:
        cfg: the run config :func:`load_config` built from ``path`` and ``overrides``.
        path: the ``--config`` file(s), as given to :func:`load_config`.
        overrides: the command-line values, keyed by field name.

    Raises:
        ConfigError: naming the file, both directories and the two fixes (``--load`` on the
            command line to resume from those checkpoints, or no ``load`` in the file to start
            fresh).
    """
    ck = cfg.checkpoint
    if not ck.load or ck.finetune or "load" in overrides:
        return
    if ck.save and os.path.realpath(ck.load) == os.path.realpath(ck.save):
        return
    files = [path] if isinstance(path, str) else path or []
    named = [f for f in files if "load" in (read_yaml(f).get("checkpoint") or {})]
    source = f"the YAML file {named[-1]!r}" if named else "a YAML file"
    save = f"this run's save={ck.save!r}" if ck.save else "this run's save (none)"
    own = f"--load {shlex.quote(ck.save)}" if ck.save else "--save DIR --load DIR"
    if ck.pretrained_checkpoint:  # trial 14: the weights come from there, not from `load`
        fix = (
            f"pass {own}: with --pretrained-checkpoint the run starts from "
            f"{ck.pretrained_checkpoint!r}'s weights while its own save directory holds no "
            "checkpoint, and resumes from that directory after"
        )
    else:
        fix = (
            f"pass {own} for a run of its own (it resumes from its save directory, and starts "
            f"fresh while that holds no checkpoint), --load {shlex.quote(ck.load)} on the command "
            "line to start from those checkpoints, or remove `load` from the file (or from a copy "
            "of it)"
        )
    raise ConfigError(
        f"load={ck.load!r}: comes from {source} (checkpoint.load), not from --load, and is not "
        f"{save}: this run would resume another run's checkpoints (a run's config.yaml records "
        f"the load it ran with). Fix: {fix}",
        ("load",),
    )


def check_run_dir_outputs(cfg: Config, path: Optional[str | list[str]], overrides: dict) -> None:
    """Refuse a new ``--run-dir`` whose ``--config`` file keeps its own run's output paths.

    A run's ``config.yaml`` names that run's ``run_dir`` and the directories it wrote and
    resumed (``save``, ``load`` = ``save``, ...), most of them inside that ``run_dir``. Reused
    as ``--config`` with only a new ``--run-dir``, it would resume the old run's checkpoints and
    save into its directory (outside this run's ``run_dir`` lock, so beside a still-running
    first run), while the new ``run_dir``'s config.yaml and curves describe another run.
    Refused, before torch is imported, when ``run_dir`` is given on the command line and differs
    from the last ``--config`` file's, and one of these values from the files lies inside
    the file's ``run_dir``: ``save``, ``load``, ``tensorboard_dir``, ``wandb_save_dir``,
    ``data_cache_path``; ``save`` and ``load`` are refused outside it too (a recipe's
    ``/checkpoints/gpt-0.3b`` layered with an ablation file under ``--run-dir
    runs/gpt-0.3b-gamma-0.5`` would write the ablation's checkpoints among the baseline's, or
    resume the baseline's), with their sibling named after the new ``run_dir``
    (``/checkpoints/gpt-0.3b-gamma-0.5``) as the fix, or ``--save``'s value for ``load`` (and
    ``--load``'s for ``save``).
    Giving such a field on the command line (even the same value: to continue that run's
    checkpoints on purpose) keeps it.

    Args:
        cfg: the run config :func:`load_config` built from ``path`` and ``overrides``.
        path: the ``--config`` file(s), as given to :func:`load_config`.
        overrides: the command-line values, keyed by field name.

    Raises:
        ConfigError: naming each such field, its value, the file's ``run_dir`` and the flags
            that put it under this run's ``run_dir``.
    """
    if "run_dir" not in overrides:
        return
    files = [path] if isinstance(path, str) else path or []
    named = [(f, d) for f in files if (d := (read_yaml(f).get("logging") or {}).get("run_dir"))]
    if not named:
        return
    source, run_dir = named[-1]
    old, new = os.path.realpath(run_dir), os.path.realpath(cfg.logging.run_dir)
    if old == new:
        return
    ck, log = cfg.checkpoint, cfg.logging
    values = {
        "save": ck.save,
        "load": ck.load,
        "tensorboard_dir": log.tensorboard_dir,
        "wandb_save_dir": log.wandb_save_dir,
        "data_cache_path": cfg.data.data_cache_path,
    }
    moved = {}  # field -> where this run's own would go
    for key, value in values.items():
        if key in overrides or not isinstance(value, str):
            continue
        if os.path.commonpath([old, os.path.realpath(value)]) == old:
            moved[key] = own_output_path(value, run_dir, cfg.logging.run_dir)
        elif key == "load" and "save" in overrides:
            moved[key] = ck.save
        elif key == "save" and "load" in overrides:
            moved[key] = ck.load
        elif key in ("save", "load"):
            moved[key] = own_output_path(value, run_dir, cfg.logging.run_dir)
    if not moved:
        return
    listed = ", ".join(f"{key}={values[key]!r}" for key in moved)
    fix = " ".join(f"--{key.replace('_', '-')} {shlex.quote(v)}" for key, v in moved.items())
    keep = " ".join(f"--{key.replace('_', '-')} {shlex.quote(values[key])}" for key in moved)
    raise ConfigError(
        f"{listed}: from the YAML file {source!r}, whose run_dir={run_dir!r}, while this run's "
        f"--run-dir is {cfg.logging.run_dir!r}: this run would write into or resume from "
        f"that run's directories. Fix: pass {fix} for a run of its own, or {keep} to use that "
        "run's on purpose",
        tuple(moved),
    )


def own_output_path(path: str, run_dir: str, new_run_dir: str) -> str:
    """Where a run under ``new_run_dir`` keeps what ``path`` holds for the run under
    ``run_dir``: the same place inside ``new_run_dir`` for a path inside ``run_dir``
    (``runs/a/checkpoints`` -> ``runs/b/checkpoints``), else ``path``'s sibling named after
    ``new_run_dir``'s last component (``/checkpoints/gpt-0.3b`` for
    ``runs/gpt-0.3b-gamma-0.5`` -> ``/checkpoints/gpt-0.3b-gamma-0.5``), or ``new_run_dir``'s
    ``checkpoints`` where that name is ``path``'s own.

    Args:
        path: a directory of the run under ``run_dir`` (``save``, ``load``, ...).
        run_dir: that run's directory.
        new_run_dir: the other run's directory.

    Returns:
        The path for the run under ``new_run_dir``, relative where ``new_run_dir`` is.
    """
    old, real = os.path.realpath(run_dir), os.path.realpath(path)
    if os.path.commonpath([old, real]) == old:
        return os.path.join(new_run_dir, os.path.relpath(real, old))
    name = os.path.basename(os.path.normpath(new_run_dir))
    sibling = os.path.join(os.path.dirname(os.path.normpath(path)), name)
    if os.path.realpath(sibling) == real:
        return os.path.join(new_run_dir, "checkpoints")
    return sibling


REDACTED = "<redacted>"
"""Written in place of every ``cluster.env`` value (which may be a secret: ``HF_TOKEN``,
``WANDB_API_KEY``) in a saved config, the W&B run config, an export and a log; names are kept."""


def redacted_dict(cfg: Config) -> dict:
    """:meth:`Config.to_dict` with every ``cluster.env`` value replaced by :data:`REDACTED`: what
    ``config.yaml``, the W&B run config and ``export-hf`` record (``submit`` refuses such a
    value until ``--env NAME=VALUE`` gives it again)."""
    raw = cfg.to_dict()
    raw["cluster"]["env"] = dict.fromkeys(raw["cluster"]["env"], REDACTED)
    return raw


def save_config(cfg: Config, path: str) -> None:
    """Write the resolved config as YAML (:func:`~megatron_gamma.atomic.atomic_open`),
    ``cluster.env`` values redacted (:func:`redacted_dict`)."""
    with atomic_open(path, encoding="utf-8") as f:
        yaml.safe_dump(redacted_dict(cfg), f, sort_keys=False, allow_unicode=True)
