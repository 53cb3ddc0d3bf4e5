"""Hostile: a server that dies at the worst instants of a launch. The replicas of a job
are started by the backend and only then recorded: a server killed in between (here:
killed right after ``backend.launch`` returned, before the loop recorded anything, and
half-way through starting a job's replicas) leaves running processes the store knew
nothing of. A restarted server must find them (stopped, never left running), record a
job whose replicas exited 0 as Succeeded, and never run it again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pollux.backends.local import MARKER_ENV, LocalBackend
from pollux.backends.processes import marked_processes
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore
from tests.service.service_builders import make_spec
from tests.service.service_test_policies import EqualSharePolicy

INSTANCE = "intent-test"


class ServerDied(BaseException):  # noqa: N818 - stands for a SIGKILL of the server
    """Raised where the server is killed: nothing after it runs."""


def _allocator(store: JobStore, backend: LocalBackend, data_dir: Path) -> Allocator:
    return Allocator(store, backend, EqualSharePolicy(), AllocatorConfig(
        data_dir=data_dir, interval_s=0.2, stop_grace_s=10.0, poll_interval_s=0.05))


def _job(store: JobStore, tmp_path: Path, runs: Path, work_s: float) -> str:
    # each replica counts its own complete run; SIGTERM is ignored, so a run once
    # started always completes (as a job with nothing left to checkpoint would)
    script = (f"trap '' TERM; echo $POLLUX_RANK >> {runs}.started; sleep {work_s}; "
              f"echo $POLLUX_RANK-$POLLUX_NUM_RESTARTS >> {runs}")
    return store.add_job(make_spec("twice", min_replicas=2, max_replicas=2,
                                   working_dir=str(tmp_path),
                                   command=["/bin/sh", "-c", script]), now=time.time()).id


def _run_until_final(store: JobStore, data_dir: Path, job_id: str) -> None:
    """A fresh server (same data dir and instance) recovers and runs until the job ends."""
    backend = LocalBackend(INSTANCE, num_nodes=1, slots_per_node=2, device="cpu")
    allocator = _allocator(store, backend, data_dir)
    try:
        allocator.recover()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not store.get_job(job_id).state.is_final:
            allocator.tick()
            time.sleep(0.05)
    finally:
        backend.close()


@pytest.mark.parametrize("work_s", [0.0, 1.0])
def test_a_server_killed_after_starting_replicas_never_reruns_the_job(tmp_path, work_s):
    """work_s 0: the replicas finished before the restart; 1: still running then."""
    data_dir, runs = tmp_path / "data", tmp_path / "runs.txt"
    store = JobStore(data_dir / "pollux.db", synchronous="OFF")
    job_id = _job(store, tmp_path, runs, work_s)
    backend = LocalBackend(INSTANCE, num_nodes=1, slots_per_node=2, device="cpu")
    real_launch = backend.launch
    orphans = []

    def launch_then_die(request):  # type: ignore[no-untyped-def]
        real_launch(request)
        orphans.extend(r.process for r in backend._jobs[request.job_id])
        raise ServerDied

    backend.launch = launch_then_die  # type: ignore[method-assign]
    allocator = _allocator(store, backend, data_dir)
    allocator.recover()
    with pytest.raises(ServerDied):
        for _ in range(50):
            allocator.tick()
            time.sleep(0.05)
    # both replicas started (then SIGTERM no longer stops them); with work_s 0 they ended
    done = runs if work_s == 0.0 else Path(f"{runs}.started")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_lines(done)) < 2:
        time.sleep(0.02)
    assert len(_lines(done)) == 2, "the replicas did not start within 60 s"
    _run_until_final(store, data_dir, job_id)
    _reap(orphans)
    record = store.get_job(job_id)
    assert record.state is JobState.SUCCEEDED, store.events(job_id)
    assert sorted(_lines(runs)) == ["0-0", "1-0"], "each replica ran exactly once"
    assert record.num_launches == 1
    assert not marked_processes(MARKER_ENV, INSTANCE), "no replica left running"
    store.close()


def test_a_server_killed_half_way_through_a_launch_leaves_nothing_running(tmp_path):
    """Killed after replica 0 started and before replica 1 did: the orphan is found and
    stopped (it completes: SIGTERM is ignored), and the job runs again as one launch."""
    data_dir, runs = tmp_path / "data", tmp_path / "runs.txt"
    store = JobStore(data_dir / "pollux.db", synchronous="OFF")
    job_id = _job(store, tmp_path, runs, 2.0)  # replica 0 outlives the checks below
    backend = LocalBackend(INSTANCE, num_nodes=1, slots_per_node=2, device="cpu")
    real_start = backend._start
    orphans = []

    def start_then_die(request, agent_env, rank, *args):  # type: ignore[no-untyped-def]
        if rank == 1:
            raise ServerDied
        replica = real_start(request, agent_env, rank, *args)
        orphans.append(replica.process)
        return replica

    backend._start = start_then_die  # type: ignore[method-assign]
    allocator = _allocator(store, backend, data_dir)
    allocator.recover()
    with pytest.raises(ServerDied):
        for _ in range(50):
            allocator.tick()
            time.sleep(0.05)
    deadline = time.monotonic() + 10  # a loaded machine may take a moment to show it
    while time.monotonic() < deadline and not marked_processes(MARKER_ENV, INSTANCE):
        time.sleep(0.02)
    assert marked_processes(MARKER_ENV, INSTANCE), "replica 0 runs, unrecorded"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _lines(Path(f"{runs}.started")):
        time.sleep(0.02)
    assert _lines(Path(f"{runs}.started")) == ["0"], "replica 0 did not start within 60 s"
    _run_until_final(store, data_dir, job_id)
    _reap(orphans)
    record = store.get_job(job_id)
    assert record.state is JobState.SUCCEEDED, store.events(job_id)
    lines = _lines(runs)
    assert sorted(lines) == ["0-0", "0-1", "1-1"], "launch 2 ran whole, once"
    assert not marked_processes(MARKER_ENV, INSTANCE)
    store.close()


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _reap(processes) -> None:  # type: ignore[no-untyped-def]
    """What init does for the processes of a dead server (they are this test's children)."""
    for process in processes:
        process.wait(timeout=10)
