"""`pollux-ga` against the published Pollux: every (workload, seed) pair, resumable.

    python bench/pollux_fidelity.py --processes 4                 # all 24 pairs
    python bench/pollux_fidelity.py --workloads 3,4 --seeds 0     # some of them
    python bench/pollux_fidelity.py --table                       # only print the table
    python bench/pollux_fidelity.py --table --markdown docs/research/results/pollux-ga-16x4.md

Runs `pollux-ga` (seed = the policy's random seed) on the paper's workloads (16 x 4 GPUs,
the artifact's traces) in worker processes at nice 19 with one BLAS thread, seed 0 of
every workload first, then seeds 1 and 2. Each finished run is appended to ``--results``
(JSON lines) at once, so an interrupted session keeps what finished and a rerun skips the
pairs already there. Prints, per workload, each seed's average JCT against the published
figure, the mean over the seeds run, and the mean over workloads (the issue's criterion:
the 3-seed mean within 2% of 2751.1 s, every workload within 5%).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
from concurrent.futures import ProcessPoolExecutor, as_completed  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ARTIFACT = Path(__file__).resolve().parents[1].parent / "shared" / "pollux-artifact"
RESULTS = Path(__file__).resolve().parent / "results" / "pollux_fidelity.jsonl"


def _lower_priority() -> None:
    os.nice(max(0, 19 - os.nice(0)))


def run_pair(workload_name: str, seed: int, artifact: str) -> dict[str, Any]:
    """One `pollux-ga` simulation; its summary as a JSON-able dict."""
    from pollux.policies.registry import make_policy
    from pollux.sim.metrics import summarize_run
    from pollux.sim.runner import load_applications
    from pollux.sim.simulator import ClusterConfig, Simulator
    from pollux.sim.workload import read_workload, workload_files

    apps = load_applications(str(Path(artifact) / "traces"))
    workload = next(w for w in (read_workload(p, set(apps))
                                for p in workload_files([Path(artifact) / "workloads"]))
                    if w.name == workload_name)
    result = Simulator(workload, apps, make_policy("pollux-ga", seed=seed), ClusterConfig()).run()
    record = summarize_run(result, apps)
    return {"workload": workload_name, "seed": seed, "avg_jct_s": record.avg_jct_s,
            "p99_jct_s": record.p99_jct_s, "max_ftf": record.max_ftf,
            "restarts_per_job": record.restarts_per_job,
            "round_median_s": record.round_s.median, "wall_s": record.wall_s}


def read_results(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(row["workload"], int(row["seed"])): row for row in rows}


def print_table(results: dict[tuple[str, int], dict[str, Any]], published: dict[str, float],
                seeds: list[int]) -> None:
    names = sorted(published, key=lambda n: int(n.split("-")[1]))
    print(f"{'workload':<11}{'published':>10}" + "".join(f"{f'seed {s}':>17}" for s in seeds)
          + f"{'mean of seeds':>20}")
    means: dict[str, float] = {}
    for name in names:
        ref = published[name]
        cells = []
        values = []
        for seed in seeds:
            row = results.get((name, seed))
            if row is None:
                cells.append(f"{'-':>17}")
                continue
            values.append(row["avg_jct_s"])
            cells.append(f"{row['avg_jct_s']:9.1f} {100 * (row['avg_jct_s'] / ref - 1):+6.2f}%")
        if values:
            means[name] = float(np.mean(values))
            mean = f"{means[name]:9.1f} {100 * (means[name] / ref - 1):+6.2f}% ({len(values)})"
        else:
            mean = "-"
        print(f"{name:<11}{ref:10.1f}" + "".join(cells) + f"{mean:>20}")
    for seed in seeds:
        got = [results[(n, seed)]["avg_jct_s"] for n in names if (n, seed) in results]
        if len(got) == len(names):
            overall = float(np.mean(got))
            ref = float(np.mean([published[n] for n in names]))
            print(f"seed {seed}: mean over {len(names)} workloads {overall:.1f} s "
                  f"({100 * (overall / ref - 1):+.2f}% vs {ref:.1f})")
    if len(means) == len(names):
        overall = float(np.mean(list(means.values())))
        ref = float(np.mean([published[n] for n in names]))
        worst = max(abs(means[n] / published[n] - 1) for n in names)
        print(f"mean of seeds, over {len(names)} workloads: {overall:.1f} s "
              f"({100 * (overall / ref - 1):+.2f}% vs {ref:.1f}); worst workload "
              f"{100 * worst:.2f}%")
    elif means:
        ref = float(np.mean([published[n] for n in means]))
        overall = float(np.mean(list(means.values())))
        print(f"workloads run so far ({len(means)}): mean {overall:.1f} s vs published "
              f"{ref:.1f} s ({100 * (overall / ref - 1):+.2f}%)")


def markdown_table(results: dict[tuple[str, int], dict[str, Any]],
                   published: dict[str, float], seeds: list[int]) -> str:
    """The table as markdown: each seed's JCT and difference, the mean of the seeds."""
    names = sorted(published, key=lambda n: int(n.split("-")[1]))
    lines = ["| workload | published | " + " | ".join(f"seed {s}" for s in seeds)
             + " | mean of seeds run |", "|---" * (len(seeds) + 3) + "|"]
    means = {}
    for name in names:
        ref = published[name]
        values = [results[(name, s)]["avg_jct_s"] if (name, s) in results else None
                  for s in seeds]
        cells = [f"{v:.1f} ({100 * (v / ref - 1):+.2f}%)" if v is not None else "-"
                 for v in values]
        got = [v for v in values if v is not None]
        if got:
            means[name] = float(np.mean(got))
            mean = f"{means[name]:.1f} (**{100 * (means[name] / ref - 1):+.2f}%**, {len(got)})"
        else:
            mean = "-"
        lines.append(f"| {name} | {ref:.1f} | " + " | ".join(cells) + f" | {mean} |")
    if means:
        ref = float(np.mean([published[n] for n in means]))
        overall = float(np.mean(list(means.values())))
        lines.append(f"| mean of the {len(means)} workloads run | {ref:.1f} | "
                     + " | ".join("" for _ in seeds)
                     + f" | {overall:.1f} (**{100 * (overall / ref - 1):+.2f}%**) |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--artifact", default=str(ARTIFACT))
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--table", action="store_true", help="print the table, run nothing")
    parser.add_argument("--markdown", nargs="?", const="-", default=None, metavar="PATH",
                        help="the table as Markdown: printed, or written to PATH (the docs' "
                             "research pages include it)")
    args = parser.parse_args()
    published = json.loads((Path(args.artifact) / "published-results.json").read_text())
    per_workload: dict[str, float] = published["policies"]["pollux"]["per_workload"]
    seeds = [int(s) for s in args.seeds.split(",")]
    results_path = Path(args.results)
    results = read_results(results_path)
    if not args.table:
        names = [f"workload-{w}" for w in args.workloads.split(",")]
        todo = [(n, s) for s in seeds for n in names if (n, s) not in results]
        print(f"{len(todo)} runs to do, {args.processes} at a time", flush=True)
        results_path.parent.mkdir(parents=True, exist_ok=True)
        with ProcessPoolExecutor(max_workers=args.processes,
                                 initializer=_lower_priority) as pool:
            futures = [pool.submit(run_pair, n, s, args.artifact) for n, s in todo]
            for future in as_completed(futures):
                row = future.result()
                with results_path.open("a") as out:
                    out.write(json.dumps(row) + "\n")
                results[(row["workload"], row["seed"])] = row
                ref = per_workload[row["workload"]]
                print(f"  {row['workload']} seed {row['seed']}: {row['avg_jct_s']:.1f} s "
                      f"({100 * (row['avg_jct_s'] / ref - 1):+.2f}%), restarts/job "
                      f"{row['restarts_per_job']:.2f}, wall {row['wall_s']:.0f} s", flush=True)
    if args.markdown == "-":
        print(markdown_table(results, per_workload, seeds))
    elif args.markdown is not None:
        path = Path(args.markdown)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(markdown_table(results, per_workload, seeds) + "\n")
        print(f"wrote {path}")
    else:
        print_table(results, per_workload, seeds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
