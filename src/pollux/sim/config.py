"""The simulated cluster and scheduling loop: one record for every cluster.

A homogeneous cluster is ``num_nodes`` x ``gpus_per_node`` GPUs of the default type; a
typed one is a :class:`~pollux.cluster_spec.ClusterSpec` (``cluster=``), whose groups
override those two. What the reference simulators of the artifacts do differently is
``semantics`` (:mod:`pollux.sim.semantics`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

from pollux.cluster_spec import ClusterSpec, NodeGroup
from pollux.errors import ConfigError
from pollux.policies.autoscaling import DEFAULT_NODE_PRICE_PER_HOUR
from pollux.policies.base import NodeInfo
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.sim.semantics import POLLUX_ARTIFACT, ReferenceSemantics

SPEEDS_FROM = ("own", "others")


@dataclass(frozen=True)
class ClusterConfig:
    """The simulated cluster and scheduling loop."""

    num_nodes: int = 16
    """Nodes in the cluster (a typed ``cluster``: ignored, its groups count)."""
    gpus_per_node: int = 4
    """GPUs on every node (a typed ``cluster``: ignored)."""
    interval_s: float = 60.0
    """Simulated seconds between scheduling rounds."""
    restart_delay_s: float = 30.0
    """Seconds a job holds its GPUs without progress after each placement change (unless
    the semantics set one per application)."""
    interference: float = 0.0
    """Slowdown of a distributed job sharing a node with another distributed job (0-1)."""
    max_time_s: float = 90 * 86400.0
    """Simulated time after which a run stops even with jobs left."""
    min_nodes: int = 1
    """With an autoscaler: the fewest nodes, and the size the cluster starts with."""
    max_nodes: int | None = None
    """With an autoscaler: the most nodes (None: ``num_nodes``; a typed cluster: each
    group's node count bounds its type)."""
    node_price_per_hour: float | Mapping[str, float] = DEFAULT_NODE_PRICE_PER_HOUR
    """Price of one node for an hour: one for every type, or per GPU type."""
    provision_delay_s: float = 120.0
    """With an autoscaler: seconds from requesting a node until jobs can use it (billed)."""
    cluster: ClusterSpec | None = None
    """A typed cluster; None: ``num_nodes`` x ``gpus_per_node`` of the default type."""
    semantics: ReferenceSemantics = POLLUX_ARTIFACT
    project_unseen_types: bool = True
    """Jobs project their model onto types they have not run on (Sia's bootstrap)."""
    speeds_from: str = "own"
    """Speed ratios the projection uses: ``own``, each application's own 1-GPU ratios (Sia:
    every application profiled on every type); ``others``, the speeds learned across the
    *other* applications (:mod:`pollux.models.type_speeds`, what a service without
    per-application profiling learns from other jobs)."""

    def __post_init__(self) -> None:
        for name in ("num_nodes", "gpus_per_node", "min_nodes"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ConfigError(name, value, "use a whole number >= 1")
        if not (isinstance(self.scaling_max_nodes, int)
                and self.scaling_max_nodes >= self.min_nodes):
            raise ConfigError("max_nodes", self.max_nodes,
                              f"use a whole number >= min_nodes ({self.min_nodes})")
        prices = self.node_prices()
        for price in prices.values():
            if not (price >= 0 and price < float("inf")):
                raise ConfigError("node_price_per_hour", price, "use a finite price >= 0")
        types = self.spec.gpu_types
        if set(prices) != set(types):
            raise ConfigError("node_price_per_hour", dict(prices),
                              f"give one price, or one per GPU type: {', '.join(types)}")
        if not (self.provision_delay_s >= 0 and self.provision_delay_s < float("inf")):
            raise ConfigError("provision_delay_s", self.provision_delay_s,
                              "use a finite number of seconds >= 0")
        for name in ("interval_s", "max_time_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, getattr(self, name), "use a number of seconds > 0")
        if not self.restart_delay_s >= 0:
            raise ConfigError("restart_delay_s", self.restart_delay_s, "use seconds >= 0")
        if not 0 <= self.interference < 1:
            raise ConfigError("interference", self.interference, "use a fraction in [0, 1)")
        if self.speeds_from not in SPEEDS_FROM:
            raise ConfigError("speeds_from", self.speeds_from,
                              f"choose from: {', '.join(SPEEDS_FROM)}")

    @cached_property
    def spec(self) -> ClusterSpec:
        """The cluster as groups of nodes (one group of the default type unless typed)."""
        if self.cluster is not None:
            return self.cluster
        return ClusterSpec((NodeGroup(DEFAULT_GPU_TYPE, self.num_nodes, self.gpus_per_node),))

    @property
    def num_gpus(self) -> int:
        return self.spec.num_gpus

    @property
    def scaling_max_nodes(self) -> int:
        """The autoscaler's upper bound: ``max_nodes``, or every node of the spec."""
        return self.spec.num_nodes if self.max_nodes is None else self.max_nodes

    def gpus_per_node_of(self, gpu_type: str) -> int:
        return next(g.gpus_per_node for g in self.spec.groups if g.gpu_type == gpu_type)

    def node_prices(self) -> Mapping[str, float]:
        """GPU type -> price of one node-hour."""
        if isinstance(self.node_price_per_hour, (int, float)):
            return MappingProxyType(dict.fromkeys(self.spec.gpu_types,
                                                  float(self.node_price_per_hour)))
        return MappingProxyType({t: float(p) for t, p in self.node_price_per_hour.items()})

    def node_infos(self) -> tuple[NodeInfo, ...]:
        return self.spec.node_infos()
