"""What the projection onto unseen GPU types is worth, by where its speed ratios come from.

A job that has not run on a type gets its model there projected from a type it has run
on, by the ratio of the types' 1-GPU speeds. Sia knows each application's own ratios (it
profiles every application on every type); the service learns one table from the jobs
that ran on several types (:mod:`pollux.models.type_speeds`), which for a new kind of job
is the other applications' speeds. Variants, per policy, on the Sia artifact's Philly
workloads (``aws:6x4,dgx-ext:2x8,rtx:3x8``, 60 s rounds):

* ``own``: each application's own ratios (Sia's setting; the default of the simulator);
* ``others``: the speeds learned across the other applications (leave one out);
* ``none``: no projection: a type a job has not run on has no model (1 GPU there).

    python bench/hetero_speeds_source.py --policies pollux,sia --workloads 1,7

Measured (workloads 1 + 7, 320 jobs, pooled; 2-core machine, ~13 min):

    policy   speeds   avg JCT s  p99 h GPU-h/job restarts/job  per workload
    pollux   own          2,322   9.08      4.68         4.05  1,818 / 2,825
    pollux   others       2,385   9.98      4.97         4.45  1,872 / 2,899
    pollux   none         3,243  10.08      4.91         3.89  2,615 / 3,871
    sia      own          2,330   9.58      4.73         4.16  1,822 / 2,838
    sia      others       2,350   9.08      4.84         4.26  1,827 / 2,872
    sia      none         3,088  10.13      5.90         3.73  2,499 / 3,678

Speeds learned from other applications are wrong by 0.32x-4.3x for one application
(yolov3 on rtx: 0.42x a T4 for it, 1.8x for the others), yet they keep nearly all of the
projection's value: +2.7% (pollux) and +0.9% (sia) average JCT against each
application's own ratios, where no projection costs +40% and +33%.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pollux.cluster_spec import parse_cluster_spec
from pollux.policies.registry import make_policy
from pollux.sim.applications import load_typed_applications
from pollux.sim.config import ClusterConfig
from pollux.sim.metrics import summarize_run
from pollux.sim.semantics import SIA_ARTIFACT
from pollux.sim.simulator import Simulator
from pollux.sim.workload import read_workload

CLUSTER = "aws:6x4,dgx-ext:2x8,rtx:3x8"
SIA = Path(__file__).resolve().parents[1].parent / "shared" / "sia-artifact"
VARIANTS = {"own": {"speeds_from": "own"}, "others": {"speeds_from": "others"},
            "none": {"project_unseen_types": False}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="pollux,sia")
    parser.add_argument("--workloads", default="1,7")
    parser.add_argument("--variants", default="own,others,none")
    parser.add_argument("--traces", default=str(SIA / "traces"))
    args = parser.parse_args()
    spec = parse_cluster_spec(CLUSTER)
    apps = load_typed_applications(args.traces, spec.gpu_types)
    workloads = [read_workload(SIA / "workloads" / "philly" / f"workload-{w}.csv", set(apps))
                 for w in args.workloads.split(",")]
    print(f"{'policy':<8} {'speeds':<7} {'avg JCT s':>10} {'p99 h':>6} {'GPU-h/job':>9} "
          f"{'restarts/job':>12}  per workload", flush=True)
    for policy in args.policies.split(","):
        for variant in args.variants.split(","):
            jcts: list[float] = []
            gpu_h = restarts = 0.0
            per_workload = []
            for workload in workloads:
                config = ClusterConfig(cluster=spec, semantics=SIA_ARTIFACT,
                                       **VARIANTS[variant])  # type: ignore[arg-type]
                record = summarize_run(Simulator(
                    workload, apps, make_policy(policy, seed=0), config).run(), apps)
                jcts += [job.jct_s for job in record.jobs if job.jct_s is not None]
                gpu_h += record.gpu_hours_per_job * record.num_jobs
                restarts += record.restarts_per_job * record.num_jobs
                per_workload.append(f"{record.avg_jct_s:,.0f}")
            n = len(jcts)
            print(f"{policy:<8} {variant:<7} {np.mean(jcts):>10,.0f} "
                  f"{np.percentile(jcts, 99) / 3600:>6.2f} {gpu_h / n:>9.2f} "
                  f"{restarts / n:>12.2f}  {' / '.join(per_workload)}", flush=True)


if __name__ == "__main__":
    main()
