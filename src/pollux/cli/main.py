"""The ``pollux`` command: parses arguments and dispatches to one module per command.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``func(args) -> int`` as the parser default. Add a new command to ``COMMANDS`` (its name
and its module); a test checks that every module registers exactly the names it is
listed under. Only the module of the command given is imported (``pollux ls --help``
loads the job commands and the client, not the server, the simulator or the policies);
without a known command, all of them are (for ``pollux --help`` and its choices).

Exit status: 0 success; 1 a runtime failure (the server is unreachable or refused the
request, a job or a backend failed); 2 a usage error (bad arguments or input, named
in the message, or refused by the server as invalid).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from pollux import __version__
from pollux.errors import ConfigError, PolluxError, UnknownPluginError, WorkloadError

EXIT_RUNTIME_ERROR = 1
"""A runtime failure: the server is unreachable or refused the request, a job ref is
unknown, a job or a backend failed."""
EXIT_USAGE_ERROR = 2
"""A usage error: bad arguments or input (named in the message), or input the server
refused as invalid (400, 422)."""

COMMANDS: Mapping[str, str] = MappingProxyType({
    "goodput": "pollux.cli.goodput",
    "simulate": "pollux.cli.simulate",
    "policies": "pollux.cli.policies",
    "workload": "pollux.cli.workload",
    "server": "pollux.cli.server",
    "submit": "pollux.cli.job_parsers",
    "ls": "pollux.cli.job_parsers",
    "describe": "pollux.cli.job_parsers",
    "logs": "pollux.cli.job_parsers",
    "cancel": "pollux.cli.job_parsers",
    "top": "pollux.cli.job_parsers",
    "user": "pollux.cli.users",
    "teams": "pollux.cli.users",
    "dashboard": "pollux.cli.dashboard",
    "demo": "pollux.cli.demo",
})
"""Each command and the module that registers it, in the order ``pollux --help`` lists
them."""
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMANDS.values()))


def command_of(argv: Sequence[str]) -> str | None:
    """The command word of ``argv`` (the first word not an option of ``pollux`` itself,
    none of which takes a value), or None."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``pollux``; with a known ``command``, of that command's module only
    (the others are not imported)."""
    parser = argparse.ArgumentParser(
        prog="pollux",
        description="Goodput-optimized, co-adaptive deep-learning cluster scheduling.",
    )
    parser.add_argument("--version", action="version", version=f"pollux {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug)")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    module = None if command is None else COMMANDS.get(command)
    names = COMMAND_MODULES if module is None else (module,)
    for module_name in names:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(argv))
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    try:
        return int(func(args) or 0)
    except BrokenPipeError:  # e.g. `pollux ls | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ConfigError, UnknownPluginError, WorkloadError) as exc:
        print(f"pollux: error: {exc}", file=sys.stderr)
        return EXIT_USAGE_ERROR
    except PolluxError as exc:
        print(f"pollux: error: {exc}", file=sys.stderr)
        # the server refusing the input (400, 422) is a usage error too
        if getattr(exc, "status", None) in (400, 422):
            return EXIT_USAGE_ERROR
        return EXIT_RUNTIME_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
