"""Hostile: wall-clock steps and a slow recovery. Rounds and attained service run on a
monotonic clock (a -1 h step does not stop rounds, +1 h adds no service); a recovery
waiting on a previous server's stubborn replicas does not stop the scheduling of nodes
it is not waiting for; recovery events carry the time they happened."""

from __future__ import annotations

import threading
import time

from pollux.backends.fake import FakeBackend
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.storage.records import ReplicaRecord
from pollux.service.storage.states import JobState
from tests.service.service_builders import make_nodes, make_spec
from tests.service.service_test_policies import EqualSharePolicy


def test_wall_clock_steps_neither_stop_rounds_nor_add_service(store, fake_backend, tmp_path):
    wall, mono = [1_000_000.0], [50.0]
    allocator = Allocator(store, fake_backend, EqualSharePolicy(), AllocatorConfig(
        data_dir=tmp_path, interval_s=2.0, stop_grace_s=5.0),
        clock=lambda: wall[0], monotonic=lambda: mono[0])
    job = store.add_job(make_spec("a", max_replicas=1), now=wall[0]).id
    allocator.tick()
    mono[0] += 0.5
    allocator.tick()
    assert store.get_job(job).state is JobState.RUNNING
    service_before = store.get_job(job).attained_service_s
    rounds_before = allocator.num_rounds

    def run_for(seconds: int, step_s: float) -> None:
        for _ in range(seconds):
            wall[0] += 1.0
            mono[0] += 1.0
            allocator.tick()
        wall[0] += step_s  # the wall clock is set back or forward...
        for _ in range(seconds):  # ...and time goes on
            wall[0] += 1.0
            mono[0] += 1.0
            allocator.tick()

    run_for(5, -3600.0)
    run_for(5, +3600.0)
    rounds = allocator.num_rounds - rounds_before
    assert rounds >= 9, f"{rounds} rounds in 20 s at one per 2 s"
    gained = store.get_job(job).attained_service_s - service_before
    assert 19.0 <= gained <= 21.0, f"{gained:.0f} replica-seconds of service in 20 s"


def _previous_servers_job(store, node: str) -> str:
    """A job a dead server left running with 2 replicas on ``node``."""
    job = store.add_job(make_spec("old", max_replicas=2), now=time.time()).id
    store.transition(job, JobState.STARTING, time.time(), "launch 1",
                     allocation=(node, node), num_launches=1, started_at=time.time())
    for rank in range(2):
        store.add_replica(ReplicaRecord(job, 1, rank, node, {"fake": True, "job": job},
                                        time.time(), None, None))
    store.transition(job, JobState.RUNNING, time.time(), "running")
    return job


def test_a_slow_recovery_does_not_stop_scheduling_of_free_nodes(store, tmp_path):
    old = _previous_servers_job(store, "node-0")
    backend = FakeBackend(make_nodes(2, 2))
    backend.recover_gate = threading.Event()  # the old replicas take their whole grace
    allocator = Allocator(store, backend, EqualSharePolicy(), AllocatorConfig(
        data_dir=tmp_path, interval_s=1.0, stop_grace_s=30.0, poll_interval_s=0.05))
    stop = threading.Event()
    loop = threading.Thread(target=allocator.recover_and_run, args=(stop,), daemon=True)
    loop.start()
    try:
        new = store.add_job(make_spec("new", max_replicas=1), now=time.time()).id
        allocator.request_round()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and store.get_job(new).state is JobState.PENDING:
            time.sleep(0.05)
        record = store.get_job(new)
        assert record.state in (JobState.STARTING, JobState.RUNNING), store.events(new)
        assert record.allocation == ("node-1",)
        assert old in allocator.recovering_jobs
        assert store.get_job(old).state is JobState.RUNNING  # untouched meanwhile
        time.sleep(1.0)
        released_at = time.time()
        backend.recover_gate.set()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and old in allocator.recovering_jobs:
            time.sleep(0.05)
        assert old not in allocator.recovering_jobs
        requeued = [e for e in store.events(old) if e.message.startswith("server restarted")]
        assert requeued and requeued[0].time >= released_at, \
            "the event carries the time recovery started, not when it happened"
    finally:
        backend.recover_gate.set()
        stop.set()
        allocator.wake()
        loop.join(timeout=10)
