"""End to end: a real ``pollux server`` (2 virtual nodes x 2 CPU slots, equal-share
policy, 1 s rounds) running the agent's example, examples/train_digits.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.service.e2e_helpers import (
    EXAMPLE,
    ServerProcess,
    agent_events,
    all_final,
    check_sample_accounting,
    checkpointed_after_an_epoch,
    example_spec,
    finished_an_epoch,
    replica_intervals,
    replica_pid,
    started,
    states,
    wait_until,
)

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not EXAMPLE.exists(), reason="needs examples/train_digits.py"),
]


@pytest.fixture
def server(tmp_path: Path):
    process = ServerProcess(tmp_path / "data")
    yield process
    process.cleanup()




def test_three_jobs_resized_and_a_killed_replica(server):
    data = server.data_dir
    client = server.start()
    epochs = {"j1": 10, "j2": 4, "j3": 3}
    j1 = client.submit(example_spec("j1", 3, epochs["j1"]))["id"]
    wait_until(lambda: started(data, j1, 0), 90, "j1 to start on 3 replicas")
    j2 = client.submit(example_spec("j2", 2, epochs["j2"]))["id"]
    # equal shares: j1 is resized 3 -> 2 through a checkpoint, j2 gets 2
    j1_resumed = wait_until(lambda: started(data, j1, 1), 90, "j1 to restart on 2 replicas")
    assert j1_resumed["num_replicas"] == 2 and j1_resumed["restored"]
    # SIGKILL one replica of j1 once it has trained and checkpointed during this launch
    wait_until(lambda: checkpointed_after_an_epoch(data, j1, 2), 60,
               "j1 to checkpoint after an epoch on 2 replicas")
    os.kill(replica_pid(data, j1, 2, 1), signal.SIGKILL)
    wait_until(lambda: started(data, j2, None), 90, "j2 to start")
    j3 = client.submit(example_spec("j3", 1, epochs["j3"]))["id"]
    wait_until(lambda: all_final(client), 180, "all jobs to end")

    jobs = {job["id"]: job for job in client.jobs()}
    assert {job_id: job["state"] for job_id, job in jobs.items()} == {
        j1: "Succeeded", j2: "Succeeded", j3: "Succeeded"}, server.log_text()
    detail = client.job(j1)
    # (>= 1: a replica of the example sometimes aborts while exiting after training; the
    # service restarts it like any crash, and the relaunch ends at once)
    assert detail["failures"] >= 1 and detail["rescales"] >= 1
    assert "replica 1 was killed by SIGKILL" in " ".join(e["message"] for e in detail["events"])
    starts = [e for e in agent_events(data, j1) if e["event"] == "start"]
    after_kill = starts[-1]
    assert after_kill["restored"] and after_kill["optimizer_steps"] > j1_resumed[
        "optimizer_steps"], "j1 did not resume from a checkpoint taken after its resize"
    assert client.job(j2)["rescales"] >= 1  # 2 -> 1 when j3 arrived
    for job_id, name in ((j1, "j1"), (j2, "j2"), (j3, "j3")):
        records = check_sample_accounting(data, job_id, epochs[name])
        assert len({r["num_replicas"] for r in records}) >= (2 if name != "j3" else 1)
    server.stop()


def test_server_sigkill_then_restart_loses_and_duplicates_nothing(server):
    data = server.data_dir
    client = server.start()
    epochs = 6
    jobs = [client.submit(example_spec(name, 2, epochs))["id"] for name in ("k1", "k2")]
    for job_id in jobs:
        wait_until(lambda job_id=job_id: finished_an_epoch(data, job_id, 1), 90,
                   f"{job_id} to train an epoch")
    server.kill()
    # a new server on the same data directory stops the orphans (they checkpoint) and
    # relaunches both jobs from their checkpoints
    client = server.start()
    wait_until(lambda: all_final(client), 180, "all jobs to end after the restart")
    assert states(client) == dict.fromkeys(jobs, "Succeeded"), server.log_text()
    for job_id in jobs:
        check_sample_accounting(data, job_id, epochs)
        intervals = replica_intervals(data, job_id)
        assert len(intervals) >= 2
        for (_, _, end), (_, next_start, _) in zip(intervals, intervals[1:]):
            assert end is not None and end <= next_start, intervals
        events = agent_events(data, job_id)
        launches = [e["launch"] for e in events if e["event"] == "start"]
        assert launches == sorted(set(launches)), events
        resumed = [e for e in events if e["event"] == "start" and e["launch"] > 0]
        # resumed from a checkpoint taken after some training; epoch == epochs when the
        # orphans finished training while no server ran (the relaunch then ends at once,
        # and the sample accounting above shows that nothing ran twice)
        assert resumed and resumed[0]["restored"] and 0 < resumed[0]["epoch"] <= epochs
    server.stop()
