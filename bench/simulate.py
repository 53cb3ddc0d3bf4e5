"""Benchmark of the simulator: the paper's 8 workloads under the baselines, and a large one.

    python bench/simulate.py                    # 8 workloads x tiresias, optimus (traces)
    python bench/simulate.py --policy pollux    # any registered policies
    python bench/simulate.py --builtin          # the built-in catalog instead of traces
    python bench/simulate.py --scale            # 2,000 generated jobs on 256 x 8 GPUs
                                                # (built-in catalog unless --traces)
    python bench/simulate.py --artifact DIR --markdown docs/research/results/baselines-16x4.md

Prints each run's average JCT next to the published figure, the mean per policy, and the
wall time of the whole batch (aim: the 16 baseline runs under 60 s on 2 cores). The
traces default to ../shared/pollux-artifact seen from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pollux.sim.generator import generate_workload
from pollux.sim.runner import RunTask, load_applications, run_tasks
from pollux.sim.simulator import ClusterConfig
from pollux.sim.workload import read_workload, workload_files

ARTIFACT = Path(__file__).resolve().parents[1].parent / "shared" / "pollux-artifact"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="tiresias,optimus")
    parser.add_argument("--artifact", default=str(ARTIFACT))
    parser.add_argument("--builtin", action="store_true", help="use the built-in catalog")
    parser.add_argument("--traces", action="store_true",
                        help="use the artifact traces even with --scale (measured on 4-GPU "
                             "nodes, so 8-GPU placements are extrapolated)")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--scale", action="store_true",
                        help="run 2,000 generated jobs on 256 nodes x 8 GPUs instead")
    parser.add_argument("--scale-jobs", type=int, default=2000)
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                        help="also write the comparison with the published figures as a "
                             "Markdown table to PATH (the docs' research pages include it)")
    args = parser.parse_args()
    console = Console(width=max(Console().width, 110))
    artifact = Path(args.artifact)
    builtin = args.builtin or (args.scale and not args.traces)
    traces = None if builtin else str(artifact / "traces")
    policies = [p for p in args.policy.split(",") if p]
    apps = set(load_applications(traces))
    if args.scale:
        config = ClusterConfig(num_nodes=256, gpus_per_node=8)
        workloads = [generate_workload(args.scale_jobs, 8.0, seed=0)]
    else:
        config = ClusterConfig()
        workloads = [read_workload(p, apps) for p in workload_files([artifact / "workloads"])]
    tasks = [RunTask(p, w, config, traces) for w in workloads for p in policies]
    published = {}
    results_path = artifact / "published-results.json"
    if results_path.is_file() and not args.scale:
        published = json.loads(results_path.read_text())["policies"]
    start = time.perf_counter()
    outcomes = run_tasks(tasks, args.processes)
    wall = time.perf_counter() - start
    table = Table(title=f"{len(tasks)} runs on {config.num_nodes} x {config.gpus_per_node} "
                        f"GPUs ({'built-in catalog' if traces is None else 'traces'})")
    for col in ("policy", "workload", "jobs done", "avg JCT (s)", "published (s)", "diff",
                "restarts/job", "run wall (s)"):
        table.add_column(col, justify="left" if col in ("policy", "workload") else "right")
    means: dict[str, list[tuple[float, float | None]]] = {}
    for outcome in outcomes:
        rec = outcome.record
        ref = published.get(rec.policy, {}).get("per_workload", {}).get(rec.workload)
        means.setdefault(rec.policy, []).append((rec.avg_jct_s, ref))
        diff = "" if ref is None else f"{(rec.avg_jct_s / ref - 1) * 100:+.2f}%"
        table.add_row(rec.policy, rec.workload, f"{rec.num_completed}/{rec.num_jobs}",
                      f"{rec.avg_jct_s:.1f}", "" if ref is None else f"{ref:.1f}", diff,
                      f"{rec.restarts_per_job:.2f}", f"{rec.wall_s:.1f}")
    console.print(table)
    for policy, pairs in means.items():
        mean = sum(a for a, _ in pairs) / len(pairs)
        refs = [r for _, r in pairs if r is not None]
        line = f"{policy}: mean of average JCT {mean:.1f} s"
        if len(refs) == len(pairs):
            ref = sum(refs) / len(refs)
            line += f" (published {ref:.1f} s, {(mean / ref - 1) * 100:+.2f}%)"
        console.print(line, highlight=False)
    console.print(f"wall time: {wall:.1f} s for {len(tasks)} runs with {args.processes} "
                  f"process(es)", highlight=False)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_table(outcomes, published, policies))
        console.print(f"wrote {args.markdown}", highlight=False)
    return 0


def markdown_table(outcomes: list, published: dict, policies: list[str]) -> str:
    """Average JCT per workload and policy beside the published figure, then the means."""
    by_key = {(o.record.workload, o.record.policy): o.record.avg_jct_s for o in outcomes}
    workloads = sorted({w for w, _ in by_key}, key=lambda name: (len(name), name))
    header = ["workload"]
    for policy in policies:
        header += [f"{policy} (s)", "published (s)", "difference"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    sums: dict[str, list[float]] = {p: [] for p in policies}
    refs: dict[str, list[float]] = {p: [] for p in policies}
    for workload in workloads:
        cells = [workload]
        for policy in policies:
            ours = by_key.get((workload, policy))
            ref = published.get(policy, {}).get("per_workload", {}).get(workload)
            if ours is not None:
                sums[policy].append(ours)
            if ref is not None:
                refs[policy].append(ref)
            cells += ["-" if ours is None else f"{ours:,.1f}",
                      "-" if ref is None else f"{ref:,.1f}",
                      "" if ours is None or ref is None else f"{(ours / ref - 1) * 100:+.3f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["**mean**"]
    for policy in policies:
        ours = sum(sums[policy]) / len(sums[policy]) if sums[policy] else None
        ref = sum(refs[policy]) / len(refs[policy]) if len(refs[policy]) == len(sums[policy]) \
            and refs[policy] else None
        cells += ["-" if ours is None else f"**{ours:,.1f}**",
                  "-" if ref is None else f"{ref:,.1f}",
                  "" if ours is None or ref is None else f"{(ours / ref - 1) * 100:+.3f}%"]
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
