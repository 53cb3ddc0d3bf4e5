"""What a team's jobs would hold on a private cluster of its quota, this round.

The Pollux policy bounds a team's guarantee by it (:mod:`pollux.policies.team_shares`):
a guarantee protects what the team would use on its own nodes, and never forces its jobs
to grow where they would not on those nodes. The private cluster is the team's quota of
the round's nodes, the nodes its jobs run on first (most of its replicas first, then by
name; the last node cut to fit), and the team's jobs keep what they hold there: the
solve starts from the team's current allocation and pays the same restart penalty as
the shared round, so a team is guaranteed what its private cluster would hold *now*,
restart costs counted, not what a fresh start would give it. Starting a job that holds
nothing costs nothing there (``penalize_first_start`` off): what is bounded is how
much the team holds, not when a new job starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from pollux.policies.base import GPU, Allocations, JobInfo, NodeInfo
from pollux.policies.pollux.marginal import MarginalGainOptimizer
from pollux.policies.pollux.objective import PolluxObjective
from pollux.policies.pollux.options import PolluxOptions
from pollux.policies.pollux.problem import build_problem
from pollux.teams import Teams

__all__ = ["alone_gpus", "private_nodes"]


def private_nodes(nodes: Sequence[NodeInfo], quota_gpus: float,
                  used: dict[str, int]) -> list[NodeInfo]:
    """``quota_gpus`` GPUs of ``nodes``: those with the most of ``used`` (node -> the
    team's replicas there) first, then by name, the last one cut to fit."""
    ordered = sorted(nodes, key=lambda node: (-used.get(node.name, 0), node.name))
    left = float(quota_gpus)
    private: list[NodeInfo] = []
    for node in ordered:
        gpus = float(node.resources.get(GPU, 0.0))
        if left <= 0 or gpus <= 0:
            continue
        part = min(1.0, left / gpus)
        private.append(replace(node, resources={r: a * part for r, a in node.resources.items()}))
        left -= gpus * part
    return private


def alone_gpus(jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
               previous_allocations: Allocations, teams: Teams, gpu_type: str,
               options: PolluxOptions, least_service_first: bool = False) -> dict[str, float]:
    """Team -> GPUs its jobs would hold alone on a private cluster of its quota (module
    docstring), by the objective of ``options`` on the marginal-gain optimizer."""
    out: dict[str, float] = {}
    alone_options = replace(options, penalize_first_start=False)
    team_of = {job.name: teams.team_of(job.team).name for job in jobs}
    for team in dict.fromkeys(team_of.values()):
        members = [job for job in jobs if team_of[job.name] == team]
        used: dict[str, int] = {}
        for job in members:
            for name in previous_allocations.get(job.name, ()):
                used[name] = used.get(name, 0) + 1
        private = private_nodes(nodes, teams[team].quota(gpu_type), used)
        if not private:
            out[team] = 0.0
            continue
        kept = {node.name for node in private}
        previous = {job.name: tuple(n for n in previous_allocations.get(job.name, ())
                                    if n in kept) for job in members}
        problem = build_problem(members, private, previous, least_service_first)
        optimizer = MarginalGainOptimizer(options.interference_avoidance, options.fill_free,
                                          shrink_whole_nodes=options.shrink_whole_nodes)
        state, _ = optimizer.solve(problem, PolluxObjective(problem, alone_options))
        out[team] = float(np.sum(state.sum(axis=1) * np.array(
            [job.gpus_per_replica for job in problem.jobs])))
    return out
