"""End to end on a local Ray cluster: a real ``pollux server --backend ray`` (equal-share
policy, 1 s rounds) on two worker nodes of 2 slots each, running the agent's example
(examples/train_digits.py) as Ray actors' subprocesses."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray backend needs ray: pip install 'pollux[ray]'")

from pollux.backends.processes import is_alive, marked_processes, signal_group  # noqa: E402
from pollux.backends.ray.launch import MARKER_ENV  # noqa: E402
from tests.backends.ray.conftest import SLOT  # noqa: E402
from tests.service.e2e_helpers import (  # noqa: E402
    EXAMPLE,
    ServerProcess,
    agent_events,
    all_final,
    check_sample_accounting,
    checkpointed_after_an_epoch,
    example_spec,
    finished_an_epoch,
    instance_id,
    started,
    states,
    wait_until,
)

pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(not EXAMPLE.exists(), reason="needs examples/train_digits.py"),
]


class RayServerProcess(ServerProcess):
    """``pollux server --backend ray`` connected to the test cluster."""

    def __init__(self, data_dir: Path, ray_address: str | None) -> None:
        super().__init__(data_dir)
        main = self.args.index("pollux.cli.main")
        ray_args = ["--ray-address", ray_address, "--ray-slot-resource", SLOT] if ray_address \
            else []
        self.args = [*self.args[:main + 1], "-v", *self.args[main + 1:self.args.index("--nodes")],
                     "--backend", "ray", *ray_args, "--interval", "1", "--policy",
                     self.args[self.args.index("--policy") + 1], "--stop-grace", "30"]

    def cleanup(self) -> None:
        super().cleanup()  # the server's death ends its actors; their watchdogs, replicas
        instance = instance_id(self.data_dir)
        if instance is not None:
            for pid in marked_processes(MARKER_ENV, instance):
                signal_group(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def server(tmp_path: Path, ray_workers):
    process = RayServerProcess(tmp_path / "data", ray_workers.address)
    yield process
    process.cleanup()




def launch_nodes(data_dir: Path, job_id: str, generation: int) -> list[str]:
    """Node of each rank of one launch, from the job store."""
    with contextlib.closing(sqlite3.connect(data_dir / "pollux.db")) as conn:
        rows = conn.execute("SELECT node FROM replicas WHERE job_id=? AND generation=? "
                            "ORDER BY rank", (job_id, generation)).fetchall()
    return [str(row[0]) for row in rows]


def test_two_jobs_one_resized_across_nodes(server):
    data = server.data_dir
    client = server.start()
    epochs = {"r1": 4, "r2": 4}  # r1 ends first, so r2 (at most 2 replicas) keeps its 2
    r1 = client.submit(example_spec("r1", 3, epochs["r1"]))["id"]
    wait_until(lambda: finished_an_epoch(data, r1, 1), 90, "r1 to train an epoch")
    assert started(data, r1, 0)["num_replicas"] == 3
    assert len(set(launch_nodes(data, r1, 1))) == 2  # 3 replicas span both nodes
    r2 = client.submit(example_spec("r2", 2, epochs["r2"]))["id"]
    # equal shares: r1 is resized 3 -> 2 through a checkpoint, r2 gets 2
    resumed = wait_until(lambda: started(data, r1, 1), 90, "r1 to restart on 2 replicas")
    assert resumed["num_replicas"] == 2 and resumed["restored"]
    wait_until(lambda: all_final(client), 120, "both jobs to end")
    assert states(client) == {r1: "Succeeded", r2: "Succeeded"}, server.log_text()
    assert client.job(r1)["rescales"] >= 1
    records = check_sample_accounting(data, r1, epochs["r1"])
    assert {r["num_replicas"] for r in records if r["launch"] == 0} == {3}
    assert 2 in {r["num_replicas"] for r in records if r["launch"] > 0}
    check_sample_accounting(data, r2, epochs["r2"])
    assert "pollux server on" in server.log_text()
    server.stop()


def test_losing_a_node_resumes_the_job_on_the_remaining_node(server, ray_workers):
    data = server.data_dir
    client = server.start()
    epochs = 4
    job = client.submit(example_spec("n1", 2, epochs))["id"]
    wait_until(lambda: checkpointed_after_an_epoch(data, job, 1), 90,
               "the job to checkpoint after an epoch on 2 replicas")
    nodes = launch_nodes(data, job, 1)
    assert len(set(nodes)) == 2, nodes  # one replica on each worker
    lost = ray_workers.worker_by_id(nodes[1].rsplit("-", 1)[1])
    removed_at = time.time()
    ray_workers.remove_worker(lost)  # not gracefully: like a machine that crashed
    resumed = wait_until(lambda: started(data, job, 1), 90, "the job to resume")
    recovery_s = resumed["time"] - removed_at
    print(f"node loss -> job resumed from its checkpoint in {recovery_s:.1f} s")
    # from a checkpoint with progress in it; not necessarily of epoch 1: the background
    # save of epoch 0's last sync point can be written after the epoch's accuracy line
    assert resumed["restored"] and resumed["optimizer_steps"] > 0, resumed
    survivor = nodes[0]
    assert launch_nodes(data, job, 2) == [survivor, survivor]
    wait_until(lambda: all_final(client), 120, "the job to end")
    detail = client.job(job)
    assert detail["state"] == "Succeeded", server.log_text()
    assert detail["failures"] >= 1
    # the lost replica vanished, or its peer saw the collective break first and exited
    messages = [e["message"] for e in detail["events"]]
    assert any("replica " in m and ("vanished" in m or "exited with code" in m
                                    or "was killed by" in m)
               for m in messages), messages
    check_sample_accounting(data, job, epochs)
    starts = [e for e in agent_events(data, job) if e["event"] == "start"]
    assert [e["num_replicas"] for e in starts][:2] == [2, 2]
    log = (data / "jobs" / job / "logs" / "replica-1.log").read_text()
    assert "lost with its Ray actor" in log
    server.stop()


def child_pids(pid: int) -> set[int]:
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            children.update(int(c) for c in (task / "children").read_text().split())
    return children


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_without_an_address_the_server_starts_and_stops_a_local_ray(tmp_path, monkeypatch):
    ray_tmp = tempfile.mkdtemp(prefix="prl", dir="/tmp")  # short: Ray's socket paths
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    server = RayServerProcess(tmp_path / "data", None)
    ray_processes: set[int] = set()
    try:
        client = server.start()
        assert server.process is not None
        ray_processes = child_pids(server.process.pid)  # Ray's head processes
        [node] = client.nodes()
        assert node["resources"]["gpu"] == node["resources"]["cpu"] >= 1  # CPU slots
        assert "slot resource CPU" in server.log_text()
        server.stop()
        assert ray_processes and not any(is_alive(pid) for pid in ray_processes)
    finally:
        for pid in ray_processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        server.cleanup()
        shutil.rmtree(ray_tmp, ignore_errors=True)
