"""The last step of a Pollux round with teams: every team's guarantee met.

The objective already makes each replica below a job's floor cost more than any other
job can gain (:mod:`pollux.policies.team_shares`), but floors are per job, and a job's
floor may not fit where the optimizer's placement rules (whole nodes, interference
avoidance) leave room: a GPU stays idle, or with a job of a team beyond its guarantee,
while a team is short of its own. This step closes such gaps replica by replica: the
short team's job with the most to gain (highest priority first) takes a free slot, or
else the slot of a replica of a job whose team holds more than its guarantee (the
borrower's lowest-priority, least-hurt job gives it back: reclaim by preemption).
"""

from __future__ import annotations

import numpy as np

from pollux.policies.pollux.objective import PolluxObjective
from pollux.policies.pollux.problem import IntArray

_TOLERANCE = 1e-9


def meet_guarantees(objective: PolluxObjective, state: IntArray, teams: list[str],
                    gpus: np.ndarray) -> IntArray:
    """``state`` with every team's guarantee met where the cluster can hold it (module
    docstring); ``teams[j]`` is job ``j``'s team, ``gpus[j]`` its GPUs per replica."""
    shares = objective.shares
    if shares is None:
        return state
    problem = objective.problem
    state = state.copy()
    names = sorted(set(teams))
    member = {t: np.array([team == t for team in teams]) for t in names}
    for _ in range(int(state.sum()) + int(problem.max_replicas.sum()) + 1):
        held = {t: float((state[member[t]].sum(axis=1) * gpus[member[t]]).sum()) for t in names}
        short = [t for t in names if held[t] + _TOLERANCE < shares.guarantee_gpus.get(t, 0.0)]
        if not short or not _close_one(objective, state, teams, gpus, held, short[0]):
            break
    return state


def _close_one(objective: PolluxObjective, state: IntArray, teams: list[str],
               gpus: np.ndarray, held: dict[str, float], team: str) -> bool:
    """Give team ``team`` one more replica (free slot first, else reclaimed); False when
    none of its jobs can grow anywhere."""
    problem = objective.problem
    shares = objective.shares
    if shares is None:
        return False
    free = problem.capacity - state.T @ problem.demand
    growers = [j for j in range(problem.num_jobs) if teams[j] == team
               and not problem.pinned[j] and state[j].sum() < problem.max_replicas[j]
               and gpus[j] <= shares.guarantee_gpus[team] - held[team] + _TOLERANCE]
    growers.sort(key=lambda j: (-problem.jobs[j].priority, -_gain(objective, state, j), j))
    for j in growers:
        fits = np.all(free >= problem.demand[j] - _TOLERANCE, axis=1)
        if fits.any():
            _grow(state, j, fits)
            return True
    lenders = [v for v in range(problem.num_jobs) if state[v].any() and not problem.pinned[v]
               and held[teams[v]] - gpus[v] + _TOLERANCE >= shares.guarantee_gpus.get(
                   teams[v], 0.0) and teams[v] != team]
    lenders.sort(key=lambda v: (problem.jobs[v].priority, _loss(objective, state, v), v))
    for j in growers:
        for v in lenders:
            for n in np.flatnonzero(state[v]):
                after = free[n] + problem.demand[v] * (
                    state[v].sum() if state[v].sum() - 1 < problem.min_replicas[v] else 1)
                if np.all(after >= problem.demand[j] - _TOLERANCE):
                    _shrink(state, v, int(n), int(problem.min_replicas[v]))
                    state[j, n] += 1
                    return True
    return False


def _grow(state: IntArray, j: int, fits: np.ndarray) -> None:
    """One replica more for job ``j``: on a node it has if one fits, else on the fitting
    node with the most of its replicas' room."""
    own = fits & (state[j] > 0)
    n = int(np.flatnonzero(own)[0]) if own.any() else int(np.flatnonzero(fits)[0])
    state[j, n] += 1


def _shrink(state: IntArray, v: int, n: int, min_replicas: int) -> None:
    """One replica less for job ``v`` on node ``n`` (all of them below its minimum)."""
    if state[v].sum() - 1 < min_replicas:
        state[v] = 0
    else:
        state[v, n] -= 1


def _gain(objective: PolluxObjective, state: IntArray, j: int) -> float:
    k, nodes = int(state[j].sum()), int(np.count_nonzero(state[j]))
    now = float(objective.job_utility(j, nodes, k, True))
    return float(objective.job_utility(j, max(nodes, 1), k + 1, True)) - now


def _loss(objective: PolluxObjective, state: IntArray, v: int) -> float:
    k, nodes = int(state[v].sum()), int(np.count_nonzero(state[v]))
    now = float(objective.job_utility(v, nodes, k, False))
    return now - float(objective.job_utility(v, nodes, k - 1, True))
