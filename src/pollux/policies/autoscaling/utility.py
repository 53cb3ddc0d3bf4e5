"""Cluster utility: how close an allocation comes to ideal (linear) scaling.

A job holding ``k`` replicas on ``n`` nodes runs ``S(n, k)`` times faster than on one
replica (its speedup function, the one the Pollux policy optimizes; a job that reports
none is taken to scale perfectly, ``S = k``). Its *scaling efficiency* is ``S(n, k) / k``:
1 when every replica adds a full replica's worth of progress, lower when replicas are
spent on synchronization or on batch sizes too large to train efficiently.

The cluster utility of an allocation is the average of the jobs' scaling efficiencies
weighted by the share of the cluster each job holds::

    U = sum_j share_j * S_j(n_j, k_j) / k_j  /  sum_j share_j,
    share_j = k_j * d_j,

where ``d_j`` is the largest fraction of any cluster resource one replica of job ``j``
takes (its dominant share). Jobs without resources do not count; an allocation that gives
nothing to anyone has no utility (None). Idle resources do not lower ``U``: the
autoscalers deal with idle nodes separately (a node no job uses is never worth adding).

Also here: the *throughput* speedup of a job, its speedup with statistical efficiency
ignored (every sample counts fully), which the throughput-based autoscaler uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pollux.models import GoodputFunction, GradientStats, SpeedupFunction
from pollux.policies.base import Allocations, JobInfo, NodeInfo, SpeedupFn

THROUGHPUT_SPEEDUP_KEY = "throughput_speedup_fn"
"""``JobInfo.extras`` key of a job's throughput speedup (a :data:`SpeedupFn`): samples per
second at ``(nodes, replicas)`` over samples per second on one replica, statistical
efficiency ignored. Both drivers put it there for jobs with a throughput model
(:mod:`pollux.policies.snapshot`); the throughput-based autoscaler falls back to
``speedup_fn`` (None: linear)."""


def throughput_speedup_function(
    goodput_fn: GoodputFunction,
    max_batch_size: float | None = None,
    local_bsz_bounds: tuple[float, float] | None = None,
    accumulation: bool = False,
) -> SpeedupFunction:
    """The speedup of ``goodput_fn``'s job in samples per second, efficiency ignored.

    Same throughput model and batch-size limits, but gradient statistics of infinite
    noise scale (``sqr = 0``), for which every batch size is fully efficient: the job's
    best configuration is then simply its fastest in samples per second.
    """
    ignoring = GoodputFunction(goodput_fn.throughput_params, GradientStats(sqr=0.0, var=1.0),
                               goodput_fn.init_batch_size)
    return SpeedupFunction(ignoring, max_batch_size, local_bsz_bounds, accumulation)


def dominant_shares(jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo]) -> np.ndarray:
    """(J,): largest fraction of any resource of ``nodes`` one replica of each job takes."""
    totals: dict[str, float] = {}
    for node in nodes:
        for name, amount in node.resources.items():
            totals[name] = totals.get(name, 0.0) + float(amount)
    shares = np.zeros(len(jobs))
    for j, job in enumerate(jobs):
        fractions = [float(amount) / totals[name] for name, amount in job.resources.items()
                     if float(amount) > 0 and totals.get(name, 0.0) > 0]
        shares[j] = max(fractions, default=0.0)
    return shares


def speedup_of(fn: SpeedupFn | None, num_nodes: int, num_replicas: int) -> float:
    """One job's speedup at one allocation size (0 without replicas, finite and >= 0)."""
    if num_replicas <= 0:
        return 0.0
    if fn is None:
        return float(num_replicas)
    value = float(np.asarray(fn(np.array([num_nodes]), np.array([num_replicas])))[0])
    return value if np.isfinite(value) and value > 0 else 0.0


def scaling_efficiencies(jobs: Sequence[JobInfo], allocations: Allocations
                         ) -> dict[str, float]:
    """Job -> ``S(n, k) / k`` for every job holding replicas in ``allocations``."""
    out: dict[str, float] = {}
    for job in jobs:
        alloc = tuple(allocations.get(job.name, ()))
        if alloc:
            out[job.name] = speedup_of(job.on().speedup_fn, len(set(alloc)),
                                       len(alloc)) / len(alloc)
    return out


def cluster_utility(jobs: Sequence[JobInfo], allocations: Allocations,
                    nodes: Sequence[NodeInfo]) -> float | None:
    """Resource-share-weighted average of the jobs' scaling efficiencies (module docstring);
    None when no job holds anything."""
    shares = dominant_shares(jobs, nodes)
    efficiency = scaling_efficiencies(jobs, allocations)
    weighted = 0.0
    total = 0.0
    for j, job in enumerate(jobs):
        if job.name not in efficiency or shares[j] <= 0:
            continue
        share = len(allocations[job.name]) * shares[j]
        weighted += share * efficiency[job.name]
        total += share
    return weighted / total if total > 0 else None


def total_speedup(jobs: Sequence[JobInfo], allocations: Allocations,
                  speedups: Mapping[str, SpeedupFn | None] | None = None) -> float:
    """Sum over jobs of their speedup at ``allocations`` (``speedups`` overrides each job's
    ``speedup_fn`` by name)."""
    total = 0.0
    for job in jobs:
        alloc = tuple(allocations.get(job.name, ()))
        own = job.on().speedup_fn
        fn = own if speedups is None else speedups.get(job.name, own)
        total += speedup_of(fn, len(set(alloc)), len(alloc))
    return total
