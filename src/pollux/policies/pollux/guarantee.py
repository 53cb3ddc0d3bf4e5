"""A Pollux round with teams: every team's guarantee met, by price, then by repair.

The objective charges every GPU a team holds below its guarantee more than any job can
gain (:mod:`pollux.policies.team_shares`), but the fast optimizers work job by job and
cannot see a team's total. So the round is solved with a *price* per team, the Lagrange
multiplier of its guarantee: the utilities of a short team's jobs are weighted
:data:`PRICE_STEP` times more and the round solved again, up to
:data:`MAX_PRICE_ROUNDS` times (a team's jobs keep their ratios; only the teams' balance
moves). What is still short after a solve (a replica that fits nowhere the placement
rules allow) is closed replica by replica, and the round's answer is the repaired solve
that the unpriced objective values most: a price only adds candidates, so a priced solve
that kept the current allocation (idle GPUs, new jobs waiting) never replaces a better
one. The closing step: the short team's job with the most to gain (highest
priority first) takes a free slot, or else the slot of a replica of a job whose team
holds more than its quota (the borrower's lowest-priority, least-hurt job gives it back:
reclaim by preemption). Interference avoidance holds throughout: a job spread over nodes
never joins another on a node, so a spread borrower hands a spread grower a whole node.
A team counts as short only while another team holds more than its quota: a guarantee
protects a team's GPUs from the others, it never forces its own jobs to grow where their
speedups do not pay for the restart. Last, a job the closing step left waiting starts on
a replica of its own team's job where the objective gains (the teams' totals unchanged).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from pollux.capacity import RESOURCE_TOLERANCE
from pollux.policies.pollux.objective import PolluxObjective
from pollux.policies.pollux.problem import IntArray
from pollux.policies.team_shares import TeamShares

MAX_PRICE_ROUNDS = 4
"""Solves of one round beyond the first, each with higher prices for short teams."""
PRICE_STEP = 4.0
"""How much a short team's price (its jobs' utility weight) grows per solve."""


def shortfalls(state: IntArray, shares: TeamShares, gpus: np.ndarray) -> np.ndarray:
    """(T,) GPUs each team of ``shares.team_names`` holds below its guarantee in ``state``
    while another team holds more than its quota (a team that leaves GPUs idle that
    nobody else takes is short of nothing: its jobs chose not to grow)."""
    held = np.bincount(shares.team_index, weights=state.sum(axis=1) * gpus,
                       minlength=len(shares.team_names))
    guarantee = np.array([shares.guarantee_gpus[t] for t in shares.team_names])
    quota = np.array([shares.quota_gpus[t] for t in shares.team_names])
    over = held > quota + RESOURCE_TOLERANCE
    others_over = over.sum() - over > 0
    return np.where(others_over, np.maximum(guarantee - held, 0.0), 0.0)


def priced_solve(solve: Callable[[PolluxObjective], tuple[IntArray, dict[str, Any]]],
                 build: Callable[[TeamShares], PolluxObjective], shares: TeamShares,
                 teams: list[str], gpus: np.ndarray, max_price_rounds: int = MAX_PRICE_ROUNDS,
                 current: IntArray | None = None
                 ) -> tuple[PolluxObjective, IntArray, dict[str, Any]]:
    """Solve with prices until every guarantee is met (module docstring), each solve
    repaired; the answer is the repaired solve the unpriced objective values most (a
    higher price only ever adds candidates: it never replaces a better allocation), or
    ``current`` (the current allocation, repaired too) where that is valued more."""
    prices = np.ones(len(shares.team_names))
    true = build(shares)
    best: tuple[float, IntArray, dict[str, Any], int] | None = None
    if current is not None:
        kept = meet_guarantees(true, current, teams, gpus)
        best = (float(true.evaluate(kept[None])[0]), kept, {}, -1)
    for attempt in range(max_price_rounds + 1):
        priced = replace(shares, weights=shares.weights * prices[shares.team_index])
        objective = true if attempt == 0 else build(priced)
        state, stats = solve(objective)
        short = shortfalls(state, shares, gpus) > RESOURCE_TOLERANCE
        repaired = meet_guarantees(objective, state, teams, gpus)
        value = float(true.evaluate(repaired[None])[0])
        if best is None or value > best[0]:
            best = (value, repaired, stats, attempt)
        if not short.any() or attempt == max_price_rounds:
            break
        prices[short] *= PRICE_STEP
    assert best is not None  # the loop runs at least once
    _, state, stats, chosen = best
    stats = {**stats, "kept_current": chosen < 0, "price_rounds": attempt,
             "chosen_price_round": chosen,
             "max_team_price": float(prices.max())}
    return true, state, stats


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
        gaps = shortfalls(state, shares, gpus)
        short = [t for t, gap in zip(shares.team_names, gaps) if gap > RESOURCE_TOLERANCE]
        if not short or not _close_one(objective, state, teams, gpus, held, short[0]):
            break
    return _start_waiting(objective, state, teams)


def _start_waiting(objective: PolluxObjective, state: IntArray, teams: list[str]) -> IntArray:
    """``state`` with each job left without replicas started on one replica taken from a
    job of its own team, where that improves the objective (the teams' totals, so their
    guarantees, unchanged): closing a guarantee can take the slot of a new job whose team
    was over its quota, while the team's big job could spare one."""
    problem = objective.problem
    avoid = objective.config.interference_avoidance
    value = float(objective.evaluate(state[None])[0])
    for w in range(problem.num_jobs):
        if (state[w].any() or problem.pinned[w] or problem.max_replicas[w] < 1
                or problem.min_replicas[w] > 1):
            continue
        trials = []
        for d in range(problem.num_jobs):
            if (teams[d] != teams[w] or problem.pinned[d] or not np.array_equal(
                    problem.demand[d], problem.demand[w])
                    or state[d].sum() - 1 < max(int(problem.min_replicas[d]), 1)):
                continue
            for n in np.flatnonzero(state[d]):
                trial = state.copy()
                trial[d, n] -= 1
                if _may_add(trial, w, int(n), avoid):
                    trial[w, n] += 1
                    trials.append(trial)
        if trials:
            scores = objective.evaluate(np.stack(trials))
            k = int(np.argmax(scores))
            if scores[k] > value:
                value, state = float(scores[k]), trials[k]
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
               and gpus[j] <= shares.guarantee_gpus[team] - held[team] + RESOURCE_TOLERANCE]
    growers.sort(key=lambda j: (-problem.jobs[j].priority, -_gain(objective, state, j), j))
    avoid = objective.config.interference_avoidance
    for j in growers:
        fits = np.all(free >= problem.demand[j] - RESOURCE_TOLERANCE, axis=1)
        fits &= np.array([_may_add(state, j, n, avoid) for n in range(problem.num_nodes)])
        if fits.any():
            _grow(state, j, fits)
            return True
    lenders = [v for v in range(problem.num_jobs) if state[v].any() and not problem.pinned[v]
               and held[teams[v]] - gpus[v] + RESOURCE_TOLERANCE >= shares.quota_gpus.get(
                   teams[v], 0.0) and teams[v] != team]
    lenders.sort(key=lambda v: (problem.jobs[v].priority, _loss(objective, state, v), v))
    for j in growers:
        for v in lenders:
            for n in np.flatnonzero(state[v]):
                after = free[n] + problem.demand[v] * (
                    state[v].sum() if state[v].sum() - 1 < problem.min_replicas[v] else 1)
                if not np.all(after >= problem.demand[j] - RESOURCE_TOLERANCE):
                    continue
                before = state.copy()
                _shrink(state, v, int(n), int(problem.min_replicas[v]))
                if _may_add(state, j, int(n), avoid):
                    state[j, n] += 1
                    return True
                state[:] = before
                # a spread grower may not join a spread lender on its node: the lender
                # hands the whole node over, where its team keeps its quota without it
                if (avoid and state[v, n] > 1 and held[teams[v]] - state[v, n] * gpus[v]
                        + RESOURCE_TOLERANCE >= shares.quota_gpus.get(teams[v], 0.0)):
                    state[v, n] = 0
                    if state[v].sum() < problem.min_replicas[v]:
                        state[v] = 0
                    if _may_add(state, j, int(n), avoid):
                        state[j, n] += 1
                        return True
                    state[:] = before
    return False


def _may_add(state: IntArray, j: int, n: int, avoid: bool) -> bool:
    """Whether job ``j`` may take one more replica on node ``n``: with interference
    avoidance, a job spread over several nodes shares none of them with another such job
    (the rule the optimizers keep: :func:`~pollux.policies.pollux.constraints.violations`)."""
    if not avoid:
        return True
    row = state[j].copy()
    row[n] += 1
    nodes = np.flatnonzero(row)
    if nodes.size <= 1:
        return True
    others = np.delete(state, j, axis=0)
    spread = np.count_nonzero(others, axis=1) > 1
    return not bool((others[spread][:, nodes] > 0).any())


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
    return now - float(objective.job_utility(v, min(nodes, k - 1), k - 1, True))
