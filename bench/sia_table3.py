"""Sia (SOSP'23) Table 3, Philly traces: our runs beside the published figures.

    pollux simulate ARTIFACT/workloads/philly --cluster aws:6x4,dgx-ext:2x8,rtx:3x8 \\
        --traces ARTIFACT/traces --policy sia,pollux-unaware,pollux --json runs.json
    python bench/sia_table3.py runs.json --markdown docs/research/results/sia-philly.md

ARTIFACT is the Sia artifact's data (see docs/research/data.md). Reads any number of
`pollux simulate --json` files (default: the runs stored under bench/results/), pools each
policy's jobs over its workloads (the paper's figures are over every job of the 8
workloads) and prints, or writes as Markdown, average JCT, p99 JCT and GPU-hours per job
beside Table 3's figures for the policy that corresponds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
STORED = [RESULTS / "pollux_best" / "typed", RESULTS / "sia_philly"]

PUBLISHED: dict[str, tuple[str, float, float, float]] = {
    "sia": ("Sia", 0.6, 9.5, 4.0),
    "pollux-unaware": ("Pollux", 1.0, 14.9, 5.6),
}
"""Our policy -> (Table 3's row, average JCT h, p99 JCT h, GPU-hours per job), Philly.
Table 3 also has Gavel+TunedJobs (1.9 h, 30.0 h, 9.0), which Pollux does not implement."""


def runs_from(paths: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """Policy spec -> its runs (one per workload; the first file to have a workload wins)."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        for file in files:
            for run in json.loads(file.read_text())["runs"]:
                found.setdefault(run["policy"], {}).setdefault(run["workload"], run)
    return {policy: list(by_workload.values()) for policy, by_workload in found.items()}


def pooled(runs: list[dict[str, Any]]) -> tuple[float, float, float, int, int]:
    """(avg JCT s, p99 JCT s, GPU-hours per job, jobs, workloads) over every job of ``runs``."""
    jobs = [job for run in runs for job in run["jobs"]]
    jcts = [job["jct_s"] for job in jobs if job["jct_s"] is not None]
    return (float(np.mean(jcts)), float(np.percentile(jcts, 99)),
            sum(job["gpu_hours"] for job in jobs) / len(jobs), len(jobs), len(runs))


def markdown(runs: dict[str, list[dict[str, Any]]]) -> str:
    lines = ["| policy | workloads | avg JCT (h) | published | p99 JCT (h) | published "
             "| GPU-hours per job | published |", "|---|---|---|---|---|---|---|---|"]
    order = [p for p in PUBLISHED if p in runs] + sorted(p for p in runs if p not in PUBLISHED)
    for policy in order:
        avg_s, p99_s, gpu_h, _, workloads = pooled(runs[policy])
        row, *ref = PUBLISHED.get(policy, ("-", None, None, None))
        pub = ["-" if r is None else f"{r:.1f} ({row})" for r in ref]
        lines.append(f"| `{policy}` | {workloads} | {avg_s / 3600:.2f} | {pub[0]} | "
                     f"{p99_s / 3600:.2f} | {pub[1]} | {gpu_h:.2f} | {pub[2]} |")
    missing = [p for p in PUBLISHED if p not in runs]
    if missing:
        lines += ["", "Not run yet: " + ", ".join(f"`{p}`" for p in missing) + "."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path, help="pollux simulate --json files "
                        "or folders of them (default: the stored runs)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                        help="write the table as Markdown to PATH (else print it)")
    args = parser.parse_args()
    runs = runs_from(args.runs or [p for p in STORED if p.exists()])
    table = markdown(runs)
    if args.markdown is None:
        print(table)
    else:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table)
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
