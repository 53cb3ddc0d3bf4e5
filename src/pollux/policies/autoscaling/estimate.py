"""What-if allocations: the best allocation of the active jobs on ``n`` template nodes.

An autoscaler judges a candidate cluster size by the allocation an *estimator* policy
(by default the Pollux policy with its default optimizer, restart penalty off) would make
on that many empty copies of the node template, summarized as a :class:`SizeEstimate`
and memoized per size for the round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pollux.policies.autoscaling.utility import cluster_utility, total_speedup
from pollux.policies.base import Allocations, JobInfo, NodeInfo, Policy


def identical_nodes(resources: Mapping[str, float], count: int,
                    prefix: str = "virtual") -> list[NodeInfo]:
    """``count`` nodes with ``resources`` each, named ``<prefix>-0000`` and on."""
    return [NodeInfo(f"{prefix}-{i:04d}", dict(resources)) for i in range(count)]


@dataclass(frozen=True)
class SizeEstimate:
    """The estimator's best allocation on ``num_nodes`` template nodes, summarized."""

    num_nodes: int
    num_used_nodes: int
    """Nodes holding at least one replica."""
    utility: float | None
    """Cluster utility of the allocation (None: nobody got anything)."""
    total_speedup: float
    """Sum of the jobs' speedups (as the estimator's jobs report them)."""
    num_replicas: int


class SizeEvaluator:
    """Best allocations of fixed jobs on ``n`` template nodes, memoized per ``n``."""

    def __init__(self, estimator: Policy, jobs: Sequence[JobInfo],
                 node_resources: Mapping[str, float]) -> None:
        self.estimator = estimator
        self.jobs = list(jobs)
        self.node_resources = node_resources
        self._cache: dict[int, SizeEstimate] = {}

    @property
    def num_evaluations(self) -> int:
        return len(self._cache)

    def allocations(self, num_nodes: int) -> tuple[list[NodeInfo], Allocations]:
        nodes = identical_nodes(self.node_resources, num_nodes)
        if num_nodes <= 0 or not self.jobs:
            return nodes, {}
        return nodes, self.estimator.optimize(self.jobs, nodes, {}).allocations

    def estimate(self, num_nodes: int) -> SizeEstimate:
        found = self._cache.get(num_nodes)
        if found is None:
            nodes, allocations = self.allocations(num_nodes)
            used = {node for alloc in allocations.values() for node in alloc}
            found = SizeEstimate(
                num_nodes=num_nodes, num_used_nodes=len(used),
                utility=cluster_utility(self.jobs, allocations, nodes),
                total_speedup=total_speedup(self.jobs, allocations),
                num_replicas=sum(len(a) for a in allocations.values()))
            self._cache[num_nodes] = found
        return found


def default_estimator() -> Policy:
    """The Pollux policy (default optimizer), restart penalty off: the allocation a size
    would get, not the cost of moving there."""
    from pollux.policies.pollux import PolluxPolicy

    return PolluxPolicy(restart_penalty=False)
