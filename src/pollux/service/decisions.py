"""The resource arithmetic the allocation loop uses to launch only what fits (a policy's
decision is checked against its snapshot by :mod:`pollux.policies.decision`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from pollux.job_spec import JobSpec
from pollux.policies.base import Allocation

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
