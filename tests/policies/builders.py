"""Snapshot builders for the baseline-policy tests (and any test that needs plain jobs,
nodes and a capacity check): jobs with a tuned configuration, homogeneous nodes, and
hypothesis strategies for whole snapshots."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from hypothesis import strategies as st

from pollux.models.typed import TypedGoodput
from pollux.policies.base import (
    GPU,
    Allocation,
    JobInfo,
    NodeInfo,
    RemainingTimeFn,
    SpeedupFn,
    TunedConfig,
    TypeFacts,
    facts_by_type,
)


def by_type(max_replicas: int = 64, speedup_fn: SpeedupFn | None = None,
            remaining_time_fn: RemainingTimeFn | None = None, *,
            caps: Mapping[str, int] | None = None,
            oracles: Mapping[str, RemainingTimeFn] | None = None,
            model: TypedGoodput | None = None) -> dict[str, TypeFacts]:
    """A job's ``by_type``: its default entry and, per GPU type named in ``caps`` or
    ``oracles``, its own (a type without a cap: ``max_replicas``; ``model``'s view)."""
    caps, oracles = caps or {}, oracles or {}
    own = {t: TypeFacts(caps.get(t, max_replicas), None if model is None else model.on(t),
                        oracles.get(t)) for t in dict.fromkeys([*caps, *oracles])}
    return facts_by_type(max_replicas, speedup_fn, remaining_time_fn, own)


def tuned_job(name: str, num_replicas: int = 1, batch_size: int = 128, *,
              service_gpu_s: float = 0.0, submission_s: float = 0.0,
              max_replicas: int = 64, remaining_time_fn: RemainingTimeFn | None = None,
              caps: Mapping[str, int] | None = None,
              oracles: Mapping[str, RemainingTimeFn] | None = None,
              **fields: object) -> JobInfo:
    """A one-GPU-per-replica job with a tuned configuration."""
    return JobInfo(name=name, resources={GPU: 1.0},
                   by_type=by_type(max_replicas, None, remaining_time_fn, caps=caps,
                                   oracles=oracles),
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
            previous[job.name] = _take_in_order(free, list(free), want)
    return jobs, nodes, previous


def _take_in_order(free: dict[str, int], names: list[str], want: int) -> Allocation:
    """``want`` slots from ``names`` in order (their free slots reduced); they must fit."""
    alloc: list[str] = []
    for name in names:
        take = min(free[name], want - len(alloc))
        alloc += [name] * take
        free[name] -= take
    return tuple(alloc)


def amdahl_oracle(serial_s: float, parallel_s: float):  # type: ignore[no-untyped-def]
    """Remaining time ``serial + parallel / k`` at k replicas (0 replicas: infinite)."""
    def remaining(num_nodes: object, num_replicas: object) -> object:
        import numpy as np

        k = np.asarray(num_replicas, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return np.where(k > 0, serial_s + parallel_s / k, np.inf)
    return remaining


@st.composite
def typed_tuned_snapshots(draw: st.DrawFn, max_jobs: int = 12
                          ) -> tuple[list[JobInfo], list[NodeInfo], dict[str, Allocation]]:
    """Random typed clusters (1-3 GPU types, each its own node size), jobs with tuned
    GPUs, per-type oracles of remaining time and per-type caps, and a feasible previous
    allocation of a random subset of the jobs, each within one type."""
    types = draw(st.lists(st.sampled_from(["t4", "a100", "rtx"]), min_size=1, max_size=3,
                          unique=True))
    nodes: list[NodeInfo] = []
    for gpu_type in types:
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        nodes += [NodeInfo(f"{gpu_type}-{i}", {GPU: float(gpus)}, gpu_type=gpu_type)
                  for i in range(draw(st.integers(1, 4)))]
    if draw(st.booleans()):
        nodes = draw(st.permutations(nodes))
    total = sum(node.num_gpus for node in nodes)
    jobs = []
    for i in range(draw(st.integers(1, max_jobs))):
        oracles = {t: amdahl_oracle(draw(st.sampled_from([0.0, 10.0, 100.0])),
                                    draw(st.sampled_from([100.0, 1000.0, 5000.0])))
                   for t in types if draw(st.booleans())}
        caps = {t: draw(st.integers(1, 16)) for t in types if draw(st.booleans())}
        jobs.append(tuned_job(
            f"job-{i}", draw(st.integers(1, total)),
            service_gpu_s=draw(st.sampled_from([0.0, 16 * 3600.0, 100 * 3600.0])),
            submission_s=draw(st.integers(0, 3600)),
            max_replicas=draw(st.integers(1, 64)),
            oracles=oracles, caps=caps))
    free = {node.name: node.num_gpus for node in nodes}
    previous: dict[str, Allocation] = {}
    for job in jobs:
        assert job.tuned is not None
        want = job.tuned.num_replicas
        gpu_type = draw(st.sampled_from(types))
        within = [node.name for node in nodes if node.gpu_type == gpu_type]
        if draw(st.booleans()) and sum(free[n] for n in within) >= want:
            previous[job.name] = _take_in_order(free, within, want)
    return jobs, nodes, previous
