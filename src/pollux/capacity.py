"""Resource arithmetic shared by the policies, both drivers and the backends: what is
left on nodes, whether replicas fit, all with one tolerance.

Amounts are floats (fractions of a GPU, bytes of memory), so sums that should equal a
capacity may round above it; every comparison of an amount with a capacity allows
:data:`RESOURCE_TOLERANCE`, absolute (``need <= free + tol``) or, where amounts are large
(bytes), relative and absolute (:func:`with_slack`). Numeric tolerances of the optimizer
and the fits (gains, time grids) are not resource arithmetic and live with their code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

RESOURCE_TOLERANCE = 1e-9
"""Rounding slack when comparing resource amounts."""

Resources = dict[str, dict[str, float]]
"""Node name -> resource name -> amount."""


def with_slack(amount: Any) -> Any:
    """``amount`` widened by the tolerance, relative and absolute (a float or an array):
    ``need <= with_slack(free)`` is "need fits in free"."""
    return amount * (1 + RESOURCE_TOLERANCE) + RESOURCE_TOLERANCE


def subtract(free: Mapping[str, Mapping[str, float]],
             placements: Iterable[tuple[Sequence[str], Mapping[str, float]]]) -> Resources:
    """``free`` minus, for each (allocation, per-replica resources) pair, one replica's
    resources on each node of the allocation (a node once per replica on it)."""
    result = {node: dict(resources) for node, resources in free.items()}
    for allocation, per_replica in placements:
        for node in allocation:
            if node not in result:
                continue
            for name, amount in per_replica.items():
                result[node][name] = result[node].get(name, 0.0) - amount
    return result


def fits(free: Mapping[str, Mapping[str, float]], allocation: Sequence[str],
         per_replica: Mapping[str, float]) -> bool:
    """Whether the replicas of ``allocation``, each needing ``per_replica``, fit in
    ``free`` (every node known, nothing below zero beyond the tolerance)."""
    after = subtract(free, [(allocation, per_replica)])
    return all(node in free for node in allocation) and all(
        amount >= -RESOURCE_TOLERANCE for node in set(allocation)
        for amount in after[node].values())
