"""Heterogeneity-unaware Pollux, as Sia's artifact runs it for its comparison.

The typed cluster is shown to Pollux (p = -1; the project's fast optimizer by default,
``optimizer="ga"`` for the reference genetic algorithm, several times slower) as
identical nodes of ``virtual_gpus_per_node`` GPUs (an 8-GPU node as two 4-GPU ones), the
jobs report one speedup function pooled over every type (the simulator's
heterogeneity-unaware jobs), and an allocation that spans GPU types afterwards keeps only
the GPUs of its most common type (ties: the earlier type in ``type_preference``). Each
job is capped at ``max_replicas`` (16) replicas.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import ClassVar

from pollux.errors import ConfigError
from pollux.policies.base import (
    Allocation,
    Allocations,
    JobInfo,
    NodeInfo,
    Policy,
    PolicyDecision,
)
from pollux.policies.pollux import PolluxPolicy
from pollux.resources import DEFAULT_GPU_TYPE, GPU

SEPARATOR = "#"
"""Virtual node name = real node name + ``#`` + index."""


class PolluxUnawarePolicy(Policy):
    """Pollux's GA over virtual identical nodes; see the module docstring."""

    name = "pollux-unaware"
    adaptive_jobs: ClassVar[bool] = True
    heterogeneity_aware: ClassVar[bool] = False
    """The simulator gives this policy heterogeneity-unaware (pooled-model) jobs."""
    pooled_limits_type: ClassVar[str | None] = "aws"
    """Batch limits of the pooled speedup function (Sia's artifact: the T4 nodes')."""

    def __init__(self, seed: int | None = 0, virtual_gpus_per_node: int = 4,
                 max_replicas: int = 16,
                 type_preference: Sequence[str] = ("dgx-ext", "rtx", "aws"),
                 optimizer: str = "pollux") -> None:
        if virtual_gpus_per_node < 1:
            raise ConfigError("virtual_gpus_per_node", virtual_gpus_per_node, "use >= 1")
        if max_replicas < 1:
            raise ConfigError("max_replicas", max_replicas, "use >= 1")
        if optimizer not in ("pollux", "ga"):
            raise ConfigError("optimizer", optimizer, "use 'pollux' (fast) or 'ga' (the "
                              "reference genetic algorithm)")
        self.inner: Policy = PolluxPolicy(seed=seed, base="paper", p=-1.0, optimizer=(
            "ga" if optimizer == "ga" else "marginal"))
        self.virtual_gpus_per_node = virtual_gpus_per_node
        self.max_replicas = max_replicas
        self.type_preference = tuple(type_preference)
        self._virtual: dict[str, tuple[Allocation, Allocation]] = {}
        """Job -> (real allocation returned last round, its virtual allocation)."""

    def _virtual_nodes(self, nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
        size = self.virtual_gpus_per_node  # a node without GPUs: one virtual node without
        return [NodeInfo(f"{node.name}{SEPARATOR}{index}",
                         {**node.resources, GPU: float(min(size, node.num_gpus - index * size))},
                         node.preemptible, DEFAULT_GPU_TYPE)
                for node in nodes for index in range(max(1, -(-node.num_gpus // size)))]

    def _to_virtual(self, previous: Allocations, nodes: Sequence[NodeInfo]
                    ) -> dict[str, Allocation]:
        """Last round's allocations on virtual nodes: as returned then when unchanged,
        else each real node's replicas fill its virtual nodes in order."""
        used: Counter[str] = Counter()
        result: dict[str, Allocation] = {}
        pending = []
        for name, alloc in previous.items():
            known = self._virtual.get(name)
            if known is not None and known[0] == tuple(alloc):
                result[name] = known[1]
                used.update(known[1])
            else:
                pending.append((name, alloc))
        virtual_of: dict[str, list[NodeInfo]] = {}
        for vnode in self._virtual_nodes(nodes):
            virtual_of.setdefault(vnode.name.rsplit(SEPARATOR, 1)[0], []).append(vnode)
        for name, alloc in pending:
            placed = []
            for real in alloc:
                room = [v.name for v in virtual_of.get(real, []) if used[v.name] < v.num_gpus]
                if room:
                    used[room[0]] += 1
                    placed.append(room[0])
            if len(placed) == len(alloc):
                result[name] = tuple(placed)
        return result

    def _one_type(self, alloc: Allocation, type_of: dict[str, str]) -> Allocation:
        """Only the GPUs of the allocation's most common type (ties by preference)."""
        counts = Counter(type_of[node] for node in alloc)
        if len(counts) <= 1:
            return alloc
        rank = {t: i for i, t in enumerate(self.type_preference)}
        keep = min(counts, key=lambda t: (-counts[t], rank.get(t, len(rank)), t))
        return tuple(node for node in alloc if type_of[node] == keep)

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        capped = [job.with_default(max_replicas=min(job.max_replicas, self.max_replicas))
                  for job in jobs]
        previous = self._to_virtual(previous_allocations, nodes)
        decision = self.inner.optimize(capped, self._virtual_nodes(nodes), previous)
        type_of = {node.name: node.gpu_type for node in nodes}
        allocations: dict[str, Allocation] = {}
        self._virtual = {}
        for job in jobs:
            virtual = tuple(decision.allocations.get(job.name, ()))
            real = tuple(v.rsplit(SEPARATOR, 1)[0] for v in virtual)
            fixed = self._one_type(real, type_of)
            allocations[job.name] = fixed
            if fixed == real and virtual:
                self._virtual[job.name] = (fixed, virtual)
        return PolicyDecision(allocations, info=decision.info)
