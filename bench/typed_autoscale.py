"""Benchmark of autoscaling a typed cluster: cost and JCT of a fixed typed cluster, the
autoscaler restricted to one GPU type, and the typed autoscaler choosing types.

    python bench/typed_autoscale.py                    # the 8 Philly workloads
    python bench/typed_autoscale.py --workloads 1,7 --processes 2

Every run is ``pollux`` on the Sia artifact's per-type traces, 60 s rounds, nodes usable
120 s after they are requested. Node prices per hour: aws (4 T4, an AWS g4dn.12xlarge)
3.912, dgx-ext (8 A100, an AWS p4d.24xlarge) 32.77, rtx (8 RTX 2080Ti: no cloud rents
them; assumed 1.2 per GPU-hour) 9.6. The fixed cluster is the Sia paper's
``aws:6x4,dgx-ext:2x8,rtx:3x8``; each autoscaler may grow to 64 GPUs of a type
(``aws:16x4``, ``dgx-ext:8x8``, ``rtx:8x8``; the typed one all three) from one node.
Cost is node-hours x price, summed per type (nodes billed while provisioning), from time
0 to the last completion; JCT is pooled over the workloads' jobs. Aim: the typed
autoscaler costs less than the best single-type one at no more than +10% average JCT.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from pollux.cluster_spec import parse_cluster_spec
from pollux.sim.config import ClusterConfig
from pollux.sim.runner import RunOutcome, RunTask, load_applications, run_tasks
from pollux.sim.semantics import SIA_ARTIFACT
from pollux.sim.workload import read_workload

SIA = Path(__file__).resolve().parents[1].parent / "shared" / "sia-artifact"
PRICES = {"aws": 3.912, "dgx-ext": 32.77, "rtx": 9.6}
SETUPS = {  # name -> (cluster, autoscaler)
    "fixed aws:6x4,dgx-ext:2x8,rtx:3x8": ("aws:6x4,dgx-ext:2x8,rtx:3x8", "none"),
    "autoscaler, aws only": ("aws:16x4", "pollux"),
    "autoscaler, dgx-ext only": ("dgx-ext:8x8", "pollux"),
    "autoscaler, rtx only": ("rtx:8x8", "pollux"),
    "typed autoscaler": ("aws:16x4,dgx-ext:8x8,rtx:8x8", "pollux"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--setups", default=",".join(str(i) for i in range(len(SETUPS))),
                        help="indices into the setups (0 fixed, 1-3 one type, 4 typed)")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    names = [list(SETUPS)[int(i)] for i in args.setups.split(",")]
    tasks = []
    for name in names:
        spec = parse_cluster_spec(SETUPS[name][0])
        config = ClusterConfig(cluster=spec, semantics=SIA_ARTIFACT, provision_delay_s=120.0,
                               node_price_per_hour={t: PRICES[t] for t in spec.gpu_types})
        apps = set(load_applications(SIA / "traces", config))
        for w in args.workloads.split(","):
            workload = read_workload(SIA / "workloads" / "philly" / f"workload-{w}.csv", apps)
            tasks.append((name, RunTask("pollux", workload, config, str(SIA / "traces"),
                                        autoscaler=SETUPS[name][1])))
    start = time.perf_counter()
    def done(outcome: RunOutcome) -> None:  # as each run ends (partial results survive)
        r = outcome.record
        print(f"# {tasks[outcome.task_index][0]} / {r.workload}: cost {r.cost:,.1f}, "
              f"avg JCT {r.avg_jct_s:,.0f} s, {r.num_completed}/{r.num_jobs} done",
              flush=True)

    outcomes = run_tasks([task for _, task in tasks], args.processes, done)
    print(f"{len(tasks)} runs in {time.perf_counter() - start:.0f} s\n")
    print("| setup | cost (mean per workload) | node-hours | avg JCT (pooled) | p99 JCT | "
          "GPU-hours per job | jobs done |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        records = [o.record for (n, _), o in zip(tasks, outcomes) if n == name]
        jcts = [j.jct_s for r in records for j in r.jobs if j.jct_s is not None]
        print(f"| {name} | {np.mean([r.cost for r in records]):,.1f} | "
              f"{np.mean([r.node_hours for r in records]):,.1f} | {np.mean(jcts):,.0f} s | "
              f"{np.percentile(jcts, 99) / 3600:.2f} h | "
              f"{np.mean([r.gpu_hours_per_job for r in records]):.2f} | "
              f"{sum(r.num_completed for r in records)}/{sum(r.num_jobs for r in records)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
