"""``pollux server``: run the scheduler service (job store, REST API, allocation loop).

Binds 127.0.0.1 by default. Every request must carry the token: the one in
``--token-file`` (mode 0600) or ``$POLLUX_TOKEN``, else one generated into
``<data dir>/token`` (which the CLI reads by itself); never on the command line, which
every local user can read (``--token`` is refused). Beyond loopback, serve HTTPS
(``--tls-cert``, ``--tls-key``). Ctrl-C (or SIGTERM) asks every running job to checkpoint and stop; a
restart on the same ``--data-dir`` resumes them. With ``--backend ray`` the replicas run
as Ray actors on the Ray cluster at ``--ray-address`` (or on a local Ray instance the
server starts).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pollux.cli import config_flags
from pollux.data_dir import TOKEN_FILE
from pollux.service.config import ServerConfig
from pollux.service.runner import run_server
from pollux.tokens import argv_token_refused, read_token_file, token_from_environment


def token_from_args(args: argparse.Namespace) -> str | None:
    """The token of ``--token-file``, else of ``$POLLUX_TOKEN`` (then removed from this
    process's environment); a token on the command line is refused."""
    if args.token is not None:
        raise argv_token_refused()
    from_env = token_from_environment(remove=True)
    return read_token_file(args.token_file) if args.token_file is not None else from_env


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The server's configuration from its flags (:func:`add_server_arguments`)."""
    config: ServerConfig = config_flags.config_from_args(
        ServerConfig, args, {"http.token": token_from_args(args)})
    return config


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)

    def ready(url: str) -> None:
        print(f"pollux server on {url} (policy {config.policy.spec}, "
              f"backend {config.backend.name}, "
              f"data {config.data_dir})", flush=True)
        print(f"dashboard {url}/ · API docs {url}/docs · Prometheus {url}/metrics",
              flush=True)
        where = ("$POLLUX_TOKEN" if config.http.token and not config.http.token_file
                 else config.http.token_file or config.data_dir / TOKEN_FILE)
        print(f"open the dashboard with 'pollux dashboard --data-dir {config.data_dir}' or "
              f"once as {url}/?token=<the token in {where}>", flush=True)

    run_server(config, ready)
    print("pollux server stopped", file=sys.stderr, flush=True)
    return 0


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of every :class:`ServerConfig` field that has one (help, default and
    checks written at the field), and ``--token``, only to refuse it."""
    config_flags.add_config_flags(parser, ServerConfig)
    parser.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("server", help="run the scheduler service",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.set_defaults(func=run)
