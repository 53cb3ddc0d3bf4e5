"""What the drivers need around an autoscaler: the node template a cluster grows by, and
the JSON view of a decision that runtimes show. The scheduling round
(:mod:`pollux.policies.round`) asks the autoscaler every round, before the policy; the
drivers (the simulator and the service) carry out the nodes it wants."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from pollux.errors import ConfigError
from pollux.policies.autoscaling.autoscaler import Autoscaler, NodeTemplate, ScalingDecision
from pollux.policies.base import NodeInfo


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
