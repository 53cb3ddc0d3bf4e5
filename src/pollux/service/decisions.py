"""Checking a policy's decision against the snapshot before applying it, and the
resource arithmetic the allocation loop uses to launch only what fits."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from pollux.job_spec import JobSpec
from pollux.policies.base import Allocation, PolicyDecision
from pollux.service.snapshot import Snapshot

logger = logging.getLogger(__name__)

FREE_EPSILON = 1e-9

Resources = dict[str, dict[str, float]]
"""Node name -> resource name -> amount."""


def subtract(free: Mapping[str, Mapping[str, float]],
             placements: Iterable[tuple[Allocation, JobSpec]]) -> Resources:
    """``free`` minus the resources of each (allocation, spec) pair."""
    result = {node: dict(resources) for node, resources in free.items()}
    for allocation, spec in placements:
        per_replica = spec.resources.as_policy_resources()
        for node in allocation:
            if node not in result:
                continue
            for name, amount in per_replica.items():
                result[node][name] = result[node].get(name, 0.0) - amount
    return result


def fits(free: Mapping[str, Mapping[str, float]], allocation: Allocation,
         spec: JobSpec) -> bool:
    """Whether ``allocation`` of ``spec``'s replicas fits in ``free``."""
    after = subtract(free, [(allocation, spec)])
    return all(node in free for node in allocation) and all(
        amount >= -FREE_EPSILON for node in set(allocation) for amount in after[node].values())


def checked_allocations(decision: PolicyDecision, snapshot: Snapshot
                        ) -> dict[str, Allocation] | None:
    """The decision's allocations after sanity checks, or None when it must be ignored.

    A job's allocation naming an unknown node, or outside [min_replicas, max_replicas],
    becomes empty (logged); a decision that overcommits a node is ignored as a whole.
    """
    nodes = {node.name: node for node in snapshot.nodes}
    jobs = {job.name: job for job in snapshot.jobs}
    allocations: dict[str, Allocation] = {}
    for job_id, allocation in decision.allocations.items():
        job = jobs.get(job_id)
        if job is None or not allocation:
            continue
        unknown = [node for node in allocation if node not in nodes]
        if unknown:
            logger.error("policy placed job %s on unknown node %s; ignoring", job_id,
                         unknown[0])
            continue
        if not job.min_replicas <= len(allocation) <= job.max_replicas:
            logger.error("policy gave job %s %d replicas outside [%d, %d]; ignoring", job_id,
                         len(allocation), job.min_replicas, job.max_replicas)
            continue
        allocations[job_id] = tuple(allocation)
    used: Resources = {name: {} for name in nodes}
    for job_id, allocation in allocations.items():
        for node in allocation:
            for resource, amount in jobs[job_id].resources.items():
                used[node][resource] = used[node].get(resource, 0.0) + float(amount)
    for name, usage in used.items():
        for resource, amount in usage.items():
            capacity = float(nodes[name].resources.get(resource, 0.0))
            if amount > capacity + FREE_EPSILON:
                logger.error("policy overcommits %s on node %s (%g > %g); decision ignored",
                             resource, name, amount, capacity)
                return None
    return allocations
