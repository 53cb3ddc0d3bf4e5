"""The local backend with real processes running tests/backends/fake_job.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from pollux.backends.base import LaunchRequest, ReplicaState
from pollux.backends.local import MARKER_ENV, LocalBackend
from pollux.backends.processes import is_alive, marked_processes
from pollux.errors import BackendError, ConfigError, JobSpecError
from pollux.job_spec import JobSpec
from pollux.jobenv import RESCALE_EXIT_CODE

FAKE_JOB = str(Path(__file__).with_name("fake_job.py"))


def spec(*args: str, **fields) -> JobSpec:
    data = {"name": "fake", "command": [sys.executable, FAKE_JOB, *args],
            "working_dir": str(Path(__file__).parent), "max_replicas": 4}
    data.update(fields)
    return JobSpec.from_dict(data)


def request(tmp_path: Path, job_spec: JobSpec, allocation: tuple[str, ...],
            generation: int = 1) -> LaunchRequest:
    return LaunchRequest(job_id="fake-1", generation=generation, spec=job_spec,
                         allocation=allocation, checkpoint_dir=str(tmp_path / "ckpt"),
                         log_dir=str(tmp_path / "logs"), hints_target="http://x/hints",
                         hints_token="secret")


def wait_exited(backend: LocalBackend, job_id: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = backend.poll(job_id)
        if statuses and all(s.state is ReplicaState.EXITED for s in statuses):
            return statuses
        time.sleep(0.05)
    raise AssertionError(f"replicas of {job_id} still running after {timeout_s} s")



def wait_for(path: Path, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_virtual_nodes_env_logs_and_checkpointed_stop(tmp_path, instance_id):
    backend = LocalBackend(instance_id, num_nodes=2, slots_per_node=2, device="cpu")
    assert [n.resources["gpu"] for n in backend.nodes()] == [2.0, 2.0]
    job = spec("--steps", "1000", "--step-s", "0.02", resources={"cpu": 1})
    launched = backend.launch(request(tmp_path, job, ("node-0", "node-0", "node-1")))
    assert [r.rank for r in launched] == [0, 1, 2]
    for r in range(3):
        wait_for(tmp_path / "ckpt" / f"env-0-{r}.json")
    envs = [json.loads((tmp_path / "ckpt" / f"env-0-{r}.json").read_text()) for r in range(3)]
    assert [e["POLLUX_RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["POLLUX_LOCAL_RANK"] for e in envs] == ["0", "1", "0"]
    assert [e["POLLUX_NODE_RANK"] for e in envs] == ["0", "0", "1"]
    assert {e["POLLUX_NUM_REPLICAS"] for e in envs} == {"3"}
    assert {e["POLLUX_NUM_NODES"] for e in envs} == {"2"}
    assert len({e["POLLUX_MASTER_PORT"] for e in envs}) == 1
    assert {e["POLLUX_HINTS_TOKEN"] for e in envs} == {"secret"}
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {""}
    assert {e["OMP_NUM_THREADS"] for e in envs} == {"1"}
    assert {e[MARKER_ENV] for e in envs} == {instance_id}
    assert all(s.state is ReplicaState.RUNNING for s in backend.poll("fake-1"))
    with pytest.raises(BackendError, match="still has live replicas"):
        backend.launch(request(tmp_path, job, ("node-1",)))
    time.sleep(0.3)
    backend.stop("fake-1")
    statuses = wait_exited(backend, "fake-1")
    assert [s.exit_code for s in statuses] == [RESCALE_EXIT_CODE] * 3
    step = json.loads((tmp_path / "ckpt" / "state.json").read_text())["step"]
    assert step > 0
    log = (tmp_path / "logs" / "replica-0.log").read_text()
    assert "launch 1, rank 0 of 3 on node-0" in log and "exiting 75" in log
    # relaunch on a new allocation resumes from the checkpoint
    backend.release("fake-1")
    backend.launch(request(tmp_path, job, ("node-1",), generation=2))
    wait_for(tmp_path / "ckpt" / "env-1-0.json")
    resumed = json.loads((tmp_path / "ckpt" / "env-1-0.json").read_text())
    assert resumed["resumed_step"] == step and resumed["POLLUX_NUM_RESTARTS"] == "1"
    backend.stop("fake-1", force=True)
    assert [s.exit_code for s in wait_exited(backend, "fake-1")] == [-signal.SIGKILL]


def test_the_servers_own_launch_variables_never_reach_a_replica(
        tmp_path, instance_id, monkeypatch):
    """A server started from a shell that has Pollux's or AdaptDL's launch variables set
    (a job's own, say) must not hand them on: the agent refuses two sources that disagree,
    so a stale ``ADAPTDL_NUM_REPLICAS`` would stop every job. The job's own env still
    reaches it."""
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "4")
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "3")
    monkeypatch.setenv("POLLUX_RANK", "9")
    backend = LocalBackend(instance_id, num_nodes=1, slots_per_node=1, device="cpu")
    job = spec("--steps", "1", env={"ADAPTDL_JOB_ID": "mine"})
    backend.launch(request(tmp_path, job, ("node-0",)))
    wait_for(tmp_path / "ckpt" / "env-0-0.json")
    env = json.loads((tmp_path / "ckpt" / "env-0-0.json").read_text())
    assert env["POLLUX_RANK"] == "0" and env["ADAPTDL_JOB_ID"] == "mine"
    assert "ADAPTDL_NUM_REPLICAS" not in env and "ADAPTDL_REPLICA_RANK" not in env
    wait_exited(backend, "fake-1")


def test_gpu_slots_get_one_device_each(tmp_path, instance_id):
    backend = LocalBackend(instance_id, num_nodes=2, slots_per_node=2,
                           gpu_ids=["0", "1", "2", "3"])
    job = spec("--steps", "1")
    backend.launch(request(tmp_path, job, ("node-1", "node-1", "node-0")))
    wait_exited(backend, "fake-1")
    devices = [json.loads((tmp_path / "ckpt" / f"env-0-{r}.json").read_text())
               ["CUDA_VISIBLE_DEVICES"] for r in range(3)]
    assert devices == ["2", "3", "0"]


def test_full_node_refuses_and_cleans_up(tmp_path, instance_id):
    backend = LocalBackend(instance_id, num_nodes=1, slots_per_node=2, device="cpu")
    with pytest.raises(BackendError, match="free slots"):
        backend.launch(request(tmp_path, spec("--steps", "1000"), ("node-0",) * 3))
    assert backend.poll("fake-1") == []
    time.sleep(0.2)
    assert marked_processes(MARKER_ENV, instance_id) == []
    backend.launch(request(tmp_path, spec("--steps", "1"), ("node-0",) * 2))
    assert [s.exit_code for s in wait_exited(backend, "fake-1")] == [0, 0]


def test_a_replica_exit_kills_its_process_group(tmp_path, instance_id):
    backend = LocalBackend(instance_id, num_nodes=1, slots_per_node=1, device="cpu")
    backend.launch(request(tmp_path, spec("--steps", "3", "--spawn-child"), ("node-0",)))
    wait_for(tmp_path / "ckpt" / "child-0.pid")
    child = int((tmp_path / "ckpt" / "child-0.pid").read_text())
    assert [s.exit_code for s in wait_exited(backend, "fake-1")] == [0]
    deadline = time.monotonic() + 5
    while is_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_alive(child)


def test_recover_stops_a_dead_servers_replicas(tmp_path, instance_id):
    first = LocalBackend(instance_id, num_nodes=1, slots_per_node=2, device="cpu")
    launched = first.launch(request(tmp_path, spec("--steps", "1000", "--step-s", "0.02"),
                                    ("node-0", "node-0")))
    for rank in (0, 1):  # both up (rank 0 may start after rank 1 under load)
        wait_for(tmp_path / "ckpt" / f"env-0-{rank}.json")
    time.sleep(0.2)
    pids = [r.handle["pid"] for r in launched]
    # a new backend (new server) on the same data dir, knowing only rank 0's record:
    # rank 1 is found through its environment marker
    second = LocalBackend(instance_id, num_nodes=1, slots_per_node=2, device="cpu")
    stopped = second.recover([launched[0].handle], grace_s=10.0)
    assert stopped == [f"pid {pid}" for pid in sorted(pids)]
    assert not any(is_alive(pid) for pid in pids)
    # they were asked to checkpoint, not killed
    assert "exiting 75" in (tmp_path / "logs" / "replica-0.log").read_text()
    assert second.recover([launched[0].handle], grace_s=1.0) == []
    first.close()


def test_recover_kills_replicas_that_ignore_sigterm(tmp_path, instance_id):
    first = LocalBackend(instance_id, num_nodes=1, slots_per_node=1, device="cpu")
    launched = first.launch(request(tmp_path, spec("--steps", "1000", "--ignore-sigterm"),
                                    ("node-0",)))
    wait_for(tmp_path / "ckpt" / "env-0-0.json")
    start = time.monotonic()
    LocalBackend(instance_id, device="cpu").recover([r.handle for r in launched], grace_s=0.5)
    assert time.monotonic() - start < 5
    assert not is_alive(launched[0].handle["pid"])
    first.close()


def test_validate_names_the_field(tmp_path, instance_id):
    backend = LocalBackend(instance_id, num_nodes=1, slots_per_node=2, device="cpu")
    backend.validate(spec())
    with pytest.raises(JobSpecError) as info:
        backend.validate(spec(working_dir=str(tmp_path / "missing")))
    assert info.value.field == "working_dir"
    with pytest.raises(JobSpecError) as info:
        backend.validate(spec(command=["no-such-program-xyz"]))
    assert info.value.field == "command"
    with pytest.raises(JobSpecError) as info:
        backend.validate(spec(resources={"gpu": 0.5}))
    assert info.value.field == "resources.gpu"
    assert os.path.isabs(FAKE_JOB)


@pytest.mark.skipif(not Path("/sys/class/net/lo").exists(), reason="no loopback interface")
def test_local_jobs_talk_over_loopback_only(tmp_path, instance_id, monkeypatch):
    """Issue #13 item 7: gloo's sockets of a local job stay on the loopback interface
    (unless the job chooses another), as does its rendezvous store (tests/torch)."""
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    backend = LocalBackend(instance_id, num_nodes=1, slots_per_node=2, device="cpu")
    env = backend._replica_env(request(tmp_path, spec(), ("node-0",)), {}, (0,), "node-0")
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and backend.master_addr == "127.0.0.1"
    chosen = spec(env={"GLOO_SOCKET_IFNAME": "eth0"})
    env = backend._replica_env(request(tmp_path, chosen, ("node-0",)), {}, (0,), "node-0")
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_typed_virtual_nodes_report_their_types_and_slots(tmp_path, instance_id):
    backend = LocalBackend(instance_id, device="cpu", virtual_nodes="aws:2x2,rtx:1x4")
    nodes = backend.nodes()
    assert [(n.name, n.gpu_type, n.num_gpus) for n in nodes] == [
        ("aws-0", "aws", 2), ("aws-1", "aws", 2), ("rtx-0", "rtx", 4)]
    backend.validate(spec(resources={"gpu": 4}))  # the largest node has 4 slots
    with pytest.raises(JobSpecError, match="at most 4"):
        backend.validate(spec(resources={"gpu": 5}))
    # the rtx node has 4 slots, an aws node 2; the launch's type reaches every replica
    request_rtx = request(tmp_path, spec("--steps", "1"), ("rtx-0",) * 4)
    backend.launch(LaunchRequest(**{**request_rtx.__dict__, "gpu_type": "rtx"}))
    assert [s.exit_code for s in wait_exited(backend, "fake-1")] == [0] * 4
    envs = [json.loads((tmp_path / "ckpt" / f"env-0-{r}.json").read_text()) for r in range(4)]
    assert {e["POLLUX_GPU_TYPE"] for e in envs} == {"rtx"}
    backend.release("fake-1")
    with pytest.raises(BackendError, match="free slots"):
        backend.launch(request(tmp_path, spec("--steps", "1"), ("aws-0",) * 3, generation=2))


def test_typed_virtual_nodes_take_gpus_in_order(instance_id):
    backend = LocalBackend(instance_id, virtual_nodes="a:1x1,b:1x2", gpu_ids=["4", "5", "6"])
    assert backend._devices == {"a-0": ["4"], "b-0": ["5", "6"]}
    with pytest.raises(ConfigError, match="3 GPUs; 2 are visible") as info:
        LocalBackend(instance_id, virtual_nodes="a:1x1,b:1x2", gpu_ids=["4", "5"])
    assert info.value.field == "virtual_nodes"
    with pytest.raises(ConfigError) as info:
        LocalBackend(instance_id, num_nodes=2, virtual_nodes="a:1x1")
    assert info.value.field == "virtual_nodes"
    with pytest.raises(ConfigError) as info:
        LocalBackend(instance_id, device="cpu", virtual_nodes="a:1x1,a:2x2")
    assert info.value.field == "virtual_nodes" and "twice" in str(info.value)
    untyped = LocalBackend(instance_id, device="cpu", virtual_nodes="2x3")
    assert [(n.name, n.gpu_type, n.num_gpus) for n in untyped.nodes()] == [
        ("node-0", "default", 3), ("node-1", "default", 3)]
