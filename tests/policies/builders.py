"""Snapshot builders for the baseline-policy tests (and any test that needs plain jobs,
nodes and a capacity check): jobs with a tuned configuration, homogeneous nodes, and
hypothesis strategies for whole snapshots."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from hypothesis import strategies as st

from pollux.policies.base import GPU, Allocation, JobInfo, NodeInfo, TunedConfig


def tuned_job(name: str, num_replicas: int = 1, batch_size: int = 128, *,
              service_gpu_s: float = 0.0, submission_s: float = 0.0,
              max_replicas: int = 64, **fields: object) -> JobInfo:
    """A one-GPU-per-replica job with a tuned configuration."""
    return JobInfo(name=name, resources={GPU: 1.0}, max_replicas=max_replicas,
                   submission_time_s=submission_s, attained_service_s=service_gpu_s,
                   tuned=TunedConfig(num_replicas, batch_size), **fields)  # type: ignore[arg-type]


def gpu_nodes(count: int, gpus: int = 4) -> list[NodeInfo]:
    """``count`` identical nodes named node-00, node-01, ..."""
    return [NodeInfo(f"node-{i:02d}", {GPU: float(gpus)}) for i in range(count)]


def capacity_violations(nodes: Sequence[NodeInfo],
                        allocations: Mapping[str, Allocation]) -> list[str]:
    """Nodes given more replicas than they have GPUs, and unknown nodes."""
    used = Counter(node for alloc in allocations.values() for node in alloc)
    capacity = {node.name: node.num_gpus for node in nodes}
    return [f"{node}: {count} > {capacity.get(node)}" for node, count in used.items()
            if node not in capacity or count > capacity[node]]


@st.composite
def tuned_snapshots(draw: st.DrawFn, max_jobs: int = 12
                    ) -> tuple[list[JobInfo], list[NodeInfo], dict[str, Allocation]]:
    """Random jobs (tuned GPUs, service, submission), nodes, and a feasible previous
    allocation of a random subset of the jobs at their tuned sizes."""
    num_nodes = draw(st.integers(1, 6))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    nodes = gpu_nodes(num_nodes, gpus)
    count = draw(st.integers(1, max_jobs))
    jobs = []
    for i in range(count):
        jobs.append(tuned_job(
            f"job-{i}", draw(st.integers(1, 2 * gpus * num_nodes)),
            service_gpu_s=draw(st.sampled_from([0.0, 3600.0, 16 * 3600.0, 100 * 3600.0])),
            submission_s=draw(st.integers(0, 3600)),
            max_replicas=draw(st.integers(1, 64))))
    free = {node.name: node.num_gpus for node in nodes}
    previous: dict[str, Allocation] = {}
    for job in jobs:
        assert job.tuned is not None
        want = job.tuned.num_replicas
        if draw(st.booleans()) and sum(free.values()) >= want:
            alloc: list[str] = []
            for name in free:
                take = min(free[name], want - len(alloc))
                alloc += [name] * take
                free[name] -= take
            previous[job.name] = tuple(alloc)
    return jobs, nodes, previous
