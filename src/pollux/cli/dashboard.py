"""``pollux dashboard``: a link that opens the server's dashboard in a browser.

The link holds a one-time login code (one use, within a minute), not the token: the
token never enters the browser, its history, or the command line of whatever opens the
link. ``--open`` opens it in the default browser."""

from __future__ import annotations

import argparse
import webbrowser
from typing import Any

from pollux.cli.job_parsers import add_connection_arguments


def run(args: argparse.Namespace) -> int:
    from pollux.cli.jobs import connect

    with connect(args) as client:
        login = client.dashboard_login()
        base = client.address.url  # another user's client knows the server by its socket:
        if client.address.server_uid is not None and login.get("url"):  # it says its URL
            base = str(login["url"])
        url = base + login["path"]
    print(url, flush=True)
    if args.open:
        webbrowser.open(url)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("dashboard", help="print (or open) a one-time link to "
                                                     "the dashboard", description=__doc__)
    parser.add_argument("--open", action="store_true", help="open it in the default browser")
    add_connection_arguments(parser)
    parser.set_defaults(func=run)
