"""``pollux simulate``: run workloads through scheduling policies on a simulated cluster.

With no WORKLOAD a workload is generated with the paper's job mix (``--jobs``,
``--hours``, ``--seed``). Applications come from ``--traces DIR`` (the Pollux artifact
format) or, by default, from the built-in catalog. Runs go to parallel processes; the
table compares policies side by side; ``--json`` and ``--plot`` save the details.

``--autoscaler pollux`` (goodput-aware) or ``throughput`` (the baseline) makes the cluster
elastic: it starts at ``--min-nodes``, grows up to ``--max-nodes`` (default ``--nodes``)
and new nodes become usable ``--provision-delay-s`` after they are requested; node-hours
and their cost at ``--node-price`` are reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pollux.cli.output import make_console
from pollux.cluster_spec import parse_cluster_spec
from pollux.errors import ConfigError
from pollux.policies.autoscaling import (
    DEFAULT_HIGH_UTIL,
    DEFAULT_LOW_UTIL,
    DEFAULT_NODE_PRICE_PER_HOUR,
    autoscaler_names,
    check_autoscaler_name,
)
from pollux.policies.registry import make_policy, policy_names
from pollux.sim.generator import generate_workload
from pollux.sim.lower_bound import with_lower_bounds
from pollux.sim.metrics import RunRecord, report, summarize_policies
from pollux.sim.report import TextTable
from pollux.sim.runner import RunOutcome, RunTask, load_applications, run_tasks
from pollux.sim.simulator import ClusterConfig
from pollux.sim.workload import Workload, read_workload, workload_files

DEFAULT_POLICIES = "tiresias,optimus,pollux"
DEFAULT_GENERATED_JOBS = 40
DEFAULT_GENERATED_HOURS = 2.0


def _policies(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in policy_names():
            make_policy(name)  # raises UnknownPluginError with the choices
    return list(dict.fromkeys(names))


def _workloads(args: argparse.Namespace, applications: set[str]) -> list[Workload]:
    if not args.workloads:
        return [generate_workload(args.jobs, args.hours, args.seed)]
    return [read_workload(path, applications) for path in workload_files(args.workloads)]


def _seconds(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:,.1f} s"


def _ratio(value: float, bound: float) -> str:
    return "-" if not (math.isfinite(value) and math.isfinite(bound) and bound > 0) \
        else f"{value / bound:.2f}x"


def _cluster_config(args: argparse.Namespace) -> ClusterConfig:
    autoscaler = check_autoscaler_name(args.autoscaler)
    if autoscaler == "none":
        for flag, value in (("--min-nodes", args.min_nodes), ("--max-nodes", args.max_nodes)):
            if value is not None:
                raise ConfigError("autoscaler", autoscaler,
                                  f"{flag} needs --autoscaler pollux or throughput")
    return ClusterConfig(num_nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                         interval_s=args.interval, restart_delay_s=args.restart_delay,
                         interference=args.interference,
                         min_nodes=1 if args.min_nodes is None else args.min_nodes,
                         max_nodes=args.max_nodes, node_price_per_hour=args.node_price,
                         provision_delay_s=args.provision_delay_s)


def _policy_table(records: list[RunRecord]) -> TextTable:
    """Metrics as rows, policies side by side as columns (means over workloads)."""
    summary = summarize_policies(records)
    policies = list(summary)
    runs = {p: [r for r in records if r.policy == p] for p in policies}

    def mean(policy: str, field: str) -> float:
        values = [r.round_s.median if field == "round_median_s" else getattr(r, field)
                  for r in runs[policy]]
        return sum(values) / len(values)

    rows: list[tuple[str, Any]] = [
        ("workloads", lambda p: str(len(runs[p]))),
        ("jobs done", lambda p: f"{sum(r.num_completed for r in runs[p])}"
                                f"/{sum(r.num_jobs for r in runs[p])}"),
        ("avg JCT (mean)", lambda p: _seconds(summary[p]["mean_avg_jct_s"])),
        ("lower bound (mean)", lambda p: _seconds(summary[p]["mean_lower_bound_avg_jct_s"])),
        ("avg JCT / bound", lambda p: _ratio(summary[p]["mean_avg_jct_s"],
                                             summary[p]["mean_lower_bound_avg_jct_s"])),
        ("p50 JCT", lambda p: _seconds(mean(p, "p50_jct_s"))),
        ("p99 JCT", lambda p: _seconds(mean(p, "p99_jct_s"))),
        ("makespan", lambda p: _seconds(mean(p, "makespan_s"))),
        ("GPU utilization", lambda p: f"{mean(p, 'gpu_utilization'):.1%}"),
        ("restarts per job", lambda p: f"{mean(p, 'restarts_per_job'):.2f}"),
        ("GPU-hours per job", lambda p: f"{mean(p, 'gpu_hours_per_job'):.2f}"),
        *([("node-hours", lambda p: f"{summary[p]['mean_node_hours']:.1f}"),
           ("cost", lambda p: f"{summary[p]['mean_cost']:,.2f}")]
          if any(r.autoscaler != "none" for r in records) else []),
        ("max FTF", lambda p: f"{summary[p]['max_ftf']:.2f}"),
        ("unfair jobs (FTF>1)", lambda p: f"{mean(p, 'unfair_fraction'):.1%}"),
        ("policy round p50", lambda p: f"{1e3 * mean(p, 'round_median_s'):.2f} ms"),
        ("policy round max", lambda p: f"{1e3 * max(r.round_s.max for r in runs[p]):.1f} ms"),
        ("wall time", lambda p: f"{sum(r.wall_s for r in runs[p]):.1f} s"),
    ]
    return TextTable("policies side by side (means over workloads)", ("metric", *policies),
                     tuple((label, *(cell(p) for p in policies)) for label, cell in rows))


def _workload_table(records: list[RunRecord]) -> TextTable:
    policies = list(dict.fromkeys(r.policy for r in records))
    rows: list[tuple[str, ...]] = []
    by_key = {(r.workload, r.policy): r for r in records}
    for workload in dict.fromkeys(r.workload for r in records):
        cells = []
        for policy in policies:
            record = by_key.get((workload, policy))
            done = record is not None and record.num_completed == record.num_jobs
            cells.append("-" if record is None else
                         f"{record.avg_jct_s:.1f}" + ("" if done else
                                                      f" ({record.num_completed}/"
                                                      f"{record.num_jobs} done)"))
        bounds = [r.lower_bound_avg_jct_s for r in records
                  if r.workload == workload and r.lower_bound_avg_jct_s is not None]
        rows.append((workload, *cells, f"{bounds[0]:.1f}" if bounds else "-"))
    return TextTable("average JCT per workload (s)", ("workload", *policies, "lower bound"),
                     tuple(rows))


def _rich(table: TextTable) -> Table:
    """A TextTable for the terminal: first column left, the others right-aligned."""
    printed = Table(title=table.title)
    for i, column in enumerate(table.columns):
        printed.add_column(column, justify="left" if i == 0 else "right")
    for row in table.rows:
        printed.add_row(*row)
    return printed


def _autoscaler_options(args: argparse.Namespace) -> dict[str, float]:
    """``--utility-band LOW:HIGH`` as the Pollux autoscaler's options (checked there)."""
    if args.utility_band is None:
        return {}
    if args.autoscaler != "pollux":
        raise ConfigError("utility_band", args.utility_band, "needs --autoscaler pollux")
    try:
        low, high = (float(part) for part in args.utility_band.split(":"))
    except ValueError:
        raise ConfigError("utility_band", args.utility_band,
                          "write LOW:HIGH, e.g. 0.6:0.78") from None
    return {"low_util": low, "high_util": high}


def run(args: argparse.Namespace) -> int:
    json_out = args.json == "-"  # stdout is the JSON: progress and notes go to stderr
    console = Console(stderr=True) if json_out else make_console()
    policies = _policies(args.policy)
    if args.cluster is not None:
        spec = parse_cluster_spec(args.cluster)
        if spec.is_typed:
            from pollux.cli.simulate_typed import run_typed

            return run_typed(args, spec, policies, console)
        if len(spec.groups) > 1:
            raise ConfigError("cluster", args.cluster, "untyped groups must be one NODESxGPUS")
        args.nodes, args.gpus_per_node = spec.groups[0].num_nodes, spec.groups[0].gpus_per_node
    config = _cluster_config(args)
    apps = load_applications(args.traces)
    applications = set(apps)
    workloads = _workloads(args, applications)
    options = _autoscaler_options(args)
    tasks = [RunTask(policy, workload, config, args.traces, args.seed,
                     timeline=args.plot is not None or args.html is not None,
                     autoscaler=args.autoscaler,
                     autoscaler_options=options, job_knowledge=args.job_knowledge)
             for workload in workloads for policy in policies]
    processes = args.processes or min(len(tasks), os.cpu_count() or 1)
    source = args.traces or "built-in catalog"
    cluster = f"{args.nodes} x {args.gpus_per_node} GPUs"
    if args.autoscaler != "none":
        cluster = (f"{config.min_nodes}..{config.scaling_max_nodes} nodes x "
                   f"{args.gpus_per_node} GPUs ({args.autoscaler} autoscaler)")
    console.print(f"{len(workloads)} workload(s) x {len(policies)} policies on "
                  f"{cluster}, applications from {source}, "
                  f"{processes} process(es)", highlight=False)
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        bar = progress.add_task("simulating", total=len(tasks))

        def done(outcome: RunOutcome) -> None:
            rec = outcome.record
            progress.update(bar, advance=1,
                            description=f"{rec.policy} on {rec.workload}: "
                                        f"{rec.avg_jct_s:.0f} s avg JCT")

        outcomes = run_tasks(tasks, processes, done)
    records = with_lower_bounds([o.record for o in outcomes], workloads, apps, config)
    tables = [_policy_table(records)] + ([_workload_table(records)] if len(workloads) > 1
                                         else [])
    for table in tables if not json_out else []:
        console.print(_rich(table))
    if json_out:
        print(json.dumps(report(records), indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(report(records), indent=1) + "\n")
        console.print(f"wrote {args.json}", highlight=False)
    if args.plot:
        from pollux.sim.plots import save_plots

        paths = save_plots(records, [o.timeline for o in outcomes], args.plot)
        console.print(f"wrote {len(paths)} plots to {args.plot}", highlight=False)
    if args.html:
        from pollux.sim.report import write_report

        description = (f"{len(workloads)} workload(s) on {cluster}, applications from "
                       f"{source}, seed {args.seed}")
        write_report(args.html, "Pollux simulation", description, tables, records,
                     [o.timeline for o in outcomes])
        console.print(f"wrote {args.html}", highlight=False)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate", help="simulate workloads under scheduling policies",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help="workload CSV files or folders of CSVs (default: generate one)")
    parser.add_argument("--policy", default=DEFAULT_POLICIES,
                        help=f"comma-separated policies (default {DEFAULT_POLICIES}; "
                             f"choices: {', '.join(policy_names())})")
    parser.add_argument("--traces", metavar="DIR",
                        help="application traces in the Pollux artifact format "
                             "(default: the built-in catalog)")
    parser.add_argument("--cluster", metavar="SPEC", default=None,
                        help="typed cluster, type:NODESxGPUS groups, e.g. "
                             "aws:6x4,dgx-ext:2x8,rtx:3x8 (needs per-type --traces); "
                             "NODESxGPUS alone is --nodes/--gpus-per-node")
    parser.add_argument("--nodes", type=int, default=16, help="nodes (default 16)")
    parser.add_argument("--gpus-per-node", type=int, default=4, help="GPUs per node (default 4)")
    parser.add_argument("--interval", type=float, default=60.0,
                        help="seconds between scheduling rounds (default 60)")
    parser.add_argument("--restart-delay", type=float, default=30.0,
                        help="seconds a job idles after each placement change (default 30)")
    parser.add_argument("--interference", type=float, default=0.0,
                        help="slowdown of distributed jobs sharing a node (default 0)")
    parser.add_argument("--job-knowledge", choices=("measured", "oracle"), default="measured",
                        help="what adaptive (Pollux) jobs know of themselves: measured (fit "
                             "their own measurements, as the agent; default) or oracle (true "
                             "step-time model and goodput: the value of perfect modelling)")
    scaling = parser.add_argument_group("cloud autoscaling")
    scaling.add_argument("--autoscaler", default="none",
                         metavar="{" + ",".join(autoscaler_names()) + "}",
                         help="who decides the cluster's size: none (fixed --nodes, the "
                              "default), pollux (goodput-aware) or throughput (baseline)")
    scaling.add_argument("--min-nodes", type=int, default=None,
                         help="autoscaling: fewest nodes, and the starting size (default 1)")
    scaling.add_argument("--max-nodes", type=int, default=None,
                         help="autoscaling: most nodes (default: --nodes)")
    scaling.add_argument("--node-price", type=float, default=DEFAULT_NODE_PRICE_PER_HOUR,
                         help="price of a node-hour for the reported cost (default "
                              f"{DEFAULT_NODE_PRICE_PER_HOUR}, an AWS g4dn.12xlarge)")
    scaling.add_argument("--utility-band", metavar="LOW:HIGH", default=None,
                         help="pollux autoscaler: the cluster-utility band it keeps (default "
                              f"{DEFAULT_LOW_UTIL}:{DEFAULT_HIGH_UTIL}; lower grows sooner, "
                              "finishing sooner at a higher cost)")
    scaling.add_argument("--provision-delay-s", type=float, default=120.0,
                         help="autoscaling: seconds before a requested node is usable "
                              "(billed meanwhile; default 120)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the policies and of the generated workload (default 0)")
    parser.add_argument("--jobs", type=int, default=DEFAULT_GENERATED_JOBS,
                        help=f"jobs of the generated workload (default {DEFAULT_GENERATED_JOBS})")
    parser.add_argument("--hours", type=float, default=DEFAULT_GENERATED_HOURS,
                        help="hours of arrivals of the generated workload "
                             f"(default {DEFAULT_GENERATED_HOURS:g})")
    parser.add_argument("--processes", type=int, default=0,
                        help="worker processes (default: one per run, up to the CPU count)")
    parser.add_argument("--json", metavar="OUT",
                        help="write every run's figures as JSON to OUT ('-': stdout, "
                             "instead of the table)")
    parser.add_argument("--plot", metavar="DIR", help="save PNG figures in DIR")
    parser.add_argument("--html", metavar="OUT",
                        help="write one self-contained HTML page with the tables and every "
                             "figure (embedded; shareable as a single file)")
    from pollux.cli.simulate_typed import TYPED_UNSUPPORTED

    parser.set_defaults(func=run, typed_unsupported_defaults={
        dest: parser.get_default(dest) for dest in TYPED_UNSUPPORTED})
