"""One scheduling round as arrays: the snapshot the Pollux optimizers work on.

An allocation of every job is a *state*: an integer matrix ``state[j, n]`` = replicas of
job ``j`` on node ``n``. Jobs are ordered by priority (pinned jobs first, then by
submission time), nodes by preference (non-preemptible first, then by name); both orders
matter to the repair step, which resolves conflicts in favour of earlier jobs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pollux.capacity import RESOURCE_TOLERANCE, with_slack
from pollux.errors import ConfigError
from pollux.policies.base import Allocation, Allocations, JobInfo, NodeInfo

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]



@dataclass(frozen=True)
class AllocationProblem:
    """The arrays of one round. Shapes: J jobs, N nodes, R resource types."""

    jobs: tuple[JobInfo, ...]
    """Active jobs in priority order: pinned first, then by submission time and name."""
    nodes: tuple[NodeInfo, ...]
    """Nodes in preference order: non-preemptible first, then by name."""
    resource_types: tuple[str, ...]
    """Resource types requested by at least one job, sorted."""
    demand: FloatArray
    """(J, R): amount of each resource one replica of each job needs."""
    capacity: FloatArray
    """(N, R): total amount of each resource on each node."""
    base_state: IntArray
    """(J, N): the previous allocation (replicas on nodes that still exist)."""
    pinned: BoolArray
    """(J,): non-preemptible jobs that are running; they keep ``base_state`` rows."""
    free_capacity: FloatArray
    """(N, R): capacity left once the pinned jobs are placed."""
    max_per_node: IntArray
    """(J, N): replicas of each job one node can hold on its own (pinned rows: base)."""
    min_replicas: IntArray
    """(J,): below this many replicas a job gets nothing."""
    max_replicas: IntArray
    """(J,): most replicas a job may get (its bound, the cluster's room for it)."""
    node_preemptible: BoolArray
    """(N,): preemptible (spot) nodes, used last."""
    dominant_share: FloatArray
    """(J,): largest fraction of any cluster resource one replica of the job takes."""
    node_size: IntArray
    """(J,): replicas of each job the largest empty node holds (at least 1)."""

    @property
    def num_jobs(self) -> int:
        return len(self.jobs)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.jobs), len(self.nodes))

    def to_allocations(
        self, state: IntArray, previous_allocations: Allocations
    ) -> dict[str, Allocation]:
        """Job name -> node per replica. Unchanged rows return the previous tuple verbatim."""
        names = [node.name for node in self.nodes]
        result: dict[str, Allocation] = {}
        for j, job in enumerate(self.jobs):
            row = state[j]
            if np.array_equal(row, self.base_state[j]) and row.any():
                previous = tuple(previous_allocations.get(job.name, ()))
                if len(previous) == int(row.sum()):
                    result[job.name] = previous
                    continue
            result[job.name] = tuple(
                names[n] for n in np.flatnonzero(row) for _ in range(int(row[n])))
        return result


def candidate_counts(problem: AllocationProblem, j: int) -> IntArray:
    """Replica counts worth considering for job ``j``: 0, then its minimum up to its maximum.

    Every count up to two nodes' worth; then steps of half a node up to four nodes, of a
    node up to eight, of two nodes beyond (a job that large changes little per replica,
    and the fill and exchange steps still adjust by single replicas); plus the maximum and
    the current count.
    """
    cap = int(problem.max_replicas[j])
    smallest = max(int(problem.min_replicas[j]), 1)
    size = int(problem.node_size[j])
    half = max(size // 2, 1)
    parts = [np.arange(smallest, min(cap, 2 * size) + 1),
             np.arange(2 * size + half, min(cap, 4 * size) + 1, half),
             np.arange(4 * size + size, min(cap, 8 * size) + 1, size),
             np.arange(8 * size + 2 * size, cap + 1, 2 * size)]
    current = int(problem.base_state[j].sum())
    extra = [cap] if cap >= smallest else []
    if smallest <= current <= cap:
        extra.append(current)
    return np.unique(np.concatenate([[0], *parts, extra])).astype(np.int64)


def fitting_replicas(demand: FloatArray, free: FloatArray, cap: IntArray) -> IntArray:
    """(J, N): ``min_r floor(free[n, r] / demand[j, r])`` over requested types, capped
    (nothing requested: only the cap limits)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = free[None, :, :] / demand[:, None, :]
    ratio = np.where(demand[:, None, :] > 0, ratio, np.inf)
    fits = np.floor(with_slack(ratio)).min(axis=2, initial=np.inf)
    fits = np.minimum(fits, cap[:, None].astype(np.float64))
    return np.maximum(fits, 0.0).astype(np.int64)


def count_along(mask: BoolArray, axis: int) -> IntArray:
    """True entries of ``mask`` along ``axis``, as int64.

    Same as ``mask.sum(axis)``; an einsum over a byte view (exact while the axis is
    shorter than 256) is several times faster on the small 3-d arrays of a population.
    """
    if mask.shape[axis] >= 256:
        return np.asarray(mask.sum(axis=axis), dtype=np.int64)
    letters = "abcdefghijklmnop"[: mask.ndim]
    kept = letters.replace(letters[axis], "")
    return np.einsum(f"{letters}->{kept}", mask.view(np.uint8)).astype(np.int64)


def _check_unique(names: Sequence[str], field: str) -> None:
    repeated = [name for name, count in Counter(names).items() if count > 1]
    if repeated:
        raise ConfigError(field, repeated[0], "give every entry a unique name")


def _check_amounts(resources: Mapping[str, float], field: str) -> None:
    if not isinstance(resources, Mapping):
        raise ConfigError(field, resources, "give a mapping of resource type -> amount")
    for rtype, amount in resources.items():
        if not 0 <= float(amount) < np.inf:
            raise ConfigError(f"{field}[{rtype!r}]", amount, "use a finite amount >= 0")


def build_problem(
    jobs: Sequence[JobInfo],
    nodes: Sequence[NodeInfo],
    previous_allocations: Allocations,
    least_service_first: bool = False,
) -> AllocationProblem:
    """Arrays for one round; validates names and amounts (ConfigError on bad input).

    Jobs go pinned first, then by submission time, or with ``least_service_first`` by
    attained service (GPU-seconds) and then submission time, as the reference GA orders
    them (the repair resolves conflicts in favour of earlier jobs)."""
    _check_unique([job.name for job in jobs], "JobInfo.name")
    _check_unique([node.name for node in nodes], "NodeInfo.name")
    for job in jobs:
        _check_amounts(job.resources, f"JobInfo({job.name!r}).resources")
        for attr in ("min_replicas", "max_replicas"):
            if getattr(job, attr) < 0:
                raise ConfigError(f"JobInfo({job.name!r}).{attr}", getattr(job, attr),
                                  "use a count >= 0")
    for node in nodes:
        _check_amounts(node.resources, f"NodeInfo({node.name!r}).resources")

    node_order = sorted(nodes, key=lambda node: (node.preemptible, node.name))
    node_index = {node.name: n for n, node in enumerate(node_order)}

    def running(job: JobInfo) -> bool:
        return any(name in node_index for name in previous_allocations.get(job.name, ()))

    job_order = sorted(jobs, key=lambda job: (
        job.preemptible or not running(job),
        job.attained_service_s if least_service_first else 0.0,
        job.submission_time_s, job.name))
    rtypes = tuple(sorted({r for job in job_order for r, a in job.resources.items()
                           if float(a) > 0}))
    num_jobs, num_nodes = len(job_order), len(node_order)
    demand = np.array([[float(job.resources.get(r, 0.0)) for r in rtypes]
                       for job in job_order], dtype=np.float64).reshape(num_jobs, len(rtypes))
    capacity = np.array([[float(node.resources.get(r, 0.0)) for r in rtypes]
                         for node in node_order],
                        dtype=np.float64).reshape(num_nodes, len(rtypes))

    base = np.zeros((num_jobs, num_nodes), dtype=np.int64)
    for j, job in enumerate(job_order):
        for name in previous_allocations.get(job.name, ()):
            if name in node_index:
                base[j, node_index[name]] += 1
    pinned = base.any(axis=1) & ~np.array([job.preemptible for job in job_order], dtype=bool)

    free = np.maximum(capacity - base[pinned].T @ demand[pinned], 0.0)
    bound = np.array([job.max_replicas for job in job_order], dtype=np.int64)
    per_node = fitting_replicas(demand, free, bound)
    per_node[pinned] = base[pinned]
    max_replicas = np.minimum(bound, per_node.sum(axis=1))
    max_replicas[pinned] = base[pinned].sum(axis=1)
    min_replicas = np.array([job.min_replicas for job in job_order], dtype=np.int64)

    total = capacity.sum(axis=0)
    shares = np.where(total > 0, demand / np.where(total > 0, total, 1.0), 0.0)
    dominant = shares.max(axis=1, initial=0.0)
    ratio = np.where(demand[:, None, :] > 0,
                     capacity[None, :, :] / np.where(demand > 0, demand, 1.0)[:, None, :], np.inf)
    largest = np.floor(ratio * (1 + RESOURCE_TOLERANCE)).min(axis=2, initial=np.inf)
    largest = largest.max(axis=1, initial=-np.inf)  # no nodes or no resources: inf or -inf
    node_size = np.where(np.isfinite(largest), np.maximum(largest, 1), 1).astype(np.int64)

    return AllocationProblem(
        jobs=tuple(job_order), nodes=tuple(node_order), resource_types=rtypes,
        demand=demand, capacity=capacity, base_state=base, pinned=pinned,
        free_capacity=free, max_per_node=per_node, min_replicas=min_replicas,
        max_replicas=max_replicas,
        node_preemptible=np.array([node.preemptible for node in node_order], dtype=bool),
        dominant_share=dominant, node_size=node_size,
    )
