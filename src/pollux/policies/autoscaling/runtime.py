"""What the drivers need around an autoscaler: the autoscaler of a cluster's nodes (typed
where they have several GPU types), the node template a cluster grows by, and the JSON
view of a decision that runtimes show. The scheduling round
(:mod:`pollux.policies.round`) asks the autoscaler every round, before the policy; the
drivers (the simulator and the service) carry out the nodes it wants."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pollux.cluster_spec import gpu_types_of
from pollux.errors import ConfigError
from pollux.policies.autoscaling.autoscaler import (
    Autoscaler,
    AutoscalerConfig,
    NodeTemplate,
    ScalingDecision,
)
from pollux.policies.autoscaling.registry import check_autoscaler_name, make_autoscaler
from pollux.policies.autoscaling.typed import TypedAutoscaler, TypedThroughputAutoscaler
from pollux.policies.base import GPU, NodeInfo
from pollux.resources import DEFAULT_GPU_TYPE

NodePrices = float | Mapping[str, float]
"""A node-hour's price: one for every GPU type, or one per type."""


def parse_node_prices(text: str) -> NodePrices:
    """``--node-price``: one price for every type, or ``type=PRICE,...``."""
    try:
        return float(text)
    except ValueError:
        pass
    prices: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        try:
            prices[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ConfigError("node_price", text, "give one price (e.g. 3.912) or one per "
                              "GPU type, e.g. t4=3.91,a100=32.77")
    return prices


def price_of(prices: NodePrices, gpu_type: str) -> float:
    """The node-hour price of ``gpu_type``; a type without one is refused by name."""
    if isinstance(prices, (int, float)):
        return float(prices)
    if gpu_type not in prices:
        raise ConfigError("node_price", dict(prices),
                          f"give a price for GPU type {gpu_type!r} too, e.g. {gpu_type}=3.91")
    return float(prices[gpu_type])


def autoscaler_for_nodes(name: str, nodes: Sequence[NodeInfo], prices: NodePrices,
                         min_nodes: int = 1, max_nodes: int | None = None,
                         **options: Any) -> Autoscaler | None:
    """The registered autoscaler ``name`` of a cluster that has ``nodes`` now (None for
    ``none``). On nodes of one GPU type new nodes copy the most common node; on several
    types ``pollux`` and ``throughput`` are the typed ones, as in the simulator
    (:mod:`.typed`): one template per type (its most common node, at its price), each type
    and the cluster in all bounded by ``max_nodes`` (None: the nodes there are now, at
    least ``min_nodes`` and 1)."""
    if check_autoscaler_name(name) == "none":
        return None
    bound = max(min_nodes, 1, len(nodes)) if max_nodes is None else max_nodes
    by_type = {t: group for t, group in gpu_types_of(  # types of nodes with device slots
        [node for node in nodes if float(node.resources.get(GPU, 0.0)) > 0]).items()}
    if len(by_type) <= 1:
        price = price_of(prices, next(iter(by_type), DEFAULT_GPU_TYPE))
        return make_autoscaler(name, AutoscalerConfig(template_from_nodes(nodes, price),
                                                      min_nodes, bound), **options)
    templates = {t: template_from_nodes(group, price_of(prices, t))
                 for t, group in by_type.items()}
    config = AutoscalerConfig(template_from_nodes(nodes, price_of(
        prices, max(by_type, key=lambda t: len(by_type[t])))), min_nodes, bound)
    typed = TypedThroughputAutoscaler if name == "throughput" else TypedAutoscaler
    return typed(config, templates, dict.fromkeys(templates, bound), **options)


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
            "price_per_hour": scaling.price_per_hour,
            "desired_num_nodes_by_type": dict(scaling.num_nodes_by_type)}
