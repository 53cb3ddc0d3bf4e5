"""FIFO: first come, first served at the tuned GPU count, no preemption.

Jobs start in submission order (ties: snapshot order) as soon as their tuned GPU count
fits in the free GPUs; the first job that does not fit blocks the ones behind it (no
backfilling). Once started a job keeps its nodes until it completes. Replicas are packed
onto the nodes with the most free GPUs. On a typed cluster a job fits when its GPU count
fits in the free GPUs of one type, and it goes to the type with the most free GPUs (FIFO
knows nothing of speed), its replicas packed within that type
(:mod:`pollux.policies.packing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pollux.policies.base import Allocations, JobInfo, NodeInfo, Policy, PolicyDecision
from pollux.policies.packing import (
    free_by_type,
    free_slots,
    node_types,
    pack_within_type,
    preference_order,
    tuned_replicas,
    type_for,
)


class FifoPolicy(Policy):
    """Strict first-come-first-served; see the module docstring."""

    name = "fifo"
    adaptive_jobs: ClassVar[bool] = False

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        by_name = {job.name: job for job in jobs}
        allocations = {name: tuple(alloc) for name, alloc in previous_allocations.items()
                       if name in by_name and alloc}
        free = free_slots(nodes, by_name, allocations)
        types = node_types(nodes)
        order = preference_order(nodes)
        queue = sorted((i for i, job in enumerate(jobs) if job.name not in allocations),
                       key=lambda i: (jobs[i].submission_time_s, i))
        for i in queue:
            demand = tuned_replicas(jobs[i])
            gpu_type = type_for(free_by_type(free, types), demand)
            if gpu_type is None:
                break
            allocations[jobs[i].name] = pack_within_type(free, demand, order, types, gpu_type)
        return PolicyDecision({job.name: allocations.get(job.name, ()) for job in jobs})
