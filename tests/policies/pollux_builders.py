"""Snapshot builders for the Pollux policy tests: jobs with real speedup functions, nodes,
hypothesis strategies for whole snapshots, and an independent feasibility checker."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from hypothesis import strategies as st

from pollux.models import GoodputFunction, GradientStats, SpeedupFunction, ThroughputParams
from pollux.policies.base import Allocation, JobInfo, NodeInfo, SpeedupFn, facts_by_type

GPU, CPU, MEM = "gpu", "cpu", "memory"


def speedup_function(seed: int) -> SpeedupFunction:
    """A plausible job: random step-time parameters and gradient noise."""
    rng = np.random.default_rng(seed)
    params = ThroughputParams(
        alpha_c=rng.uniform(0.02, 0.2), beta_c=rng.uniform(1e-4, 3e-3),
        alpha_n=rng.uniform(0.05, 0.5), beta_n=rng.uniform(0.0, 0.02),
        alpha_r=rng.uniform(0.01, 0.1), beta_r=rng.uniform(0.0, 0.005),
        gamma=rng.uniform(1.0, 3.0))
    m0 = int(rng.choice([32, 64, 128]))
    goodput = GoodputFunction(params, GradientStats(1.0, float(rng.uniform(1, 200))), m0)
    return SpeedupFunction(goodput, m0 * int(rng.choice([8, 16, 32])), (16, 256),
                           accumulation=True)


def job(name: str, gpus: float = 1, *, seed: int | None = 0, max_replicas: int = 64,
        speedup_fn: SpeedupFn | None = None, **fields: object) -> JobInfo:
    """A job needing ``gpus`` GPUs (and 4 CPUs) per replica; ``seed=None``: no speedup
    function (unless ``speedup_fn`` gives one)."""
    resources = fields.pop("resources", {GPU: gpus, CPU: 4})
    if speedup_fn is None and seed is not None:
        speedup_fn = speedup_function(seed)
    defaults: dict[str, object] = {"age_s": 3600.0,
                                   "by_type": facts_by_type(max_replicas, speedup_fn)}
    defaults.update(fields)
    return JobInfo(name=name, resources=resources, **defaults)  # type: ignore[arg-type]


def nodes(count: int, gpus: int = 4, *, preemptible: int = 0, cpus: int = 64) -> list[NodeInfo]:
    """``count`` identical nodes; the last ``preemptible`` of them are preemptible."""
    return [NodeInfo(f"node-{i:02d}", {GPU: gpus, CPU: cpus},
                     preemptible=i >= count - preemptible) for i in range(count)]


def violations(jobs: Sequence[JobInfo], cluster: Sequence[NodeInfo],
               previous: Mapping[str, Allocation], allocations: Mapping[str, Allocation],
               interference_avoidance: bool = True) -> list[str]:
    """Every way ``allocations`` breaks the rules, checked from the records alone."""
    out: list[str] = []
    by_node = {node.name: node for node in cluster}
    names = {j.name for j in jobs}
    if set(allocations) != names:
        out.append(f"jobs decided {sorted(allocations)} != active {sorted(names)}")
    used: dict[str, Counter[str]] = {n: Counter() for n in by_node}
    jobs_on: dict[str, list[str]] = {n: [] for n in by_node}
    for j in jobs:
        alloc = tuple(allocations.get(j.name, ()))
        for node_name in alloc:
            if node_name not in by_node:
                out.append(f"{j.name} on unknown node {node_name}")
                continue
            for res, amount in j.resources.items():
                used[node_name][res] += amount
        for node_name in set(alloc) & set(by_node):
            jobs_on[node_name].append(j.name)
        prev = tuple(n for n in previous.get(j.name, ()) if n in by_node)
        if not j.preemptible and prev:
            if sorted(alloc) != sorted(prev):
                out.append(f"non-preemptible {j.name} moved from {prev} to {alloc}")
            continue
        if len(alloc) > j.max_replicas:
            out.append(f"{j.name} has {len(alloc)} > max {j.max_replicas}")
        if 0 < len(alloc) < j.min_replicas:
            out.append(f"{j.name} has {len(alloc)} < min {j.min_replicas}")
    for node_name, counter in used.items():
        for res, amount in counter.items():
            cap = by_node[node_name].resources.get(res, 0.0)
            if amount > cap * (1 + 1e-9) + 1e-9:
                out.append(f"{node_name} {res}: {amount} > {cap}")
    if interference_avoidance:
        # Two running non-preemptible jobs that already share a node must both stay.
        pinned = {j.name for j in jobs if not j.preemptible
                  and any(n in by_node for n in previous.get(j.name, ()))}
        spread = {j.name for j in jobs if len(set(allocations.get(j.name, ()))) > 1}
        for node_name, names_here in jobs_on.items():
            dist = [n for n in names_here if n in spread]
            if len([n for n in dist if n not in pinned]) + any(n in pinned for n in dist) > 1:
                out.append(f"{node_name} hosts distributed jobs {dist}")
    return out


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[list[JobInfo], list[NodeInfo], dict[str, Allocation]]:
    """Random clusters (GPU/CPU/memory, some preemptible nodes) and jobs, with a feasible
    previous allocation for some of them (non-preemptible running jobs included)."""
    num_nodes = draw(st.integers(1, 6))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    cluster = [NodeInfo(f"n{i}", {GPU: gpus, CPU: draw(st.sampled_from([8, 16, 32])),
                                  MEM: 64.0},
                        preemptible=draw(st.booleans()) and i > 0)
               for i in range(num_nodes)]
    free = {node.name: dict(node.resources) for node in cluster}
    num_jobs = draw(st.integers(1, 12))
    jobs: list[JobInfo] = []
    previous: dict[str, Allocation] = {}
    for i in range(num_jobs):
        resources = {GPU: float(draw(st.sampled_from([0, 1, 1, 1, 2]))),
                     CPU: float(draw(st.sampled_from([1, 2, 4, 8])))}
        if draw(st.booleans()):
            resources[MEM] = float(draw(st.sampled_from([4.0, 16.0, 48.0])))
        min_r = draw(st.sampled_from([0, 0, 1, 2, 3]))
        max_r = draw(st.integers(max(min_r, 1), 16))
        has_fn = draw(st.booleans())
        info = JobInfo(
            name=f"job{i}", resources=resources, min_replicas=min_r,
            preemptible=draw(st.booleans()) or draw(st.booleans()),
            submission_time_s=float(i), age_s=draw(st.floats(0, 7200)),
            num_restarts=draw(st.integers(0, 5)),
            restart_delay_s=draw(st.sampled_from([0.0, 30.0])),
            by_type=facts_by_type(max_r, speedup_function(i) if has_fn else None))
        jobs.append(info)
        # A feasible previous allocation, packed on randomly chosen nodes.
        want = draw(st.integers(0, max_r))
        if want and want >= min_r:
            alloc: list[str] = []
            order = draw(st.permutations([node.name for node in cluster]))
            for node_name in order:
                while len(alloc) < want and all(
                        free[node_name].get(r, 0.0) >= a for r, a in resources.items()):
                    alloc.append(node_name)
                    for r, a in resources.items():
                        free[node_name][r] -= a
                    if all(a == 0 for a in resources.values()):
                        break
            if len(alloc) < min_r:
                for node_name in alloc:
                    for r, a in resources.items():
                        free[node_name][r] += a
            elif alloc:
                previous[info.name] = tuple(alloc)
    return jobs, cluster, previous
