"""Small deterministic policies for the service tests (also loaded by a server subprocess
as ``--policy tests.service.service_test_policies:EqualSharePolicy``, the repository on
PYTHONPATH)."""

from __future__ import annotations

from collections.abc import Sequence

from pollux.policies.base import (
    Allocation,
    Allocations,
    JobInfo,
    NodeInfo,
    Policy,
    PolicyDecision,
)


def equal_shares(jobs: Sequence[JobInfo], total_slots: int) -> dict[str, int]:
    """One slot at a time to each job in submission order, up to its max_replicas; while
    a job is left below its min_replicas, the latest such job gets nothing and the slots
    are shared again among the others (so jobs run in submission order, none starves)."""
    order = sorted(jobs, key=lambda j: (j.submission_time_s, j.name))
    shares = {job.name: 0 for job in order}
    sharing = list(order)
    while True:
        current = {job.name: 0 for job in sharing}
        remaining = total_slots
        progress = True
        while remaining > 0 and progress:
            progress = False
            for job in sharing:
                if remaining > 0 and current[job.name] < job.max_replicas:
                    current[job.name] += 1
                    remaining -= 1
                    progress = True
        short = [job for job in sharing if current[job.name] < job.min_replicas]
        if not short:
            shares.update(current)
            return shares
        sharing.remove(short[-1])


class EqualSharePolicy(Policy):
    """Every active job gets an equal share of the slots ("gpu" resource, one per
    replica); a job keeps its previous placement when its share is unchanged; new
    placements take slots from the nodes with the most free slots first."""

    name = "equal-share"
    adaptive_jobs = False
    """It shares slots by ``max_replicas``, reading no job's model: its jobs are rigid
    (bounded by their specs from the start, as the simulator's fixed-batch jobs)."""

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        free = {node.name: int(node.resources.get("gpu", 0)) for node in nodes}
        shares = equal_shares(jobs, sum(free.values()))
        allocations: dict[str, Allocation] = {}
        for job in jobs:
            previous = tuple(previous_allocations.get(job.name, ()))
            if previous and len(previous) == shares[job.name] and all(
                    node in free for node in previous):
                allocations[job.name] = previous
                for node in previous:
                    free[node] -= 1
        for job in sorted(jobs, key=lambda j: (j.submission_time_s, j.name)):
            if job.name in allocations:
                continue
            placed: list[str] = []
            for _ in range(shares[job.name]):
                node = max(sorted(free), key=lambda n: free[n])
                if free[node] <= 0:
                    break
                free[node] -= 1
                placed.append(node)
            allocations[job.name] = tuple(sorted(placed))
        return PolicyDecision(allocations=allocations)


class OvercommitPolicy(Policy):
    """Puts every job's max_replicas on the first node, whatever fits (a broken policy)."""

    name = "overcommit"
    adaptive_jobs = False

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        return PolicyDecision(allocations={
            job.name: (nodes[0].name,) * job.max_replicas for job in jobs})
