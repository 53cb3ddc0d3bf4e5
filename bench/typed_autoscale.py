"""Benchmark of autoscaling a typed cluster: cost and JCT of a fixed typed cluster, the
autoscaler restricted to one GPU type, and the typed autoscaler choosing types.

    python bench/typed_autoscale.py                    # the 8 Philly workloads
    python bench/typed_autoscale.py --workloads 1,7 --setups 3,4 --bands 0.6:0.78,0.8:0.95

Every run is ``pollux`` on the Sia artifact's per-type traces, 60 s rounds, nodes usable
120 s after they are requested. Node prices per hour: aws (4 T4, an AWS g4dn.12xlarge)
3.912, dgx-ext (8 A100, an AWS p4d.24xlarge) 32.77, rtx (8 RTX 2080Ti: no cloud rents
them; assumed 1.2 per GPU-hour) 9.6. The fixed cluster is the Sia paper's
``aws:6x4,dgx-ext:2x8,rtx:3x8``; each autoscaler may grow to 64 GPUs of a type
(``aws:16x4``, ``dgx-ext:8x8``, ``rtx:8x8``; the typed one all three) from one node. To
compare at equal bounds, setup 5 is the typed autoscaler within rtx alone's price per hour
(its 8 nodes, 76.8: ``max_price_per_hour``) and setup 6 rtx alone up to the typed
cluster's 192 GPUs. Cost is node-hours x price, summed per type (nodes billed while
provisioning), from time 0 to the last completion; JCT is pooled over the workloads' jobs.

Aim: the typed autoscaler costs less than the best single-type one at no more than +10%
average JCT. The first table after the figures checks it at the same band, for every
typed point against every single type; the utility band trades cost for time
(``--bands``: each autoscaled setup runs at each band), so the second compares on that
frontier: for every single-type point, the cheapest typed point whose average JCT is at
most 1.1x the single type's, and its cost and JCT ratios.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from pollux.cluster_spec import parse_cluster_spec
from pollux.policies.autoscaling import DEFAULT_HIGH_UTIL, DEFAULT_LOW_UTIL
from pollux.sim.config import ClusterConfig
from pollux.sim.runner import RunOutcome, RunTask, load_applications, run_tasks
from pollux.sim.semantics import SIA_ARTIFACT
from pollux.sim.workload import read_workload

SIA = Path(__file__).resolve().parents[1].parent / "shared" / "sia-artifact"
PRICES = {"aws": 3.912, "dgx-ext": 32.77, "rtx": 9.6}
RTX_BOUND = 8 * PRICES["rtx"]  # per hour: the rtx-only autoscaler's 8 nodes
SETUPS: dict[str, tuple[str, str, dict[str, float]]] = {  # name -> (cluster, autoscaler, options)
    "fixed aws:6x4,dgx-ext:2x8,rtx:3x8": ("aws:6x4,dgx-ext:2x8,rtx:3x8", "none", {}),
    "autoscaler, aws only": ("aws:16x4", "pollux", {}),
    "autoscaler, dgx-ext only": ("dgx-ext:8x8", "pollux", {}),
    "autoscaler, rtx only": ("rtx:8x8", "pollux", {}),
    "typed autoscaler": ("aws:16x4,dgx-ext:8x8,rtx:8x8", "pollux", {}),
    "typed autoscaler, at most 76.8 per hour": ("aws:16x4,dgx-ext:8x8,rtx:8x8", "pollux",
                                                 {"max_price_per_hour": RTX_BOUND}),
    "autoscaler, rtx only, 192 GPUs": ("rtx:24x8", "pollux", {}),
}
TYPED = ("typed autoscaler", "typed autoscaler, at most 76.8 per hour")
SINGLE = ("autoscaler, aws only", "autoscaler, dgx-ext only", "autoscaler, rtx only",
          "autoscaler, rtx only, 192 GPUs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--setups", default=",".join(str(i) for i in range(len(SETUPS))),
                        help="indices into the setups (0 fixed, 1-3 one type, 4 typed, 5 typed "
                             "within rtx only's 76.8 per hour, 6 rtx only up to 192 GPUs)")
    parser.add_argument("--bands", default=f"{DEFAULT_LOW_UTIL}:{DEFAULT_HIGH_UTIL}",
                        help="utility bands LOW:HIGH, comma-separated; every autoscaled "
                             "setup runs at each")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="an option of every autoscaler, e.g. max_price_per_hour=60, "
                             "repeatable")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    extra = {name: float(value) for name, value in (o.split("=", 1) for o in args.option)}
    names = [list(SETUPS)[int(i)] for i in args.setups.split(",")]
    bands = [tuple(float(x) for x in band.split(":")) for band in args.bands.split(",")]
    tasks = []  # ((setup, band or None), task)
    for name in names:
        spec = parse_cluster_spec(SETUPS[name][0])
        config = ClusterConfig(cluster=spec, semantics=SIA_ARTIFACT, provision_delay_s=120.0,
                               node_price_per_hour={t: PRICES[t] for t in spec.gpu_types})
        apps = set(load_applications(SIA / "traces", config))
        for band in bands if SETUPS[name][1] != "none" else [None]:
            options = {} if band is None else {"low_util": band[0], "high_util": band[1],
                                                **SETUPS[name][2], **extra}
            for w in args.workloads.split(","):
                workload = read_workload(SIA / "workloads" / "philly" / f"workload-{w}.csv",
                                         apps)
                tasks.append(((name, band), RunTask(
                    "pollux", workload, config, str(SIA / "traces"),
                    autoscaler=SETUPS[name][1], autoscaler_options=options)))
    start = time.perf_counter()
    def done(outcome: RunOutcome) -> None:  # as each run ends (partial results survive)
        r = outcome.record
        print(f"# {label(tasks[outcome.task_index][0])} / {r.workload}: cost {r.cost:,.1f}, "
              f"avg JCT {r.avg_jct_s:,.0f} s, {r.num_completed}/{r.num_jobs} done",
              flush=True)

    outcomes = run_tasks([task for _, task in tasks], args.processes, done)
    print(f"{len(tasks)} runs in {time.perf_counter() - start:.0f} s\n")
    points: dict[tuple[str, tuple[float, ...] | None], tuple[float, float]] = {}
    print("| setup | band | cost (mean per workload) | node-hours | avg JCT (pooled) | "
          "p99 JCT | GPU-hours per job | jobs done |")
    print("|---|---|---|---|---|---|---|---|")
    for key in dict.fromkeys(k for k, _ in tasks):
        records = [o.record for (k, _), o in zip(tasks, outcomes) if k == key]
        jcts = [j.jct_s for r in records for j in r.jobs if j.jct_s is not None]
        points[key] = (float(np.mean([r.cost for r in records])), float(np.mean(jcts)))
        print(f"| {key[0]} | {band_text(key[1])} | {points[key][0]:,.1f} | "
              f"{np.mean([r.node_hours for r in records]):,.1f} | {points[key][1]:,.0f} s | "
              f"{np.percentile(jcts, 99) / 3600:.2f} h | "
              f"{np.mean([r.gpu_hours_per_job for r in records]):.2f} | "
              f"{sum(r.num_completed for r in records)}/{sum(r.num_jobs for r in records)} |")
    typed = {k: p for k, p in points.items() if k[0] in TYPED}
    singles = {k: p for k, p in points.items() if k[0] in SINGLE}
    if typed and singles:
        print("\n| typed point | single type at the same band: cost, avg JCT | cost ratio | "
              "JCT ratio | aim met (cheaper, JCT <= 1.1x) |")
        print("|---|---|---|---|---|")
        for key, (cost, jct) in typed.items():
            for k, (c, j) in sorted(singles.items(), key=lambda item: item[1]):
                if k[1] == key[1]:
                    print(f"| {label(key)} | {k[0]}: {c:,.1f}, {j:,.0f} s | {cost / c:.3f} | "
                          f"{jct / j:.3f} | {'yes' if cost < c and jct <= 1.1 * j else 'no'} |")
        print("\n| single type (band) | its cost, avg JCT | cheapest typed point at <= 1.1x its "
              "JCT | cost ratio | JCT ratio | aim met |")
        print("|---|---|---|---|---|---|")
        for key, (cost, jct) in singles.items():
            near = [(c, j, k) for k, (c, j) in typed.items() if j <= 1.1 * jct]
            if not near:
                print(f"| {label(key)} | {cost:,.1f}, {jct:,.0f} s | none | | | no |")
                continue
            c, j, k = min(near)
            print(f"| {label(key)} | {cost:,.1f}, {jct:,.0f} s | {label(k)}: "
                  f"{c:,.1f}, {j:,.0f} s | {c / cost:.3f} | {j / jct:.3f} | "
                  f"{'yes' if c < cost else 'no'} |")
    return 0


def band_text(band: tuple[float, ...] | None) -> str:
    return "-" if band is None else f"{band[0]:g}:{band[1]:g}"


def label(key: tuple[str, tuple[float, ...] | None]) -> str:
    return key[0] if key[1] is None else f"{key[0]} ({band_text(key[1])})"


if __name__ == "__main__":
    raise SystemExit(main())
