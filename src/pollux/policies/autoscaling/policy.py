"""A policy whose decisions also carry an autoscaler's desired cluster size.

:class:`AutoscaledPolicy` wraps any scheduling policy: every round it asks the policy for
the allocations, then the autoscaler for the desired number of nodes, and returns the
policy's decision with ``desired_num_nodes`` set and the autoscaler's view in
``info["autoscaler"]``. A runtime (the service) passes the size on to its backend. With
no active jobs the wrapped policy is not asked; the autoscaler still is (it shrinks).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pollux.errors import ConfigError
from pollux.policies.autoscaling.autoscaler import Autoscaler, NodeTemplate, ScalingDecision
from pollux.policies.base import Allocations, JobInfo, NodeInfo, Policy, PolicyDecision


def template_from_nodes(nodes: Sequence[NodeInfo], price_per_hour: float) -> NodeTemplate:
    """The most common node shape (largest first among equals) as the template."""
    shapes = Counter(tuple(sorted((k, float(v)) for k, v in node.resources.items()))
                     for node in nodes if any(float(v) > 0 for v in node.resources.values()))
    if not shapes:
        raise ConfigError("nodes", [node.name for node in nodes],
                          "autoscaling copies an existing node: start with at least one node "
                          "that has resources")
    shape = max(shapes, key=lambda s: (shapes[s], sum(v for _, v in s)))
    return NodeTemplate(dict(shape), price_per_hour)


def scaling_view(autoscaler: Autoscaler, scaling: ScalingDecision) -> dict[str, Any]:
    """What runtimes show about the latest decision (JSON-ready)."""
    cfg = autoscaler.config
    return {"autoscaler": autoscaler.name, "num_nodes": scaling.current_num_nodes,
            "desired_num_nodes": scaling.num_nodes,
            "proposed_num_nodes": scaling.proposed_num_nodes,
            "utility": None if scaling.utility is None else float(scaling.utility),
            "reason": scaling.reason, "min_nodes": cfg.min_nodes, "max_nodes": cfg.max_nodes,
            "node_resources": dict(cfg.template.resources),
            "price_per_hour": scaling.price_per_hour}


class AutoscaledPolicy(Policy):
    """``policy``'s allocations plus ``autoscaler``'s desired cluster size."""

    name = "autoscaled"

    def __init__(self, policy: Policy, autoscaler: Autoscaler) -> None:
        self.policy = policy
        self.autoscaler = autoscaler
        self.last_scaling: ScalingDecision | None = None

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        if jobs:
            decision = self.policy.optimize(jobs, nodes, previous_allocations)
        else:
            decision = PolicyDecision(allocations={})
        scaling = self.autoscaler.decide(jobs, len(nodes))
        self.last_scaling = scaling
        info: Mapping[str, Any] = {**decision.info,
                                   "autoscaler": scaling_view(self.autoscaler, scaling)}
        return replace(decision, desired_num_nodes=scaling.num_nodes, info=info)
