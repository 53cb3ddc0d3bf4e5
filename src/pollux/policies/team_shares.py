"""Fair share between teams: what each team is guaranteed and entitled to in a round, and
what that means for each of its jobs.

In a round, team ``t`` *demands* ``D_t`` GPUs: what its active jobs could use (each
job's replica bound times its GPUs per replica). Then, on the ``C`` GPUs of the cluster
(of one GPU type):

1. **Guarantee**: ``G_t = min(quota_t, D_t)``: a team's quota is its own while it has
   the demand for it; what it leaves idle is lent to the others. The Pollux policy
   bounds it further by what the team's jobs would hold now on a private cluster of its
   quota (:mod:`pollux.policies.pollux.alone`: the same objective, solved for the team
   alone from its current allocation, restart costs counted): a guarantee never forces
   a team's jobs to grow or restart where they would not on a private cluster.
2. **Entitlement**: ``E_t = G_t`` plus a part of what lies beyond the guarantees
   (``C - sum G``), shared by weight among the teams that want more, each capped at its
   demand (water-filling); what no team can use is spread by weight over the teams with
   jobs.
3. **Jobs within a team**: a job's *fair share* is the paper's, within its team: the
   team's entitlement divided equally among the team's jobs (by dominant share). How the
   team's GPUs are split among its jobs is the objective's choice (their fair-share
   speedups), a job's utility weighing :data:`PRIORITY_STEP` times more per ``priority``
   level above the team's lowest (the team's total weight unchanged: priorities order a
   team's own jobs and weigh nothing against other teams), so that the lowest priority
   shrinks first; where a guarantee must be met by the last step, the team's job of
   highest priority grows first, and a team that gives borrowed GPUs back loses them from its job of lowest
   priority first (:mod:`pollux.policies.pollux.guarantee`).

The Pollux objective (:mod:`pollux.policies.pollux.objective`) uses these: each job's
speedup is relative to its fair share within its team, its utility counts ``1 / J_t`` of
its team's (every team with jobs weighs the same in the mean, however many jobs it
submits), and each GPU a team holds below its guarantee while another team borrows costs
more than any job could gain from it, so the optimizer meets every guarantee and reclaims
lent GPUs in the same round (the restart a reclaim costs is paid as any move's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pollux.capacity import RESOURCE_TOLERANCE
from pollux.policies.base import JobInfo
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.teams import Teams

__all__ = ["PRIORITY_STEP", "TeamShares", "entitlements", "team_shares"]

PRIORITY_STEP = 4.0
"""Within a team, a job's utility weighs this much more per priority level above the
team's lowest (the levels the team's jobs have this round, in order)."""


@dataclass(frozen=True)
class TeamShares:
    """One round's shares (module docstring), per job in the order given."""

    guarantee_gpus: Mapping[str, float]
    """Team -> ``G_t``."""
    quota_gpus: Mapping[str, float]
    """Team -> its quota (of the round's GPU type)."""
    entitlement_gpus: Mapping[str, float]
    """Team -> ``E_t``."""
    team_names: tuple[str, ...]
    """The teams with jobs this round."""
    team_index: np.ndarray
    """(J,) each job's team, as an index into ``team_names``."""
    share: np.ndarray
    """(J,) the job's team's entitlement as a part of the cluster, over the team's jobs:
    the fair replicas of a job are ``share / dominant_share``."""
    weights: np.ndarray
    """(J,) utility weights, ``J / (T * J_t)`` (they sum to J)."""


def entitlements(guarantee: Mapping[str, float], demand: Mapping[str, float],
                 weights: Mapping[str, float], capacity: float) -> dict[str, float]:
    """``E_t`` (module docstring, step 2) of the teams in ``demand``."""
    out = {t: float(guarantee[t]) for t in demand}
    left = capacity - sum(out.values())
    wanting = [t for t in demand if demand[t] > out[t] + RESOURCE_TOLERANCE]
    while left > RESOURCE_TOLERANCE and wanting:
        total = sum(weights[t] for t in wanting)
        step = {t: left * weights[t] / total for t in wanting}
        capped = [t for t in wanting if out[t] + step[t] >= demand[t] - RESOURCE_TOLERANCE]
        if not capped:
            for t in wanting:
                out[t] += step[t]
            left = 0.0
            break
        for t in capped:
            left -= demand[t] - out[t]
            out[t] = float(demand[t])
        wanting = [t for t in wanting if t not in capped]
    active = [t for t in demand if demand[t] > 0]
    if left > RESOURCE_TOLERANCE and active:  # nobody can use it: spread by weight, as the paper does
        total = sum(weights[t] for t in active)
        for t in active:
            out[t] += left * weights[t] / total
    return out


def team_shares(jobs: Sequence[JobInfo], bounds: Sequence[int], capacity_gpus: float,
                teams: Teams, gpu_type: str = DEFAULT_GPU_TYPE,
                alone_gpus: Mapping[str, float] | None = None) -> TeamShares:
    """The shares of ``jobs`` (bounds: each job's most replicas this round) on a cluster
    of ``capacity_gpus`` GPUs of ``gpu_type``; ``alone_gpus``: team -> the GPUs its jobs
    would hold alone on nodes of its quota (then the guarantee is at most that)."""
    names = [teams.team_of(job.team, f"JobInfo({job.name!r}).team").name for job in jobs]
    per_replica = [job.gpus_per_replica for job in jobs]
    demand: dict[str, float] = {}
    for name, bound, gpus in zip(names, bounds, per_replica):
        demand[name] = demand.get(name, 0.0) + bound * gpus
    guarantee = {t: min(float(teams[t].quota(gpu_type)), d) for t, d in demand.items()}
    if alone_gpus is not None:
        guarantee = {t: min(g, float(alone_gpus.get(t, g))) for t, g in guarantee.items()}
    entitled = entitlements(guarantee, demand, {t: teams[t].weight for t in demand},
                            capacity_gpus)
    counts = {t: names.count(t) for t in demand}
    share = np.array([entitled[n] / max(capacity_gpus, 1e-12) / counts[n] for n in names])
    num_teams = len(demand)
    weights = np.array([len(jobs) / (num_teams * counts[n]) for n in names])
    for team in demand:  # within a team, each priority level above the lowest weighs more,
        members = [i for i, n in enumerate(names) if n == team]  # the team's total as before
        levels = sorted({jobs[i].priority for i in members})
        if len(levels) > 1:
            scale = np.array([PRIORITY_STEP ** levels.index(jobs[i].priority) for i in members])
            weights[members] *= scale * len(members) / scale.sum()
    order = tuple(demand)
    index = np.array([order.index(n) for n in names], dtype=np.int64)
    quota = {t: float(teams[t].quota(gpu_type)) for t in demand}
    return TeamShares(guarantee, quota, entitled, order, index, share, weights)
