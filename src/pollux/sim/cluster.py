"""An elastic simulated cluster: nodes that can be requested and released while it runs.

Used by the simulator when an autoscaler decides the cluster's size. A requested node is
*provisioning* for ``provision_delay_s`` (billed, not yet usable), then *ready*. Shrinking
cancels provisioning nodes first (the newest first), then releases the ready nodes that
hold the fewest replicas (the newest first among equals); the jobs on a released node
lose their allocation. Every node is billed from its request until its release; the
history of sizes gives the node-hours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from pollux.errors import ConfigError
from pollux.policies.base import GPU, NodeInfo
from pollux.resources import DEFAULT_GPU_TYPE


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
    billed_by_type: Mapping[str, int] = field(default_factory=dict, compare=False)
    """GPU type -> billed nodes (empty: every node of the default type; detail, not
    compared)."""

    def billed(self, gpu_type: str | None) -> int:
        """Billed nodes of ``gpu_type`` (None: of every type)."""
        if gpu_type is None:
            return self.num_billed_nodes
        if not self.billed_by_type:
            return self.num_billed_nodes if gpu_type == DEFAULT_GPU_TYPE else 0
        return self.billed_by_type.get(gpu_type, 0)


def node_seconds(sizes: tuple[ClusterSize, ...] | list[ClusterSize], end_s: float,
                 gpu_type: str | None = None) -> float:
    """Billed node-seconds (of ``gpu_type``; None: of every type) from the first size
    until ``end_s`` (sizes sorted by time)."""
    total = 0.0
    for size, after in zip(sizes, list(sizes[1:]) + [None]):
        stop = end_s if after is None else min(after.time_s, end_s)
        if stop > size.time_s:
            total += size.billed(gpu_type) * (stop - size.time_s)
    return total


class ElasticCluster:
    """Ready and provisioning nodes of one simulation, per GPU type, with the history of
    sizes. ``groups`` bound each type: (type, most nodes, GPUs per node); nodes are named
    ``<type>-<i>`` (``node-<i>`` for the default type), as in a cluster spec."""

    def __init__(self, initial: Mapping[str, int], groups: Sequence[tuple[str, int, int]],
                 provision_delay_s: float) -> None:
        self.max_nodes = {gpu_type: most for gpu_type, most, _ in groups}
        total = sum(initial.values())
        if not 1 <= total <= sum(self.max_nodes.values()) or any(
                not 0 <= n <= self.max_nodes.get(t, -1) for t, n in initial.items()):
            raise ConfigError("min_nodes", total, "need 1 <= min_nodes <= max_nodes "
                              f"({', '.join(f'{t}: {m}' for t, m in self.max_nodes.items())})")
        self.provision_delay_s = float(provision_delay_s)
        self._resources = {t: MappingProxyType({GPU: float(g)}) for t, _, g in groups}
        self._prefix = {t: "node" if t == DEFAULT_GPU_TYPE else t for t, _, _ in groups}
        self._width = {t: len(str(most - 1)) for t, most, _ in groups}
        self.ready: list[NodeInfo] = []
        self.provisioning: list[tuple[float, NodeInfo]] = []
        """(ready at, node), in request order."""
        for gpu_type, count in initial.items():
            for _ in range(count):
                self.ready.append(self._new_node(gpu_type))
        self.history: list[ClusterSize] = [
            ClusterSize(0.0, total, total, total, self.billed_by_type())]

    @property
    def num_billed_nodes(self) -> int:
        return len(self.ready) + len(self.provisioning)

    def billed_by_type(self) -> dict[str, int]:
        """GPU type -> ready plus provisioning nodes."""
        counts = dict.fromkeys(self.max_nodes, 0)
        for node in self.ready + [n for _, n in self.provisioning]:
            counts[node.gpu_type] += 1
        return counts

    def nodes(self) -> tuple[NodeInfo, ...]:
        """Ready nodes, by name."""
        return tuple(sorted(self.ready, key=lambda node: node.name))

    def _new_node(self, gpu_type: str) -> NodeInfo:
        taken = {node.name for node in self.ready} | {n.name for _, n in self.provisioning}
        index = 0
        prefix, width = self._prefix[gpu_type], self._width[gpu_type]
        while f"{prefix}-{index:0{width}d}" in taken:
            index += 1
        return NodeInfo(f"{prefix}-{index:0{width}d}", self._resources[gpu_type],
                        gpu_type=gpu_type)

    def refresh(self, now_s: float) -> None:
        """Provisioning nodes whose delay has passed become ready."""
        done = [entry for entry in self.provisioning if entry[0] <= now_s]
        if done:
            self.provisioning = [entry for entry in self.provisioning if entry[0] > now_s]
            self.ready.extend(node for _, node in done)

    def resize(self, num_nodes: Mapping[str, int], now_s: float,
               replicas_on: Mapping[str, int]) -> set[str]:
        """Request or release nodes of each type to reach ``num_nodes`` billed nodes of
        it; returns the names of the ready nodes released (``replicas_on``: node ->
        replicas it holds)."""
        released: set[str] = set()
        for gpu_type, wanted in num_nodes.items():
            least = 1 if len(self.max_nodes) == 1 else 0  # one type: never empty
            target = min(max(int(wanted), least), self.max_nodes[gpu_type])
            billed = self.billed_by_type()[gpu_type]
            for _ in range(target - billed):
                node = self._new_node(gpu_type)
                if self.provision_delay_s > 0:
                    self.provisioning.append((now_s + self.provision_delay_s, node))
                else:
                    self.ready.append(node)
            excess = billed - target
            while excess > 0 and any(n.gpu_type == gpu_type for _, n in self.provisioning):
                last = max(i for i, (_, n) in enumerate(self.provisioning)
                           if n.gpu_type == gpu_type)
                self.provisioning.pop(last)
                excess -= 1
            if excess > 0:
                # fewest replicas first; among equals the highest name (the newest) first
                by_name = sorted((n for n in self.ready if n.gpu_type == gpu_type),
                                 key=lambda n: n.name, reverse=True)
                victims = sorted(by_name, key=lambda n: replicas_on.get(n.name, 0))  # stable
                gone = {node.name for node in victims[:excess]}
                self.ready = [node for node in self.ready if node.name not in gone]
                released |= gone
        return released

    def record(self, now_s: float, desired_num_nodes: int) -> None:
        """Append the current size to the history when it changed."""
        last = self.history[-1]
        size = ClusterSize(now_s, len(self.ready), self.num_billed_nodes, desired_num_nodes,
                           self.billed_by_type())
        if (size.num_nodes, size.num_billed_nodes, size.desired_num_nodes,
                dict(size.billed_by_type)) != (last.num_nodes, last.num_billed_nodes,
                                               last.desired_num_nodes,
                                               dict(last.billed_by_type)):
            self.history.append(size)
