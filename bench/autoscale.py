"""Benchmark of cloud autoscaling: node-hours, cost and JCT, side by side, of a fixed
cluster, the throughput-based autoscaler and the goodput-aware (Pollux) autoscaler.

    python bench/autoscale.py                       # one imagenet job, then workload-1
    python bench/autoscale.py --builtin             # the built-in catalog, not the traces
    python bench/autoscale.py --workload workload-3 --bands 0.6:0.78,0.35:0.65
    python bench/autoscale.py --skip-workload
    python bench/autoscale.py --artifact DIR --markdown docs/research/results/autoscale.md

Every run uses the Pollux policy on nodes of 4 GPUs (up to ``--max-nodes``, 16), a 60 s
scheduling interval, 120 s to provision a node and the on-demand price of an AWS
g4dn.12xlarge; the fixed cluster has ``--max-nodes`` nodes all along. Aim: the Pollux
autoscaler at least 25% fewer node-hours than the throughput one, JCT at most 10% longer.

The baseline is throughput-based throughout, as the system of Or et al. (MLSys'20) the
paper compares with: the autoscaler adds a node while it still adds at least half of its
ideal throughput (samples per second), and the jobs ignore statistical efficiency too,
each training at its throughput-optimal batch size (which grows with its GPUs up to the
largest batch it allows) and reporting its throughput speedup to the policy. True
progress still counts statistical efficiency, so the large batches of inefficient phases
cost it time and nodes. Under the fixed cluster and the Pollux autoscaler, jobs pick their
goodput-optimal batch. For the single job the extra utility bands (``--bands``) show the
Pollux autoscaler's cost/time trade-off: a higher band keeps fewer nodes busier and
finishes later, so the band whose JCT matches the baseline's shows the saving at similar
completion time, the paper's comparison.

For the single job the script also prints an *ideal per-epoch sizing*: with the true
application model, the node count of each epoch chosen to spend the fewest node-hours
within a completion time (no exploration, restarts or provisioning), i.e. what any
autoscaler could at best save at that completion time. The traces default to
../shared/pollux-artifact seen from the repository root; the workload part is skipped
when they are absent.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from pollux.sim.applications import Application
from pollux.sim.job import JobSpec
from pollux.sim.metrics import RunRecord
from pollux.sim.runner import RunTask, load_applications, run_tasks
from pollux.sim.simulator import ClusterConfig
from pollux.sim.workload import Workload, read_workload

ARTIFACT = Path(__file__).resolve().parents[1].parent / "shared" / "pollux-artifact"
AUTOSCALERS = ("none", "throughput", "pollux")
GPUS_PER_NODE = 4
NUM_BATCH_CANDIDATES = 32


def cluster(max_nodes: int) -> ClusterConfig:
    return ClusterConfig(num_nodes=max_nodes, gpus_per_node=GPUS_PER_NODE, min_nodes=1,
                         max_nodes=max_nodes, provision_delay_s=120.0)


def label(task: RunTask) -> str:
    if task.autoscaler == "none":
        return f"fixed, {task.config.num_nodes} nodes"
    options = dict(task.autoscaler_options)
    if "low_util" in options:
        return f"pollux, band {options['low_util']:g}-{options['high_util']:g}"
    return task.autoscaler


def mean_nodes(record: RunRecord) -> float:
    """Time-average of the billed nodes (node-hours over the billed span)."""
    end = max((j.completion_s or 0.0) for j in record.jobs)
    return record.node_hours * 3600 / end if end > 0 else float("nan")


def table(title: str, tasks: list[RunTask], records: list[RunRecord]) -> Table:
    out = Table(title=title)
    for column in ("autoscaler", "node-hours", "cost $", "avg JCT h", "makespan h",
                   "mean nodes", "peak nodes", "restarts", "wall s"):
        out.add_column(column, justify="left" if column == "autoscaler" else "right",
                       no_wrap=True)
    for task, rec in zip(tasks, records):
        out.add_row(label(task), f"{rec.node_hours:.1f}", f"{rec.cost:,.0f}",
                    f"{rec.avg_jct_s / 3600:.2f}", f"{rec.makespan_s / 3600:.2f}",
                    f"{mean_nodes(rec):.1f}", str(max(rec.nodes_over_time.num_billed_nodes)),
                    f"{rec.restarts_per_job:.2f}", f"{rec.wall_s:.1f}")
    return out


def markdown_table(title: str, tasks: list[RunTask], records: list[RunRecord],
                   base: RunRecord) -> list[str]:
    """The table as Markdown, with node-hours and JCT against the throughput autoscaler."""
    lines = [f"**{title}**", "",
             "| autoscaler | node-hours | cost ($) | avg JCT (h) | makespan (h) | mean nodes "
             "| peak nodes | node-hours vs throughput | avg JCT vs throughput |",
             "|---|---|---|---|---|---|---|---|---|"]
    for task, rec in zip(tasks, records):
        lines.append(f"| {label(task)} | {rec.node_hours:.1f} | {rec.cost:,.0f} | "
                     f"{rec.avg_jct_s / 3600:.2f} | {rec.makespan_s / 3600:.2f} | "
                     f"{mean_nodes(rec):.1f} | {max(rec.nodes_over_time.num_billed_nodes)} | "
                     f"{rec.node_hours / base.node_hours - 1:+.1%} | "
                     f"{rec.avg_jct_s / base.avg_jct_s - 1:+.1%} |")
    return [*lines, ""]


def verdict(console: Console, base: RunRecord, ours: RunRecord, name: str = "pollux") -> None:
    """Node-hours and average JCT of a Pollux autoscaler run relative to the throughput one."""
    hours = ours.node_hours / base.node_hours - 1
    jct = ours.avg_jct_s / base.avg_jct_s - 1
    met = hours <= -0.25 and jct <= 0.10
    console.print(f"{name} vs throughput autoscaler: node-hours {hours:+.1%}, cost "
                  f"{ours.cost / base.cost - 1:+.1%}, avg JCT {jct:+.1%} "
                  f"(aim: <= -25% node-hours with <= +10% JCT: {'met' if met else 'NOT met'})",
                  highlight=False)


# -- the ideal per-epoch sizing of one job ----------------------------------------------

def epoch_seconds(app: Application, num_nodes: int, epoch: int) -> float:
    """Seconds of one epoch on ``num_nodes`` whole nodes at the goodput-optimal batch of the
    true model (the simulator's progress rule: gain per step over step time)."""
    spec = app.spec
    replicas = num_nodes * GPUS_PER_NODE
    placement = (GPUS_PER_NODE,) * num_nodes
    lowest = max(spec.init_batch_size, spec.min_local_bsz * replicas)
    best = 0.0
    for total in np.unique(np.geomspace(lowest, max(lowest, spec.max_batch_size),
                                        NUM_BATCH_CANDIDATES).round()):
        atomic, accum = spec.fixed_batch_config(float(total), replicas)
        if atomic < 1:
            continue
        batch = replicas * atomic * (accum + 1)
        step, sync = app.step_sync_time(placement, atomic)
        sqr, var = app.grad_stats(batch, epoch)
        gain = (var + sqr) / (var / (batch / spec.init_batch_size) + sqr)
        best = max(best, gain / (step + (step - sync) * accum))
    return (app.epoch_progress(epoch + 1) - app.epoch_progress(epoch)) / best


def ideal_node_hours(app: Application, max_nodes: int, jct_limit_s: float) -> tuple[float, float]:
    """Fewest node-hours (and the JCT in hours) of per-epoch sizes finishing within
    ``jct_limit_s``: Lagrangian sweep of node-seconds + price x seconds per epoch."""
    sizes = np.arange(1, max_nodes + 1)
    seconds = np.array([[epoch_seconds(app, int(n), e) for n in sizes]
                        for e in range(app.spec.max_epochs)])
    best = (float("inf"), float("nan"))
    rows = np.arange(seconds.shape[0])
    for price in np.geomspace(0.05, 1000.0, 400):
        pick = np.argmin(seconds * (sizes[None, :] + price), axis=1)
        jct = float(seconds[rows, pick].sum())
        node_s = float((seconds[rows, pick] * sizes[pick]).sum())
        if jct <= jct_limit_s and node_s < best[0]:
            best = (node_s, jct)
    return best[0] / 3600, best[1] / 3600


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", default=str(ARTIFACT))
    parser.add_argument("--builtin", action="store_true",
                        help="applications from the built-in catalog, not the traces")
    parser.add_argument("--workload", default="workload-1",
                        help="shared workload to run (default workload-1)")
    parser.add_argument("--skip-workload", action="store_true")
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--bands", default="0.35:0.65,0.5:0.8,0.65:0.8",
                        help="extra utility bands of the Pollux autoscaler for the single job "
                             "(default 0.35:0.65,0.5:0.8,0.65:0.8; '' for none)")
    parser.add_argument("--processes", type=int, default=min(3, os.cpu_count() or 1))
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                        help="also write the tables as Markdown to PATH (the docs' research "
                             "pages include it)")
    args = parser.parse_args()
    written: list[str] = []
    console = Console(width=max(Console().width, 120))
    artifact = Path(args.artifact)
    has_traces = (artifact / "traces").is_dir()
    traces = None if args.builtin or not has_traces else str(artifact / "traces")
    source = "built-in catalog" if traces is None else "traces"
    console.print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())} "
                  f"on {os.cpu_count()} cores; {args.processes} process(es)", highlight=False)
    console.print("baseline 'throughput': a node is added while it adds >= 50% of its ideal "
                  "throughput, and jobs train at their throughput-optimal batch (statistical "
                  "efficiency ignored in both); 'pollux': utility band 0.6-0.78, jobs at "
                  "their goodput-optimal batch; 'fixed': all nodes, goodput-optimal batch",
                  highlight=False)
    start = time.perf_counter()

    config = cluster(args.max_nodes)
    job = Workload("imagenet-alone", (JobSpec("imagenet-0", 0.0, "imagenet", 32, 6400),))
    tasks = [RunTask("pollux", job, config, traces, autoscaler=name) for name in AUTOSCALERS]
    for band in filter(None, args.bands.split(",")):
        low, high = (float(x) for x in band.split(":"))
        tasks.append(RunTask("pollux", job, config, traces, autoscaler="pollux",
                             autoscaler_options={"low_util": low, "high_util": high}))
    records = [o.record for o in run_tasks(tasks, args.processes)]
    console.print(table(f"one imagenet job, 1..{args.max_nodes} nodes x {GPUS_PER_NODE} GPUs "
                        f"({source})", tasks, records))
    verdict(console, records[1], records[2])
    written += markdown_table(f"One imagenet job, 1 to {args.max_nodes} nodes of "
                              f"{GPUS_PER_NODE} GPUs ({source})", tasks, records, records[1])
    for task, record in zip(tasks[3:], records[3:]):
        verdict(console, records[1], record, label(task))
    throughput = records[1]
    limit_s = 1.10 * throughput.avg_jct_s
    app = load_applications(traces)["imagenet"]
    ideal, ideal_jct = ideal_node_hours(app, args.max_nodes, limit_s)
    console.print(f"ideal per-epoch sizing within {limit_s / 3600:.2f} h (throughput JCT + 10%): "
                  f"{ideal:.1f} node-hours in {ideal_jct:.2f} h, "
                  f"{ideal / throughput.node_hours - 1:+.1%} vs the throughput autoscaler",
                  highlight=False)

    if args.skip_workload:
        pass
    elif not has_traces:
        console.print(f"skipping the shared workload: no traces at {artifact / 'traces'}",
                      highlight=False)
    else:
        trace_dir = str(artifact / "traces")
        apps = load_applications(trace_dir)
        workload = read_workload(artifact / "workloads" / f"{args.workload}.csv", set(apps))
        tasks = [RunTask("pollux", workload, config, trace_dir, autoscaler=name)
                 for name in AUTOSCALERS]
        records = [o.record for o in run_tasks(tasks, args.processes)]
        console.print(table(f"{args.workload} ({len(workload)} jobs, traces)", tasks,
                            records))
        verdict(console, records[1], records[2])
        written += markdown_table(f"{args.workload} ({len(workload)} jobs, traces)", tasks,
                                  records, records[1])
    console.print(f"wall time: {time.perf_counter() - start:.1f} s; load average at end: "
                  f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}", highlight=False)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join(written))
        console.print(f"wrote {args.markdown}", highlight=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
