"""End to end on a real Slurm (issue #22), cluster mode: ``pollux server --backend slurm``
on 4 virtual nodes of two GPU types (n1, n2: 2 x t4; n3, n4: 2 x a100), one t4 GPU of n1
held by a foreign Slurm job throughout. Two real elastic jobs (examples/train_digits.py
through the API, as ``pollux submit`` sends them): the first is rescaled when the second
arrives; a node taken DOWN under the first relaunches it elsewhere; the server is
SIGKILLed and restarted mid-run; both end Succeeded with every sample once per epoch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pollux.cli.main import main
from tests.backends.slurm.cluster import SlurmCluster
from tests.service.e2e_helpers import (
    EXAMPLE,
    FINAL_STATES,
    ServerProcess,
    check_sample_accounting,
    example_spec,
    finished_an_epoch,
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


def test_two_elastic_jobs_on_slurm_rescale_node_down_and_server_restart(
        slurm: SlurmCluster, server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
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

    first = client.submit(example_spec("first", 3, epochs=24))["id"]
    wait_until(lambda: finished_an_epoch(data, first, 1), 90, "the first job's first epoch")
    second = client.submit(example_spec("second", 3, epochs=12))["id"]
    wait_until(lambda: len(launches(data, first)) >= 2 and client.job(second)["state"]
               == "Running", 90, "the first job rescaled and the second running")
    names = squeue_names(slurm)
    assert any(first in name for name in names) and any(second in name for name in names)

    # a node taken DOWN under the first job: relaunched elsewhere within a round + grace
    down = launches(data, first)[max(launches(data, first))][0]
    before = len(launches(data, first))
    taken_down_at = time.monotonic()
    slurm.scontrol("update", f"nodename={down}", "state=down", "reason=pollux-test")
    relaunched = wait_until(
        lambda: (lambda runs: runs if len(runs) > before and client.job(first)["state"]
                 == "Running" else None)(launches(data, first)),
        60, "the first job relaunched after its node went down")
    assert down not in relaunched[max(relaunched)]
    assert time.monotonic() - taken_down_at < INTERVAL_S + GRACE_S + 25

    # the server SIGKILLed and restarted: the Slurm work is found, nothing runs twice
    wait_until(lambda: finished_an_epoch(data, first, max(launches(data, first))), 60,
               "an epoch after the relaunch")
    server.kill()
    client = server.start()
    for job in (first, second):
        done = wait_until(lambda job=job: final(client, job), 180, f"{job} to end")
        assert done["state"] == "Succeeded", done["events"]
    check_sample_accounting(data, first, 24)
    check_sample_accounting(data, second, 12)
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
    assert "someone-else" in squeue_names(slurm)
