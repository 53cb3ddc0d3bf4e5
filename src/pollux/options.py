"""Options declared once: a configuration field carries its help text and its flag.

A configuration is a tree of frozen dataclasses. Each leaf made with :func:`option`
holds, in its field metadata, the help text and (if a flag sets it) the flag with its
argparse details; a nested dataclass is a :func:`section`, shown as one argument group.
:mod:`pollux.cli.config_flags` turns such a tree into argparse flags and parsed flags
back into the tree, so a flag's help is written nowhere but at its field. A backend
declares its own options this way (``pollux.backends.ray.options`` ...), below the
service and the CLI that read them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

OPTION_KEY = "pollux.option"
SECTION_KEY = "pollux.section"


@dataclass(frozen=True)
class Option:
    """What a configuration field is, and the flag that sets it (``flag`` None: none)."""

    help: str
    """The field's help text: the flag's ``--help`` line (argparse's ``%(default)s``
    expanded there)."""
    flag: str | None = None
    """The flag, e.g. ``--port``; None: set only by code (the help says how)."""
    type: Callable[[str], Any] | None = None
    """Argparse's ``type``: the flag's text -> the value (errors name the flag)."""
    metavar: str | Callable[[], str] | None = None
    """Argparse's ``metavar`` (a callable: computed when the parser is built)."""
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    """Argparse's ``choices`` (a callable: computed when the parser is built)."""
    store_true: bool = False
    """A switch: present means True."""
    convert: Callable[[Any], Any] | None = None
    """The parsed value (when not None) -> the field's value, e.g. a path made absolute."""
    flag_default: Callable[[], Any] | None = None
    """The flag's default for a field that has none (computed when the parser is built)."""


def option(default: Any = MISSING, *, help: str, flag: str | None = None,
           type: Callable[[str], Any] | None = None,
           metavar: str | Callable[[], str] | None = None,
           choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,
           store_true: bool = False, convert: Callable[[Any], Any] | None = None,
           flag_default: Callable[[], Any] | None = None,
           default_factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field with its :class:`Option` (the arguments are its attributes)."""
    metadata = {OPTION_KEY: Option(help, flag, type, metavar, choices, store_true, convert,
                                   flag_default)}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def section(cls: type, title: str) -> Any:
    """A dataclass field holding the nested configuration ``cls`` (its defaults), whose
    flags form the argument group ``title``."""
    return field(default_factory=cls, metadata={SECTION_KEY: title})


def option_of(item: Field[Any]) -> Option | None:
    """The :class:`Option` of a field (None for a section or an undeclared field)."""
    found = item.metadata.get(OPTION_KEY)
    return found if isinstance(found, Option) else None


def section_of(item: Field[Any]) -> tuple[str, type] | None:
    """(title, class) of a section field, else None."""
    title = item.metadata.get(SECTION_KEY)
    if title is None or not callable(item.default_factory):
        return None
    return title, item.default_factory  # type: ignore[return-value]


def default_of(item: Field[Any]) -> Any:
    """A field's default value (MISSING when it has none)."""
    if item.default is not MISSING:
        return item.default
    if item.default_factory is not MISSING:
        return item.default_factory()
    return MISSING


def flagged_fields(cls: type, path: str = "") -> list[tuple[str, Field[Any], Option]]:
    """(dotted path, field, option) of every field of ``cls``'s tree, depth first in
    declaration order."""
    found: list[tuple[str, Field[Any], Option]] = []
    for item in fields(cls):
        nested = section_of(item)
        if nested is not None:
            found.extend(flagged_fields(nested[1], f"{path}{item.name}."))
            continue
        declared = option_of(item)
        if declared is not None:
            found.append((path + item.name, item, declared))
    return found


def changed_flag(value: Any) -> str | None:
    """The flag of the first field of the dataclass ``value`` that differs from its
    default (None when every one is the default)."""
    for item in fields(value):
        declared = option_of(item)
        if declared is None or declared.flag is None:
            continue
        if getattr(value, item.name) != default_of(item):
            return declared.flag
    return None
