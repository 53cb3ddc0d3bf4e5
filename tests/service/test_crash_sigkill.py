"""Hostile: a real ``pollux server`` SIGKILLed at random instants while two-replica
jobs launch, run and finish (a small slice of ``bench/crash_launches.py``): every job
ends Succeeded having run in exactly one launch (counted by the job itself), and no
replica of the data directory is left running."""

from __future__ import annotations

from pathlib import Path

import pytest

from pollux.backends.local import MARKER_ENV
from pollux.backends.processes import marked_processes
from tests.service.crash_harness import run_crashes
from tests.service.e2e_helpers import ServerProcess, instance_id

pytestmark = pytest.mark.timeout(240)


def test_sigkills_at_random_instants_never_run_a_job_twice(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir, interval_s=0.5)
    try:
        report = run_crashes(
            server, tmp_path, num_jobs=6, num_kills=3, seed=3, max_pause_s=1.5,
            left_running=lambda: marked_processes(MARKER_ENV, str(instance_id(data_dir))))
    finally:
        server.cleanup()
    assert report.ok(), report.summary()
