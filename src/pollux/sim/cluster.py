"""An elastic simulated cluster: nodes that can be requested and released while it runs.

Used by the simulator when an autoscaler decides the cluster's size. A requested node is
*provisioning* for ``provision_delay_s`` (billed, not yet usable), then *ready*. Shrinking
cancels provisioning nodes first (the newest first), then releases the ready nodes that
hold the fewest replicas (the newest first among equals); the jobs on a released node
lose their allocation. Every node is billed from its request until its release; the
history of sizes gives the node-hours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pollux.errors import ConfigError
from pollux.policies.base import GPU, NodeInfo


@dataclass(frozen=True)
class ClusterSize:
    """The cluster's size from ``time_s`` until the next change."""

    time_s: float
    num_nodes: int
    """Ready nodes (usable by jobs)."""
    num_billed_nodes: int
    """Ready plus provisioning nodes (paid for)."""
    desired_num_nodes: int
    """What the autoscaler asked for."""


def node_seconds(sizes: tuple[ClusterSize, ...] | list[ClusterSize], end_s: float) -> float:
    """Billed node-seconds from the first size until ``end_s`` (sizes sorted by time)."""
    total = 0.0
    for size, after in zip(sizes, list(sizes[1:]) + [None]):
        stop = end_s if after is None else min(after.time_s, end_s)
        if stop > size.time_s:
            total += size.num_billed_nodes * (stop - size.time_s)
    return total


class ElasticCluster:
    """Ready and provisioning nodes of one simulation, with the history of sizes."""

    def __init__(self, initial_num_nodes: int, max_num_nodes: int, gpus_per_node: int,
                 provision_delay_s: float) -> None:
        if not 1 <= initial_num_nodes <= max_num_nodes:
            raise ConfigError("min_nodes", initial_num_nodes,
                              f"need 1 <= min_nodes <= max_nodes ({max_num_nodes})")
        self.max_num_nodes = max_num_nodes
        self.provision_delay_s = float(provision_delay_s)
        self._resources = MappingProxyType({GPU: float(gpus_per_node)})
        self._width = len(str(max_num_nodes - 1))
        self.ready: list[NodeInfo] = []
        self.provisioning: list[tuple[float, NodeInfo]] = []
        """(ready at, node), in request order."""
        for _ in range(initial_num_nodes):
            self.ready.append(self._new_node())
        self.history: list[ClusterSize] = [
            ClusterSize(0.0, initial_num_nodes, initial_num_nodes, initial_num_nodes)]

    @property
    def num_billed_nodes(self) -> int:
        return len(self.ready) + len(self.provisioning)

    def nodes(self) -> tuple[NodeInfo, ...]:
        """Ready nodes, by name."""
        return tuple(sorted(self.ready, key=lambda node: node.name))

    def _new_node(self) -> NodeInfo:
        taken = {node.name for node in self.ready} | {n.name for _, n in self.provisioning}
        index = 0
        while f"node-{index:0{self._width}d}" in taken:
            index += 1
        return NodeInfo(f"node-{index:0{self._width}d}", self._resources)

    def refresh(self, now_s: float) -> None:
        """Provisioning nodes whose delay has passed become ready."""
        done = [entry for entry in self.provisioning if entry[0] <= now_s]
        if done:
            self.provisioning = [entry for entry in self.provisioning if entry[0] > now_s]
            self.ready.extend(node for _, node in done)

    def resize(self, num_nodes: int, now_s: float, replicas_on: Mapping[str, int]) -> set[str]:
        """Request or release nodes to reach ``num_nodes`` billed nodes; returns the names
        of the ready nodes released (``replicas_on``: node -> replicas it holds)."""
        target = min(max(int(num_nodes), 1), self.max_num_nodes)
        released: set[str] = set()
        while self.num_billed_nodes < target:
            node = self._new_node()
            if self.provision_delay_s > 0:
                self.provisioning.append((now_s + self.provision_delay_s, node))
            else:
                self.ready.append(node)
        excess = self.num_billed_nodes - target
        while excess > 0 and self.provisioning:
            self.provisioning.pop()
            excess -= 1
        if excess > 0:
            # fewest replicas first; among equals the highest name (the newest) first
            by_name = sorted(self.ready, key=lambda n: n.name, reverse=True)
            victims = sorted(by_name, key=lambda n: replicas_on.get(n.name, 0))  # stable
            released = {node.name for node in victims[:excess]}
            self.ready = [node for node in self.ready if node.name not in released]
        return released

    def record(self, now_s: float, desired_num_nodes: int) -> None:
        """Append the current size to the history when it changed."""
        last = self.history[-1]
        size = ClusterSize(now_s, len(self.ready), self.num_billed_nodes, desired_num_nodes)
        if (size.num_nodes, size.num_billed_nodes, size.desired_num_nodes) != (
                last.num_nodes, last.num_billed_nodes, last.desired_num_nodes):
            self.history.append(size)
