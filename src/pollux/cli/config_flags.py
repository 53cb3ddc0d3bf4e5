"""Argparse flags from a configuration's fields, and the configuration from parsed flags.

A configuration is a tree of frozen dataclasses whose fields declare their help text
and flag (:mod:`pollux.options`). :func:`add_config_flags` adds one flag per declared
flag, each section's flags as one argument group; :func:`config_from_args` builds the
tree back from the parsed flags (the fields without a flag keep their defaults unless
given). So a flag's name, default, help and checks are written once, at its field.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any

from pollux.options import Option, default_of, option_of, section_of


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _add_flag(target: Any, declared: Option, default: Any) -> None:
    assert declared.flag is not None
    if default is MISSING:
        default = None if declared.flag_default is None else declared.flag_default()
    kwargs: dict[str, Any] = {"dest": _dest(declared.flag), "help": declared.help}
    if declared.store_true:
        kwargs["action"] = "store_true"
    else:
        kwargs["default"] = default
        if declared.type is not None:
            kwargs["type"] = declared.type
        metavar = declared.metavar() if callable(declared.metavar) else declared.metavar
        if metavar is not None:
            kwargs["metavar"] = metavar
        choices = declared.choices() if callable(declared.choices) else declared.choices
        if choices is not None:
            kwargs["choices"] = choices
    target.add_argument(declared.flag, **kwargs)


def add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per flagged field of ``cls``'s tree; a section's flags form an argument
    group (groups are not nested: a section within a section gets its own group)."""
    _add_section(parser, parser, cls)


def _add_section(parser: argparse.ArgumentParser, target: Any, cls: type) -> None:
    for item in fields(cls):
        nested = section_of(item)
        if nested is not None:
            title, inner = nested
            _add_section(parser, parser.add_argument_group(title), inner)
            continue
        declared = option_of(item)
        if declared is not None and declared.flag is not None:
            _add_flag(target, declared, default_of(item))


def config_from_args(cls: type, args: argparse.Namespace,
                     given: Mapping[str, Any] | None = None) -> Any:
    """``cls`` built from the flags of ``args``; ``given`` maps dotted field paths
    (``http.token``) to values set by code rather than by a flag."""
    return _build(cls, args, dict(given or {}), "")


def _build(cls: type, args: argparse.Namespace, given: dict[str, Any], path: str) -> Any:
    values: dict[str, Any] = {}
    for item in fields(cls):
        name = path + item.name
        nested = section_of(item)
        if nested is not None:
            values[item.name] = _build(nested[1], args, given, name + ".")
        elif name in given:
            values[item.name] = given[name]
        else:
            declared = option_of(item)
            if declared is None or declared.flag is None:
                continue
            value = getattr(args, _dest(declared.flag))
            if value is not None and declared.convert is not None:
                value = declared.convert(value)
            values[item.name] = value
    return cls(**values)
