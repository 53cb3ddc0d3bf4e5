"""Tiresias: two-queue discretized least-attained-service, each job at its tuned GPU count.

After Gu et al., NSDI'19, as run in the Pollux study ("Tiresias+TunedJobs"):

1. New jobs join the back of the high-priority queue Q0.
2. A job in Q0 whose attained service reaches ``queue_threshold_gpu_s`` (16 GPU-hours by
   default) is demoted to the back of the low-priority queue Q1.
3. Walking Q0 then Q1 in order, every job whose tuned GPU count still fits in the
   cluster's remaining GPUs runs; the others wait (running ones are preempted).
4. Running jobs keep their nodes; newly started ones get their replicas packed onto the
   nodes with the most free GPUs (ties: first node in the snapshot's order).

On a typed cluster (:mod:`pollux.policies.packing`) a job fits in step 3 when its tuned
GPU count fits in the free GPUs of one type: the type it runs on if it still fits there,
else the type with the most free GPUs (Tiresias knows nothing of speed); its replicas are
packed within that type. On an untyped cluster this is the rule above, unchanged.

The queues are the policy's state across rounds; everything else comes from the snapshot.
Non-preemptible jobs that already run are served first and never preempted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

from pollux.policies.base import (
    Allocations,
    JobInfo,
    NodeInfo,
    Policy,
    PolicyDecision,
)
from pollux.policies.packing import (
    allocation_type,
    free_slots,
    gpus_by_type,
    node_types,
    pack_onto_most_free,
    place_counts,
    tuned_replicas,
    type_for,
)

__all__ = ["TiresiasPolicy", "free_slots", "pack_onto_most_free", "tuned_replicas"]

Usable = Callable[[str, Mapping[str, int]], Mapping[str, int]]
"""``usable(job, free)``: of the free GPUs per type, those a job may be admitted on."""

DEFAULT_QUEUE_THRESHOLD_GPU_S = 16 * 3600.0
"""Attained service (GPU-seconds) after which a job is demoted to the low-priority queue."""


class TiresiasPolicy(Policy):
    """Two-queue least-attained-service with tuned GPU counts; see the module docstring."""

    name = "tiresias"
    adaptive_jobs: ClassVar[bool] = False

    def __init__(self, queue_threshold_gpu_s: float = DEFAULT_QUEUE_THRESHOLD_GPU_S,
                 seed: int | None = None) -> None:
        self.queue_threshold_gpu_s = float(queue_threshold_gpu_s)
        self._queues: tuple[list[str], list[str]] = ([], [])
        """(Q0, Q1): job names in service order."""

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        return self.admit(jobs, nodes, previous_allocations, [lambda name, room: room])

    def admit(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
              previous_allocations: Allocations, passes: Sequence[Usable],
              admitted: Callable[[str, str, int], None] | None = None) -> PolicyDecision:
        """Steps 2-4 of the module docstring: running non-preemptible jobs first, then
        the queues walked once per pass, each job admitted at its tuned GPU count where
        it fits in the free GPUs per type that the pass lets it use (``passes[i](job,
        free)``); ``admitted(job, type, GPUs)`` is told of each job admitted."""
        by_name = {job.name: job for job in jobs}
        q0, q1 = self._update_queues(jobs)
        previous = {name: tuple(alloc) for name, alloc in previous_allocations.items()
                    if name in by_name and alloc}
        types = node_types(nodes)
        room = gpus_by_type(nodes)  # free GPUs per type as jobs are admitted
        running: dict[str, str] = {}  # admitted job -> its GPU type

        def admit(name: str, gpu_type: str, demand: int) -> None:
            running[name] = gpu_type
            room[gpu_type] -= demand
            if admitted is not None:
                admitted(name, gpu_type, demand)

        # Non-preemptible jobs already running keep their GPUs before anyone else.
        pinned = [j.name for j in jobs if not j.preemptible and j.name in previous]
        for name in pinned:
            gpu_type = allocation_type(previous[name], types)
            if gpu_type is not None:
                admit(name, gpu_type, len(previous[name]))
        for usable in passes:
            for name in q0 + q1:
                if name in pinned or name in running:
                    continue
                demand = tuned_replicas(by_name[name])
                gpu_type = type_for(usable(name, room), demand,
                                    allocation_type(previous.get(name, ()), types))
                if gpu_type is not None:
                    admit(name, gpu_type, demand)
        kept = {name: previous[name] for name, gpu_type in running.items()
                if allocation_type(previous.get(name, ()), types) == gpu_type}
        result = place_counts(nodes, jobs, kept, ((name, tuned_replicas(by_name[name]), gpu_type)
                                                  for name, gpu_type in running.items()))
        return PolicyDecision(result, info={"queue_0": len(q0), "queue_1": len(q1)})

    def _update_queues(self, jobs: Sequence[JobInfo]) -> tuple[list[str], list[str]]:
        names = {job.name for job in jobs}
        q0, q1 = ([name for name in queue if name in names] for queue in self._queues)
        known = set(q0) | set(q1)
        q0 += [job.name for job in jobs if job.name not in known]
        in_q0 = set(q0)
        demoted = [job.name for job in jobs  # in snapshot order
                   if job.name in in_q0 and job.attained_service_s >= self.queue_threshold_gpu_s]
        self._queues = ([name for name in q0 if name not in demoted], q1 + demoted)
        return self._queues
