"""Optimus+Oracle: GPUs handed out one at a time by the largest cut in remaining time.

After Peng et al., EuroSys'18, as run in the Pollux study ("Optimus+Oracle+TunedJobs"):
each job keeps its tuned batch size, and the policy knows its true remaining time at any
GPU count (``JobInfo.remaining_time_fn``, the oracle).

1. Every job, in snapshot order, gets one GPU while GPUs last.
2. Each remaining GPU goes to the job whose remaining time drops the most with one more
   GPU, ``R(k) - R(k + 1)`` (ties: earlier job), up to the job's ``max_replicas``, until
   GPUs run out or no job gains.
3. Jobs whose GPU count did not change keep their nodes; the others, fewest GPUs first,
   are packed onto the nodes with the most free GPUs.

``R(k)`` is evaluated on ``ceil(k / G)`` nodes (G: GPUs of the largest node), i.e. packed
placements. Without an oracle a job's remaining time is taken as ``1 / speedup`` (or
``1 / k`` without a speedup function either).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from pollux.policies.base import (
    Allocations,
    JobInfo,
    NodeInfo,
    Policy,
    PolicyDecision,
)
from pollux.policies.tiresias import free_slots, pack_onto_most_free


def remaining_times(job: JobInfo, max_replicas: int, gpus_per_node: int) -> np.ndarray:
    """``R[k]`` for k = 0..max_replicas + 1 (R[0] = inf), packed placements."""
    k = np.arange(max_replicas + 2, dtype=np.float64)
    nodes = np.ceil(k / max(gpus_per_node, 1))
    with np.errstate(divide="ignore"):
        if job.remaining_time_fn is not None:
            times = np.asarray(job.remaining_time_fn(nodes, k), dtype=np.float64)
        elif job.speedup_fn is not None:
            times = 1.0 / np.asarray(job.speedup_fn(nodes, k), dtype=np.float64)
        else:
            times = 1.0 / k
    times = np.where(k > 0, times, np.inf)
    return np.where(np.isnan(times), np.inf, times)


class OptimusPolicy(Policy):
    """Greedy marginal allocation with an oracle of remaining time; see the module docstring."""

    name: ClassVar[str] = "optimus"
    adaptive_jobs: ClassVar[bool] = False

    def __init__(self, seed: int | None = None) -> None:
        pass

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        num_gpus = sum(node.num_gpus for node in nodes)
        gpus_per_node = max((node.num_gpus for node in nodes), default=1)
        counts = [0] * len(jobs)
        left = num_gpus
        for i, job in enumerate(jobs):  # step 1: one GPU each, in order
            if job.min_replicas <= 1 and left >= 1 and job.max_replicas >= 1:
                counts[i] = 1
                left -= 1
        caps = [min(job.max_replicas, num_gpus) for job in jobs]
        times = [remaining_times(job, cap, gpus_per_node) if counts[i] else None
                 for i, (job, cap) in enumerate(zip(jobs, caps))]

        def gain(i: int) -> float:
            k = counts[i]
            table = times[i]
            if table is None or k + 1 > caps[i]:
                return 0.0
            return float(table[k] - table[k + 1])

        heap = [(-gain(i), i) for i in range(len(jobs)) if counts[i]]
        heapq.heapify(heap)
        while left > 0 and heap:  # step 2: marginal gains
            neg, i = heapq.heappop(heap)
            if -neg <= 0:
                break
            counts[i] += 1
            left -= 1
            heapq.heappush(heap, (-gain(i), i))
        return PolicyDecision(self._place(jobs, nodes, previous_allocations, counts))

    @staticmethod
    def _place(jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
               previous_allocations: Allocations, counts: list[int]) -> dict[str, tuple[str, ...]]:
        by_name = {job.name: job for job in jobs}
        kept = {job.name: tuple(previous_allocations[job.name]) for i, job in enumerate(jobs)
                if counts[i] and len(previous_allocations.get(job.name, ())) == counts[i]}
        free = free_slots(nodes, by_name, kept)
        order = [node.name for node in sorted(nodes, key=lambda n: n.preemptible)]
        allocations = dict(kept)
        for i in sorted(range(len(jobs)), key=lambda i: counts[i]):  # step 3
            name = jobs[i].name
            if counts[i] and name not in allocations:
                alloc = pack_onto_most_free(free, counts[i], order)
                if alloc:
                    allocations[name] = alloc
        return {job.name: allocations.get(job.name, ()) for job in jobs}
