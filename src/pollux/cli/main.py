"""The ``pollux`` command: parses arguments and dispatches to one module per command.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``func(args) -> int`` as the parser default. Add new commands to ``COMMAND_MODULES``.

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
from collections.abc import Sequence

from pollux import __version__
from pollux.errors import ConfigError, PolluxError, UnknownPluginError, WorkloadError

EXIT_RUNTIME_ERROR = 1
"""A runtime failure: the server is unreachable or refused the request, a job ref is
unknown, a job or a backend failed."""
EXIT_USAGE_ERROR = 2
"""A usage error: bad arguments or input (named in the message), or input the server
refused as invalid (400, 422)."""

COMMAND_MODULES: tuple[str, ...] = (
    "pollux.cli.goodput",
    "pollux.cli.simulate",
    "pollux.cli.policies",
    "pollux.cli.workload",
    "pollux.cli.server",
    "pollux.cli.jobs",
    "pollux.cli.users",
    "pollux.cli.dashboard",
    "pollux.cli.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pollux",
        description="Goodput-optimized, co-adaptive deep-learning cluster scheduling.",
    )
    parser.add_argument("--version", action="version", version=f"pollux {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug)")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
