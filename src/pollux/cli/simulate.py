"""``pollux simulate``: run workloads through scheduling policies on a simulated cluster.

With no WORKLOAD a workload is generated with the paper's job mix (``--jobs``,
``--hours``, ``--seed``). Applications come from ``--traces DIR`` (the Pollux artifact
format) or, by default, from the built-in catalog. Runs go to parallel processes; the
table compares policies side by side; ``--json`` and ``--plot`` save the details.

``--autoscaler pollux`` (goodput-aware) or ``throughput`` (the baseline) makes the cluster
elastic: it starts at ``--min-nodes``, grows up to ``--max-nodes`` (default ``--nodes``)
and new nodes become usable ``--provision-delay-s`` after they are requested; node-hours
and their cost at ``--node-price`` are reported.

``--teams FILE`` schedules by teams (:mod:`pollux.teams`; the workloads' ``team``
column, every job in ``default`` without it) and reports per-team figures;
``--partitioned`` adds, for each policy, the run of private clusters (each team alone on
nodes of its quota) beside the shared one.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from threadpoolctl import threadpool_limits

from pollux.cli.output import make_console
from pollux.cli.simulate_tables import result_tables, rich_table
from pollux.cluster_spec import parse_cluster_spec
from pollux.errors import ConfigError
from pollux.policies.autoscaling import (
    DEFAULT_HIGH_UTIL,
    DEFAULT_LOW_UTIL,
    DEFAULT_NODE_PRICE_PER_HOUR,
    autoscaler_names,
    check_autoscaler_name,
    parse_node_prices,
)
from pollux.policies.registry import canonical_spec, policy_names
from pollux.sim.generator import generate_workload
from pollux.sim.lower_bound import with_lower_bounds
from pollux.sim.metrics import report
from pollux.sim.runner import RunOutcome, RunTask, load_applications, run_tasks
from pollux.sim.semantics import POLLUX_ARTIFACT, SIA_ARTIFACT
from pollux.sim.simulator import ClusterConfig
from pollux.sim.workload import Workload, read_workload, workload_files
from pollux.spec import split_specs
from pollux.teams import load_teams

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
    """The cluster of ``--cluster`` (typed: per-type traces, the Sia artifact's semantics)
    or ``--nodes`` x ``--gpus-per-node``, with the loop and autoscaling options."""
    autoscaler = check_autoscaler_name(args.autoscaler)
    if autoscaler == "none":
        for flag, value in (("--min-nodes", args.min_nodes), ("--max-nodes", args.max_nodes)):
            if value is not None:
                raise ConfigError("autoscaler", autoscaler,
                                  f"{flag} needs --autoscaler pollux or throughput")
    spec = None if args.cluster is None else parse_cluster_spec(args.cluster)
    typed = spec is not None and spec.is_typed
    if spec is not None and not typed:
        if len(spec.groups) > 1:
            raise ConfigError("cluster", args.cluster, "untyped groups must be one NODESxGPUS")
        args.nodes, args.gpus_per_node = spec.groups[0].num_nodes, spec.groups[0].gpus_per_node
    elif typed:
        for flag, value in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node)):
            if value is not None:
                raise ConfigError(flag, value, "a typed --cluster gives the nodes of each "
                                  "type; leave it out or change --cluster")
    semantics = POLLUX_ARTIFACT
    if typed:
        semantics = (SIA_ARTIFACT if args.restart_delay is None
                     else replace(SIA_ARTIFACT, restart_delays_s=None))
    return ClusterConfig(num_nodes=args.nodes or 16, gpus_per_node=args.gpus_per_node or 4,
                         interval_s=args.interval,
                         restart_delay_s=30.0 if args.restart_delay is None
                         else args.restart_delay,
                         interference=args.interference,
                         min_nodes=1 if args.min_nodes is None else args.min_nodes,
                         max_nodes=args.max_nodes, node_price_per_hour=parse_node_prices(args.node_price),
                         provision_delay_s=args.provision_delay_s,
                         cluster=spec if typed else None, semantics=semantics)


def _autoscaler_options(args: argparse.Namespace) -> dict[str, float]:
    """``--utility-band LOW:HIGH`` and ``--max-price-per-hour`` as the Pollux autoscaler's
    options (their values checked there)."""
    options: dict[str, float] = {}
    if args.max_price_per_hour is not None:
        typed = args.cluster is not None and parse_cluster_spec(args.cluster).is_typed
        if args.autoscaler != "pollux" or not typed:
            raise ConfigError("max_price_per_hour", args.max_price_per_hour,
                              "needs --autoscaler pollux on a typed --cluster "
                              "(TYPE:NODESxGPUS,...)")
        options["max_price_per_hour"] = args.max_price_per_hour
    if args.utility_band is None:
        return options
    if args.autoscaler != "pollux":
        raise ConfigError("utility_band", args.utility_band, "needs --autoscaler pollux")
    try:
        low, high = (float(part) for part in args.utility_band.split(":"))
    except ValueError:
        raise ConfigError("utility_band", args.utility_band,
                          "write LOW:HIGH, e.g. 0.6:0.78") from None
    return {**options, "low_util": low, "high_util": high}


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


def _describe(args: argparse.Namespace, config: ClusterConfig) -> str:
    """The cluster in words."""
    spec = config.spec
    if config.cluster is not None:
        cluster = f"{spec} ({spec.num_gpus} GPUs)"
        if args.autoscaler != "none":
            cluster = f"up to {cluster}, from {config.min_nodes} node(s)"
    else:
        cluster = f"{config.num_nodes} x {config.gpus_per_node} GPUs"
        if args.autoscaler != "none":
            cluster = (f"{config.min_nodes}..{config.scaling_max_nodes} nodes x "
                       f"{config.gpus_per_node} GPUs")
    return cluster + (f" ({args.autoscaler} autoscaler)" if args.autoscaler != "none" else "")


def run(args: argparse.Namespace) -> int:
    json_out = args.json == "-"  # stdout is the JSON: progress and notes go to stderr
    console = Console(stderr=True) if json_out else make_console()
    if args.list_policies:
        from pollux.cli.policies import policy_listing

        console.print(policy_listing(), highlight=False, markup=False)
        return 0
    policies = _policies(args.policy)
    config = _cluster_config(args)
    autoscaler_options = _autoscaler_options(args)
    apps = load_applications(args.traces, config)
    workloads = _workloads(args, set(apps))
    teams = None if args.teams is None else load_teams(args.teams, config.spec, "--teams")
    if args.partitioned and teams is None:
        raise ConfigError("--partitioned", True, "private clusters need --teams FILE")
    tasks = [RunTask(policy, workload, config, args.traces, args.seed,
                     timeline=args.plot is not None or args.html is not None,
                     autoscaler=args.autoscaler, autoscaler_options=autoscaler_options,
                     job_knowledge=args.job_knowledge, teams=teams, partitioned=partitioned)
             for workload in workloads for policy in policies
             for partitioned in ((False, True) if args.partitioned else (False,))]
    processes = args.processes or min(len(tasks), os.cpu_count() or 1)
    source = args.traces or "built-in catalog"
    cluster = _describe(args, config)
    console.print(f"{len(workloads)} workload(s) x {len(policies)} policies on "
                  f"{cluster}, applications from {source}, "
                  f"{processes} process(es)", highlight=False)
    progress, done = _progress(console, len(tasks))
    with progress, threadpool_limits(limits=1, user_api="blas"):  # see runner.execute
        outcomes = run_tasks(tasks, processes, done)
        records = with_lower_bounds([o.record for o in outcomes], workloads, apps, config)
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
        from pollux.sim.html_report import write_report

        title = "Pollux simulation" + (" on a typed cluster" if config.cluster else "")
        write_report(args.html, title, f"{len(workloads)} workload(s) on {cluster}, "
                     f"applications from {source}, seed {args.seed}", tables, records,
                     timelines)
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
    parser.add_argument("--nodes", type=int, default=None, help="nodes (default 16)")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="GPUs per node (default 4)")
    parser.add_argument("--interval", type=float, default=60.0,
                        help="seconds between scheduling rounds (default 60)")
    parser.add_argument("--restart-delay", type=float, default=None,
                        help="seconds a job idles after each placement change (default 30; "
                             "on a typed cluster: per application, as Sia's artifact)")
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
    scaling.add_argument("--node-price", default=str(DEFAULT_NODE_PRICE_PER_HOUR),
                         metavar="PRICE|TYPE=PRICE,...",
                         help="price of a node-hour, one for every type or per GPU type "
                              "(t4=3.91,a100=32.77): the reported cost, and what the typed "
                              f"autoscaler weighs (default {DEFAULT_NODE_PRICE_PER_HOUR}, an "
                              "AWS g4dn.12xlarge)")
    scaling.add_argument("--utility-band", metavar="LOW:HIGH", default=None,
                         help="pollux autoscaler: the cluster-utility band it keeps (default "
                              f"{DEFAULT_LOW_UTIL}:{DEFAULT_HIGH_UTIL}; lower grows sooner, "
                              "finishing sooner at a higher cost)")
    scaling.add_argument("--max-price-per-hour", type=float, default=None, metavar="PRICE",
                         help="typed pollux autoscaler: a budget, the most the whole cluster "
                              "may cost per hour at --node-price (default: no bound)")
    scaling.add_argument("--provision-delay-s", type=float, default=120.0,
                         help="autoscaling: seconds before a requested node is usable "
                              "(billed meanwhile; default 120)")
    parser.add_argument("--teams", metavar="FILE", default=None,
                        help="teams file (quota_gpus, weight per team): schedule by teams "
                             "and report per-team figures")
    parser.add_argument("--partitioned", action="store_true",
                        help="also run each policy on private clusters: each team alone "
                             "on nodes of its quota (needs --teams)")
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
    parser.set_defaults(func=run)
