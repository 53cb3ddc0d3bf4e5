"""Hostile: a job that floods its output (``yes``) on a 64 MiB data directory (a real
tmpfs, mounted for the test). Its log stays within its budget, the disk's reserve stays
for the job store: other jobs' submits answer 201, state changes are recorded, and the
flooding job is cancelled within a round."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.service.e2e_helpers import ServerProcess, wait_until

pytestmark = pytest.mark.timeout(180)
DISK_BYTES = 64 << 20
BUDGET_BYTES = 64 << 20
"""Two parts of 32 MiB: more than the disk holds above its 8 MiB reserve (56 MiB), so the
flood meets both the rotation and the reserve."""
MARKER_ALLOWANCE = 1024
RESERVE_BYTES = 8 << 20
"""The disk reserve of a 64 MiB filesystem (replica_log.disk_reserve_bytes)."""


def free_bytes(path: Path) -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


@pytest.fixture
def small_disk(tmp_path: Path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a 64 MiB tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0700",
                           "tmpfs", str(mount_point)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def test_a_flooding_job_cannot_fill_the_disk_of_the_store(small_disk: Path) -> None:
    server = ServerProcess(small_disk, interval_s=1.0,
                           extra_args=("--log-budget", f"{BUDGET_BYTES >> 20}MiB"))
    try:
        client = server.start()
        flood = client.submit({"name": "flood", "command": ["yes", "pollux"],
                               "working_dir": "/", "resources": {"cpu": 1}})
        reserve = RESERVE_BYTES
        wait_until(lambda: free_bytes(small_disk) < reserve + (1 << 20), 60,
                   "the flood to reach the disk's reserve")
        time.sleep(1.0)  # it keeps writing: nothing more lands on the disk
        assert free_bytes(small_disk) >= reserve - (1 << 20)
        used = sum(p.stat().st_size for p in small_disk.rglob("*") if p.is_file())
        held = DISK_BYTES - free_bytes(small_disk) - used  # by files deleted but open
        assert held < 2 << 20, f"{held} B of rotated-away logs still held open"
        # the store still has room: a submit answers 201, a job runs and is recorded
        other = client.submit({"name": "other", "command": ["true"], "working_dir": "/",
                               "resources": {"cpu": 1}})
        wait_until(lambda: client.job(other["id"])["state"] == "Succeeded", 30,
                   "the other job to succeed")
        started = time.monotonic()
        client.cancel(flood["id"])
        wait_until(lambda: client.job(flood["id"])["state"] == "Cancelled", 30,
                   "the flood to be cancelled")
        cancel_s = time.monotonic() - started
        assert cancel_s < 4.0, f"cancelled after {cancel_s:.1f} s (rounds of 1 s)"
        logs = small_disk / "jobs" / flood["id"] / "logs"
        log, rotated = logs / "replica-0.log", logs / "replica-0.log.1"
        assert log.stat().st_size + rotated.stat().st_size <= BUDGET_BYTES + MARKER_ALLOWANCE
        head = log.read_bytes()[:4096].decode()
        assert "reached half its budget" in head and "replica-0.log.1" in head
        assert rotated.read_bytes()[-70:] == b"pollux\n" * 10  # whole lines, the newest
        print(f"cancelled in {cancel_s:.2f} s; log {log.stat().st_size} + "
              f"{rotated.stat().st_size} B; {free_bytes(small_disk)} B free")
        assert "of output dropped: the disk had less than" in log.read_text(errors="replace")
    finally:
        server.cleanup()
