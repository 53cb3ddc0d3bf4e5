"""Hostile: transient SQLite errors, a full disk and an external write lock on the job
store. Writes are retried; one that fails for good leaves the job as it was and never
reruns it; a full disk refuses the write and loses nothing; reads never wait behind a
writer."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from pollux.backends.fake import FakeBackend
from pollux.errors import StoreUnavailableError
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore
from tests.service.service_builders import make_nodes, make_spec
from tests.service.service_test_policies import EqualSharePolicy
from tests.service.store_faults import FlakyWrites

HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO meta(key, value) VALUES ('held', 'yes')")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


def test_a_transient_write_error_is_retried(tmp_path):
    store = JobStore(tmp_path / "pollux.db", synchronous="OFF")
    flaky = FlakyWrites(store, seed=1, episodes=1, rate=1.0, bursts=(2,))
    job = store.add_job(make_spec("a"), now=1.0)
    assert flaky.injected == 2
    assert [e.message for e in store.events(job.id)] == [f"accepted as {job.id}"]
    store.close()


def test_a_full_disk_refuses_the_write_naming_the_data_dir_and_loses_nothing(tmp_path):
    store = JobStore(tmp_path / "pollux.db", synchronous="OFF")
    kept = store.add_job(make_spec("kept"), now=1.0)
    flaky = FlakyWrites(store, seed=1, episodes=1, rate=1.0, bursts=(1,),
                        message="database or disk is full")
    with pytest.raises(StoreUnavailableError) as info:
        store.add_job(make_spec("lost"), now=2.0)
    assert info.value.full and str(tmp_path) in str(info.value)
    assert flaky.injected == 1
    assert [r.id for r in store.list_jobs()] == [kept.id]
    assert store.add_job(make_spec("later"), now=3.0).state is JobState.PENDING
    store.close()


def test_reads_answer_while_another_process_holds_the_write_lock(tmp_path):
    store = JobStore(tmp_path / "pollux.db", synchronous="OFF", retry_s=1.0)
    job = store.add_job(make_spec("a"), now=1.0)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "pollux.db"),
                               "4"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        writer = threading.Thread(target=lambda: _try(store.add_job, make_spec("b"), 2.0))
        writer.start()
        time.sleep(0.2)  # the writer now waits for the external lock
        worst_s = 0.0
        for _ in range(10):
            started = time.monotonic()
            assert [r.id for r in store.list_jobs()][:1] == [job.id]
            assert store.get_job(job.id).state is JobState.PENDING
            worst_s = max(worst_s, time.monotonic() - started)
            time.sleep(0.05)
        assert worst_s < 0.5, f"a read waited {worst_s:.2f} s behind a writer"
        writer.join(timeout=30)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    store.close()


def _try(call, *args):  # type: ignore[no-untyped-def]
    try:
        call(*args)
    except StoreUnavailableError:
        pass


def _drive(allocator: Allocator, backend: FakeBackend, store: JobStore, ticks: int) -> set[str]:
    """Tick as the loop does (an error in a tick is logged, the next tick runs); each
    replica that has run for two ticks exits 0, once. Returns the jobs finished."""
    seen_running: Counter[str] = Counter()
    finished: set[str] = set()
    for tick in range(ticks):
        try:
            allocator.tick(float(tick))
        except StoreUnavailableError:
            pass
        for job_id in backend.live_jobs():
            seen_running[job_id] += 1
            if seen_running[job_id] >= 2 and job_id not in finished:
                backend.finish(job_id, 0)
                finished.add(job_id)
    return finished


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_20_injected_store_errors_never_rerun_a_job_that_exited_0(tmp_path, seed):
    store = JobStore(tmp_path / "pollux.db", synchronous="OFF", retry_s=0.05)
    backend = FakeBackend(make_nodes(2, 2))
    allocator = Allocator(store, backend, EqualSharePolicy(), AllocatorConfig(
        data_dir=tmp_path, interval_s=1.0, stop_grace_s=5.0), clock=lambda: 0.0)
    ids = [store.add_job(make_spec(f"j{i}", max_replicas=1), now=0.0).id for i in range(8)]
    flaky = FlakyWrites(store, seed=seed, episodes=20, rate=0.25)
    finished = _drive(allocator, backend, store, ticks=200)
    assert flaky.episodes_left == 0 and flaky.failed_for_good > 0, "inject all 20"
    launches = Counter(request.job_id for request in backend.launches)
    for job_id in ids:
        record = store.get_job(job_id)
        assert record.state is JobState.SUCCEEDED, (job_id, store.events(job_id))
        assert launches[job_id] == 1 and record.num_failures == 0, store.events(job_id)
        assert store.events(job_id)[0].message == f"accepted as {job_id}"
    assert finished == set(ids)
    store.close()


def test_store_errors_through_a_real_local_job_run_it_once(tmp_path):
    from pollux.backends.local import LocalBackend

    store = JobStore(tmp_path / "pollux.db", synchronous="OFF", retry_s=0.05)
    backend = LocalBackend("faults", num_nodes=1, slots_per_node=2, device="cpu")
    allocator = Allocator(store, backend, EqualSharePolicy(), AllocatorConfig(
        data_dir=tmp_path / "data", interval_s=0.5, stop_grace_s=5.0, poll_interval_s=0.05))
    runs = tmp_path / "runs.txt"
    ids = [store.add_job(make_spec(f"l{i}", max_replicas=1, working_dir=str(tmp_path),
                                   command=["/bin/sh", "-c", f"sleep 1; echo l{i} >> {runs}"]),
                         now=time.time()).id for i in range(3)]
    flaky = FlakyWrites(store, seed=7, episodes=20, rate=0.3)
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline and not (
            flaky.episodes_left == 0 and all(store.get_job(j).state.is_final for j in ids)):
        try:
            allocator.tick()
        except StoreUnavailableError:
            pass
        time.sleep(0.05)
    backend.close()
    assert flaky.episodes_left == 0
    assert all(store.get_job(j).state is JobState.SUCCEEDED for j in ids), [
        store.events(j) for j in ids]
    assert sorted(Path(runs).read_text().split()) == ["l0", "l1", "l2"]
    store.close()
