"""Putting replica counts onto nodes, and filling what is left, for the default optimizer.

A :class:`Placement` is a working state that stays feasible after every operation: it
tracks each node's free resources and, for interference avoidance, which distributed job
(if any) owns each node. Pinned jobs are placed when it is created.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from pollux.capacity import with_slack
from pollux.policies.pollux.objective import PolluxObjective
from pollux.policies.pollux.problem import AllocationProblem, IntArray, fitting_replicas

GAIN_TOLERANCE = 1e-12


class Placement:
    """A feasible state under construction."""

    def __init__(self, problem: AllocationProblem, interference_avoidance: bool) -> None:
        self.problem = problem
        self.interference_avoidance = interference_avoidance
        self.state = np.zeros(problem.shape, dtype=np.int64)
        self.free = problem.free_capacity.copy()
        self.owner = np.full(problem.num_nodes, -1, dtype=np.int64)
        """Node -> index of the distributed job using it (-1: none)."""
        for j in np.flatnonzero(problem.pinned):
            self.state[j] = problem.base_state[j]
            if np.count_nonzero(self.state[j]) > 1:
                self.owner[(self.state[j] > 0) & (self.owner < 0)] = j

    # -- queries --------------------------------------------------------------------------

    def fit(self, j: int) -> IntArray:
        """(N,): replicas of job ``j`` that still fit on each node, within its maximum."""
        room = int(self.problem.max_replicas[j] - self.state[j].sum())
        return fitting_replicas(self.problem.demand[j][None], self.free, np.array([room]))[0]

    def fits_row(self, j: int, row: IntArray) -> bool:
        need = row[:, None] * self.problem.demand[j][None, :]
        if np.any(need > with_slack(self.free)):
            return False
        if self.interference_avoidance and np.count_nonzero(row) > 1:
            return bool(np.all(self.owner[row > 0] < 0))
        return True

    # -- updates --------------------------------------------------------------------------

    def assign(self, j: int, row: IntArray) -> None:
        """Add ``row`` (N,) replicas to job ``j``."""
        self.state[j] += row
        self.free -= row[:, None] * self.problem.demand[j][None, :]
        if np.count_nonzero(self.state[j]) > 1:
            self.owner[self.state[j] > 0] = j

    def remove(self, j: int, n: int, count: int) -> None:
        """Take ``count`` replicas of job ``j`` off node ``n``."""
        self.state[j, n] -= count
        self.free[n] += count * self.problem.demand[j]
        row = self.state[j]
        if row[n] == 0 and self.owner[n] == j:
            self.owner[n] = -1
        if np.count_nonzero(row) <= 1:
            self.owner[self.owner == j] = -1

    def place(self, j: int, count: int) -> IntArray | None:
        """A row with ``count`` replicas for job ``j`` (empty so far), or None.

        One node when one can hold them all (non-preemptible first, then a node the job
        used before, then the tightest fit); otherwise as few nodes as possible among
        those free of other distributed jobs.
        """
        problem = self.problem
        fit = self.fit(j)
        before = problem.base_state[j] > 0
        spot = problem.node_preemptible
        row = np.zeros(problem.num_nodes, dtype=np.int64)
        single = np.flatnonzero(fit >= count)
        if single.size:
            key = np.lexsort((single, fit[single] - count, ~before[single], spot[single]))
            row[single[key[0]]] = count
            return row
        allowed = fit > 0
        if self.interference_avoidance:
            allowed &= self.owner < 0
        candidates = np.flatnonzero(allowed)
        if fit[candidates].sum() < count:
            return None
        order = candidates[np.lexsort((candidates, ~before[candidates], -fit[candidates],
                                       spot[candidates]))]
        row[order] = np.minimum(fit[order], np.maximum(count - np.cumsum(fit[order])
                                                       + fit[order], 0))
        return row


def _best_addition(
    placement: Placement, objective: PolluxObjective, j: int
) -> tuple[float, IntArray] | None:
    """Job ``j``'s best addition of replicas on one node: (gain per unit, row to add)."""
    problem = placement.problem
    row = placement.state[j]
    fit = placement.fit(j)
    if not fit.any():
        return None
    base = problem.base_state[j]
    replicas = int(row.sum())
    own = row > 0
    num_nodes = int(own.sum())
    unit = max(float(problem.dominant_share[j]), 1e-12)
    changed_now = not np.array_equal(row, base)
    current = objective.job_utility(j, num_nodes, replicas, changed_now)
    best: tuple[float, IntArray] | None = None

    candidates: list[tuple[int, int]] = []  # (node, nodes after adding there)
    mine = np.flatnonzero(own & (fit > 0))
    if mine.size:
        candidates.append((int(mine[np.argmax(fit[mine])]), num_nodes))
    others = ~own & (fit > 0)
    if num_nodes >= 1 and placement.interference_avoidance:
        # spread onto nodes no distributed job owns, and only if none of its own is another's
        owners = placement.owner[own]
        others &= (placement.owner < 0) & bool(np.all((owners < 0) | (owners == j)))
    if others.any():
        cand = np.flatnonzero(others)
        key = np.lexsort((cand, base[cand] == 0, -fit[cand], problem.node_preemptible[cand]))
        candidates.append((int(cand[key[0]]), num_nodes + 1))

    for node, nodes_after in candidates:
        ks = np.arange(max(1, int(problem.min_replicas[j]) - replicas), int(fit[node]) + 1)
        if ks.size == 0:
            continue
        totals = replicas + ks
        rest_equal = np.array_equal(np.delete(row, node), np.delete(base, node))
        changed = ~(rest_equal & (row[node] + ks == base[node]))
        value = objective.job_utility(j, np.full(ks.shape, nodes_after), totals, changed)
        gains = (value - current) / (ks * unit)
        k = int(np.argmax(gains))
        if gains[k] > GAIN_TOLERANCE and (best is None or gains[k] > best[0]):
            addition = np.zeros(problem.num_nodes, dtype=np.int64)
            addition[node] = ks[k]
            best = (float(gains[k]), addition)
    return best


def fill(placement: Placement, objective: PolluxObjective, jobs: Sequence[int]) -> int:
    """Hand free resources to the jobs that gain most per unit; returns additions made.

    Lazy greedy: a job's best addition only gets worse as others take resources, so a
    popped entry that is still at least as good as the next one is applied right away. The
    heap holds at most one entry per job (each pop pushes back at most one).
    """
    heap: list[tuple[float, int]] = []
    for j in jobs:
        found = _best_addition(placement, objective, j)
        if found is not None:
            heap.append((-found[0], j))
    heapq.heapify(heap)
    made = 0
    while heap:
        _, j = heapq.heappop(heap)
        found = _best_addition(placement, objective, j)
        if found is None:
            continue
        gain, addition = found
        if not heap or gain >= -heap[0][0] - GAIN_TOLERANCE:  # still the best: apply it
            placement.assign(j, addition)
            made += 1
            found = _best_addition(placement, objective, j)
        if found is not None:  # its next addition, or this one at its gain now
            heapq.heappush(heap, (-found[0], j))
    return made
