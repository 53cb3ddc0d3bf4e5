"""End to end on a real Slurm (issue #22), cluster mode: ``pollux server --backend slurm``
on 4 virtual nodes of two GPU types (n1, n2: 2 x t4; n3, n4: 2 x a100), one t4 GPU of n1
held by a foreign Slurm job throughout. Two real elastic jobs (examples/train_digits.py;
the first through the API, the second through ``pollux submit``): the first is rescaled
when the second arrives; a node taken DOWN under the first relaunches it elsewhere; the
server is SIGKILLed and restarted mid-run (it adopts the running Slurm work); slurmctld
is stopped for a while (no job failed or relaunched for it); both end Succeeded with
every sample once per epoch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pollux.cli.main import main
from pollux.jobenv import JOB_ID
from tests.backends.slurm.cluster import SlurmCluster
from tests.service.e2e_helpers import (
    EXAMPLE,
    FINAL_STATES,
    ServerProcess,
    check_sample_accounting,
    checkpoint_dir,
    example_spec,
    launches,
    wait_until,
)

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not EXAMPLE.exists(), reason="needs examples/train_digits.py"),
]

TYPED_SHARE = "tests.backends.slurm.typed_share:TypedEqualSharePolicy"
TYPES = {"n1": "t4", "n2": "t4", "n3": "a100", "n4": "a100"}
INTERVAL_S = 1.0
GRACE_S = 20.0
EPOCHS = {"first": 4, "second": 2}


def latest_checkpoint(data: Path, job: str) -> int:
    """The sequence number of the job's latest checkpoint (0: none yet)."""
    return max((int(p.stem.split("-")[1]) for p in checkpoint_dir(data, job).glob(
        "checkpoint-*.pt")), default=0)


def steps_where_placed(cluster: SlurmCluster, data: Path, *jobs: str) -> bool:
    """Whether Slurm runs a step for every replica of each job's latest launch, on the
    node the job store records for that rank."""
    out = subprocess.run(["squeue", "--steps", "-h", "-o", "%j %N"], capture_output=True,
                         text=True, env=cluster.env, check=True, timeout=30).stdout
    steps = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
    for job in jobs:
        runs = launches(data, job)
        generation = max(runs)
        for rank, node in enumerate(runs[generation]):
            found = [where for name, where in steps.items()
                     if name.endswith(f"-{job}-g{generation}-r{rank}")]
            if found != [node]:
                return False
    return True


def replica_pids(job: str) -> list[int]:
    """This machine's training processes (the example) that carry ``job``'s launch
    contract."""
    marker = f"{JOB_ID}={job}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if EXAMPLE.name.encode() in cmdline and marker in environ.split(b"\0"):
                pids.append(int(proc.name))
    return pids


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def running(client: Any, *jobs: str) -> bool:
    return all(client.job(job)["state"] == "Running" for job in jobs)


def slurm_server(data_dir: Path, *extra: str) -> ServerProcess:
    server = ServerProcess(data_dir)
    server.args = [sys.executable, "-m", "pollux.cli.main", "server", "--data-dir",
                   str(data_dir), "--port", "0", "--backend", "slurm", "--interval",
                   str(INTERVAL_S), "--policy", TYPED_SHARE, "--stop-grace", str(GRACE_S),
                   *extra]
    return server


def squeue_names(cluster: SlurmCluster) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True,
                         env=cluster.env, check=True, timeout=30)
    return out.stdout.split()


def final(client: Any, job: str) -> dict[str, Any] | None:
    detail: dict[str, Any] = client.job(job)
    return detail if detail["state"] in FINAL_STATES else None


@pytest.fixture
def server(slurm: SlurmCluster, tmp_path: Path):
    process = slurm_server(tmp_path / "data")
    yield process
    process.cleanup()


def print_timeline(client: Any) -> None:
    """The jobs' events, for the test's output when it fails."""
    events = [(e["time"], job["id"], e["message"]) for job in client.jobs()
              for e in client.job(job["id"])["events"]]
    start = min((t for t, _, _ in events), default=0.0)
    for t, job, message in sorted(events):
        print(f"{t - start:7.1f} {job} {message}")


def test_two_elastic_jobs_on_slurm_rescale_node_down_and_server_restart(
        slurm: SlurmCluster, server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        run_scenario(slurm, server, capsys)
    finally:
        if server.clients and server.process is not None and server.process.poll() is None:
            print_timeline(server.clients[-1])


def run_scenario(slurm: SlurmCluster, server: ServerProcess,
                 capsys: pytest.CaptureFixture[str]) -> None:
    foreign = subprocess.run(
        ["sbatch", "--parsable", "-J", "someone-else", "-w", "n1", "--gres=gpu:t4:1",
         f"--output={server.data_dir.parent / 'foreign.out'}", "--wrap", "sleep 600"],
        capture_output=True, text=True, env=slurm.env, check=True, timeout=30).stdout.strip()
    wait_until(lambda: "RUNNING" in slurm.scontrol("show", "job", foreign), 20,
               "the foreign job to run")
    data = server.data_dir
    client = server.start()
    # the cluster as Slurm describes it: 4 nodes, their types, n1 less the foreign GPU
    nodes = {n["name"]: n for n in client.nodes()}
    assert {name: n["gpu_type"] for name, n in nodes.items()} == TYPES
    assert {name: n["resources"]["gpu"] for name, n in nodes.items()} == {
        "n1": 1, "n2": 2, "n3": 2, "n4": 2}
    assert client.health()["backend"] == "slurm"
    assert client.cluster()["num_nodes"] == 4
    assert main(["top", "--data-dir", str(data), "--json", "--iterations", "1"]) == 0
    view = json.loads(capsys.readouterr().out.splitlines()[0])
    assert [(n["name"], n["gpu_type"]) for n in view["nodes"]] == list(TYPES.items())

    first = client.submit(example_spec("first", 3, epochs=EPOCHS["first"]))["id"]
    wait_until(lambda: client.job(first)["state"] == "Running", 60, "the first job running")
    spec = example_spec("second", 3, epochs=EPOCHS["second"])  # through `pollux submit`
    assert main(["submit", "--data-dir", str(data), "--name", "second", "--max-replicas",
                 "3", "--max-failures", "5", "--workdir", spec["working_dir"], "--json",
                 "--", *spec["command"]]) == 0
    second = json.loads(capsys.readouterr().out)["id"]
    wait_until(lambda: len(launches(data, first)) >= 2 and running(client, first, second),
               90, "the first job rescaled and the second running")
    names = squeue_names(slurm)
    assert any(first in name for name in names) and any(second in name for name in names)
    # each replica runs as a Slurm step on the node the policy chose for its rank
    wait_until(lambda: steps_where_placed(slurm, data, first, second), 30,
               "every replica's step on its node")

    # a node taken DOWN under the first job (once it has a checkpoint): relaunched
    # elsewhere within a round plus the grace, resuming from that checkpoint
    wait_until(lambda: latest_checkpoint(data, first) > 0, 60, "a checkpoint of the first job")
    runs = launches(data, first)
    down, before = runs[max(runs)][0], max(runs)
    taken_down_at = time.monotonic()
    slurm.scontrol("update", f"nodename={down}", "state=down", "reason=pollux-test")
    wait_until(lambda: max(launches(data, first)) > before and running(client, first), 60,
               "the first job relaunched after its node went down")
    relaunched = launches(data, first)
    assert all(down not in relaunched[g] for g in relaunched if g > before), relaunched
    assert time.monotonic() - taken_down_at < INTERVAL_S + GRACE_S + 25

    # the server SIGKILLed and restarted: the Slurm work is found, nothing runs twice
    checkpointed = latest_checkpoint(data, first)
    wait_until(lambda: latest_checkpoint(data, first) > checkpointed, 60,
               "a checkpoint after the relaunch")
    killed_in = max(launches(data, first))
    server.kill()
    client = server.start()
    # the restarted server adopts the Slurm work still running: no stop, no relaunch
    adopted = f"server restarted: launch {killed_in} adopted"
    wait_until(lambda: any(e["message"].startswith(adopted)
                           for e in client.job(first)["events"]), 60,
               "the restarted server to adopt the first job's launch")
    assert not any(e["message"].startswith("server restarted: launch")
                   and "stopped" in e["message"] for e in client.job(first)["events"])

    # slurmctld unreachable for a while: the jobs are kept, neither failed nor relaunched
    wait_until(lambda: running(client, first), 60, "the first job running after the restart")
    before_outage = client.job(first)
    # its replicas paused meanwhile: a Slurm client takes seconds to give up on a stopped
    # controller, and the job must not end (with exit files as evidence) before that
    paused = replica_pids(first)
    assert paused, "no replica process of the first job found"
    signal_all(paused, signal.SIGSTOP)
    slurm.stop_controller()
    try:
        wait_until(lambda: any("no evidence now" in e["message"]
                               for e in client.job(first)["events"]), 90,
                   "the server to notice that Slurm is unreachable")
    finally:
        slurm.start_controller()
        signal_all(paused, signal.SIGCONT)
    assert max(launches(data, first)) == before_outage["launches"]  # not relaunched for it
    for job in (first, second):
        done = wait_until(lambda job=job: final(client, job), 180, f"{job} to end")
        assert done["state"] == "Succeeded", done["events"]
    after = client.job(first)  # (a later launch may be a rescale once the second ends)
    assert after["failures"] == before_outage["failures"], after["events"]
    check_sample_accounting(data, first, EPOCHS["first"])
    check_sample_accounting(data, second, EPOCHS["second"])
    for job in (first, second):
        for generation, placed in launches(data, job).items():
            assert len({TYPES[n] for n in placed}) == 1, (job, generation, placed)
            assert placed.count("n1") <= 1, (job, generation, placed)  # the foreign GPU
    # describe shows each launch's Slurm job id
    assert main(["describe", first, "--data-dir", str(data), "--json"]) == 0
    detail = json.loads(capsys.readouterr().out)
    assert detail["slurm_job_id"] and all(r["slurm_job_id"] == detail["slurm_job_id"]
                                          for r in detail["replicas_of_launch"])
    assert len(detail["slurm_launches"]) == len(launches(data, first))
    assert main(["describe", first, "--data-dir", str(data)]) == 0
    assert f"launch 1: {detail['slurm_launches'][0]['slurm_job_id']}" in capsys.readouterr().out
    assert "someone-else" in squeue_names(slurm)
