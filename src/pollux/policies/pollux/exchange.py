"""Local search for the default optimizer: hand replicas from one job to another on a node.

The count step of the default optimizer reasons about aggregate capacity, so packing can
leave a job short (say two jobs that each hold 3 of a node's 4 GPUs where 2 + 2 packs
better). An *exchange* takes ``k`` replicas of a job ``A`` off a node and gives the room,
with whatever was free there, to the job ``B`` that gains most from it on that node. It is
applied when ``B``'s utility gain exceeds ``A``'s loss, on the exact objective of the
actual placement, and the search sweeps the nodes until no exchange helps (or a move
budget is spent). Every move keeps the placement feasible.
"""

from __future__ import annotations

import numpy as np

from pollux.policies.pollux.objective import PolluxObjective
from pollux.policies.pollux.placement import Placement
from pollux.policies.pollux.problem import FloatArray, fitting_replicas

_TOLERANCE = 1e-9


class _Gains:
    """Per-job utility now, and gains of adding 1..K replicas on an own or a new node."""

    def __init__(self, placement: Placement, objective: PolluxObjective, movable: list[int],
                 max_step: int) -> None:
        self.placement = placement
        self.objective = objective
        self.max_step = max_step
        num_jobs = placement.problem.num_jobs
        self.movable = np.zeros(num_jobs, dtype=bool)
        self.movable[movable] = True
        self.current = np.zeros(num_jobs)
        self.own, self.new = np.full((2, num_jobs, max_step + 1), -np.inf)
        for j in movable:
            self.update(j)
        self.refresh_layout()

    def refresh_layout(self) -> None:
        """Node counts and who may spread to a new node (interference rule), after any move."""
        placement = self.placement
        occupied = placement.state > 0
        self.num_nodes = occupied.sum(axis=1)
        owners = placement.owner[None, :]
        jobs = np.arange(placement.problem.num_jobs)[:, None]
        self.spread_ok = ~(occupied & (owners >= 0) & (owners != jobs)).any(axis=1)

    def utility(self, j: int, num_nodes: int | np.ndarray, replicas: int | np.ndarray,
                changed: bool | np.ndarray = True) -> FloatArray:
        return self.objective.job_utility(j, num_nodes, replicas, changed)

    def update(self, j: int) -> None:
        problem = self.placement.problem
        row = self.placement.state[j]
        replicas, num_nodes = int(row.sum()), int(np.count_nonzero(row))
        changed = not np.array_equal(row, problem.base_state[j])
        self.current[j] = float(self.utility(j, num_nodes, replicas, changed))
        ks = np.arange(1, self.max_step + 1)
        totals = replicas + ks
        valid = (totals <= problem.max_replicas[j]) & (totals >= problem.min_replicas[j])
        own, new = np.full((2, self.max_step + 1), -np.inf)
        if valid.any():
            totals = totals[valid]
            at = ks[valid]
            # One lookup for both cases: on one node more, and on the nodes it has.
            nodes = np.concatenate([np.full(at.shape, num_nodes + 1),
                                    np.full(at.shape, max(num_nodes, 1))])
            value = self.utility(j, nodes, np.concatenate([totals, totals])) - self.current[j]
            new[at] = value[: at.size]
            if num_nodes:
                own[at] = value[at.size:]
        # Best gain using at most k replicas (the receiver may take fewer than fit).
        self.own[j] = np.maximum.accumulate(own)
        self.new[j] = np.maximum.accumulate(new)


def _receivers_gain(gains: _Gains, n: int, free_after: FloatArray, owner_after: int,
                    exclude: int) -> tuple[float, int]:
    """Best (gain, job) for receiving room ``free_after`` (R,) on node ``n``."""
    placement = gains.placement
    problem = placement.problem
    fit = fitting_replicas(problem.demand, free_after[None, :],
                           np.full(problem.num_jobs, gains.max_step))[:, 0]
    rows = np.arange(problem.num_jobs)
    spreads_ok = (not placement.interference_avoidance) | (gains.num_nodes == 0) | (
        gains.spread_ok & ((owner_after < 0) | (owner_after == rows)))
    gain = np.where(placement.state[:, n] > 0, gains.own[rows, fit],
                    np.where(spreads_ok, gains.new[rows, fit], -np.inf))
    gain = np.where(gains.movable & (rows != exclude) & (fit > 0), gain, -np.inf)
    best = int(np.argmax(gain))
    return float(gain[best]), best


def _apply_gain(gains: _Gains, j: int, n: int) -> None:
    """Give job ``j`` its best addition on node ``n`` (as many replicas as pay most)."""
    placement = gains.placement
    fit = int(min(placement.fit(j)[n], gains.max_step))
    table = gains.own[j] if placement.state[j, n] > 0 else gains.new[j]
    k = int(np.argmax(table[: fit + 1]))
    if k > 0 and table[k] > -np.inf:
        addition = np.zeros(placement.problem.num_nodes, dtype=np.int64)
        addition[n] = k
        placement.assign(j, addition)


def exchange(placement: Placement, objective: PolluxObjective, movable: list[int],
             max_moves: int, nodes: list[int] | None = None) -> int:
    """Improve ``placement`` in place by exchanges on ``nodes`` (default: all); returns the
    number of moves made."""
    problem = placement.problem
    scan = list(range(problem.num_nodes)) if nodes is None else nodes
    if not movable or not scan or max_moves <= 0:
        return 0
    max_step = int(max(1, problem.max_per_node.max(initial=1)))
    gains = _Gains(placement, objective, movable, max_step)
    moves = 0
    improved = True
    while improved and moves < max_moves:
        improved = False
        for n in scan:
            holders = [int(a) for a in np.flatnonzero(placement.state[:, n]) if gains.movable[a]]
            for a in holders:
                row = placement.state[a]
                replicas, num_nodes = int(row.sum()), int(np.count_nonzero(row))
                best: tuple[float, int, int] | None = None
                for k in range(1, int(row[n]) + 1):
                    left = replicas - k
                    if 0 < left < problem.min_replicas[a]:
                        continue
                    nodes_left = num_nodes - (1 if k == row[n] else 0)
                    loss = gains.current[a] - float(
                        gains.utility(a, nodes_left if left else 0, left))
                    owner_after = int(placement.owner[n])
                    if k == row[n] and owner_after == a:  # it leaves the node
                        owner_after = -1
                    free_after = placement.free[n] + k * problem.demand[a]
                    gain, b = _receivers_gain(gains, n, free_after, owner_after, a)
                    if gain - loss > _TOLERANCE and (best is None or gain - loss > best[0]):
                        best = (gain - loss, k, b)
                if best is not None:
                    _, k, b = best
                    placement.remove(a, n, k)
                    _apply_gain(gains, b, n)
                    gains.update(a)
                    gains.update(b)
                    gains.refresh_layout()
                    moves += 1
                    improved = True
                    if moves >= max_moves:
                        return moves
    return moves
