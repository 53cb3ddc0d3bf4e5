"""Checking a policy's decision against the snapshot it answered, for every driver.

An allocation that cannot be applied (an unknown node, nodes of different GPU types, a
replica count outside the job's bounds, or resources a node does not have left) is not
applied and not raised: it moves into the decision's ``infeasible`` entries with the
reason, and the job gets nothing this round. Drivers record those entries as job events.
Allocations are checked in snapshot order, so on an overcommitted node the jobs listed
first keep theirs.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from pollux.capacity import RESOURCE_TOLERANCE
from pollux.cluster_spec import allocation_gpu_type
from pollux.errors import MixedGpuTypesError
from pollux.policies.base import Allocation, JobInfo, NodeInfo, PolicyDecision
from pollux.policies.snapshot import Snapshot

logger = logging.getLogger(__name__)

def check_decision(decision: PolicyDecision, snapshot: Snapshot) -> PolicyDecision:
    """``decision`` with every allocation that cannot be applied moved to ``infeasible``
    (the job's allocation then empty); allocations of jobs not in the snapshot dropped."""
    nodes = {node.name: node for node in snapshot.nodes}
    typed = len({node.gpu_type for node in snapshot.nodes}) > 1
    used: dict[str, dict[str, float]] = {}
    infeasible = dict(decision.infeasible)
    allocations: dict[str, Allocation] = {}
    active = {job.name for job in snapshot.jobs}
    for name, allocation in decision.allocations.items():
        if allocation and name not in active:
            logger.warning("policy allocated %s, which is not an active job; dropped", name)
    for job in snapshot.jobs:
        allocation = tuple(decision.allocations.get(job.name, ()))
        allocations[job.name] = ()
        if not allocation:
            continue
        counts = Counter(allocation)
        reason = _why_infeasible(job, len(allocation), counts, nodes, typed, used)
        if reason is not None:
            infeasible[job.name] = reason
            continue
        allocations[job.name] = allocation
        for node, count in counts.items():
            on_node = used.setdefault(node, {})
            for resource, amount in job.resources.items():
                on_node[resource] = on_node.get(resource, 0.0) + count * float(amount)
    return replace(decision, allocations=allocations, infeasible=infeasible)


def _why_infeasible(job: JobInfo, num_replicas: int, counts: Mapping[str, int],
                    nodes: Mapping[str, NodeInfo], typed: bool,
                    used: Mapping[str, Mapping[str, float]]) -> str | None:
    """Why ``counts`` replicas per node (in allocation order) cannot be placed on top of
    ``used``; None when they can. ``typed``: the nodes have more than one GPU type."""
    for node in counts:
        if node not in nodes:
            return f"placed on unknown node {node!r}"
    if typed:
        try:
            allocation_gpu_type(counts, nodes)
        except MixedGpuTypesError as exc:
            return str(exc)
    if not job.min_replicas <= num_replicas <= job.max_replicas:
        return f"{num_replicas} replicas, outside [{job.min_replicas}, {job.max_replicas}]"
    empty: Mapping[str, float] = {}
    for node, count in counts.items():
        total = nodes[node].resources
        on_node = used.get(node, empty)
        for resource, amount in job.resources.items():
            need = count * float(amount)
            left = float(total.get(resource, 0.0)) - on_node.get(resource, 0.0)
            if need > left + RESOURCE_TOLERANCE:
                return f"{count} replicas on {node!r} need {need:g} {resource}, {left:g} left"
    return None
