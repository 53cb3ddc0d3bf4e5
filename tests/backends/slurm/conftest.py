"""A real Slurm for the tests of this directory: started once per test session (in a
temporary directory, on free ports) by the first test that needs it, stopped at the
end; skipped with the reason when Slurm is not installed here."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.slurm.cluster import SlurmCluster, why_unavailable


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reason = why_unavailable()
    if reason is not None:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="pollux-slurm-"))
    root.chmod(0o755)  # munged (user munge) must reach its socket under it
    try:
        cluster = SlurmCluster(root).start()  # stops what it started when it fails
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
          ) -> Iterator[SlurmCluster]:
    """The session's Slurm, reachable through ``SLURM_CONF``; every node back in service
    and every job cancelled after the test."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    yield slurm_cluster
    slurm_cluster.reset()
