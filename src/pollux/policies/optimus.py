"""Optimus+Oracle: GPUs handed out one at a time by the largest cut in remaining time.

After Peng et al., EuroSys'18, as run in the Pollux study ("Optimus+Oracle+TunedJobs"):
each job keeps its tuned batch size, and the policy knows its true remaining time at any
GPU count (the ``remaining_time_fn`` of ``JobInfo.on()``, the oracle).

1. Every job, in snapshot order, gets one GPU while GPUs last.
2. Each remaining GPU goes to the job whose remaining time drops the most with one more
   GPU, ``R(k) - R(k + 1)`` (ties: earlier job), up to the job's ``max_replicas``, until
   GPUs run out or no job gains.
3. Jobs whose GPU count did not change keep their nodes; the others, fewest GPUs first,
   are packed onto the nodes with the most free GPUs.

``R(k)`` is evaluated on ``ceil(k / G)`` nodes (G: GPUs of the largest node), i.e. packed
placements. Without an oracle a job's remaining time is taken as ``1 / speedup`` (or
``1 / k`` without a speedup function either).

On a typed cluster every job runs within one GPU type (:mod:`pollux.policies.packing`),
chosen in step 1: the type it runs on if that type has a GPU left, else the type where
its own oracle for that type (``JobInfo.own(type)``) says one GPU finishes it soonest
(ties, and without per-type oracles: the type with the most GPUs left). Steps 2 and 3
then work within each job's type: GPUs of a type go only to jobs of that type, ``G`` and
the cap (``JobInfo.on(type).max_replicas``) are the type's. On an untyped cluster this is the rule
above, unchanged.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from pollux.cluster_spec import gpu_types_of
from pollux.policies.base import (
    Allocations,
    JobInfo,
    NodeInfo,
    Policy,
    PolicyDecision,
    RemainingTimeFn,
)
from pollux.policies.packing import (
    allocation_type,
    gpus_by_type,
    node_types,
    place_counts,
    type_for,
)


def remaining_times(job: JobInfo, max_replicas: int, gpus_per_node: int,
                    oracle: RemainingTimeFn | None = None) -> np.ndarray:
    """``R[k]`` for k = 0..max_replicas + 1 (R[0] = inf), packed placements, from
    ``oracle`` (default: its default entry's ``remaining_time_fn``)."""
    k = np.arange(max_replicas + 2, dtype=np.float64)
    nodes = np.ceil(k / max(gpus_per_node, 1))
    default = job.on()
    oracle = oracle if oracle is not None else default.remaining_time_fn
    with np.errstate(divide="ignore"):
        if oracle is not None:
            times = np.asarray(oracle(nodes, k), dtype=np.float64)
        elif default.speedup_fn is not None:
            times = 1.0 / np.asarray(default.speedup_fn(nodes, k), dtype=np.float64)
        else:
            times = 1.0 / k
    return np.where((k > 0) & ~np.isnan(times), times, np.inf)


def _own_oracle(job: JobInfo, gpu_type: str) -> RemainingTimeFn | None:
    """The job's oracle on ``gpu_type`` itself (None: only the default entry's, if any)."""
    own = job.own(gpu_type)
    return None if own is None else own.remaining_time_fn


def _one_gpu_time(job: JobInfo, gpu_type: str) -> float:
    """The job's oracle of remaining seconds on one GPU of ``gpu_type`` (inf: unknown)."""
    oracle = _own_oracle(job, gpu_type)
    if oracle is None:
        return float("inf")
    value = float(np.asarray(oracle(np.ones(1), np.ones(1)), dtype=np.float64)[0])
    return value if value == value else float("inf")


class OptimusPolicy(Policy):
    """Greedy marginal allocation with an oracle of remaining time; see the module docstring."""

    name = "optimus"
    adaptive_jobs: ClassVar[bool] = False

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        types = node_types(nodes)
        capacity = gpus_by_type(nodes)
        typed = len(capacity) > 1
        left = dict(capacity)  # GPUs per type not yet handed out
        gpus_per_node = {t: max(1, *(n.num_gpus for n in group))
                         for t, group in gpu_types_of(nodes).items()}
        counts = [0] * len(jobs)
        job_types: list[str | None] = [None] * len(jobs)
        for i, job in enumerate(jobs):  # step 1: one GPU each, in order
            if job.min_replicas <= 1 and job.max_replicas >= 1:
                current = allocation_type(tuple(previous_allocations.get(job.name, ())), types)
                cost = (lambda t, job=job: _one_gpu_time(job, t)) if typed else None
                gpu_type = type_for(left, 1, current, cost)
                if gpu_type is not None:
                    counts[i] = 1
                    left[gpu_type] -= 1
                    job_types[i] = gpu_type
        caps = [0 if t is None else min(job.on(t).max_replicas, capacity[t])
                for job, t in zip(jobs, job_types)]
        times = [None if t is None else
                 remaining_times(job, cap, gpus_per_node[t], _own_oracle(job, t))
                 for job, cap, t in zip(jobs, caps, job_types)]

        def gain(i: int) -> float:  # R(k) - R(k + 1), 0 at the cap
            table, k = times[i], counts[i]
            return 0.0 if table is None or k + 1 > caps[i] else float(table[k] - table[k + 1])

        heap = [(-gain(i), i) for i in range(len(jobs)) if counts[i]]
        heapq.heapify(heap)
        while heap and any(n > 0 for n in left.values()):  # step 2: marginal gains
            neg, i = heapq.heappop(heap)
            if -neg <= 0:
                break
            gpu_type = job_types[i]
            assert gpu_type is not None
            if left[gpu_type] <= 0:  # its type is full: the job gets no more
                continue
            counts[i] += 1
            left[gpu_type] -= 1
            heapq.heappush(heap, (-gain(i), i))
        return PolicyDecision(self._place(jobs, nodes, previous_allocations, counts,
                                          job_types))

    @staticmethod
    def _place(jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
               previous_allocations: Allocations, counts: list[int],
               job_types: list[str | None]) -> dict[str, tuple[str, ...]]:
        """Step 3: unchanged jobs keep their nodes, the others are packed, fewest GPUs first."""
        types = node_types(nodes)
        kept = {}
        for job, count, gpu_type in zip(jobs, counts, job_types):
            previous = tuple(previous_allocations.get(job.name, ()))
            if count and len(previous) == count and allocation_type(previous, types) == gpu_type:
                kept[job.name] = previous
        wanted = sorted((count, i, t) for i, (count, t) in enumerate(zip(counts, job_types))
                        if count and t is not None)
        return place_counts(nodes, jobs, kept, ((jobs[i].name, n, t) for n, i, t in wanted))
