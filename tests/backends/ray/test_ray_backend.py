"""The Ray backend on a local 3-node Ray cluster, with tests/backends/fake_job.py as the
replica: nodes and resources, placement, the agent's environment, logs, checkpointed
and forced stops, replicas that never outlive their actor, recovery, autoscaling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'pollux[ray]'")

import ray  # noqa: E402
from ray.util.placement_group import placement_group_table  # noqa: E402

from pollux.backends.base import LaunchRequest, ReplicaState  # noqa: E402
from pollux.backends.processes import is_alive  # noqa: E402
from pollux.backends.ray import RayBackend  # noqa: E402
from pollux.backends.ray.launch import MARKER_ENV  # noqa: E402
from pollux.backends.registry import make_backend  # noqa: E402
from pollux.errors import (
    BackendError,  # noqa: E402
    JobSpecError,  # noqa: E402
)
from pollux.job_spec import JobSpec  # noqa: E402
from pollux.jobenv import RESCALE_EXIT_CODE  # noqa: E402
from tests.backends.ray.conftest import SLOT  # noqa: E402

pytestmark = pytest.mark.timeout(60)
FAKE_JOB = str(Path(__file__).parents[1] / "fake_job.py")


@pytest.fixture
def backend(ray_cluster):
    made = RayBackend(f"test-{uuid.uuid4().hex[:8]}", slot_resource=SLOT)
    yield made
    made.close()


def spec(*args: str, **fields) -> JobSpec:
    data = {"name": "fake", "command": [sys.executable, FAKE_JOB, *args],
            "working_dir": str(Path(FAKE_JOB).parent), "max_replicas": 4}
    data.update(fields)
    return JobSpec.from_dict(data)


def request(tmp_path: Path, job_spec: JobSpec, allocation: tuple[str, ...],
            generation: int = 1, job_id: str = "fake-1") -> LaunchRequest:
    return LaunchRequest(job_id=job_id, generation=generation, spec=job_spec,
                         allocation=allocation, checkpoint_dir=str(tmp_path / "ckpt"),
                         log_dir=str(tmp_path / "logs"), hints_target="http://x/hints",
                         hints_token="secret")


def wait_states(backend, job_id: str, states: set[ReplicaState], timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = backend.poll(job_id)
        if statuses and all(s.state in states for s in statuses):
            return statuses
        assert time.monotonic() < deadline, f"{job_id}: {statuses}"
        time.sleep(0.05)


def wait_for(backend, path: Path, timeout_s: float = 30.0) -> None:
    """Poll the backend (launches advance only when polled) until ``path`` exists."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        backend.poll("fake-1")
        time.sleep(0.05)


def test_nodes_are_the_ray_nodes_with_slots_and_follow_joins_and_departures(
        backend, ray_workers):
    nodes = backend.nodes()
    assert len(nodes) == 2  # the head declares no slots
    for node in nodes:
        assert node.resources["gpu"] == 2.0 and node.resources[SLOT] == 2.0
        assert node.resources["cpu"] == 2.0 and node.resources["memory"] > 0
        assert not any(name.startswith("node:") for name in node.resources)
    joined = ray_workers.add_worker()
    names = {n.name for n in backend.nodes()}
    assert len(names) == 3 and any(joined.node_id[:8] in name for name in names)
    ray_workers.remove_worker(joined, graceful=True)
    deadline = time.monotonic() + 10
    while len(backend.nodes()) != 2:
        assert time.monotonic() < deadline, "the removed node is still listed"
        time.sleep(0.05)


def test_placement_env_logs_and_checkpointed_stop(backend, tmp_path):
    first, second = sorted(n.name for n in backend.nodes())
    job = spec("--steps", "1000", "--step-s", "0.02")
    launched = backend.launch(request(tmp_path, job, (first, first, second)))
    assert [(r.rank, r.node) for r in launched] == [(0, first), (1, first), (2, second)]
    wait_states(backend, "fake-1", {ReplicaState.RUNNING})
    for rank in range(3):
        wait_for(backend, tmp_path / "ckpt" / f"env-0-{rank}.json")
    envs = [json.loads((tmp_path / "ckpt" / f"env-0-{r}.json").read_text()) for r in range(3)]
    assert [e["POLLUX_RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["POLLUX_LOCAL_RANK"] for e in envs] == ["0", "1", "0"]
    assert [e["POLLUX_NODE_RANK"] for e in envs] == ["0", "0", "1"]
    assert {e["POLLUX_MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["POLLUX_MASTER_PORT"] for e in envs}) == 1
    assert {e["POLLUX_HINTS_TOKEN"] for e in envs} == {"secret"}
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {""}
    assert {e[MARKER_ENV] for e in envs} == {backend.instance_id}
    # every bundle sits on the node the allocation named
    launch = backend._launches["fake-1"]
    table = placement_group_table(launch.placement)
    assert table["state"] == "CREATED"
    by_name = {n.name: n.node_id for n in launch.nodes}
    assert [table["bundles_to_node_id"][i] for i in range(3)] == [
        by_name[first], by_name[first], by_name[second]]
    backend.stop("fake-1")
    statuses = wait_states(backend, "fake-1", {ReplicaState.EXITED})
    assert {s.exit_code for s in statuses} == {RESCALE_EXIT_CODE}
    for rank in range(3):
        log = (tmp_path / "logs" / f"replica-{rank}.log").read_text()
        assert f": launch 1, rank {rank} of 3 on " in log
        assert f"rank {rank} checkpointed" in log
    backend.release("fake-1")
    assert backend.poll("fake-1") == []
    deadline = time.monotonic() + 10
    while placement_group_table(launch.placement)["state"] != "REMOVED":
        assert time.monotonic() < deadline, "placement group not removed"
        time.sleep(0.05)


def test_forced_stop_kills_the_process_group(backend, tmp_path):
    node = backend.nodes()[0].name
    job = spec("--steps", "1000", "--step-s", "0.02", "--ignore-sigterm", "--spawn-child")
    backend.launch(request(tmp_path, job, (node,)))
    wait_for(backend, tmp_path / "ckpt" / "child-0.pid")
    child = int((tmp_path / "ckpt" / "child-0.pid").read_text())
    backend.stop("fake-1")
    time.sleep(0.5)
    assert [s.state for s in backend.poll("fake-1")] == [ReplicaState.RUNNING]
    backend.stop("fake-1", force=True)
    statuses = wait_states(backend, "fake-1", {ReplicaState.EXITED})
    assert statuses[0].exit_code == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while is_alive(child):
        assert time.monotonic() < deadline, "the replica's child survived"
        time.sleep(0.05)


def test_a_replica_never_outlives_its_actor(backend, tmp_path):
    node = backend.nodes()[0].name
    backend.launch(request(tmp_path, spec("--steps", "1000", "--step-s", "0.02"),
                           (node, node)))
    wait_states(backend, "fake-1", {ReplicaState.RUNNING})
    for rank in range(2):
        wait_for(backend, tmp_path / "ckpt" / f"env-0-{rank}.json")
    pid = json.loads((tmp_path / "ckpt" / "env-0-1.json").read_text())["pid"]
    ray.kill(backend._launches["fake-1"].actors[1])
    deadline = time.monotonic() + 10
    while is_alive(pid):
        assert time.monotonic() < deadline, "the replica outlived its actor"
        time.sleep(0.05)
    statuses = {s.rank: s for s in wait_states(
        backend, "fake-1", {ReplicaState.EXITED, ReplicaState.RUNNING})}
    while statuses[1].state is not ReplicaState.EXITED:
        statuses = {s.rank: s for s in backend.poll("fake-1")}
        assert time.monotonic() < deadline + 10
        time.sleep(0.05)
    assert statuses[1].exit_code is None  # lost, not a clean exit
    assert "lost with its Ray actor" in (tmp_path / "logs" / "replica-1.log").read_text()
    backend.stop("fake-1")
    wait_states(backend, "fake-1", {ReplicaState.EXITED})


def test_unplaceable_launch_waits_then_stops_or_times_out(ray_cluster, tmp_path):
    backend = RayBackend(f"test-{uuid.uuid4().hex[:8]}", slot_resource=SLOT,
                         placement_timeout_s=1.5)
    try:
        node = backend.nodes()[0].name
        job = spec("--steps", "5")
        backend.launch(request(tmp_path, job, (node,) * 3))  # 3 replicas, 2 slots
        time.sleep(0.3)
        assert [s.state for s in backend.poll("fake-1")] == [ReplicaState.STARTING] * 3
        backend.stop("fake-1")
        assert {s.exit_code for s in backend.poll("fake-1")} == {-signal.SIGTERM}
        backend.release("fake-1")
        backend.launch(request(tmp_path, job, (node,) * 3, generation=2))
        statuses = wait_states(backend, "fake-1", {ReplicaState.EXITED}, timeout_s=10)
        assert {s.exit_code for s in statuses} == {None}
        assert "not up within 1.5 s (not placed" in (tmp_path / "logs" / "replica-0.log").read_text()
        with pytest.raises(BackendError, match="no longer"):
            backend.launch(request(tmp_path, job, ("10.0.0.1-deadbeef",), generation=3))
    finally:
        backend.close()


def test_recover_stops_the_replicas_of_a_previous_server(ray_cluster, tmp_path):
    instance = f"test-{uuid.uuid4().hex[:8]}"
    old = RayBackend(instance, slot_resource=SLOT)
    node = old.nodes()[0].name
    old.launch(request(tmp_path, spec("--steps", "1000", "--step-s", "0.02"), (node, node)))
    wait_states(old, "fake-1", {ReplicaState.RUNNING})
    for rank in range(2):
        wait_for(old, tmp_path / "ckpt" / f"env-0-{rank}.json")
    old._launches.clear()  # as if that server died without stopping anything
    new = make_backend("ray", instance_id=instance, slot_resource=SLOT)
    try:
        stopped = new.recover([], grace_s=20)
        assert stopped[:2] == ["actor fake-1-1-0", "actor fake-1-1-1"]
        assert len(stopped) == 3 and stopped[2].startswith("placement group")
        for rank in range(2):
            log = (tmp_path / "logs" / f"replica-{rank}.log").read_text()
            assert f"rank {rank} checkpointed" in log
        assert new.recover([], grace_s=1) == []
    finally:
        new.close()
        old.close()


def test_validate_and_autoscaler_request(ray_cluster):
    backend = RayBackend(f"test-{uuid.uuid4().hex[:8]}", slot_resource=SLOT, autoscale=True)
    try:
        with pytest.raises(JobSpecError, match="resources.gpu"):
            backend.validate(spec(resources={"gpu": 1.5}))
        backend.validate(spec(resources={"gpu": 0.5, "cpu": 2}))
        backend.request_cluster_size(3)
        from ray.autoscaler._private.commands import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
        from ray.experimental.internal_kv import _internal_kv_get
        stored = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
        assert stored is not None and json.loads(stored) == [{SLOT: 2.0}] * 3
    finally:
        backend.close()
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_node_loss_ends_its_replicas_and_the_survivor_takes_the_relaunch(
        backend, ray_workers, tmp_path):
    doomed = ray_workers.add_worker()
    names = {n.name: n for n in backend.nodes()}
    lost = next(name for name in names if doomed.node_id.startswith(name.rsplit("-", 1)[1]))
    survivor = next(name for name in names if name != lost)
    job = spec("--steps", "1000", "--step-s", "0.02")
    backend.launch(request(tmp_path, job, (survivor, lost)))
    wait_states(backend, "fake-1", {ReplicaState.RUNNING})
    removed_at = time.monotonic()
    ray_workers.remove_worker(doomed)
    statuses = {s.rank: s for s in wait_states(
        backend, "fake-1", {ReplicaState.EXITED, ReplicaState.RUNNING})}
    while statuses[1].state is not ReplicaState.EXITED:
        statuses = {s.rank: s for s in backend.poll("fake-1")}
        assert time.monotonic() < removed_at + 20, "the lost replica is still running"
        time.sleep(0.05)
    lost_after_s = time.monotonic() - removed_at
    assert statuses[1].exit_code is None and statuses[0].state is ReplicaState.RUNNING
    backend.stop("fake-1")
    assert wait_states(backend, "fake-1", {ReplicaState.EXITED})[0].exit_code == 75
    backend.release("fake-1")
    relaunched_at = time.monotonic()
    backend.launch(request(tmp_path, job, (survivor, survivor), generation=2))
    wait_states(backend, "fake-1", {ReplicaState.RUNNING})
    while lost in {n.name for n in backend.nodes()}:  # the health check marks it dead
        assert time.monotonic() < removed_at + 20, "the lost node is still listed"
        time.sleep(0.05)
    print(f"replica lost {lost_after_s:.2f} s after its node; relaunch running in "
          f"{time.monotonic() - relaunched_at:.2f} s")
    backend.stop("fake-1")
    wait_states(backend, "fake-1", {ReplicaState.EXITED})


DRIVER = """
import json, sys, time
from pathlib import Path
from pollux.backends.base import LaunchRequest
from pollux.backends.ray import RayBackend
from pollux.job_spec import JobSpec
address, instance, fake_job, tmp = sys.argv[1:5]
backend = RayBackend(instance, address=address, slot_resource="slot")
spec = JobSpec.from_dict({"name": "fake", "command": [sys.executable, fake_job, "--steps",
                          "100000", "--step-s", "0.02"], "working_dir": tmp})
node = backend.nodes()[0].name
backend.launch(LaunchRequest(job_id="fake-1", generation=1, spec=spec, allocation=(node,),
                             checkpoint_dir=tmp + "/ckpt", log_dir=tmp + "/logs"))
env_file = Path(tmp, "ckpt", "env-0-0.json")
while not env_file.exists():
    backend.poll("fake-1")
    time.sleep(0.05)
print(json.loads(env_file.read_text())["pid"], flush=True)
time.sleep(600)
"""


def test_replicas_share_the_fate_of_the_server_process(ray_cluster, tmp_path):
    instance = f"test-{uuid.uuid4().hex[:8]}"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, ray_cluster.address, instance,
                               FAKE_JOB, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout is not None
        pid = int(driver.stdout.readline())
        assert is_alive(pid)
        driver.kill()  # the server dies without stopping anything
        driver.wait()
        killed_at = time.monotonic()
        while is_alive(pid):
            assert time.monotonic() < killed_at + 30, "the replica outlived its server"
            time.sleep(0.05)
        print(f"replica gone {time.monotonic() - killed_at:.2f} s after its server")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if driver.stdout is not None:
            driver.stdout.close()
    backend = RayBackend(instance, slot_resource=SLOT)
    try:
        deadline = time.monotonic() + 20
        while backend.recover([], grace_s=1):  # Ray removes the dead owner's actors itself
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        backend.close()
