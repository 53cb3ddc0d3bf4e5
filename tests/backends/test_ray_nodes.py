"""Ray's node records as the policy's nodes, and replicas as bundles (no Ray needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pollux.backends.ray.nodes import (
    actor_options,
    alive_nodes,
    autoscaler_bundles,
    check_ray_amount,
    choose_slot_resource,
    node_info,
    offers_slots,
    replica_bundle,
    typed_autoscaler_bundles,
)
from pollux.errors import JobSpecError
from pollux.job_spec import ReplicaResources

NODE_ID = "ab" * 28


def record(node_id: str = NODE_ID, alive: bool = True, **resources: float) -> dict:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "10.0.0.7",
            "Resources": {"node:10.0.0.7": 1.0, "object_store_memory": 1e8, **resources}}


def test_node_info_maps_slots_cpus_memory_and_custom_resources():
    [node] = alive_nodes([record(CPU=48, GPU=8, memory=2e11, **{"accelerator_type:A100": 1,
                                                                 "nvme": 2}),
                          record("cd" * 28, alive=False, CPU=4)])
    assert node.name == "10.0.0.7-abababab"
    info = node_info(node, "GPU")
    assert info.name == node.name
    assert dict(info.resources) == {"gpu": 8.0, "cpu": 48.0, "memory": 2e11, "nvme": 2.0}
    assert node_info(node, "nvme").resources["gpu"] == 2.0


def test_auto_slot_is_gpu_when_any_node_has_one():
    cpu_only = alive_nodes([record(CPU=8), record("cd" * 28, CPU=8)])
    assert choose_slot_resource("auto", cpu_only) == "CPU"
    mixed = alive_nodes([record(CPU=8), record("cd" * 28, CPU=8, GPU=4)])
    assert choose_slot_resource("auto", mixed) == "GPU"
    assert choose_slot_resource("slot", mixed) == "slot"
    assert not offers_slots(mixed[0], "GPU") and offers_slots(mixed[1], "GPU")


def test_bundles_reserve_what_a_replica_needs():
    gpu_job = ReplicaResources(gpu=1, cpu=4, memory_bytes=8e9)
    assert replica_bundle(gpu_job, "GPU") == {"GPU": 1.0, "CPU": 4.0, "memory": 8e9}
    assert actor_options(replica_bundle(gpu_job, "GPU")) == {
        "num_cpus": 4.0, "num_gpus": 1.0, "memory": 8e9}
    # with CPU slots the slots are the replica's CPUs: max(gpu, cpu), not their sum
    assert replica_bundle(ReplicaResources(gpu=2, cpu=1), "CPU") == {"CPU": 2.0}
    assert actor_options(replica_bundle(ReplicaResources(gpu=1, cpu=1), "slot")) == {
        "num_cpus": 1.0, "num_gpus": 0.0, "resources": {"slot": 1.0}}


@given(st.floats(0.05, 8), st.floats(0.05, 64), st.sampled_from(["GPU", "CPU", "slot"]))
def test_a_bundle_never_asks_less_than_the_policy_reserves(gpu, cpu, slot):
    bundle = replica_bundle(ReplicaResources(gpu=gpu, cpu=cpu), slot)
    assert bundle[slot] >= gpu and bundle["CPU"] >= cpu


def test_fractions_above_one_are_refused():
    check_ray_amount("resources.gpu", 0.5)
    check_ray_amount("resources.gpu", 2)
    with pytest.raises(JobSpecError, match="resources.gpu"):
        check_ray_amount("resources.gpu", 1.5)


def test_autoscaler_bundles_are_shaped_like_the_largest_node():
    nodes = alive_nodes([record(CPU=8, GPU=4), record("cd" * 28, CPU=8, GPU=8),
                         record("ef" * 28, CPU=2)])
    assert autoscaler_bundles(3, nodes, "GPU") == [{"GPU": 8.0}] * 3
    assert autoscaler_bundles(0, nodes, "GPU") == []
    assert autoscaler_bundles(2, [], "GPU") == [{"GPU": 1.0}] * 2


def test_typed_bundles_carry_their_types_marker_and_shape():
    """Nodes wanted per GPU type become one bundle per node holding the type's
    ``accelerator_type:<T>`` marker (only that type's nodes have it), shaped like the
    type's largest node; a type not seen asks for one slot."""
    nodes = alive_nodes([record(CPU=8, GPU=4, **{"accelerator_type:T4": 1}),
                         record("cd" * 28, CPU=8, GPU=8, **{"accelerator_type:A100": 1})])
    bundles = typed_autoscaler_bundles({"T4": 2, "A100": 1, "V100": 1, "K80": 0}, nodes, "GPU")
    assert bundles == [{"GPU": 8.0, "accelerator_type:A100": 1.0},
                       {"GPU": 4.0, "accelerator_type:T4": 1.0},
                       {"GPU": 4.0, "accelerator_type:T4": 1.0},
                       {"GPU": 1.0, "accelerator_type:V100": 1.0}]


def test_gpu_type_from_accelerator_type_or_a_custom_prefix() -> None:
    from pollux.backends.ray.nodes import gpu_type_of
    from pollux.resources import DEFAULT_GPU_TYPE

    [a100] = alive_nodes([record(CPU=8, GPU=8, **{"accelerator_type:A100": 1})])
    assert node_info(a100, "GPU").gpu_type == "A100"
    [custom] = alive_nodes([record(CPU=8, slot=4, **{"gpu_type:t4": 1})])
    info = node_info(custom, "slot", type_prefix="gpu_type:")
    assert info.gpu_type == "t4" and "gpu_type:t4" not in info.resources
    [plain] = alive_nodes([record(CPU=8)])
    assert gpu_type_of(plain) == DEFAULT_GPU_TYPE == node_info(plain, "CPU").gpu_type
