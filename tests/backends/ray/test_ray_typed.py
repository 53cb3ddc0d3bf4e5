"""GPU types on a local multi-node Ray cluster (issue #16): two worker nodes declare
different ``accelerator_type:<T>`` resources (``x``: 2 slots, ``y``: 1 slot of the custom
resource ``tslot``); a real ``pollux server --backend ray --policy pollux`` reads the
types from Ray and trains the agent's example, a job that may take 3 replicas. A
type-blind placement would take x's 2 slots and y's one; every launch stays within one
type and its replicas are told that type."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'pollux[ray]'")

from tests.backends.ray.conftest import NODE_ARGS, SLOT, RayTestCluster  # noqa: E402
from tests.backends.ray.test_ray_e2e import RayServerProcess  # noqa: E402
from tests.service.e2e_helpers import (  # noqa: E402
    EXAMPLE,
    FINAL_STATES,
    example_spec,
    launches,
    wait_until,
)

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not EXAMPLE.exists(), reason="needs examples/train_digits.py"),
]

TYPED_SLOT = "tslot"
"""The slot resource of the typed nodes only (the package's untyped workers have none)."""
TYPED_NODES = {"x": 2, "y": 1}
"""GPU type -> slots of its one node."""


@pytest.fixture
def typed_workers(ray_cluster: RayTestCluster) -> Iterator[list[Any]]:
    """One node per type of TYPED_NODES added to the package's cluster, removed after."""
    added = []
    try:
        for gpu_type, slots in TYPED_NODES.items():
            added.append(ray_cluster.cluster.add_node(
                wait=True, num_cpus=slots, object_store_memory=NODE_ARGS["object_store_memory"],
                resources={TYPED_SLOT: slots, f"accelerator_type:{gpu_type}": 1}))
        yield added
    finally:
        for node in added:
            with contextlib.suppress(Exception):
                ray_cluster.cluster.remove_node(node)


@pytest.fixture
def server(tmp_path: Path, ray_cluster: RayTestCluster, typed_workers: list[Any]):
    process = RayServerProcess(tmp_path / "data", ray_cluster.address)
    args = process.args
    args[args.index(SLOT)] = TYPED_SLOT
    args[args.index("--policy") + 1] = "pollux"
    yield process
    process.cleanup()


def test_ray_nodes_report_their_types_and_a_job_stays_within_one(server):
    client = server.start()
    nodes = client.nodes()
    types = {node["name"]: node["gpu_type"] for node in nodes}
    assert sorted(types.values()) == ["x", "y"]  # only the nodes offering tslot
    assert {node["gpu_type"]: node["resources"]["gpu"] for node in nodes} == TYPED_NODES
    assert all(not name.startswith("accelerator_type:") for node in nodes
               for name in node["resources"])
    job = client.submit(example_spec("typed", 3, epochs=3))["id"]
    final = wait_until(lambda: (lambda j: j if j["state"] in FINAL_STATES else None)(
        client.job(job)), 200, "the job to end")
    assert final["state"] == "Succeeded", server.log_text()
    runs = launches(server.data_dir, job)
    assert runs
    for generation, placed in runs.items():
        assert len({types[node] for node in placed}) == 1, (generation, placed)
    last_type = types[runs[max(runs)][0]]
    assert final["gpu_type"] == last_type
    hints = final["hints"]
    assert hints is not None and hints["gpu_type"] == last_type
    assert set(hints["type_profiles"]) == {types[n] for placed in runs.values() for n in placed}
    server.stop()


def test_a_per_type_decision_asks_rays_autoscaler_for_each_types_nodes(
        typed_workers: list[Any]) -> None:
    """The nodes wanted per GPU type (the typed autoscaler's decision) reach Ray's
    autoscaler as one bundle per node holding the type's ``accelerator_type:<T>`` marker,
    shaped like that type's node, in the request channel Ray's autoscaler reads. (Ray's
    own ``AutoscalingCluster`` with fake nodes cannot run here: the installed wheel lacks
    its ``fake_multi_node/example.yaml``, and its ``start`` runs ``ray stop --force``,
    which would end every Ray cluster on the machine.)"""
    import json
    import uuid

    from ray.autoscaler._private.commands import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    from pollux.backends.ray.backend import RayBackend

    backend = RayBackend(f"test-{uuid.uuid4().hex[:8]}", slot_resource=TYPED_SLOT,
                         autoscale=True)
    try:
        assert {n.gpu_type for n in backend.nodes() if n.resources["gpu"] > 0} == {"x", "y"}
        backend.request_nodes_by_type({"x": 2, "y": 3})
        stored = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
        assert stored is not None
        assert json.loads(stored) == (
            [{TYPED_SLOT: 2.0, "accelerator_type:x": 1.0}] * 2
            + [{TYPED_SLOT: 1.0, "accelerator_type:y": 1.0}] * 3)
        backend.request_nodes_by_type({"x": 4})  # one type: its size, as before
        assert json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)) == \
            [{TYPED_SLOT: 2.0}] * 4
    finally:
        backend.close()
