"""Hostile: a launch ends only on the backend's evidence. A replica the backend reports
UNKNOWN, a poll that raises BackendError, a launch the backend knows nothing of and a
store write that fails while recording the end never fail or relaunch a job."""

from __future__ import annotations

import sqlite3
from typing import Any

from pollux.service.storage.states import JobState
from tests.service.service_builders import make_spec


def _events(store: Any, job_id: str) -> str:
    return " | ".join(e.message for e in store.events(job_id))


def _running_job(store: Any, allocator: Any, name: str = "a") -> str:
    job = store.add_job(make_spec(name, max_replicas=1), now=0.0)
    allocator.tick(1.0)
    allocator.tick(1.5)
    assert store.get_job(job.id).state is JobState.RUNNING
    return job.id


def test_an_unknown_replica_is_neither_ended_nor_failed(store, fake_backend, make_allocator):
    allocator = make_allocator()
    job = _running_job(store, allocator)
    fake_backend.finish(job, 0)
    fake_backend.lose_track(job, 0)  # it exited, but the backend cannot tell
    for t in range(2, 12):
        allocator.tick(float(t))
    record = store.get_job(job)
    assert record.state is JobState.RUNNING and record.num_failures == 0
    assert len(fake_backend.launches) == 1
    assert _events(store, job).count("no evidence now of replica 0") == 1
    fake_backend.lose_track(job, 0, lost=False)
    allocator.tick(12.0)
    assert store.get_job(job).state is JobState.SUCCEEDED
    assert len(fake_backend.launches) == 1


def test_a_failing_poll_is_retried_not_judged(store, fake_backend, make_allocator):
    allocator = make_allocator()
    job = _running_job(store, allocator)
    fake_backend.finish(job, 0)
    fake_backend.poll_errors = 5
    for t in range(2, 7):
        allocator.tick(float(t))
    assert store.get_job(job).state is JobState.RUNNING
    assert "cannot tell now" in _events(store, job)
    allocator.tick(7.0)
    record = store.get_job(job)
    assert record.state is JobState.SUCCEEDED and record.num_failures == 0
    assert len(fake_backend.launches) == 1


def test_a_job_the_backend_knows_nothing_of_has_not_vanished(store, fake_backend,
                                                             make_allocator):
    allocator = make_allocator()
    job = _running_job(store, allocator)
    fake_backend.forget(job)
    for t in range(2, 12):
        allocator.tick(float(t))
    record = store.get_job(job)
    assert record.state is JobState.RUNNING and record.num_failures == 0, _events(store, job)
    assert len(fake_backend.launches) == 1
    assert "vanished" not in _events(store, job)
    assert _events(store, job).count("no record of its replicas") == 1


def test_a_failed_write_of_succeeded_never_relaunches(store, fake_backend, make_allocator,
                                                       monkeypatch):
    allocator = make_allocator()
    job = _running_job(store, allocator)
    fake_backend.finish(job, 0)
    real = store.transition
    failures = {"left": 3}

    def flaky(job_id: str, target: JobState, *args: Any, **kwargs: Any) -> Any:
        if target is JobState.SUCCEEDED and failures["left"] > 0:
            failures["left"] -= 1
            raise sqlite3.OperationalError("database is locked")
        return real(job_id, target, *args, **kwargs)

    monkeypatch.setattr(store, "transition", flaky)
    for t in range(2, 10):
        try:
            allocator.tick(float(t))
        except sqlite3.OperationalError:
            pass  # the loop logs it and ticks again
    record = store.get_job(job)
    assert record.state is JobState.SUCCEEDED, _events(store, job)
    assert record.num_failures == 0 and len(fake_backend.launches) == 1


def test_a_launch_that_raises_is_a_failed_launch_not_a_vanished_replica(
        store, fake_backend, make_allocator, monkeypatch):
    allocator = make_allocator()
    job = store.add_job(make_spec("a", max_replicas=1), now=0.0)
    real = fake_backend.launch
    calls = {"n": 0}

    def launch(request: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(24, "Too many open files")
        return real(request)

    monkeypatch.setattr(fake_backend, "launch", launch)
    allocator.tick(1.0)
    allocator.tick(1.5)
    assert "vanished" not in _events(store, job.id)
    assert "launch failed" in _events(store, job.id)
    for t in range(3, 8):
        allocator.tick(float(t))
    fake_backend.finish(job.id, 0)
    allocator.tick(8.0)
    assert store.get_job(job.id).state is JobState.SUCCEEDED
