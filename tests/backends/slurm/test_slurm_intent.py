"""Hostile, on a real Slurm: the server dies right after sbatch accepted a two-replica
launch, before it recorded anything. The restarted server finds the work by its name,
settles the job from the replicas' exit statuses (Succeeded: both exited 0) and never
submits it again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pollux.backends.slurm.backend import SlurmBackend
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore
from tests.backends.slurm.cluster import SlurmCluster
from tests.backends.slurm.typed_share import TypedEqualSharePolicy
from tests.service.service_builders import make_spec

pytestmark = pytest.mark.timeout(180)
INSTANCE = "intentslurm001"


class ServerDied(BaseException):  # noqa: N818 - stands for a SIGKILL of the server
    pass


def _allocator(store: JobStore, backend: SlurmBackend, data_dir: Path) -> Allocator:
    return Allocator(store, backend, TypedEqualSharePolicy(), AllocatorConfig(
        data_dir=data_dir, interval_s=0.5, stop_grace_s=20.0, poll_interval_s=0.2))


def test_a_server_killed_after_sbatch_never_resubmits_the_job(slurm: SlurmCluster,
                                                              tmp_path: Path) -> None:
    data_dir, runs = tmp_path / "data", tmp_path / "runs.txt"
    store = JobStore(data_dir / "pollux.db", synchronous="OFF")
    script = (f"trap '' TERM; sleep 1; echo $POLLUX_RANK-$POLLUX_NUM_RESTARTS >> {runs}")
    job_id = store.add_job(make_spec("twice", min_replicas=2, max_replicas=2,
                                     working_dir=str(tmp_path),
                                     command=["/bin/sh", "-c", script]), time.time()).id
    backend = SlurmBackend(INSTANCE, mode="cluster")
    real_launch = backend.launch

    def launch_then_die(request):  # type: ignore[no-untyped-def]
        real_launch(request)
        raise ServerDied

    backend.launch = launch_then_die  # type: ignore[method-assign]
    allocator = _allocator(store, backend, data_dir)
    allocator.recover()
    with pytest.raises(ServerDied):
        for _ in range(100):
            allocator.tick()
            time.sleep(0.1)
    deadline = time.monotonic() + 60  # both replicas ran to their end meanwhile
    while time.monotonic() < deadline and len(_lines(runs)) < 2:
        time.sleep(0.2)
    assert len(_lines(runs)) == 2, "the replicas did not run within 60 s"
    after = SlurmBackend(INSTANCE, mode="cluster")
    allocator = _allocator(store, after, data_dir)
    allocator.recover()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not store.get_job(job_id).state.is_final:
        allocator.tick()
        time.sleep(0.2)
    record = store.get_job(job_id)
    assert record.state is JobState.SUCCEEDED, store.events(job_id)
    assert sorted(_lines(runs)) == ["0-0", "1-0"] and record.num_launches == 1
    assert not slurm.live_jobs()
    store.close()


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []
