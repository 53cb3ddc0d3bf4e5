"""Ablation of the Pollux policy: variants of its objective on the paper's workloads.

    python bench/pollux_variants.py --variants paper,alpha1 --workloads 2,6
    python bench/pollux_variants.py --load 1.5        # denser: the generator at 1.5x jobs

Each variant is a policy spec: ``pollux-paper`` (marginal-gain optimizer), ``pollux-ga``
or the one-type Sia-style program (``optimizer=typed``) with options; runs go to
``--processes`` worker processes. Prints, per variant, the
average JCT per workload, the mean, p99 JCT, max finish-time fairness, restarts per job,
the median policy round, and the workload's lower bound. ``--json`` keeps the records.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from pollux.policies.registry import make_policy
from pollux.sim.generator import generate_workload
from pollux.sim.lower_bound import with_lower_bounds
from pollux.sim.metrics import RunRecord, summarize_run
from pollux.sim.runner import load_applications
from pollux.sim.simulator import ClusterConfig, Simulator
from pollux.sim.workload import Workload, read_workload, workload_files
from pollux.spec import format_spec

ARTIFACT = Path(__file__).resolve().parents[1].parent / "shared" / "pollux-artifact"

def _remaining(weight: float, **more: object) -> str:
    """``pollux-paper`` with the remaining-time ingredients of the old ``pollux-remaining``
    (restart factor, 20% minimum gain, whole-node shrinking), Smith's exponent ``weight``
    and ``more`` options, as a spec."""
    return format_spec("pollux-paper", {"remaining_weight": weight, "remaining_restart": True,
                                        "min_restart_gain": 0.2, "shrink_whole_nodes": True,
                                        **more})


VARIANTS: dict[str, str] = {
    "paper": "pollux-paper",
    "alpha0.5": "pollux-paper(remaining_weight=0.5)",
    "alpha1": "pollux-paper(remaining_weight=1)",
    "alpha1.5": "pollux-paper(remaining_weight=1.5)",
    "alpha1-step2": "pollux-paper(remaining_weight=1,remaining_step=2)",
    "alpha0.5-step2": "pollux-paper(remaining_weight=0.5,remaining_step=2)",
    "alpha1-step4": "pollux-paper(remaining_weight=1,remaining_step=4)",
    "alpha1-cap1": "pollux-paper(remaining_weight=1,remaining_max_ratio=1)",
    "alpha1-cap1-step2": "pollux-paper(remaining_weight=1,remaining_max_ratio=1,remaining_step=2)",
    "alpha1-adm": "pollux-paper(remaining_weight=1,remaining_admission=true)",
    "alpha0.5-adm": "pollux-paper(remaining_weight=0.5,remaining_admission=true)",
    "alpha0.5-cap1": "pollux-paper(remaining_weight=0.5,remaining_max_ratio=1)",
    "alpha2": "pollux-paper(remaining_weight=2)",
    "paper-rr": "pollux-paper(remaining_restart=true)",
    "alpha0.5-rr": "pollux-paper(remaining_weight=0.5,remaining_restart=true)",
    "alpha1-rr": "pollux-paper(remaining_weight=1,remaining_restart=true)",
    "alpha0.5-g10": "pollux-paper(remaining_weight=0.5,min_restart_gain=0.1)",
    "alpha0.5-rr-g10":
        "pollux-paper(remaining_weight=0.5,remaining_restart=true,min_restart_gain=0.1)",
    "alpha0.5-rr-g20":
        "pollux-paper(remaining_weight=0.5,remaining_restart=true,min_restart_gain=0.2)",
    "alpha1-rr-g10": "pollux-paper(remaining_weight=1,remaining_restart=true,min_restart_gain=0.1)",
    "alpha0.5-rr-g10-cap4":
        "pollux-paper(remaining_weight=0.5,remaining_restart=true,min_restart_gain=0.1,remaining_max_ratio=4)",
    "paper-whole": "pollux-paper(shrink_whole_nodes=true)",
    "alpha0.5-rr-g20-whole": _remaining(0.5),
    "alpha1-rr-g20-whole": _remaining(1),
    "alpha0.5-rronly-g20-whole": _remaining(0.5, age_restart_factor=False),
    "alpha0.5-rr-g20big-whole": _remaining(0.5, min_restart_gain_replicas=4),
    "alpha1-rr-g20big-whole": _remaining(1, min_restart_gain_replicas=4),
    "alpha1.5-rr-g20big-whole": _remaining(1.5, min_restart_gain_replicas=4),
    "alpha2-rr-g20big-whole": _remaining(2, min_restart_gain_replicas=4),
    "paper-x4": "pollux-paper(exploration_factor=4)",
    "alpha0.5-rr-g20-whole-x4": _remaining(0.5, exploration_factor=4),
    "alpha1-rr-g20-whole-x4": _remaining(1, exploration_factor=4),
    "alpha1-rr-g20big-whole-x4": _remaining(1, min_restart_gain_replicas=4, exploration_factor=4),
    "alpha0.5-rr-g20-whole-x4-guard": _remaining(0.5, exploration_factor=4, remaining_guard=1),
    "alpha1-rr-g20-whole-x4-guard": _remaining(1, exploration_factor=4, remaining_guard=1),
    "alpha2-rr-g20-whole-x4-guard": _remaining(2, exploration_factor=4, remaining_guard=1),
    "alpha0.5-rr-g20-whole-x4-uw": _remaining(0.5, exploration_factor=4, unweighted_restarts=True),
    "alpha1-rr-g20-whole-x4-uw": _remaining(1, exploration_factor=4, unweighted_restarts=True),
    "alpha1-rr-g20big-whole-x4-uw":
        _remaining(1, min_restart_gain_replicas=4, exploration_factor=4, unweighted_restarts=True),
    "alpha1-rr-g20-whole-uw": _remaining(1, unweighted_restarts=True),
    "alpha1-rr-g20-whole-x4-cap10": _remaining(1, exploration_factor=4, remaining_max_ratio=10),
    "alpha1-rr-g20-whole-x4-cap30": _remaining(1, exploration_factor=4, remaining_max_ratio=30),
    "alpha1-rr-g20-whole-x4-eff0.5": _remaining(1, exploration_factor=4, efficient_boost=0.5),
    "alpha1-rr-g20-whole-x4-eff0.7": _remaining(1, exploration_factor=4, efficient_boost=0.7),
    "alpha1-rr-g20-whole-x4-eff0.5-uw":
        _remaining(1, exploration_factor=4, efficient_boost=0.5, unweighted_restarts=True),
    "alpha0.75-rr-g20-whole-x4-eff0.5-uw":
        _remaining(0.75, exploration_factor=4, efficient_boost=0.5, unweighted_restarts=True),
    "alpha0.5-rr-g20-whole-x4-eff0.5-uw":
        _remaining(0.5, exploration_factor=4, efficient_boost=0.5, unweighted_restarts=True),
    "alpha1-rr-g20-whole-x4-eff0.5-uw-srpt":
        _remaining(1, exploration_factor=4, efficient_boost=0.5, unweighted_restarts=True, remaining_max_ratio=1000000),
    "alpha1-rr-g20-whole-x4-srpt": _remaining(1, exploration_factor=4, remaining_max_ratio=1000000),
    "p0.5-alpha1-rr-g20-whole-x4": _remaining(1, p=-0.5, exploration_factor=4),
    "p0.5-alpha2-rr-g20-whole-x4": _remaining(2, p=-0.5, exploration_factor=4),
    "p2-alpha0.5-rr-g20-whole-x4": _remaining(0.5, p=-2, exploration_factor=4),
    "p0.25-alpha4-rr-g20-whole-x4": _remaining(4, p=-0.25, exploration_factor=4),
    "p0.5-alpha2-rr-g20-whole": _remaining(2, p=-0.5),
    "p0.5-alpha2-rr-g20-whole-x4-guard1":
        _remaining(2, p=-0.5, exploration_factor=4, remaining_guard=1),
    "p0.5-alpha2-rr-g20-whole-x4-guard0.5":
        _remaining(2, p=-0.5, exploration_factor=4, remaining_guard=0.5),
    "p0.5-alpha2-rr-g20-whole-x4-eff0.5-uw":
        _remaining(2, p=-0.5, exploration_factor=4, efficient_boost=0.5, unweighted_restarts=True),
    "milp": "pollux-paper(optimizer=typed,p=-0.5)",
    "milp-w0.5": "pollux-paper(optimizer=typed,p=-0.5,remaining_exponent=0.5)",
    "milp-w1": "pollux-paper(optimizer=typed,p=-0.5,remaining_exponent=1)",
    "milp-p1-w0.5": "pollux-paper(optimizer=typed,p=-1,remaining_exponent=0.5)",
    "milp-w0.5-guard": "pollux-paper(optimizer=typed,p=-0.5,remaining_exponent=0.5,lambda_n=50)",
    "milp-w1-guard": "pollux-paper(optimizer=typed,p=-0.5,remaining_exponent=1,lambda_n=50)",
    "milp-w0.5-guard-x4":
        "pollux-paper(optimizer=typed,p=-0.5,remaining_exponent=0.5,lambda_n=50,exploration_factor=4)",
    "milp-w1-guard-x4":
        "pollux-paper(optimizer=typed,p=-0.5,remaining_exponent=1,lambda_n=50,exploration_factor=4)",
    "milp-w0.5-both-guard":
        "pollux-paper(optimizer=typed,p=-0.5,remaining_exponent=0.5,lambda_n=50,move_discount=both,weighted_moves=true)",
    "ga": "pollux-ga",
    "ga-alpha1": "pollux-ga(remaining_weight=1)",
    "ga-submission": "pollux-ga(least_service_first=false,small_first=true)",
}
"""Variant name -> policy spec (``milp*``: Sia's program on one type, ``optimizer=typed``)."""


def run_one(variant: str, spec: str, workload: Workload, traces: str | None,
            config: ClusterConfig, seed: int, job_knowledge: str = "measured") -> RunRecord:
    apps = load_applications(traces)
    policy = make_policy(spec, seed=seed)
    result = Simulator(workload, apps, policy, config, job_knowledge=job_knowledge).run()
    record = summarize_run(result, apps)
    return RunRecord(**{**record.__dict__, "policy": variant})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="paper,alpha1")
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8",
                        help="paper workload numbers (ignored with --load)")
    parser.add_argument("--load", type=float, default=None,
                        help="generated workloads (seeds 0..--num-generated-1) with this "
                             "many times the paper's density, 160 jobs in 8 h")
    parser.add_argument("--num-generated", type=int, default=2)
    parser.add_argument("--hours", type=float, default=8.0,
                        help="arrival window of the generated workloads (jobs scale with it)")
    parser.add_argument("--artifact", default=str(ARTIFACT))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--job-knowledge", default="measured", choices=["measured", "oracle"],
                        help="oracle: jobs know their true throughput and goodput models")
    args = parser.parse_args()
    traces = str(Path(args.artifact) / "traces")
    apps = load_applications(traces)
    config = ClusterConfig()
    if args.load is None:
        wanted = {f"workload-{w}" for w in args.workloads.split(",")}
        workloads = [read_workload(p, set(apps))
                     for p in workload_files([Path(args.artifact) / "workloads"])]
        workloads = [w for w in workloads if w.name in wanted]
    else:
        workloads = [generate_workload(int(round(20 * args.hours * args.load)), args.hours,
                                       seed=s) for s in range(args.num_generated)]
    tasks = [(v, VARIANTS[v], w, traces, config, args.seed,
              args.job_knowledge)
             for w in workloads for v in args.variants.split(",")]
    start = time.perf_counter()
    records = []
    with ProcessPoolExecutor(max_workers=args.processes) as pool:
        futures = [pool.submit(run_one, *task) for task in tasks]
        for future in as_completed(futures):
            rec = future.result()
            records.append(rec)
            if args.json:  # kept as they come: a long run stopped early loses nothing
                Path(args.json).write_text(json.dumps([r.to_dict() for r in records]) + "\n")
            print(f"  {rec.policy} on {rec.workload}: avg JCT {rec.avg_jct_s:.1f} s, p99 "
                  f"{rec.p99_jct_s:.0f} s, max_ftf {rec.max_ftf:.2f}, restarts/job "
                  f"{rec.restarts_per_job:.2f}, round median {1e3 * rec.round_s.median:.1f} ms,"
                  f" wall {rec.wall_s:.0f} s", flush=True)
    records = with_lower_bounds(records, workloads, apps, config)
    print(f"{len(records)} runs in {time.perf_counter() - start:.0f} s wall")
    names = [w.name for w in workloads]
    print("variant".ljust(12) + "".join(n[-12:].rjust(13) for n in names)
          + "        mean   p99 JCT  max_ftf restarts round_ms")
    for variant in args.variants.split(","):
        rows = {r.workload: r for r in records if r.policy == variant}
        avg = [rows[n].avg_jct_s for n in names]
        print(variant.ljust(12) + "".join(f"{a:13.1f}" for a in avg)
              + f"{np.mean(avg):12.1f}{np.mean([rows[n].p99_jct_s for n in names]):10.0f}"
              + f"{max(rows[n].max_ftf for n in names):9.2f}"
              + f"{np.mean([rows[n].restarts_per_job for n in names]):9.2f}"
              + f"{1e3 * np.median([rows[n].round_s.median for n in names]):9.1f}")
    bounds = {r.workload: r.lower_bound_avg_jct_s for r in records}
    print("lower bound".ljust(12) + "".join(f"{bounds[n]:13.1f}" for n in names)
          + f"{np.mean([bounds[n] for n in names]):12.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in records]) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    raise SystemExit(main())
