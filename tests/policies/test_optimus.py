from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import given, settings
from numpy.typing import ArrayLike

from pollux.policies.base import Allocation, JobInfo, NodeInfo
from pollux.policies.optimus import OptimusPolicy
from tests.policies.builders import capacity_violations, gpu_nodes, tuned_job, tuned_snapshots


def amdahl(serial_s: float, parallel_s: float) -> Callable[[ArrayLike, ArrayLike], np.ndarray]:
    """Remaining time ``serial + parallel / k`` (0 replicas: infinite)."""
    def remaining(num_nodes: ArrayLike, num_replicas: ArrayLike) -> np.ndarray:
        k = np.asarray(num_replicas, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return np.where(k > 0, serial_s + parallel_s / k, np.inf)
    return remaining


@settings(max_examples=60, deadline=None)
@given(tuned_snapshots())
def test_capacity_max_replicas_and_one_gpu_each(
        snapshot: tuple[list[JobInfo], list[NodeInfo], dict[str, Allocation]]) -> None:
    jobs, nodes, previous = snapshot
    jobs = [tuned_job(j.name, 1, max_replicas=j.max_replicas,
                      remaining_time_fn=amdahl(10.0 * i, 1000.0 + 50 * i))
            for i, j in enumerate(jobs)]
    decision = OptimusPolicy().optimize(jobs, nodes, previous)
    allocations = decision.allocations
    assert capacity_violations(nodes, allocations) == []
    total = sum(node.num_gpus for node in nodes)
    for i, job in enumerate(jobs):
        assert len(allocations[job.name]) <= job.max_replicas
        if i < total:  # the first jobs each get at least one GPU
            assert len(allocations[job.name]) >= 1
    if len(jobs) <= total:  # with gains everywhere, no GPU is left idle unless capped
        used = sum(len(a) for a in allocations.values())
        assert used == min(total, sum(min(j.max_replicas, total) for j in jobs))


def test_gpus_go_to_the_largest_reduction_in_remaining_time() -> None:
    long_job = tuned_job("long", remaining_time_fn=amdahl(0.0, 8000.0))
    short_job = tuned_job("short", remaining_time_fn=amdahl(0.0, 1000.0))
    decision = OptimusPolicy().optimize([long_job, short_job], gpu_nodes(2, 4), {})
    # Gains k -> k+1 are T/(k(k+1)): 8000/k(k+1) beats 1000/1*2 until k=6 (8000/42 < 500).
    assert len(decision.allocations["long"]) == 6
    assert len(decision.allocations["short"]) == 2


def test_unchanged_counts_keep_their_nodes() -> None:
    jobs = [tuned_job("a", remaining_time_fn=amdahl(0.0, 100.0), max_replicas=2),
            tuned_job("b", remaining_time_fn=amdahl(0.0, 100.0), max_replicas=2)]
    previous = {"a": ("node-01", "node-01"), "b": ("node-00", "node-00")}
    decision = OptimusPolicy().optimize(jobs, gpu_nodes(2, 2), previous)
    assert decision.allocations == previous
