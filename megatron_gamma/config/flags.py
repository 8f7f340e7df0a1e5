"""Command-line flags generated from the config: one ``--field-name`` per field, its help the
field's docstring (as Megatron-LM's ``argument_utils`` builds argparse from dataclasses)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import typing
from typing import Any

from megatron_gamma.config.choices import REFUSED_CHOICES, Choice, base_type
from megatron_gamma.config.loading import field_index, section_types


@functools.cache
def _class_definitions(path: str) -> dict[str, ast.ClassDef]:
    """{name: definition} of the top-level classes of one source file, parsed once per file
    (``inspect.getsource`` of a class parses its whole module again on every call)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring} of a config dataclass, read from the string literal under
    each field in the source (as Megatron-LM's ``argument_utils`` does); empty when the source
    is unavailable or the class is not defined at its module's top level."""
    try:
        definition = _class_definitions(inspect.getsourcefile(cls)).get(cls.__qualname__)
    except (OSError, TypeError):
        return {}
    if definition is None:
        return {}
    body = definition.body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _plain(doc: str) -> str:
    """A docstring as terminal text: Sphinx roles (``:mod:`~a.b``` -> ``a.b``) and double
    backquotes dropped."""
    return re.sub(r":[a-z]+:`~?([^`]*)`", r"\1", doc).replace("``", "")


def _help(section: str, f: dataclasses.Field, base: Any) -> str:
    cls = section_types()[section]
    doc = _plain(field_docs(cls).get(f.name, ""))
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    parts = [doc] if doc else []
    if isinstance(base, type) and issubclass(base, Choice):
        parts.append(f"Choices: {base.help()}.")
    default = default.value if isinstance(default, Choice) else default
    if default is None and re.search(r"\bdefault\b", doc, re.IGNORECASE):
        # None stands for the default the docstring states (derived from other fields, e.g.
        # train_iters "(default 40; derived from train_samples ...)"): no second "default: None"
        parts.append(f"[{section}]")
    else:
        parts.append(f"[{section}; default: {default!r}]")
    return " ".join(parts).replace("%", "%%")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add one ``--field-name`` flag per config field (default: not given); its help is the
    field's docstring, its choices (with theirs) and its section and default (none where the
    default is None and the docstring states what it stands for)."""
    for name, (section, f, tp) in field_index().items():
        flag = "--" + name.replace("_", "-")
        base = base_type(tp)
        doc = _help(section, f, base)
        if base is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=doc
            )
        elif base is dict:
            parser.add_argument(
                flag, dest=name, action="append", metavar="KEY=VALUE", default=None, help=doc
            )
        elif base is list or typing.get_origin(base) is list:
            parser.add_argument(flag, dest=name, nargs="+", default=None, help=doc)
        elif isinstance(base, type) and issubclass(base, Choice):
            choices = [m.value for m in base]
            parser.add_argument(
                flag,
                dest=name,
                # with refused values, validation names the fix (argparse would list them all)
                choices=None if base in REFUSED_CHOICES else choices,
                default=None,
                help=doc,
                metavar="{" + ",".join(choices) + "}",
            )
        else:
            parser.add_argument(flag, dest=name, type=base, default=None, help=doc)


def overrides_from_args(args: argparse.Namespace) -> dict:
    """The config fields given on the command line."""
    index = field_index()
    return {k: v for k, v in vars(args).items() if k in index and v is not None}
