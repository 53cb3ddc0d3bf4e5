"""``quota-tiresias``: a Kueue-like quota scheduler, Tiresias inside each team's quota.

After Kueue's cluster queues with borrowing (and Volcano's queue capacities): jobs run at
their tuned GPU counts in Tiresias's order (:mod:`pollux.policies.tiresias`: two-queue
least-attained-service), admitted in two passes every round:

1. **Within quota**: walking the queues in order, a job is admitted when its GPUs fit in
   the cluster and in what is left of its team's quota (of the GPU type it would run on).
2. **Borrowing**: walking them again, a job not yet admitted is admitted when its GPUs
   fit in the cluster, beyond its team's quota: capacity other teams leave idle.

Since every round admits within-quota jobs first, a team whose jobs need its quota back
gets it in the next round: borrowers that no longer fit are preempted (reclaim by
preemption), as Kueue's ``reclaimWithinCohort: Any`` does. Without teams it is Tiresias.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pollux.policies.base import Allocations, JobInfo, NodeInfo, PolicyDecision
from pollux.policies.packing import (
    allocation_type,
    gpus_by_type,
    node_types,
    place_counts,
    tuned_replicas,
    type_for,
)
from pollux.policies.tiresias import TiresiasPolicy
from pollux.teams import Teams

__all__ = ["QuotaTiresiasPolicy"]


class QuotaTiresiasPolicy(TiresiasPolicy):
    """Tiresias inside quotas, with borrowing and reclaim; see the module docstring."""

    name = "quota-tiresias"

    def optimize_teams(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                       previous_allocations: Allocations, teams: Teams) -> PolicyDecision:
        by_name = {job.name: job for job in jobs}
        q0, q1 = self._update_queues(jobs)
        previous = {name: tuple(alloc) for name, alloc in previous_allocations.items()
                    if name in by_name and alloc}
        types = node_types(nodes)
        room = gpus_by_type(nodes)
        used: dict[str, Counter[str]] = {team: Counter() for team in teams.names}
        running: dict[str, str] = {}
        team_of = {job.name: teams.team_of(job.team, f"JobInfo({job.name!r}).team").name
                   for job in jobs}

        def admit(name: str, gpu_type: str, demand: int) -> None:
            running[name] = gpu_type
            room[gpu_type] -= demand
            used[team_of[name]][gpu_type] += demand

        for job in jobs:  # non-preemptible jobs already running keep their GPUs
            if not job.preemptible and job.name in previous:
                gpu_type = allocation_type(previous[job.name], types)
                if gpu_type is not None:
                    admit(job.name, gpu_type, len(previous[job.name]))
        order = [name for name in q0 + q1 if name not in running]
        for borrowing in (False, True):
            for name in order:
                if name in running:
                    continue
                demand = tuned_replicas(by_name[name])
                team = teams[team_of[name]]
                prev_type = allocation_type(previous.get(name, ()), types)
                if borrowing:
                    gpu_type = type_for(room, demand, prev_type)
                else:
                    within = {t: min(free, team.quota(t) - used[team.name][t])
                              for t, free in room.items()}
                    gpu_type = type_for(within, demand, prev_type)
                if gpu_type is not None:
                    admit(name, gpu_type, demand)
        kept = {name: previous[name] for name, gpu_type in running.items()
                if allocation_type(previous.get(name, ()), types) == gpu_type}
        result = place_counts(nodes, jobs, kept, ((name, tuned_replicas(by_name[name]), t)
                                                  for name, t in running.items()))
        return PolicyDecision(result, info={"queue_0": len(q0), "queue_1": len(q1),
                                            "borrowing": sum(
                                                max(0, sum(u.values()) - teams[t].total_quota_gpus)
                                                for t, u in used.items())})
