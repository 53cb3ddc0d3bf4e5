"""Placements: how many replicas of a job sit on each node.

A *placement* is a tuple of per-node replica counts, e.g. ``(4, 2)`` for four replicas on
one node and two on another. Policies return *allocations* (the node of every replica);
the simulator turns them into placements, and application models look placements up in
their canonical form (empty nodes dropped, lexicographically smallest rotation), the way
the reference simulator indexes its measurements.
"""

from __future__ import annotations

from collections.abc import Sequence

Placement = tuple[int, ...]


def placement_of(allocation: Sequence[str]) -> Placement:
    """Replicas per node, nodes in order of first appearance: ``(a, a, b) -> (2, 1)``."""
    counts: dict[str, int] = {}
    for node in allocation:
        counts[node] = counts.get(node, 0) + 1
    return tuple(counts.values())


def canonical_placement(placement: Sequence[int]) -> Placement:
    """Drop empty nodes and rotate to the lexicographically smallest rotation."""
    nonzero = tuple(int(c) for c in placement if c > 0)
    if len(nonzero) <= 1:
        return nonzero
    return min(nonzero[i:] + nonzero[:i] for i in range(len(nonzero)))


def packed_placement(num_replicas: int, gpus_per_node: int, num_nodes: int | None = None
                     ) -> Placement:
    """Replicas filled node by node, up to ``gpus_per_node`` each, every node used.

    With ``num_nodes=None`` the fewest nodes are used: ``packed_placement(6, 4) == (4, 2)``.
    With more nodes each gets one replica first and the rest fill nodes in turn:
    ``packed_placement(6, 4, num_nodes=3) == (4, 1, 1)``. Past full nodes the surplus is
    spread evenly.
    """
    if num_replicas <= 0:
        return ()
    per_node = max(1, int(gpus_per_node))
    nodes = -(-num_replicas // per_node) if num_nodes is None else int(num_nodes)
    nodes = max(1, min(nodes, num_replicas))
    counts = [1] * nodes
    left = num_replicas - nodes
    for i in range(nodes):
        add = min(left, per_node - 1)
        counts[i] += add
        left -= add
    i = 0
    while left > 0:  # more replicas than GPUs on these nodes: spread the surplus
        counts[i % nodes] += 1
        left -= 1
        i += 1
    return tuple(counts)
