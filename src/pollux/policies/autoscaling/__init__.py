"""Goodput-aware cloud autoscaling: how many nodes the cluster should have.

:func:`cluster_utility` measures how close an allocation comes to ideal scaling;
:class:`PolluxAutoscaler` (``pollux``) keeps it inside a band, :class:`ThroughputAutoscaler`
(``throughput``) is the throughput-based baseline and :class:`FixedSizeAutoscaler`
(``none``) keeps the size; :class:`TypedAutoscaler` sizes each GPU type of a typed
cluster by goodput per dollar. Pure functions of the job records, like the policies: the
scheduling round (:mod:`pollux.policies.round`) both drivers call asks the autoscaler
every round, before the policy, and the driver carries out the nodes wanted per type.
"""

from __future__ import annotations

from pollux.policies.autoscaling.autoscaler import (
    DEFAULT_HIGH_UTIL,
    DEFAULT_LOW_UTIL,
    DEFAULT_NODE_PRICE_PER_HOUR,
    Autoscaler,
    AutoscalerConfig,
    FixedSizeAutoscaler,
    NodeTemplate,
    PolluxAutoscaler,
    Proposal,
    ScalingDecision,
    ThroughputAutoscaler,
)
from pollux.policies.autoscaling.estimate import SizeEstimate, SizeEvaluator
from pollux.policies.autoscaling.objective import BatchObjective
from pollux.policies.autoscaling.registry import (
    autoscaler_names,
    check_autoscaler_name,
    make_autoscaler,
)
from pollux.policies.autoscaling.runtime import (
    NodePrices,
    autoscaler_for_nodes,
    parse_node_prices,
    scaling_view,
    template_from_nodes,
)
from pollux.policies.autoscaling.typed import TypedAutoscaler, TypedThroughputAutoscaler
from pollux.policies.autoscaling.utility import (
    THROUGHPUT_SPEEDUP_KEY,
    cluster_utility,
    scaling_efficiencies,
    throughput_speedup_function,
)

__all__ = [
    "DEFAULT_HIGH_UTIL",
    "DEFAULT_LOW_UTIL",
    "DEFAULT_NODE_PRICE_PER_HOUR",
    "THROUGHPUT_SPEEDUP_KEY",
    "Autoscaler",
    "AutoscalerConfig",
    "BatchObjective",
    "FixedSizeAutoscaler",
    "NodeTemplate",
    "PolluxAutoscaler",
    "Proposal",
    "ScalingDecision",
    "SizeEstimate",
    "SizeEvaluator",
    "ThroughputAutoscaler",
    "TypedAutoscaler",
    "TypedThroughputAutoscaler",
    "NodePrices",
    "autoscaler_for_nodes",
    "autoscaler_names",
    "check_autoscaler_name",
    "cluster_utility",
    "make_autoscaler",
    "parse_node_prices",
    "scaling_efficiencies",
    "scaling_view",
    "template_from_nodes",
    "throughput_speedup_function",
]
