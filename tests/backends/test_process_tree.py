"""Hostile: a replica that leaves processes behind, outside its process group and
session (``setsid``, a cleared environment too). None of them outlives the replica's
end: not a graceful stop, not a forced one, not the command's own exit, and its slot is
shown free only once they are gone."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from pollux.backends.base import LaunchRequest, ReplicaState
from pollux.backends.local import LocalBackend
from pollux.backends.processes import is_alive
from pollux.job_spec import JobSpec

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc")

ESCAPER = """
import os, subprocess, sys, time
out = sys.argv[1]
pids = [
    # its own session and process group: killpg of the replica misses it
    subprocess.Popen(["sleep", "300"], start_new_session=True).pid,
    # and with an empty environment: no marker variable either
    subprocess.Popen(["sleep", "301"], start_new_session=True, env={}).pid,
]
# a double fork: orphaned at once (reparented to the nearest subreaper, or init)
if os.fork() == 0:
    os.setsid()
    child = subprocess.Popen(["sleep", "302"])
    with open(out + ".orphan", "w") as handle:
        handle.write(str(child.pid))
    os._exit(0)
with open(out + ".tmp", "w") as handle:
    handle.write(" ".join(map(str, pids)))
while not os.path.exists(out + ".orphan"):
    time.sleep(0.01)
os.rename(out + ".tmp", out)
if sys.argv[2] == "exit":
    sys.exit(0)
time.sleep(300)
"""


def launch(tmp_path: Path, backend: LocalBackend, how: str) -> Path:
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER)
    out = tmp_path / f"pids-{how}"
    spec = JobSpec.from_dict({"name": "esc", "command": [sys.executable, str(script),
                                                         str(out), how],
                              "working_dir": str(tmp_path)})
    backend.launch(LaunchRequest(job_id=f"esc-{how}", generation=1, spec=spec,
                                 allocation=("node-0",), checkpoint_dir=str(tmp_path / "c"),
                                 log_dir=str(tmp_path / f"logs-{how}")))
    deadline = time.monotonic() + 30
    while not out.exists():
        assert time.monotonic() < deadline, "the replica did not start its processes"
        time.sleep(0.05)
    return out


def left_behind(out: Path) -> list[int]:
    pids = [int(p) for p in out.read_text().split()]
    pids.append(int(Path(f"{out}.orphan").read_text()))
    return pids


def wait_ended(backend: LocalBackend, job_id: str) -> None:
    deadline = time.monotonic() + 30
    while not all(s.state is ReplicaState.EXITED for s in backend.poll(job_id)):
        assert time.monotonic() < deadline, f"{job_id} did not end"
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["stop", "force", "exit"])
def test_nothing_a_replica_started_outlives_it(tmp_path, instance_id, how):
    backend = LocalBackend(instance_id, num_nodes=1, slots_per_node=1, device="cpu")
    out = launch(tmp_path, backend, how)
    pids = left_behind(out)
    assert all(is_alive(pid) for pid in pids) or how == "exit"
    if how == "stop":
        backend.stop(f"esc-{how}")
    elif how == "force":
        backend.stop(f"esc-{how}", force=True)
    wait_ended(backend, f"esc-{how}")
    deadline = time.monotonic() + 5  # SIGKILL is delivered at once; reaping may lag
    while any(is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if is_alive(pid)] == [], "processes outlived the replica"
    assert backend.nodes()[0].resources["gpu"] == 1.0
    backend.release(f"esc-{how}")
    backend.launch(LaunchRequest(  # the slot shown free is free
        job_id="next-1", generation=1, spec=JobSpec.from_dict(
            {"name": "next", "command": ["true"], "working_dir": str(tmp_path)}),
        allocation=("node-0",), checkpoint_dir=str(tmp_path / "c2"),
        log_dir=str(tmp_path / "logs-next")))
    wait_ended(backend, "next-1")
