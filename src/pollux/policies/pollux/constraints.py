"""Feasibility of allocation states, and the repair that maps any state onto a feasible one.

A state (J, N) is feasible when:

1. every node holds what its replicas need, for every resource type a job requests:
   ``sum_j state[j, n] * demand[j, r] <= capacity[n, r]``;
2. every job gets 0 replicas or between its ``min_replicas`` and ``max_replicas``;
3. pinned jobs (non-preemptible and running) keep exactly their previous allocation;
4. with interference avoidance, at most one *distributed* job (one spanning more than one
   node) has replicas on any node; two pinned jobs that already share a node are left be.
"""

from __future__ import annotations

import numpy as np

from pollux.capacity import with_slack
from pollux.policies.pollux.problem import (
    AllocationProblem,
    IntArray,
    count_along,
)


def violations(
    problem: AllocationProblem, state: IntArray, interference_avoidance: bool = True
) -> list[str]:
    """Human-readable reasons ``state`` is infeasible (empty when it is feasible)."""
    out: list[str] = []
    state = np.asarray(state)
    if state.shape != problem.shape:
        return [f"state has shape {state.shape}, expected {problem.shape}"]
    if (state < 0).any():
        out.append("negative replica counts")
    used = state.T.astype(np.float64) @ problem.demand
    over = used > with_slack(problem.capacity)
    for n, r in zip(*np.nonzero(over)):
        out.append(f"node {problem.nodes[n].name!r} over capacity of "
                   f"{problem.resource_types[r]!r}: {used[n, r]:g} > {problem.capacity[n, r]:g}")
    totals = state.sum(axis=1)
    for j, job in enumerate(problem.jobs):
        if problem.pinned[j]:
            if not np.array_equal(state[j], problem.base_state[j]):
                out.append(f"non-preemptible job {job.name!r} was moved")
            continue
        if totals[j] > job.max_replicas:
            out.append(f"job {job.name!r} has {totals[j]} > max_replicas {job.max_replicas}")
        if 0 < totals[j] < job.min_replicas:
            out.append(f"job {job.name!r} has {totals[j]} < min_replicas {job.min_replicas}")
    if interference_avoidance:
        distributed = np.count_nonzero(state, axis=1) > 1
        counted = distributed & ~problem.pinned
        pinned_dist = distributed & problem.pinned
        per_node = ((state[counted] > 0).sum(axis=0)
                    + (state[pinned_dist] > 0).any(axis=0).astype(np.int64))
        for n in np.flatnonzero(per_node > 1):
            out.append(f"node {problem.nodes[n].name!r} hosts {per_node[n]} distributed jobs")
    return out


def repair(
    problem: AllocationProblem,
    states: IntArray,
    rng: np.random.Generator,
    interference_avoidance: bool = True,
    small_first: bool = False,
) -> IntArray:
    """Feasible states (P, J, N) close to ``states``; conflicts go to earlier jobs.

    Steps, each keeping what the previous ones established: clip every entry to what the
    node can hold for the job; restore pinned rows; drop the replicas of a distributed job
    on any node an earlier distributed job already uses; cap each job at its maximum by
    dropping replicas on randomly ordered nodes; fit node capacity job by job in priority
    order (``small_first``: smallest allocations first, so that a job the mutation just
    started is not cut back in favour of a big one); finally clear jobs left below their
    minimum.

    The genetic algorithm repairs a whole population each generation, so every step is
    one numpy expression over all states at once (no per-state or per-job loop).
    """
    s = np.minimum(np.maximum(np.asarray(states, dtype=np.int64), 0), problem.max_per_node)
    pinned = problem.pinned
    any_pinned = bool(pinned.any())
    if any_pinned:
        s[:, pinned] = problem.base_state[pinned]
    if interference_avoidance:
        # A distributed job's entry conflicts where an earlier distributed job is there;
        # only (state, node) pairs holding two distributed jobs are looked at.
        occupied = s > 0
        occupied &= (count_along(occupied, axis=2) > 1)[:, :, None]
        state_idx, node_idx = np.nonzero(count_along(occupied, axis=1) > 1)
        if len(state_idx):
            columns = occupied[state_idx, :, node_idx]  # (M, J)
            conflict = columns & (np.cumsum(columns, axis=1) > 1)
            if any_pinned:
                conflict &= ~pinned[None, :]
            s[state_idx, :, node_idx] = np.where(conflict, 0, s[state_idx, :, node_idx])
    # At most max_replicas per job: keep a cumulative cap over a random node order.
    over = np.einsum("pjn->pj", s) > problem.max_replicas[None, :]
    if over.any():
        rows = s[over]
        order = np.argsort(rng.random(rows.shape), axis=1)
        shuffled = np.take_along_axis(rows, order, axis=1)
        limit = np.broadcast_to(problem.max_replicas[None, :], over.shape)[over]
        capped = np.minimum(np.cumsum(shuffled, axis=1), limit[:, None])
        np.put_along_axis(rows, order, np.diff(capped, axis=1, prepend=0), axis=1)
        s[over] = rows
    if problem.resource_types:
        s = _fit_capacity(problem, s, small_first)
    if int(problem.min_replicas.max(initial=0)) > 1:  # else only empty rows are below
        below = (s.sum(axis=2) < problem.min_replicas[None]) & ~pinned[None]
        s[below] = 0
    if any_pinned:
        s[:, pinned] = problem.base_state[pinned]
    return s


def _fit_capacity(problem: AllocationProblem, s: IntArray, small_first: bool) -> IntArray:
    """Node capacity, resource by resource: pinned jobs first, then (with ``small_first``)
    the jobs with the smallest allocations, else in priority order. Each job keeps the
    replicas that fit in what the jobs before it *asked* for left of the node.

    Only the (state, node) pairs asked beyond the node's capacity are looked at: on the
    others every job keeps what it asked (modifies ``s`` in place)."""
    used = np.matmul(s.transpose(0, 2, 1).astype(np.float64), problem.demand)  # (P, N, R)
    state_idx, node_idx = np.nonzero((used > problem.capacity[None]).any(axis=2))
    if len(state_idx) == 0:
        return s
    num_jobs = problem.num_jobs
    key = np.broadcast_to(np.arange(num_jobs, dtype=np.float64), s.shape[:2])
    if small_first:  # dominant shares of whole replicas differ by far more than 1e-6
        key = key + problem.dominant_share[None, :] * s.sum(axis=2) * 1e6 * num_jobs
    key = key[state_idx] + np.where(problem.pinned, -1e18, 0.0)[None, :]
    order = np.argsort(key, axis=1, kind="stable")  # (M, J)
    at = (state_idx[:, None], order, node_idx[:, None])
    columns = s[at]  # (M, J): each pair's replicas in the order capacity is given
    need = problem.demand[order]  # (M, J, R)
    fits = np.full(columns.shape, np.inf)
    for r in range(len(problem.resource_types)):
        need_r = need[:, :, r]
        room = np.minimum(np.cumsum(columns * need_r, axis=1),
                          problem.capacity[node_idx, r][:, None])
        granted = np.diff(room, axis=1, prepend=0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(need_r > 0, granted / need_r, np.inf)
        fits = np.minimum(fits, np.floor(with_slack(ratio)))
    fits = np.where(np.isfinite(fits), fits, columns)  # jobs that request nothing
    s[at] = np.minimum(columns, np.maximum(fits, 0).astype(np.int64))
    return s
