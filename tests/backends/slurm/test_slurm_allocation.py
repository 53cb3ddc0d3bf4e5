"""Allocation mode on a real Slurm (issue #22): an ``sbatch`` script asks for 2 nodes and
starts ``pollux server --backend slurm`` inside; a real job submitted to that server runs
as job steps of the allocation (``srun --jobid``) and ends Succeeded; another, cancelled
(``pollux cancel``), leaves no step behind within the grace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pollux.client import PolluxClient, server_address
from tests.backends.slurm.cluster import SlurmCluster
from tests.service.e2e_helpers import (
    EXAMPLE,
    FINAL_STATES,
    REPO,
    check_sample_accounting,
    example_spec,
    launches,
    wait_until,
)

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not EXAMPLE.exists(), reason="needs examples/train_digits.py"),
]

TYPED_SHARE = "tests.backends.slurm.typed_share:TypedEqualSharePolicy"
SCRIPT = """#!/bin/bash
#SBATCH --job-name=pollux-server
#SBATCH --nodes=2
#SBATCH --nodelist=n3,n4
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:a100:2
exec {python} -m pollux.cli.main server --backend slurm --data-dir {data} --port 0 \\
    --interval 1 --policy {policy} --stop-grace 20
"""


def step_names(cluster: SlurmCluster) -> list[str]:
    return subprocess.run(["squeue", "--steps", "-h", "-o", "%j"], capture_output=True,
                          text=True, env=cluster.env, check=True, timeout=30).stdout.split()


def test_a_server_inside_an_allocation_runs_a_job_as_steps(slurm: SlurmCluster,
                                                           tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {**slurm.env, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    allocation = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path / 'server.out'}", f"--chdir={REPO}"],
        input=SCRIPT.format(python=sys.executable, data=data, policy=TYPED_SHARE),
        capture_output=True, text=True, env=env, check=True, timeout=30).stdout.strip()

    def server() -> dict[str, Any] | None:
        try:
            record: dict[str, Any] = json.loads((data / "server.json").read_text())
        except (OSError, ValueError):
            return None
        return record

    def server_log() -> str:
        path = tmp_path / "server.out"
        return path.read_text(errors="replace") if path.exists() else ""

    record = wait_until(server, 60, "the server inside the allocation")
    with PolluxClient(server_address(record)) as client:
        nodes = {n["name"]: (n["gpu_type"], n["resources"]["gpu"]) for n in client.nodes()}
        assert nodes == {"n3": ("a100", 2), "n4": ("a100", 2)}, server_log()
        job = client.submit(example_spec("inside", 2, epochs=1))["id"]
        doomed = client.submit(example_spec("doomed", 1, epochs=50))["id"]
        wait_until(lambda: client.job(doomed)["state"] == "Running", 60, "the doomed job")
        cancelled_at = time.monotonic()
        client.cancel(doomed)  # as `pollux cancel` does: its step ends within the grace
        wait_until(lambda: client.job(doomed)["state"] == "Cancelled", 30, "the cancel")
        assert not [line for line in step_names(slurm) if doomed in line]
        assert time.monotonic() - cancelled_at < 20 + 5
        detail = wait_until(lambda: (lambda d: d if d["state"] in FINAL_STATES else None)(
            client.job(job)), 120, "the job to end")
        assert detail["state"] == "Succeeded", (detail["events"], server_log())
        assert detail["slurm_job_id"] == allocation
        for rank in range(2):  # pollux logs: each replica's output, as on any backend
            text = client.logs(job, rank)["text"]
            assert f"launch 1, rank {rank} of 2" in text and f"Slurm job {allocation}" in text
        assert "accuracy" in client.logs(job, 0)["text"]
        for replica in detail["replicas_of_launch"]:  # steps named after the job
            assert replica["slurm_step"].endswith(
                f"-{job}-g{detail['launches']}-r{replica['rank']}"), replica
    check_sample_accounting(data, job, 1)
    assert all(set(nodes) <= {"n3", "n4"} for nodes in launches(data, job).values())
    steps = (data / "jobs" / job / "logs").glob("srun-launch-*.out")
    assert list(steps), "each replica's srun output is kept under the job's log dir"
