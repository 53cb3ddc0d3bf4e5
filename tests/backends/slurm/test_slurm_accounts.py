"""Issue 32 on a real Slurm: a team's ``slurm_account`` is the account Slurm records for
its jobs' launches (``squeue -o %a``, ``scontrol show job``); a team without one is
charged to the server's ``--slurm-account``. The test Slurm keeps no accounting database
(``AccountingStorageType=accounting_storage/none``), so it records any account it is
given without checking that it exists: with slurmdbd and ``AccountingStorageEnforce``,
an account unknown to it is refused at ``sbatch``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.slurm.cluster import SlurmCluster
from tests.service.e2e_helpers import REPO, ServerProcess, wait_until

pytestmark = pytest.mark.timeout(120)

FAKE_JOB = str(REPO / "tests" / "backends" / "fake_job.py")
TEAMS = """teams:
  vision: {quota_gpus: {t4: 2, a100: 2}, slurm_account: vision-lab}
  nlp:    {quota_gpus: {t4: 2, a100: 2}}
"""


def squeue_accounts(cluster: SlurmCluster) -> dict[str, str]:
    """Slurm job name -> the account Slurm records for it."""
    out = subprocess.run(["squeue", "-h", "-o", "%j %a %i"], capture_output=True, text=True,
                         env=cluster.env, check=True, timeout=30).stdout
    return {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip()}


def slurm_job_ids(cluster: SlurmCluster, job: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%j %i"], capture_output=True, text=True,
                         env=cluster.env, check=True, timeout=30).stdout
    return [line.split()[1] for line in out.splitlines() if job in line.split()[0]]


def test_a_teams_slurm_account_is_the_account_slurm_records(slurm: SlurmCluster,
                                                             tmp_path: Path) -> None:
    teams = tmp_path / "teams.yaml"
    teams.write_text(TEAMS)
    data = tmp_path / "data"
    server = ServerProcess(data)
    server.args = [sys.executable, "-m", "pollux.cli.main", "server", "--data-dir",
                   str(data), "--port", "0", "--backend", "slurm", "--slurm-account", "ops",
                   "--interval", "1", "--policy", "quota-tiresias", "--stop-grace", "5",
                   "--teams", str(teams)]
    try:
        client = server.start()
        spec = {"command": [sys.executable, FAKE_JOB, "--steps", "72000"],
                "working_dir": str(REPO), "max_replicas": 1, "max_failures": 0}
        vision = client.submit({**spec, "name": "v"}, team="vision")["id"]
        nlp = client.submit({**spec, "name": "n"}, team="nlp")["id"]
        wait_until(lambda: all(client.job(j)["state"] == "Running" for j in (vision, nlp)),
                   60, "both jobs running on Slurm")
        accounts = squeue_accounts(slurm)
        found = {job: sorted({account for name, account in accounts.items() if job in name})
                 for job in (vision, nlp)}
        assert found == {vision: ["vision-lab"], nlp: ["ops"]}, accounts
        (slurm_id,) = slurm_job_ids(slurm, vision)
        assert "Account=vision-lab" in slurm.scontrol("show", "job", slurm_id).split()
    finally:
        server.cleanup()
