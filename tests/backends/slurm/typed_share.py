"""A small deterministic typed policy for the Slurm end-to-end tests (loaded by a server
subprocess as ``--policy tests.backends.slurm.typed_share:TypedEqualSharePolicy``).

The slots of the largest GPU type are shared equally among the jobs
(:func:`~tests.service.service_test_policies.equal_shares`); each job's share is placed
within ONE type: a job keeps its placement while its share and nodes are unchanged, else
it goes to the type with the most free GPUs that holds its whole share (a smaller share
when none does), spread over that type's nodes, most free first."""

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
from tests.service.service_test_policies import equal_shares


class TypedEqualSharePolicy(Policy):
    name = "typed-equal-share"
    adaptive_jobs = False  # shares by the specs, reading no model

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        free = {node.name: int(node.resources.get("gpu", 0)) for node in nodes}
        types = {node.name: node.gpu_type for node in nodes}
        per_type: dict[str, int] = {}
        for node in nodes:
            per_type[node.gpu_type] = per_type.get(node.gpu_type, 0) + free[node.name]
        shares = equal_shares(jobs, max(per_type.values(), default=0))
        allocations: dict[str, Allocation] = {}
        order = sorted(jobs, key=lambda j: (j.submission_time_s, j.name))
        for job in order:
            previous = tuple(previous_allocations.get(job.name, ()))
            if previous and len(previous) == shares[job.name] and all(
                    free.get(node, 0) > 0 and node in types for node in previous):
                allocations[job.name] = previous
                for node in previous:
                    free[node] -= 1
        for job in order:
            if job.name in allocations or shares[job.name] == 0:
                continue
            room = {t: sum(free[n] for n in free if types[n] == t) for t in per_type}
            fitting = [t for t in sorted(room) if room[t] >= shares[job.name]]
            gpu_type = (max(fitting, key=lambda t: room[t]) if fitting
                        else max(sorted(room), key=lambda t: room[t]))
            candidates = sorted(n for n in free if types[n] == gpu_type)
            placed: list[str] = []
            for _ in range(shares[job.name]):
                node = max(candidates, key=lambda n: free[n])
                if free[node] <= 0:
                    break
                free[node] -= 1
                placed.append(node)
            if len(placed) >= job.min_replicas:
                allocations[job.name] = tuple(sorted(placed))
        return PolicyDecision(allocations=allocations)
