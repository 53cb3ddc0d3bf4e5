"""``pollux workload``: generate workloads with the paper's job mix, or check CSV files."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from pollux.sim.applications import MAX_EPOCHS
from pollux.sim.generator import generate_workload
from pollux.sim.workload import read_workload, workload_files, write_workload


def run_generate(args: argparse.Namespace) -> int:
    workload = generate_workload(args.jobs, args.hours, args.seed)
    write_workload(workload, args.output)
    apps = Counter(job.application for job in workload.jobs)
    Console(stderr=True).print(
        f"wrote {len(workload)} jobs over {args.hours:g} h to {args.output}: "
        + ", ".join(f"{app} {count}" for app, count in sorted(apps.items())))
    return 0


def run_check(args: argparse.Namespace) -> int:
    console = Console()
    table = Table(title="workloads")
    for col in ("workload", "jobs", "span (h)", "GPUs asked (mean)", "applications"):
        table.add_column(col, justify="right" if col != "applications" else "left")
    for path in workload_files(args.workloads):
        workload = read_workload(path, MAX_EPOCHS.keys())
        times = [job.submission_time_s for job in workload.jobs]
        apps = Counter(job.application for job in workload.jobs)
        table.add_row(workload.name, str(len(workload)),
                      f"{(max(times) - min(times)) / 3600:.1f}",
                      f"{sum(j.num_replicas for j in workload.jobs) / len(workload):.1f}",
                      ", ".join(f"{a} {c}" for a, c in sorted(apps.items())))
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
    gen.add_argument("-o", "--output", required=True, help="CSV file to write")
    gen.set_defaults(func=run_generate)
    check = sub.add_parser("check", help="validate workload CSVs and summarize them")
    check.add_argument("workloads", nargs="+", metavar="WORKLOAD",
                       help="CSV files or folders of CSVs")
    check.set_defaults(func=run_check)
