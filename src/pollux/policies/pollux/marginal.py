"""The default optimizer (``pollux``): marginal-gain counts, placement, fill, exchanges.

The objective is a power mean, so maximizing it means maximizing a *sum* of per-job
utilities (:func:`pollux.policies.pollux.objective.utility`): the problem separates into
one choice per job (how many replicas, kept where they are or moved) coupled only by the
cluster's capacity. Gains are compared job by job, so the ``eps^p`` of a job without GPUs
never swamps them numerically. The optimizer works in four steps:

1. **Counts.** For every job and every candidate replica count, the utility of that count
   on as few nodes as can hold it, with the restart factor applied; at its current count
   the job may instead keep its exact placement, unpenalized. A multiple-choice knapsack
   over the cluster's aggregate capacity picks one count per job: a Lagrangian start (the
   cheapest price per unit of dominant resource at which every job's preferred count fits)
   followed by a greedy that spends what is left on the jump (to any larger count) with
   the most utility per unit. Jumps, not single steps, cross valleys in a job's utility
   (a second node, leaving the penalty-free current placement).
2. **Placement.** Jobs that keep their placement are put back first; the others, largest
   first, go on one node if any can hold them (tightest fit, non-preemptible nodes and
   nodes they used before preferred) or otherwise on as few nodes as possible among those
   no other distributed job uses. A job that does not fit drops to its next smaller count.
3. **Fill.** Whatever fragmentation left free goes, by lazy greedy on the exact objective
   of the actual placement, to the jobs that gain most from it.
4. **Exchange** (:mod:`pollux.policies.pollux.exchange`): replicas move from one job to
   another on a node while that raises the exact objective (fixes packing losses).

The result is compared with the current allocation (repaired to feasibility) and the better
of the two is returned. Every step keeps the state feasible; no randomness is involved.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from pollux.capacity import with_slack
from pollux.policies.pollux.constraints import repair
from pollux.policies.pollux.exchange import exchange
from pollux.policies.pollux.objective import PolluxObjective
from pollux.policies.pollux.placement import GAIN_TOLERANCE, Placement, fill
from pollux.policies.pollux.problem import (
    AllocationProblem,
    BoolArray,
    FloatArray,
    IntArray,
    candidate_counts,
    fitting_replicas,
)


@dataclass(frozen=True)
class JobChoices:
    """The replica counts one job may get and their utilities."""

    counts: IntArray
    """Ascending candidate counts; ``counts[0] == 0``."""
    utility: FloatArray
    """Utility of each count (on as few nodes as possible, or kept in place)."""
    keep: BoolArray
    """Whether the best way to have that count is to keep the current placement."""


def job_choices(problem: AllocationProblem, objective: PolluxObjective, j: int) -> JobChoices:
    """Candidate counts of job ``j`` with their utilities (see module docstring)."""
    cap = int(problem.max_replicas[j])
    smallest = max(int(problem.min_replicas[j]), 1)
    counts = candidate_counts(problem, j)
    cumulative = np.cumsum(np.sort(problem.max_per_node[j])[::-1])  # the roomiest nodes first
    nodes = np.where(counts > 0, np.searchsorted(cumulative, counts) + 1, 0)
    utility = objective.job_utility(j, nodes, counts, counts > 0)
    keep = np.zeros(counts.shape, dtype=bool)
    base = problem.base_state[j]
    current = int(base.sum())
    if current == 0:
        keep[0] = True
    elif smallest <= current <= cap and np.all(base <= problem.max_per_node[j]):
        kept = objective.job_utility(j, np.count_nonzero(base), current, False)
        at = int(np.searchsorted(counts, current))
        if kept >= utility[at]:
            utility[at] = kept
            keep[at] = True
    return JobChoices(counts=counts, utility=np.asarray(utility, dtype=np.float64), keep=keep)


def price_counts(problem: AllocationProblem, choices: dict[int, JobChoices]) -> dict[int, int]:
    """Lagrangian start: every job's best count at the lowest price that fits the cluster.

    At a price ``lam`` per unit of dominant resource each job picks the count maximizing
    ``utility - lam * count * dominant_share``; the total demand falls as the price rises,
    so bisection finds the cheapest price whose picks fit the aggregate free capacity.
    """
    jobs = list(choices)
    if not jobs:
        return {}
    width = max(len(choices[j].counts) for j in jobs)
    utility = np.full((len(jobs), width), -np.inf)
    counts = np.zeros((len(jobs), width))
    for i, j in enumerate(jobs):
        c = choices[j]
        utility[i, : len(c.counts)] = c.utility
        counts[i, : len(c.counts)] = c.counts
    cost = counts * np.maximum(problem.dominant_share[jobs], 1e-12)[:, None]
    demand = problem.demand[jobs]
    total = with_slack(problem.free_capacity.sum(axis=0))
    rows = np.arange(len(jobs))

    def pick(price: float) -> tuple[IntArray, bool]:
        at = np.argmax(utility - price * cost, axis=1)
        use = (counts[rows, at][:, None] * demand).sum(axis=0)
        return at, bool(np.all(use <= total))

    at, fits = pick(0.0)
    if not fits:
        low, high = 0.0, 1.0
        for _ in range(200):
            if pick(high)[1]:
                break
            low, high = high, high * 4.0
        for _ in range(60):
            middle = 0.5 * (low + high)
            low, high = (low, middle) if pick(middle)[1] else (middle, high)
        at, _ = pick(high)
    return {j: int(at[i]) for i, j in enumerate(jobs)}


def allocate_counts(
    problem: AllocationProblem, choices: dict[int, JobChoices]
) -> dict[int, int]:
    """Job -> index into its counts: the knapsack of step 1 (module docstring), from
    :func:`price_counts` then greedy jumps."""
    chosen = price_counts(problem, choices)
    remaining = problem.free_capacity.sum(axis=0) - sum(
        (choices[j].counts[at] * problem.demand[j] for j, at in chosen.items()),
        np.zeros(len(problem.resource_types)))
    heap: list[tuple[float, int, int]] = []  # (-gain, job, target count): one per job

    def best_jump(j: int) -> tuple[float, int] | None:
        c = choices[j]
        at = chosen[j]
        if at + 1 >= len(c.counts):
            return None
        extra = c.counts[at + 1:] - c.counts[at]
        need = extra[:, None] * problem.demand[j][None, :]
        fits = np.all(need <= with_slack(remaining[None, :]), axis=1)
        if not fits.any():
            return None
        unit = max(float(problem.dominant_share[j]), 1e-12)
        gains = np.where(fits, (c.utility[at + 1:] - c.utility[at]) / (extra * unit), -np.inf)
        k = int(np.argmax(gains))
        if not gains[k] > GAIN_TOLERANCE:
            return None
        return float(gains[k]), at + 1 + k

    for j in choices:
        jump = best_jump(j)
        if jump is not None:
            heap.append((-jump[0], j, jump[1]))
    heapq.heapify(heap)
    while heap:
        _, j, target = heapq.heappop(heap)
        need = (choices[j].counts[target] - choices[j].counts[chosen[j]]) * problem.demand[j]
        if np.all(need <= with_slack(remaining)):
            remaining = remaining - need
            chosen[j] = target
        jump = best_jump(j)
        if jump is not None:
            heapq.heappush(heap, (-jump[0], j, jump[1]))
    return chosen


def shrink_to_whole_nodes(placement: Placement, jobs: list[int]) -> list[int]:
    """Jobs among ``jobs`` that hold fewer replicas than before on several nodes lose
    their replicas on nodes they fill only in part (at least one node is kept); returns
    every such shrunk job (to be left out of fill and exchange)."""
    problem = placement.problem
    rounded = []
    for j in jobs:
        row = placement.state[j]
        before = int(problem.base_state[j].sum())
        if not 0 < row.sum() < before or np.count_nonzero(row) < 2:
            continue
        rounded.append(j)
        size = int(problem.node_size[j])
        partial = np.flatnonzero((row > 0) & (row < size))
        if partial.size == np.count_nonzero(row):
            continue
        for n in partial:
            placement.remove(j, int(n), int(row[n]))
    return rounded


FULL_SCAN_SIZE = 8192
"""Jobs x nodes up to which the exchange search scans every node."""


class MarginalGainOptimizer:
    """Deterministic; keeps no state between rounds."""

    def __init__(self, interference_avoidance: bool = True, fill_free: bool = True,
                 shrink_whole_nodes: bool = False) -> None:
        self.interference_avoidance = interference_avoidance
        self.fill_free = fill_free
        self.shrink_whole_nodes = shrink_whole_nodes
        """A distributed job that shrinks keeps only its whole nodes (the rest stays free
        for later arrivals instead of being taken from it one replica per round, each a
        restart of all its GPUs); fill and exchange leave such a job alone."""

    def _exchange_nodes(self, placement: Placement, shrunk: list[int]) -> list[int] | None:
        """Nodes the exchange search scans: none when packing lost nothing (no job got less
        than its target count, no room left for any job, no distributed job on part of a
        node); else all of them (None) in small problems, and in large ones only those with
        room left or holding a job that got less."""
        problem = placement.problem
        fits = fitting_replicas(problem.demand, placement.free, problem.max_replicas).any(axis=0)
        state = placement.state
        spread = np.count_nonzero(state, axis=1) > 1
        partial = ((state[spread] > 0) & (state[spread] < problem.node_size[spread, None])).any()
        if not shrunk and not fits.any() and not partial:
            return []
        if problem.num_jobs * problem.num_nodes <= FULL_SCAN_SIZE:
            return None
        hosts = (placement.state[shrunk] > 0).any(axis=0) if shrunk else fits & False
        return [int(n) for n in np.flatnonzero(fits | hosts)]

    def current_state(self, problem: AllocationProblem) -> IntArray:
        """The current allocation, made feasible on this round's nodes (the candidate
        "keep what runs")."""
        return repair(problem, problem.base_state[None], np.random.default_rng(0),
                      self.interference_avoidance)[0]

    def solve(self, problem: AllocationProblem,
              objective: PolluxObjective) -> tuple[IntArray, dict[str, Any]]:
        """Best state found, and statistics for ``PolicyDecision.info``."""
        free_jobs = [j for j in range(problem.num_jobs) if not problem.pinned[j]]
        choices = {j: job_choices(problem, objective, j) for j in free_jobs}
        chosen = allocate_counts(problem, choices)

        placement = Placement(problem, self.interference_avoidance)
        moved: list[int] = []
        for j in free_jobs:
            c, at = choices[j], chosen[j]
            if c.counts[at] == 0:
                continue
            if c.keep[at] and placement.fits_row(j, problem.base_state[j]):
                placement.assign(j, problem.base_state[j])
            else:
                moved.append(j)
        moved.sort(key=lambda j: (-choices[j].counts[chosen[j]] * problem.dominant_share[j], j))
        shrunk: list[int] = []
        for j in moved:
            c = choices[j]
            for at in range(chosen[j], 0, -1):
                row = placement.place(j, int(c.counts[at]))
                if row is not None:
                    placement.assign(j, row)
                    break
            if placement.state[j].sum() < c.counts[chosen[j]]:
                shrunk.append(j)
        adjustable = free_jobs
        if self.shrink_whole_nodes:
            rounded = set(shrink_to_whole_nodes(placement, free_jobs))
            adjustable = [j for j in free_jobs if j not in rounded]
        num_filled = fill(placement, objective, adjustable) if self.fill_free else 0
        num_exchanged = exchange(placement, objective, adjustable, 2 * len(free_jobs),
                                 self._exchange_nodes(placement, shrunk))
        if num_exchanged and self.fill_free:
            num_filled += fill(placement, objective, adjustable)

        state = placement.state
        kept_current = False
        # with teams the caller compares, once each candidate meets the guarantees
        # (pollux.policies.pollux.guarantee.priced_solve): before, the guarantee penalty
        # decided between a placement not yet repaired and the current allocation
        if objective.shares is None:
            current = self.current_state(problem)
            if not np.array_equal(placement.state, current):  # else nothing to compare
                values = objective.evaluate(np.stack([placement.state, current]))
                kept_current = bool(values[0] < values[1])
                state = current if kept_current else state
        stats = {"placement_shrinks": len(shrunk), "fill_additions": num_filled,
                 "exchanges": num_exchanged, "kept_current": kept_current}
        return state.copy(), stats
