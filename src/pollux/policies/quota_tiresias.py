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
from collections.abc import Mapping, Sequence
from dataclasses import replace

from pollux.policies.base import Allocations, JobInfo, NodeInfo, PolicyDecision
from pollux.policies.tiresias import TiresiasPolicy
from pollux.teams import Teams

__all__ = ["QuotaTiresiasPolicy"]


class QuotaTiresiasPolicy(TiresiasPolicy):
    """Tiresias inside quotas, with borrowing and reclaim; see the module docstring."""

    name = "quota-tiresias"

    def optimize_teams(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                       previous_allocations: Allocations, teams: Teams) -> PolicyDecision:
        used: dict[str, Counter[str]] = {team: Counter() for team in teams.names}
        team_of = {job.name: teams.team_of(job.team, f"JobInfo({job.name!r}).team")
                   for job in jobs}

        def within_quota(name: str, room: Mapping[str, int]) -> Mapping[str, int]:
            team = team_of[name]
            return {t: min(free, team.quota(t) - used[team.name][t]) for t, free in room.items()}

        def admitted(name: str, gpu_type: str, demand: int) -> None:
            used[team_of[name].name][gpu_type] += demand

        decision = self.admit(jobs, nodes, previous_allocations,
                              [within_quota, lambda name, room: room], admitted)
        return replace(decision, info={**decision.info, "borrowing": sum(
            max(0, sum(u.values()) - teams[t].total_quota_gpus) for t, u in used.items())})
