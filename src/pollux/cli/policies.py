"""``pollux policies``: the named policies, each with its options and their defaults.

A policy is written as a spec wherever one is taken (``pollux simulate --policy``,
``pollux server --policy``): ``pollux(p=-0.5,exploration_factor=4)``; several
comma-separated in ``simulate``: ``sia,pollux(p=-0.5)``.
"""

from __future__ import annotations

import argparse
from typing import Any

from pollux.cli.output import make_console
from pollux.policies.registry import (
    DEPRECATED_NAMES,
    NAMED_POLICIES,
    class_options,
    load_policy_class,
)
from pollux.spec import format_value


def _default(defaults: dict[str, Any] | Any) -> str:
    if set(defaults) == {""}:
        return format_value(defaults[""])
    values = {kind: format_value(value) for kind, value in defaults.items()}
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    return ", ".join(f"{value} ({kind})" for kind, value in values.items())


def policy_listing(names: list[str] | None = None) -> str:
    """Every named policy (or ``names``): summary, then each option = default and its doc."""
    lines = []
    for name in names or list(NAMED_POLICIES):
        named = NAMED_POLICIES[name]
        lines.append(f"{name}: {named.summary}")
        fixed = ",".join(f"{k}={format_value(v)}" for k, v in named.fixed.items())
        if fixed:
            lines.append(f"  (sets {fixed})")
        for doc in class_options(load_policy_class(name), named.fixed):
            if doc.name in named.fixed:
                continue
            text = f"  {doc.name} = {_default(dict(doc.defaults))}"
            lines.append(text + (f"\n      {doc.doc}" if doc.doc else ""))
    if not names:
        lines.append("deprecated names (still accepted, with a warning):")
        lines += [f"  {old} -> {new}" for old, new in DEPRECATED_NAMES.items()]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    for name in args.names:
        if name not in NAMED_POLICIES:
            load_policy_class(name)  # raises UnknownPluginError with the choices
    make_console().print(policy_listing(args.names or None), highlight=False, markup=False)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "policies", help="list the named policies with their options and defaults",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help="only these policies")
    parser.set_defaults(func=run)
