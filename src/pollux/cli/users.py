"""User and team commands: ``pollux user add|ls|rm|token`` and ``pollux teams``.

``pollux user ...`` is run by the server's own Unix user on the server's machine (over
its local socket, or with the server token): it registers the people who may use the
scheduler. ``pollux teams`` is for everyone: each team's quota and GPUs in use, lent,
borrowed and pending.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from pollux.cli.job_parsers import add_connection_arguments
from pollux.cli.jobs import connect
from pollux.cli.output import make_console


def add_user(args: argparse.Namespace) -> int:
    with connect(args) as client:
        user = client.add_user(args.name, args.team, args.team_admin, args.admin)
    _print_token(args, user, f"added user {user['name']} (teams: "
                             f"{', '.join(user['teams'])}{_roles(user)})")
    return 0


def rotate_token(args: argparse.Namespace) -> int:
    with connect(args) as client:
        answer = client.rotate_token(args.name)
    _print_token(args, answer, f"new token for {answer['name']} (the old one no longer "
                               "works)")
    return 0


def _roles(user: dict[str, Any]) -> str:
    roles = [role for role in ("team_admin", "admin") if user.get(role)]
    return "" if not roles else "; " + ", ".join(role.replace("_", " ") for role in roles)


def _print_token(args: argparse.Namespace, answer: dict[str, Any], headline: str) -> None:
    if args.json:
        print(json.dumps({"name": answer["name"], "token": answer["token"]}))
        return
    print(headline)
    print(f"token (shown once; the server keeps only its hash): {answer['token']}")
    print("Give it to the user to keep in a file only they can read (chmod 600), used "
          "with --token-file FILE; on this machine they need none: the server knows "
          "their Unix account.")


def list_users(args: argparse.Namespace) -> int:
    with connect(args) as client:
        users = client.users()
    if args.json:
        print(json.dumps(users, indent=2))
        return 0
    table = Table()
    for column in ("user", "teams", "team admin", "admin"):
        table.add_column(column)
    for user in users:
        table.add_row(user["name"], ", ".join(user["teams"]),
                      "yes" if user["team_admin"] else "-", "yes" if user["admin"] else "-")
    make_console().print(table)
    return 0


def remove_user(args: argparse.Namespace) -> int:
    with connect(args) as client:
        client.remove_user(args.name)
    print(f"removed user {args.name} (its token and sessions no longer work; its jobs "
          "keep running)")
    return 0


def _gpus(value: float) -> str:
    return f"{value:g}"


def list_teams(args: argparse.Namespace) -> int:
    with connect(args) as client:
        answer = client.teams()
    teams = answer["teams"]
    if args.json:
        print(json.dumps(teams, indent=2))
        return 0
    table = Table()
    for column in ("team", "quota", "in use", "lent", "borrowed", "pending", "jobs",
                   "weight"):
        table.add_column(column, justify="left" if column == "team" else "right")
    for team in teams:
        table.add_row(team["team"], _gpus(team["quota_gpus"]), _gpus(team["in_use_gpus"]),
                      _gpus(team["lent_gpus"]), _gpus(team["borrowed_gpus"]),
                      _gpus(team["pending_gpus"]), str(team["num_jobs"]),
                      f"{team['weight']:g}")
    console = make_console()
    console.print(table)
    if not answer.get("teams_file"):
        console.print("(no teams file: quotas are 0; start the server with --teams FILE)",
                      highlight=False)
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("user", help="register the scheduler's users (run by the "
                                           "server's own account)")
    commands = p.add_subparsers(title="user commands", metavar="COMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])

    add = commands.add_parser("add", help="register a user; prints its token once")
    add.add_argument("name", help="user name: on this machine, its Unix account name")
    add.add_argument("--team", action="append", required=True, metavar="T",
                     help="a team of the user (repeatable; the first is its default)")
    add.add_argument("--team-admin", action="store_true",
                     help="may act on (read, cancel) every job of its teams")
    add.add_argument("--admin", action="store_true", help="may act on every job")
    add.add_argument("--json", action="store_true", help='print {"name": ..., "token": ...}')
    add_connection_arguments(add)
    add.set_defaults(func=add_user)

    ls = commands.add_parser("ls", help="list the registered users")
    ls.add_argument("--json", action="store_true", help="print the users as JSON")
    add_connection_arguments(ls)
    ls.set_defaults(func=list_users)

    rm = commands.add_parser("rm", help="unregister a user (its jobs keep running)")
    rm.add_argument("name")
    add_connection_arguments(rm)
    rm.set_defaults(func=remove_user)

    token = commands.add_parser("token", help="give a user a new token (the old one stops "
                                              "working); prints it once")
    token.add_argument("name")
    token.add_argument("--json", action="store_true",
                       help='print {"name": ..., "token": ...}')
    add_connection_arguments(token)
    token.set_defaults(func=rotate_token)

    p = subparsers.add_parser("teams", help="each team's GPUs: quota, in use, lent, "
                                            "borrowed, pending")
    p.add_argument("--json", action="store_true", help="print the teams as JSON")
    add_connection_arguments(p)
    p.set_defaults(func=list_teams)
