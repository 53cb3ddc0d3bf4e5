"""``pollux simulate --cluster type:NODESxGPUS,...``: runs on a cluster of several GPU types.

Applications come from per-type traces (``--traces DIR`` with
``<app>/placements-<type>.csv``, the Sia artifact's layout); every run record has the
keys of the homogeneous JSON, with ``gpu_hours_per_job`` counting whole rounds held, and
``lower_bound_avg_jct_s`` from :mod:`pollux.sim.hetero.lower_bound`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rich.console import Console

from pollux.cluster_spec import ClusterSpec
from pollux.errors import ConfigError
from pollux.sim.hetero.lower_bound import with_typed_lower_bounds
from pollux.sim.hetero.runner import HeteroTask, load_for, run_hetero_outcomes
from pollux.sim.metrics import report
from pollux.sim.runner import RunOutcome
from pollux.sim.workload import read_workload, workload_files

TYPED_UNSUPPORTED = {
    "nodes": "--nodes", "gpus_per_node": "--gpus-per-node",
    "restart_delay": "--restart-delay", "interference": "--interference",
    "job_knowledge": "--job-knowledge", "autoscaler": "--autoscaler",
    "min_nodes": "--min-nodes", "max_nodes": "--max-nodes", "node_price": "--node-price",
    "utility_band": "--utility-band", "provision_delay_s": "--provision-delay-s",
    "jobs": "--jobs", "hours": "--hours",
}
"""Options of ``pollux simulate`` (argparse dest -> flag) the typed simulator does not
take: the cluster comes from the spec, restart delays are per application (the
reference's), and workloads are given, not generated. Given with a typed ``--cluster``
they are refused rather than silently ignored."""


def check_typed_options(args: argparse.Namespace) -> None:
    """ConfigError naming the first option given that a typed cluster does not take."""
    defaults = getattr(args, "typed_unsupported_defaults", {})
    for dest, flag in TYPED_UNSUPPORTED.items():
        if dest in defaults and getattr(args, dest, None) != defaults[dest]:
            raise ConfigError(flag, getattr(args, dest), "not available with a typed "
                              "--cluster (the typed simulator takes --policy, --traces, "
                              "--interval, --seed, --processes, --json, --plot and --html)")


def run_typed(args: argparse.Namespace, spec: ClusterSpec, policies: list[str],
              console: Console) -> int:
    """Run every (workload, policy) on the typed cluster ``spec``; print and save."""
    from pollux.cli.simulate import _policy_table, _rich, _workload_table

    check_typed_options(args)
    if not args.traces:
        raise ConfigError("traces", None, "a typed --cluster needs per-type traces, e.g. "
                          "--traces ../shared/sia-artifact/traces")
    if not args.workloads:
        raise ConfigError("workloads", None, "give workload files or folders for a typed "
                          "--cluster, e.g. ../shared/sia-artifact/workloads/philly")
    apps = load_for(str(spec), args.traces)
    workloads = [read_workload(path, set(apps)) for path in workload_files(args.workloads)]
    timelines_wanted = bool(args.plot or args.html)
    tasks = [HeteroTask(policy, workload, str(spec), args.traces, args.interval, args.seed,
                        timeline=timelines_wanted)
             for workload in workloads for policy in policies]
    processes = args.processes or min(len(tasks), os.cpu_count() or 1)
    console.print(f"{len(workloads)} workload(s) x {len(policies)} policies on {spec} "
                  f"({spec.num_gpus} GPUs), applications from {args.traces}, "
                  f"{processes} process(es)", highlight=False)

    def done(outcome: RunOutcome) -> None:
        record = outcome.record
        console.print(f"  {record.policy} on {record.workload}: {record.avg_jct_s:,.0f} s "
                      f"avg JCT", highlight=False)

    outcomes = run_hetero_outcomes(tasks, processes, done)
    records = with_typed_lower_bounds([o.record for o in outcomes], workloads, apps, spec,
                                      args.interval)
    timelines = [o.timeline for o in outcomes]
    tables = [_policy_table(records)] + ([_workload_table(records)] if len(workloads) > 1
                                         else [])
    for table in tables:
        console.print(_rich(table))
    if args.json == "-":
        print(json.dumps(report(records), indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(report(records), indent=1) + "\n")
        console.print(f"wrote {args.json}", highlight=False)
    if args.plot:
        from pollux.sim.plots import save_plots

        paths = save_plots(records, timelines, args.plot)
        console.print(f"wrote {len(paths)} plots to {args.plot}", highlight=False)
    if args.html:
        from pollux.sim.report import write_report

        write_report(args.html, "Pollux simulation on a typed cluster",
                     f"{len(workloads)} workload(s) on {spec} ({spec.num_gpus} GPUs), "
                     f"applications from {args.traces}, seed {args.seed}", tables, records,
                     timelines)
        console.print(f"wrote {args.html}", highlight=False)
    return 0
