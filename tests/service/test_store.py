"""The SQLite job store: transactions, legal transitions, durability across reopen."""

from __future__ import annotations

import sqlite3

import pytest

from pollux.errors import StoreError, UnknownJobError
from pollux.models.hints import JobHints
from pollux.service.storage.records import ReplicaRecord
from pollux.service.storage.states import ALLOWED_TRANSITIONS, JobState
from pollux.service.storage.store import JobStore
from tests.service.service_builders import make_spec


def test_jobs_get_ids_tokens_and_events(store):
    a = store.add_job(make_spec("train"), now=1.0)
    b = store.add_job(make_spec("train"), now=2.0)
    assert (a.id, b.id) == ("train-1", "train-2")
    assert a.hints_token != b.hints_token and len(a.hints_token) >= 24
    assert [e.kind for e in store.events(a.id)] == ["submitted"]
    with pytest.raises(UnknownJobError, match="several jobs"):
        store.find_job("train")
    assert store.find_job("train-2") == b
    with pytest.raises(UnknownJobError):
        store.get_job("nope")


def test_illegal_transitions_are_refused_and_change_nothing(store):
    job = store.add_job(make_spec("a"), now=1.0)
    with pytest.raises(StoreError, match="illegal transition"):
        store.transition(job.id, JobState.RUNNING, 2.0, "skip starting")
    with pytest.raises(StoreError, match="reason"):
        store.transition(job.id, JobState.FAILED, 2.0, "no reason")
    assert store.get_job(job.id) == job
    assert len(store.events(job.id)) == 1


def test_every_final_state_is_final():
    for state in JobState:
        assert state.is_final == (not ALLOWED_TRANSITIONS[state])


def test_a_failed_transaction_rolls_back(store):
    job = store.add_job(make_spec("a"), now=1.0)
    with pytest.raises(StoreError):
        store.update_job(job.id, 2.0, event="x", no_such_column=1)
    assert store.get_job(job.id).updated_at == 1.0
    assert len(store.events(job.id)) == 1


def test_state_survives_reopening_and_uses_wal(tmp_path):
    path = tmp_path / "db.sqlite"
    first = JobStore(path)
    job = first.add_job(make_spec("a"), now=1.0)
    first.transition(job.id, JobState.STARTING, 2.0, "launch", allocation=("n0", "n1"),
                     num_launches=1)
    first.add_replica(ReplicaRecord(job.id, 1, 0, "n0", {"pid": 12}, 2.0, None, None))
    first.set_hints(job.id, JobHints(32, 64, (16, 32)), 3.0)
    # no close(): as if the process died
    second = JobStore(path)
    record = second.get_job(job.id)
    assert record.state is JobState.STARTING and record.allocation == ("n0", "n1")
    assert record.hints == JobHints(32, 64, (16, 32))
    assert second.replicas(live_only=True)[0].handle == {"pid": 12}
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    first.close()
    second.close()


def test_cancel_of_a_final_job_is_a_no_op(store):
    job = store.add_job(make_spec("a"), now=1.0)
    store.transition(job.id, JobState.CANCELLED, 2.0, "cancelled")
    assert not store.request_cancel(job.id, 3.0).cancel_requested
