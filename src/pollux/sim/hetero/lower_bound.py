"""The lower bound on the average JCT (:mod:`pollux.sim.lower_bound`) on a typed cluster.

The same two relaxations, with what a typed cluster adds. A job's allocation never spans
GPU types, so alone it can use at most one type's nodes; it may change type between
epochs for free (restarts are relaxed away), so each epoch's best rate is the largest over
the types, each on that type's nodes with that type's step times and batch limits, times
the application's calibration factor. For the capacity bound the whole cluster is one
machine of ``num_gpus`` GPUs and a job's work is counted at its best per-GPU rate on any
type: a GPU of a slower type only makes the work cost more. Every job's first start costs
its application's restart delay, as in the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from pollux.cluster_spec import ClusterSpec
from pollux.sim.hetero.apps import TypedApplication
from pollux.sim.lower_bound import BestRates, LowerBound, best_rates, bound_from_rates
from pollux.sim.metrics import RunRecord
from pollux.sim.workload import Workload


def typed_best_rates(app: TypedApplication, cluster: ClusterSpec) -> BestRates:
    """``app``'s best rates per epoch over every node group of ``cluster``, calibrated."""
    per_group = [best_rates(app.by_type[group.gpu_type], group.num_nodes,
                            group.gpus_per_node) for group in cluster.groups]
    calibration = app.calibration
    rate = np.max([r.rate_per_s for r in per_group], axis=0) * calibration
    rate_gpu = np.max([r.rate_per_gpu_s for r in per_group], axis=0) * calibration
    return BestRates(app.name, tuple(rate.tolist()), tuple(rate_gpu.tolist()),
                     per_group[0].epoch_progress)


def typed_lower_bound(workload: Workload, applications: Mapping[str, TypedApplication],
                      cluster: ClusterSpec, interval_s: float,
                      rates: Mapping[str, BestRates] | None = None) -> LowerBound:
    """Lower bounds on the average JCT of ``workload`` on the typed ``cluster``."""
    found = dict(rates or {})
    for name in sorted({job.application for job in workload.jobs} - set(found)):
        found[name] = typed_best_rates(applications[name], cluster)
    return bound_from_rates(workload, found, cluster.num_gpus, interval_s,
                            lambda name: applications[name].restart_delay_s)


def with_typed_lower_bounds(records: Sequence[RunRecord], workloads: Sequence[Workload],
                            applications: Mapping[str, TypedApplication],
                            cluster: ClusterSpec, interval_s: float) -> list[RunRecord]:
    """``records`` with ``lower_bound_avg_jct_s`` set from their workload (by name)."""
    rates: dict[str, BestRates] = {}
    bounds: dict[str, float] = {}
    for workload in workloads:
        for name in sorted({job.application for job in workload.jobs} - set(rates)):
            rates[name] = typed_best_rates(applications[name], cluster)
        bounds[workload.name] = typed_lower_bound(workload, applications, cluster,
                                                  interval_s, rates).avg_jct_s
    return [replace(r, lower_bound_avg_jct_s=bounds.get(r.workload, r.lower_bound_avg_jct_s))
            for r in records]
