"""Placing a fixed number of replicas: the baselines' (tiresias, optimus, fifo) shared steps.

Each baseline decides how many GPUs a job gets; these helpers turn counts into node
lists. Replicas go to the nodes with the most free slots (ties: node order), and on a
typed cluster (nodes of several GPU types) always within one type, so an allocation never
spans types. On an untyped cluster every node has the same type and the typed steps
reduce to the plain ones, decision for decision.

Which type a job gets is each policy's rule (its module docstring), built from
:func:`type_for`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from pollux.policies.base import Allocation, JobInfo, NodeInfo


def tuned_replicas(job: JobInfo) -> int:
    """The GPU count a baseline gives a job: its tuned replicas, within its bounds."""
    return max(1, job.tuned.num_replicas if job.tuned is not None else job.min_replicas)


def pack_onto_most_free(free: dict[str, int], num_replicas: int,
                        node_order: Iterable[str]) -> Allocation:
    """Take replicas from the node with the most free slots, repeatedly (ties: node order).

    ``free`` is updated in place. Returns () when the replicas do not fit in total.
    """
    if num_replicas <= 0 or sum(free.values()) < num_replicas:
        return ()
    order = {name: i for i, name in enumerate(node_order)}
    alloc: list[str] = []
    while len(alloc) < num_replicas:
        node = min(free, key=lambda n: (-free[n], order.get(n, len(order))))
        take = min(free[node], num_replicas - len(alloc))
        alloc.extend([node] * take)
        free[node] -= take
    return tuple(alloc)


def free_slots(nodes: Sequence[NodeInfo], jobs_by_name: dict[str, JobInfo],
               allocations: dict[str, Allocation]) -> dict[str, int]:
    """Free one-GPU replica slots per node after ``allocations`` (GPU jobs of 1 GPU each)."""
    free = {node.name: node.num_gpus for node in nodes}
    for name, alloc in allocations.items():
        per = jobs_by_name[name].gpus_per_replica if name in jobs_by_name else 1.0
        for node in alloc:
            if node in free:
                free[node] -= int(round(per))
    return free


def node_types(nodes: Sequence[NodeInfo]) -> dict[str, str]:
    """Node name -> GPU type."""
    return {node.name: node.gpu_type for node in nodes}


def gpus_by_type(nodes: Sequence[NodeInfo]) -> dict[str, int]:
    """GPUs per type, types in order of first appearance."""
    return free_by_type({node.name: node.num_gpus for node in nodes}, node_types(nodes))


def free_by_type(free: Mapping[str, int], types: Mapping[str, str]) -> dict[str, int]:
    """Free slots per type, types in the order their first node appears in ``free``."""
    total: dict[str, int] = {}
    for node, slots in free.items():
        total[types[node]] = total.get(types[node], 0) + slots
    return total


def allocation_type(allocation: Allocation, types: Mapping[str, str]) -> str | None:
    """The GPU type of an allocation's first node (None: empty or unknown node)."""
    return types.get(allocation[0]) if allocation else None


def type_for(room: Mapping[str, int], num_replicas: int, current: str | None = None,
             cost: Callable[[str], float] | None = None) -> str | None:
    """The type a job of ``num_replicas`` GPUs goes to, given ``room`` (free GPUs per
    type): ``current`` if it fits there, else among the types where it fits the one of
    least ``cost`` (None: all equal), then the most room, then the first; None when it
    fits nowhere."""
    if current is not None and room.get(current, 0) >= num_replicas:
        return current
    fits = [gpu_type for gpu_type, slots in room.items() if slots >= num_replicas]
    return min(fits, key=lambda t: (0.0 if cost is None else cost(t), -room[t]), default=None)


def pack_within_type(free: dict[str, int], num_replicas: int, node_order: Iterable[str],
                     types: Mapping[str, str], gpu_type: str) -> Allocation:
    """:func:`pack_onto_most_free` over the nodes of ``gpu_type`` only (``free`` updated
    in place); () when the replicas do not fit there."""
    within = {node: slots for node, slots in free.items() if types[node] == gpu_type}
    alloc = pack_onto_most_free(within, num_replicas, node_order)
    free.update(within)
    return alloc


def preference_order(nodes: Sequence[NodeInfo]) -> list[str]:
    """Node names, non-preemptible nodes first (the packing's tie-break)."""
    return [node.name for node in sorted(nodes, key=lambda n: n.preemptible)]


def place_counts(nodes: Sequence[NodeInfo], jobs: Sequence[JobInfo],
                 kept: dict[str, Allocation], wanted: Iterable[tuple[str, int, str]]
                 ) -> dict[str, Allocation]:
    """Every job's allocation: ``kept`` ones as they are, then each ``(job, GPUs, type)``
    of ``wanted`` not kept packed within its type in turn; () for the others."""
    free = free_slots(nodes, {job.name: job for job in jobs}, kept)
    order, types = preference_order(nodes), node_types(nodes)
    placed = dict(kept)
    for name, num_replicas, gpu_type in wanted:
        if name not in placed:
            placed[name] = pack_within_type(free, num_replicas, order, types, gpu_type)
    return {job.name: placed.get(job.name, ()) for job in jobs}
