"""The job commands' flags: ``pollux submit``, ``ls``, ``describe``, ``logs``,
``cancel``, ``top`` (what each does: :mod:`pollux.cli.jobs`).

This module imports only :mod:`argparse` and the data directory's layout, and
:mod:`pollux.cli.jobs` (with the client, rich and the job spec) only when a command
runs: ``pollux ls --help`` loads nothing more.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pollux.data_dir import default_data_dir


def _run(name: str) -> Callable[[argparse.Namespace], int]:
    """Command ``name`` of :mod:`pollux.cli.jobs`, imported when it runs."""
    def run(args: argparse.Namespace) -> int:
        from pollux.cli import jobs

        return int(getattr(jobs, name)(args))
    run.__name__ = run.__qualname__ = name
    return run


def _finished_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--finished takes a whole number, not {text!r}") \
            from None
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(
            f"--finished {value}: choose 0 to 10000 (the server lists at most 10000)")
    return value


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=None, help="server URL (default: $POLLUX_SERVER "
                                                       "or the server file in --data-dir)")
    parser.add_argument("--data-dir", default=str(default_data_dir()),
                        help="where a local server keeps its server file")
    parser.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused: ps shows it
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="file (mode 0600) holding the bearer token (or $POLLUX_TOKEN)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("submit", help="submit a job (YAML file or flags -- command)",
                              description="Submit a job: 'pollux submit job.yaml' or "
                                          "'pollux submit --name N --max-replicas 4 -- "
                                          "python train.py'. Flags override the file.")
    p.add_argument("spec_or_command", nargs="*", help="a job YAML file, or the command")
    p.add_argument("--name", default=None,
                   help="job name; its id is NAME-<n> (default: the script's name)")
    p.add_argument("--min-replicas", type=int, default=None,
                   help="fewest replicas the job runs on (default: 1)")
    p.add_argument("--max-replicas", type=int, default=None,
                   help="most replicas the scheduler may give the job (default: 1); under an "
                        "adaptive policy a job grows only once its agent reports "
                        "hints, so a job without the agent that needs N replicas "
                        "says --min-replicas N --max-replicas N")
    p.add_argument("--gpu", type=float, default=None, help="GPUs (slots) per replica")
    p.add_argument("--cpu", type=float, default=None, help="CPUs per replica")
    p.add_argument("--memory", default=None, help="memory per replica, e.g. 4GiB")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE (repeatable)")
    p.add_argument("--workdir", default=None, help="working directory (default: here)")
    p.add_argument("--preemptible", action=argparse.BooleanOptionalAction, default=None,
                   help="whether the scheduler may stop and resize the job (through a "
                        "checkpoint) once it runs (default: yes)")
    p.add_argument("--restart-delay", type=float, default=None,
                   help="seconds a restart costs the job (policy input)")
    p.add_argument("--max-failures", type=int, default=None,
                   help="crashes tolerated, each restarting from the last checkpoint, "
                        "before the job is Failed (default: 3)")
    p.add_argument("--team", default=None, metavar="T",
                   help="the team the job goes into (one of yours; default: your first)")
    p.add_argument("--priority", type=int, default=None, metavar="N",
                   help="order within the team, -100..100 (default 0): when the team "
                        "must shrink, its jobs of lower priority shrink first")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    add_connection_arguments(p)
    p.set_defaults(func=_run("submit"), print_usage=p.print_usage)

    p = subparsers.add_parser("ls", help="list jobs",
                              description="List jobs: state, replicas, nodes, batch size, "
                                          "goodput (samples/s), restarts, age (since "
                                          "submission) and run time (since the first "
                                          "launch, to the end).")
    p.add_argument("--active", action="store_true", help="hide finished jobs")
    p.add_argument("--finished", type=_finished_count, default=None, metavar="N",
                   help="show the newest N finished jobs (default: the server's, 100; "
                        "every job not finished is always shown)")
    p.add_argument("--mine", action="store_true", help="only the jobs you own")
    p.add_argument("--team", default=None, metavar="T", help="only the jobs of team T")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_connection_arguments(p)
    p.set_defaults(func=_run("list_jobs"))

    p = subparsers.add_parser("describe", help="show a job in detail, with its events")
    p.add_argument("job", help="job id (or a unique name)")
    p.add_argument("--json", action="store_true",
                   help="print everything as JSON (spec, counters, hints, events, replicas)")
    add_connection_arguments(p)
    p.set_defaults(func=_run("describe"))

    p = subparsers.add_parser("logs", help="print a replica's log")
    p.add_argument("job", help="job id (or a unique name)")
    p.add_argument("--replica", type=int, default=0, help="rank (default 0)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    p.add_argument("--tail", type=int, default=None, metavar="N",
                   help="print only the last N lines (then follow, with -f)")
    p.add_argument("--poll-interval", type=float, default=1.0, help=argparse.SUPPRESS)
    add_connection_arguments(p)
    p.set_defaults(func=_run("logs"))

    p = subparsers.add_parser("cancel", help="cancel a job (it checkpoints and stops)")
    p.add_argument("job", help="job id (or a unique name)")
    add_connection_arguments(p)
    p.set_defaults(func=_run("cancel"))

    p = subparsers.add_parser("top", help="live view of jobs and nodes",
                              description="Live view of jobs and nodes. When the output "
                                          "is not a terminal: the tables once, then one "
                                          "line per job event as it happens.")
    p.add_argument("--refresh", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("--iterations", type=int, default=None, help="stop after N refreshes")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per refresh (jobs, nodes, cluster)")
    add_connection_arguments(p)
    p.set_defaults(func=_run("top"))
