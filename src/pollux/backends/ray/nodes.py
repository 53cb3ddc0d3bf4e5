"""Ray's nodes as the policy sees them, and replicas as Ray resource bundles.

Pure functions of the records ``ray.nodes()`` returns, so they are tested without a
cluster. A replica's device slot (the policy's ``gpu`` resource) is one unit of the
*slot resource*: ``GPU`` on a GPU cluster, ``CPU`` on a CPU-only one, or any custom
resource the nodes declare (e.g. ``ray start --resources '{"slot": 4}'``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pollux.errors import JobSpecError
from pollux.job_spec import ReplicaResources
from pollux.resources import CPU, DEFAULT_GPU_TYPE, GPU, MEMORY, NodeInfo

RAY_CPU = "CPU"
RAY_GPU = "GPU"
RAY_MEMORY = "memory"
AUTO_SLOT = "auto"
"""Slot resource chosen from the cluster: GPU when any node has one, else CPU."""
HIDDEN_RESOURCE_PREFIXES = ("node:", "accelerator_type:", "object_store_memory")
"""Ray bookkeeping resources that are not offered to jobs."""
GPU_TYPE_PREFIX = "accelerator_type:"
"""Ray's resource ``accelerator_type:<T>`` names a node's GPU type ``<T>`` (Ray sets it on
GPU nodes; ``ray start --resources '{"accelerator_type:A100": 1}'`` declares one)."""
NODE_ID_LABEL = "ray.io/node-id"
NODE_NAME_ID_CHARS = 8


@dataclass(frozen=True)
class RayNode:
    """One alive Ray node."""

    node_id: str
    """Ray's hex node id."""
    address: str
    """The node's IP address (the torch.distributed master address when rank 0 runs here)."""
    resources: Mapping[str, float]
    """Ray's total resources of the node (``CPU``, ``GPU``, ``memory``, custom ones)."""

    @property
    def name(self) -> str:
        """The node's name for the policy and the job store: address and id prefix (a
        test cluster runs several nodes on one address)."""
        return f"{self.address}-{self.node_id[:NODE_NAME_ID_CHARS]}"


def alive_nodes(records: Iterable[Mapping[str, Any]]) -> list[RayNode]:
    """The alive nodes among ``ray.nodes()`` records, in node id order."""
    nodes = [RayNode(str(r["NodeID"]), str(r.get("NodeManagerAddress", "")),
                     {str(k): float(v) for k, v in dict(r.get("Resources") or {}).items()})
             for r in records if r.get("Alive")]
    return sorted(nodes, key=lambda n: n.node_id)


def choose_slot_resource(requested: str, nodes: Sequence[RayNode]) -> str:
    """``requested``, or for ``auto`` GPU when any node has a GPU, else CPU."""
    if requested != AUTO_SLOT:
        return requested
    return RAY_GPU if any(n.resources.get(RAY_GPU, 0.0) > 0 for n in nodes) else RAY_CPU


def gpu_type_of(node: RayNode, type_prefix: str = GPU_TYPE_PREFIX) -> str:
    """The node's GPU type: ``<T>`` of its ``<type_prefix><T>`` resource (the first by
    name if several), or the default type when it declares none."""
    types = sorted(name[len(type_prefix):] for name in node.resources
                   if name.startswith(type_prefix) and len(name) > len(type_prefix))
    return types[0] if types else DEFAULT_GPU_TYPE


def node_info(node: RayNode, slot_resource: str, type_prefix: str = GPU_TYPE_PREFIX
              ) -> NodeInfo:
    """The policy's view: ``gpu`` = slots, ``cpu``, ``memory`` (bytes), every custom
    resource under its own name, and the GPU type from ``<type_prefix><T>``."""
    resources = {name: amount for name, amount in node.resources.items()
                 if not name.startswith(HIDDEN_RESOURCE_PREFIXES)
                 and not name.startswith(type_prefix)
                 and name not in (RAY_CPU, RAY_GPU, RAY_MEMORY, GPU, CPU, MEMORY)}
    resources[GPU] = node.resources.get(slot_resource, 0.0)
    resources[CPU] = node.resources.get(RAY_CPU, 0.0)
    resources[MEMORY] = node.resources.get(RAY_MEMORY, 0.0)
    return NodeInfo(node.name, resources, gpu_type=gpu_type_of(node, type_prefix))


def offers_slots(node: RayNode, slot_resource: str) -> bool:
    return node.resources.get(slot_resource, 0.0) > 0


def replica_bundle(resources: ReplicaResources, slot_resource: str) -> dict[str, float]:
    """The Ray resources one replica reserves. With CPU slots a replica's slots are its
    CPUs, so it reserves ``max(gpu, cpu)`` CPUs."""
    bundle: dict[str, float] = {}
    if resources.gpu > 0:
        bundle[slot_resource] = float(resources.gpu)
    if resources.cpu > 0:
        bundle[RAY_CPU] = max(bundle.get(RAY_CPU, 0.0), float(resources.cpu))
    if resources.memory_bytes > 0:
        bundle[RAY_MEMORY] = float(int(resources.memory_bytes))
    return bundle


def check_ray_amount(field: str, amount: float) -> None:
    """Ray takes fractions of a resource only below 1 (0.5 GPU, not 1.5)."""
    if amount > 1 and amount != int(amount):
        raise JobSpecError(field, amount, "Ray accepts whole amounts, or a fraction below 1")


def actor_options(bundle: Mapping[str, float]) -> dict[str, Any]:
    """``.options()`` of the replica actor so that it holds its whole bundle."""
    options: dict[str, Any] = {"num_cpus": bundle.get(RAY_CPU, 0.0),
                               "num_gpus": bundle.get(RAY_GPU, 0.0)}
    if bundle.get(RAY_MEMORY):
        options["memory"] = bundle[RAY_MEMORY]
    custom = {name: amount for name, amount in bundle.items()
              if name not in (RAY_CPU, RAY_GPU, RAY_MEMORY)}
    if custom:
        options["resources"] = custom
    return options


def autoscaler_bundles(num_nodes: int, nodes: Sequence[RayNode], slot_resource: str
                       ) -> list[dict[str, float]]:
    """What to ask Ray's autoscaler for so that ``num_nodes`` nodes with slots exist: one
    bundle per node, shaped like the largest node seen (by slots)."""
    with_slots = [n for n in nodes if offers_slots(n, slot_resource)]
    slots = max((n.resources[slot_resource] for n in with_slots), default=1.0)
    return [{slot_resource: slots} for _ in range(max(0, num_nodes))]


def typed_autoscaler_bundles(num_nodes_by_type: Mapping[str, int], nodes: Sequence[RayNode],
                             slot_resource: str, type_prefix: str = GPU_TYPE_PREFIX
                             ) -> list[dict[str, float]]:
    """What to ask Ray's autoscaler for so that each GPU type has its number of nodes with
    slots: one bundle per node, shaped like the largest node of the type seen (by slots;
    1 slot for a type none is seen of) and holding the type's ``<type_prefix><T>`` marker
    (which only nodes of that type have; none for the default type)."""
    bundles: list[dict[str, float]] = []
    for gpu_type, count in sorted(num_nodes_by_type.items()):
        of_type = [n for n in nodes if offers_slots(n, slot_resource)
                   and gpu_type_of(n, type_prefix) == gpu_type]
        slots = max((n.resources[slot_resource] for n in of_type), default=1.0)
        bundle = {slot_resource: slots}
        if gpu_type != DEFAULT_GPU_TYPE:
            bundle[f"{type_prefix}{gpu_type}"] = 1.0
        bundles.extend(dict(bundle) for _ in range(max(0, int(count))))
    return bundles
