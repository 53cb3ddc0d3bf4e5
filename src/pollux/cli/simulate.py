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
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pollux.cli.output import make_console
from pollux.cli.simulate_tables import result_tables, rich_table
from pollux.cluster_spec import ClusterSpec, parse_cluster_spec
from pollux.errors import ConfigError
from pollux.policies.autoscaling import (
    DEFAULT_HIGH_UTIL,
    DEFAULT_LOW_UTIL,
    DEFAULT_NODE_PRICE_PER_HOUR,
    autoscaler_names,
    check_autoscaler_name,
)
from pollux.policies.registry import canonical_spec, policy_names
from pollux.sim.generator import generate_workload
from pollux.sim.hetero.lower_bound import with_typed_lower_bounds
from pollux.sim.hetero.runner import HeteroTask, load_for, run_hetero_outcomes
from pollux.sim.lower_bound import with_lower_bounds
from pollux.sim.metrics import RunRecord, report
from pollux.sim.runner import RunOutcome, RunTask, load_applications, run_tasks
from pollux.sim.simulator import ClusterConfig
from pollux.sim.workload import Workload, read_workload, workload_files
from pollux.spec import split_specs

DEFAULT_POLICIES = "tiresias,optimus,pollux"
DEFAULT_GENERATED_JOBS = 40
DEFAULT_GENERATED_HOURS = 2.0


def _policies(text: str) -> list[str]:
    """``--policy`` as canonical specs (checked; ``sia,pollux(p=-0.5,x=4)``: two)."""
    return list(dict.fromkeys(canonical_spec(spec) for spec in split_specs(text)))


def _workloads(args: argparse.Namespace, applications: set[str]) -> list[Workload]:
    if not args.workloads:
        return [generate_workload(args.jobs, args.hours, args.seed)]
    return [read_workload(path, applications) for path in workload_files(args.workloads)]


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


def _progress(console: Console, total: int) -> tuple[Progress, Callable[[RunOutcome], None]]:
    """A transient progress bar and the callback that advances it per finished run."""
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                        transient=True)
    bar = progress.add_task("simulating", total=total)

    def done(outcome: RunOutcome) -> None:
        rec = outcome.record
        progress.update(bar, advance=1, description=f"{rec.policy} on {rec.workload}: "
                                                    f"{rec.avg_jct_s:.0f} s avg JCT")
    return progress, done


def _homogeneous(args: argparse.Namespace, policies: list[str], console: Console
                 ) -> tuple[list[RunRecord], list[RunOutcome], str]:
    """Every (workload, policy) on the one-type cluster; the records, the outcomes and
    the description of the runs."""
    config = _cluster_config(args)
    apps = load_applications(args.traces)
    workloads = _workloads(args, set(apps))
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
    progress, done = _progress(console, len(tasks))
    with progress:
        outcomes = run_tasks(tasks, processes, done)
    records = with_lower_bounds([o.record for o in outcomes], workloads, apps, config)
    return records, outcomes, (f"{len(workloads)} workload(s) on {cluster}, applications "
                               f"from {source}, seed {args.seed}")


def _typed(args: argparse.Namespace, spec: ClusterSpec, policies: list[str],
           console: Console) -> tuple[list[RunRecord], list[RunOutcome], str]:
    """Every (workload, policy) on the typed cluster ``spec`` (per-type traces)."""
    check_typed_options(args)
    if not args.traces:
        raise ConfigError("traces", None, "a typed --cluster needs per-type traces, e.g. "
                          "--traces ../shared/sia-artifact/traces")
    if not args.workloads:
        raise ConfigError("workloads", None, "give workload files or folders for a typed "
                          "--cluster, e.g. ../shared/sia-artifact/workloads/philly")
    apps = load_for(str(spec), args.traces)
    workloads = [read_workload(path, set(apps)) for path in workload_files(args.workloads)]
    tasks = [HeteroTask(policy, workload, str(spec), args.traces, args.interval, args.seed,
                        timeline=bool(args.plot or args.html))
             for workload in workloads for policy in policies]
    processes = args.processes or min(len(tasks), os.cpu_count() or 1)
    cluster = f"{spec} ({spec.num_gpus} GPUs)"
    console.print(f"{len(workloads)} workload(s) x {len(policies)} policies on {cluster}, "
                  f"applications from {args.traces}, {processes} process(es)",
                  highlight=False)
    progress, done = _progress(console, len(tasks))
    with progress:
        outcomes = run_hetero_outcomes(tasks, processes, done)
    records = with_typed_lower_bounds([o.record for o in outcomes], workloads, apps, spec,
                                      args.interval)
    return records, outcomes, (f"{len(workloads)} workload(s) on {cluster}, applications "
                               f"from {args.traces}, seed {args.seed}")


TYPED_UNSUPPORTED = {
    "nodes": "--nodes", "gpus_per_node": "--gpus-per-node",
    "restart_delay": "--restart-delay", "interference": "--interference",
    "job_knowledge": "--job-knowledge", "autoscaler": "--autoscaler",
    "min_nodes": "--min-nodes", "max_nodes": "--max-nodes", "node_price": "--node-price",
    "utility_band": "--utility-band", "provision_delay_s": "--provision-delay-s",
    "jobs": "--jobs", "hours": "--hours",
}
"""Options (argparse dest -> flag) a typed ``--cluster`` does not take yet; given with
one they are refused rather than silently ignored."""


def check_typed_options(args: argparse.Namespace) -> None:
    """ConfigError naming the first option given that a typed cluster does not take."""
    defaults = getattr(args, "typed_unsupported_defaults", {})
    for dest, flag in TYPED_UNSUPPORTED.items():
        if dest in defaults and getattr(args, dest, None) != defaults[dest]:
            raise ConfigError(flag, getattr(args, dest), "not available with a typed "
                              "--cluster (the typed simulator takes --policy, --traces, "
                              "--interval, --seed, --processes, --json, --plot and --html)")


def run(args: argparse.Namespace) -> int:
    json_out = args.json == "-"  # stdout is the JSON: progress and notes go to stderr
    console = Console(stderr=True) if json_out else make_console()
    if args.list_policies:
        from pollux.cli.policies import policy_listing

        console.print(policy_listing(), highlight=False, markup=False)
        return 0
    policies = _policies(args.policy)
    spec = None if args.cluster is None else parse_cluster_spec(args.cluster)
    if spec is not None and not spec.is_typed:
        if len(spec.groups) > 1:
            raise ConfigError("cluster", args.cluster, "untyped groups must be one NODESxGPUS")
        args.nodes, args.gpus_per_node = spec.groups[0].num_nodes, spec.groups[0].gpus_per_node
    typed = spec is not None and spec.is_typed
    records, outcomes, description = (
        _typed(args, spec, policies, console) if spec is not None and typed
        else _homogeneous(args, policies, console))
    tables = result_tables(records)
    for table in tables if not json_out else []:
        console.print(rich_table(table))
    if json_out:
        print(json.dumps(report(records), indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(report(records), indent=1) + "\n")
        console.print(f"wrote {args.json}", highlight=False)
    timelines = [o.timeline for o in outcomes]
    if args.plot:
        from pollux.sim.plots import save_plots

        paths = save_plots(records, timelines, args.plot)
        console.print(f"wrote {len(paths)} plots to {args.plot}", highlight=False)
    if args.html:
        from pollux.sim.report import write_report

        title = "Pollux simulation" + (" on a typed cluster" if typed else "")
        write_report(args.html, title, description, tables, records, timelines)
        console.print(f"wrote {args.html}", highlight=False)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate", help="simulate workloads under scheduling policies",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help="workload CSV files or folders of CSVs (default: generate one)")
    parser.add_argument("--policy", default=DEFAULT_POLICIES,
                        help=f"comma-separated policy specs, NAME or NAME(key=value,...) "
                             f"(default {DEFAULT_POLICIES}; names: {', '.join(policy_names())};"
                             f" options: --list-policies)")
    parser.add_argument("--list-policies", action="store_true",
                        help="list the named policies with their options and defaults, and exit")
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
    parser.set_defaults(func=run, typed_unsupported_defaults={
        dest: parser.get_default(dest) for dest in TYPED_UNSUPPORTED})
