"""``pollux workload``: generate workloads with the paper's job mix, or check CSV files."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pollux.cli.output import make_console
from pollux.sim.applications import MAX_EPOCHS
from pollux.sim.generator import generate_workload, parse_priority_shares, parse_team_shares
from pollux.sim.workload import read_workload, workload_files, write_workload


def run_generate(args: argparse.Namespace) -> int:
    teams = None if args.teams is None else parse_team_shares(args.teams, "--teams")
    priorities = (None if args.priorities is None
                  else parse_priority_shares(args.priorities, "--priorities"))
    workload = generate_workload(args.jobs, args.hours, args.seed, teams=teams,
                                 priorities=priorities)
    if args.output == "-":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "workload.csv"
            write_workload(workload, path)
            sys.stdout.write(path.read_text())
            sys.stdout.flush()
    else:
        write_workload(workload, args.output)
    apps = Counter(job.application for job in workload.jobs)
    where = "stdout" if args.output == "-" else args.output
    Console(stderr=True).print(
        f"wrote {len(workload)} jobs over {args.hours:g} h to {where}: "
        + ", ".join(f"{app} {count}" for app, count in sorted(apps.items()))
        + ("" if teams is None else "; teams: " + ", ".join(
            f"{team} {count}" for team, count in
            sorted(Counter(job.team for job in workload.jobs).items()))), highlight=False)
    return 0


def run_check(args: argparse.Namespace) -> int:
    console = make_console()
    table = Table(title="workloads")
    for col in ("workload", "jobs", "span (h)", "GPUs asked (mean)", "applications"):
        table.add_column(col, justify="right" if col != "applications" else "left")
    rows: list[dict[str, Any]] = []
    for path in workload_files(args.workloads):
        workload = read_workload(path, MAX_EPOCHS.keys())
        times = [job.submission_time_s for job in workload.jobs]
        apps = Counter(job.application for job in workload.jobs)
        span_h = (max(times) - min(times)) / 3600
        mean_gpus = sum(j.num_replicas for j in workload.jobs) / len(workload)
        applications = dict(sorted(apps.items()))
        rows.append({"workload": workload.name, "jobs": len(workload), "span_h": span_h,
                     "mean_gpus_asked": mean_gpus, "applications": applications})
        table.add_row(workload.name, str(len(workload)), f"{span_h:.1f}", f"{mean_gpus:.1f}",
                      ", ".join(f"{a} {c}" for a, c in applications.items()))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        console.print(table)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("workload", help="generate or check workload CSV files",
                                   description=__doc__)
    sub = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    gen = sub.add_parser("generate", help="generate a workload with the paper's job mix")
    gen.add_argument("--jobs", type=int, default=160, help="number of jobs (default 160)")
    gen.add_argument("--hours", type=float, default=8.0,
                     help="hours over which jobs arrive (default 8)")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument("-o", "--output", required=True, help="CSV file to write ('-': stdout)")
    gen.add_argument("--teams", metavar="TEAM:SHARE,...", default=None,
                     help="give each job a team, drawn by these shares (e.g. "
                          "vision:0.5,nlp:0.3,speech:0.2; a 'team' column)")
    gen.add_argument("--priorities", metavar="PRIORITY:SHARE,...", default=None,
                     help="give each job a priority within its team, drawn by these "
                          "shares (e.g. 0:0.8,1:0.2; a 'priority' column; the jobs "
                          "are those of the same seed without it)")
    gen.set_defaults(func=run_generate)
    check = sub.add_parser("check", help="validate workload CSVs and summarize them")
    check.add_argument("workloads", nargs="+", metavar="WORKLOAD",
                       help="CSV files or folders of CSVs")
    check.add_argument("--json", action="store_true", help="print the summary as JSON")
    check.set_defaults(func=run_check)
