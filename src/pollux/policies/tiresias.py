"""Tiresias: two-queue discretized least-attained-service, each job at its tuned GPU count.

After Gu et al., NSDI'19, as run in the Pollux study ("Tiresias+TunedJobs"):

1. New jobs join the back of the high-priority queue Q0.
2. A job in Q0 whose attained service reaches ``queue_threshold_gpu_s`` (16 GPU-hours by
   default) is demoted to the back of the low-priority queue Q1.
3. Walking Q0 then Q1 in order, every job whose tuned GPU count still fits in the
   cluster's remaining GPUs runs; the others wait (running ones are preempted).
4. Running jobs keep their nodes; newly started ones get their replicas packed onto the
   nodes with the most free GPUs (ties: first node in the snapshot's order).

The queues are the policy's state across rounds; everything else comes from the snapshot.
Non-preemptible jobs that already run are served first and never preempted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from pollux.policies.base import (
    Allocation,
    Allocations,
    JobInfo,
    NodeInfo,
    Policy,
    PolicyDecision,
)

DEFAULT_QUEUE_THRESHOLD_GPU_S = 16 * 3600.0
"""Attained service (GPU-seconds) after which a job is demoted to the low-priority queue."""


def tuned_replicas(job: JobInfo) -> int:
    """The GPU count a baseline gives a job: its tuned replicas, within its bounds."""
    wanted = job.tuned.num_replicas if job.tuned is not None else max(1, job.min_replicas)
    return max(1, wanted)


def pack_onto_most_free(free: dict[str, int], num_replicas: int,
                        node_order: Iterable[str]) -> Allocation:
    """Take replicas from the node with the most free slots, repeatedly (ties: node order).

    ``free`` is updated in place. Returns () when the replicas do not fit in total.
    """
    if num_replicas <= 0 or sum(free.values()) < num_replicas:
        return ()
    order = {name: i for i, name in enumerate(node_order)}
    alloc: list[str] = []
    while len(alloc) < num_replicas:
        node = min(free, key=lambda n: (-free[n], order.get(n, len(order))))
        take = min(free[node], num_replicas - len(alloc))
        alloc.extend([node] * take)
        free[node] -= take
    return tuple(alloc)


def free_slots(nodes: Sequence[NodeInfo], jobs_by_name: dict[str, JobInfo],
               allocations: dict[str, Allocation]) -> dict[str, int]:
    """Free one-GPU replica slots per node after ``allocations`` (GPU jobs of 1 GPU each)."""
    free = {node.name: node.num_gpus for node in nodes}
    for name, alloc in allocations.items():
        per = jobs_by_name[name].gpus_per_replica if name in jobs_by_name else 1.0
        for node in alloc:
            if node in free:
                free[node] -= int(round(per))
    return free


class TiresiasPolicy(Policy):
    """Two-queue least-attained-service with tuned GPU counts; see the module docstring."""

    name: ClassVar[str] = "tiresias"
    adaptive_jobs: ClassVar[bool] = False

    def __init__(self, queue_threshold_gpu_s: float = DEFAULT_QUEUE_THRESHOLD_GPU_S,
                 seed: int | None = None) -> None:
        self.queue_threshold_gpu_s = float(queue_threshold_gpu_s)
        self._queues: tuple[list[str], list[str]] = ([], [])
        """(Q0, Q1): job names in service order."""

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        by_name = {job.name: job for job in jobs}
        q0, q1 = self._update_queues(jobs)
        previous = {name: tuple(alloc) for name, alloc in previous_allocations.items()
                    if name in by_name and alloc}
        num_slots = sum(node.num_gpus for node in nodes)
        running: list[str] = []
        # Non-preemptible jobs already running keep their GPUs before anyone else.
        pinned = [j.name for j in jobs if not j.preemptible and j.name in previous]
        for name in pinned:
            num_slots -= len(previous[name])
            running.append(name)
        for name in q0 + q1:
            if name in pinned:
                continue
            demand = tuned_replicas(by_name[name])
            if demand <= num_slots:
                running.append(name)
                num_slots -= demand
        allocations = {name: previous[name] for name in running if name in previous}
        free = free_slots(nodes, by_name, allocations)
        order = [node.name for node in sorted(nodes, key=lambda n: n.preemptible)]
        for name in running:
            if name not in allocations:
                alloc = pack_onto_most_free(free, tuned_replicas(by_name[name]), order)
                if alloc:
                    allocations[name] = alloc
        result = {job.name: allocations.get(job.name, ()) for job in jobs}
        return PolicyDecision(result, info={"queue_0": len(q0), "queue_1": len(q1)})

    def _update_queues(self, jobs: Sequence[JobInfo]) -> tuple[list[str], list[str]]:
        names = {job.name for job in jobs}
        q0 = [name for name in self._queues[0] if name in names]
        q1 = [name for name in self._queues[1] if name in names]
        known = set(q0) | set(q1)
        in_q0 = set(q0)
        for job in jobs:
            if job.name not in known:
                q0.append(job.name)
                in_q0.add(job.name)
        for job in jobs:  # demotion, in snapshot order
            if job.name in in_q0 and job.attained_service_s >= self.queue_threshold_gpu_s:
                q0.remove(job.name)
                in_q0.discard(job.name)
                q1.append(job.name)
        self._queues = (q0, q1)
        return q0, q1
