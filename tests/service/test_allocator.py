"""The allocation loop driven through the fake backend, with explicit clock values."""

from __future__ import annotations

from collections import Counter

import pytest

from pollux.backends.exit_status import exit_status_path, write_exit_status
from pollux.backends.fake import FakeBackend
from pollux.data_dir import log_dir
from pollux.jobenv import CORRUPT_CHECKPOINT_EXIT_CODE, RESCALE_EXIT_CODE
from pollux.service.loop.allocator import Allocator
from pollux.service.loop.recovery import LOST_EXIT_CODE
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore
from tests.service.service_builders import make_spec
from tests.service.service_test_policies import OvercommitPolicy


def states(store: JobStore) -> dict[str, JobState]:
    return {job.id: job.state for job in store.list_jobs()}


def test_a_job_is_launched_with_the_agent_environment(store, fake_backend, make_allocator):
    allocator = make_allocator()
    job = store.add_job(make_spec("a", max_replicas=3), now=0.0)
    allocator.tick(1.0)
    assert store.get_job(job.id).state is JobState.STARTING
    allocator.tick(1.5)
    record = store.get_job(job.id)
    assert record.state is JobState.RUNNING
    assert len(record.allocation) == 3 and record.num_launches == 1
    request = fake_backend.launches[-1]
    envs = request.environments("127.0.0.1", 29500)
    assert [e.rank for e in envs] == [0, 1, 2]
    assert request.hints_target == f"http://127.0.0.1:1/api/jobs/{job.id}/hints"
    assert all(e.hints_token == record.hints_token for e in envs)
    assert request.checkpoint_dir.endswith(f"jobs/{job.id}/checkpoint")
    assert Counter(e.node_rank for e in envs) == Counter(
        {0: record.allocation.count(record.allocation[0]),
         1: 3 - record.allocation.count(record.allocation[0])})
    assert len(store.replicas(job.id, live_only=True)) == 3


def test_arrival_rescales_the_running_job_through_a_checkpoint(store, fake_backend,
                                                                  make_allocator):
    allocator = make_allocator()
    a = store.add_job(make_spec("a"), now=0.0)
    allocator.tick(1.0)
    allocator.tick(2.0)
    assert len(store.get_job(a.id).allocation) == 4
    b = store.add_job(make_spec("b"), now=3.0)
    allocator.request_round()
    allocator.tick(3.0)
    # a was asked to checkpoint (graceful stop), its replicas exited 75 at once
    assert fake_backend.stop_requests(a.id) == [False]
    assert store.get_job(a.id).state is JobState.RESCALING
    allocator.tick(3.5)
    a_now, b_now = store.get_job(a.id), store.get_job(b.id)
    assert a_now.state is JobState.STARTING and len(a_now.allocation) == 2
    assert a_now.num_launches == 2 and a_now.num_rescales == 1 and a_now.num_failures == 0
    assert b_now.state is JobState.STARTING and len(b_now.allocation) == 2
    assert fake_backend.launches[-2].num_restarts == 1
    exits = [r.exit_code for r in store.replicas(a.id, generation=1)]
    assert exits == [RESCALE_EXIT_CODE] * 4


def test_completion_frees_slots_for_the_others(store, fake_backend, make_allocator):
    allocator = make_allocator()
    a = store.add_job(make_spec("a"), now=0.0)
    b = store.add_job(make_spec("b"), now=0.0)
    allocator.tick(1.0)
    allocator.tick(2.0)
    assert states(store) == {a.id: JobState.RUNNING, b.id: JobState.RUNNING}
    fake_backend.finish(a.id, 0)
    allocator.tick(3.0)
    assert store.get_job(a.id).state is JobState.SUCCEEDED
    allocator.tick(3.5)
    allocator.tick(4.0)
    assert len(store.get_job(b.id).allocation) == 4
    assert store.get_job(b.id).state is JobState.RUNNING


def test_a_crashed_replica_restarts_the_job_until_max_failures(store, fake_backend,
                                                                 make_allocator):
    allocator = make_allocator()
    job = store.add_job(make_spec("a", max_replicas=2, max_failures=2), now=0.0)
    allocator.tick(1.0)
    for failure in (1, 2, 3):
        allocator.tick(failure * 10.0)
        assert store.get_job(job.id).state is JobState.RUNNING
        fake_backend.exit_replica(job.id, 1, -9)
        allocator.tick(failure * 10.0 + 1)
        assert store.get_job(job.id).state is JobState.FAILING
        assert fake_backend.stop_requests(job.id) == [False]  # survivor: checkpoint, stop
        allocator.tick(failure * 10.0 + 2)
        record = store.get_job(job.id)
        assert record.num_failures == failure
        if failure <= 2:  # relaunched on the same allocation after a doubling back-off
            backoff_s = 2.0 ** (failure - 1)
            assert record.state is JobState.PENDING
            assert f"in {backoff_s:g} s" in store.events(job.id)[-1].message
            allocator.tick(failure * 10.0 + 2 + backoff_s - 0.01)
            assert store.get_job(job.id).state is JobState.PENDING
            allocator.tick(failure * 10.0 + 2 + backoff_s)
            record = store.get_job(job.id)
            assert record.state is JobState.STARTING
            assert record.num_launches == failure + 1
        if failure == 1:  # nothing saved yet; then the job checkpoints
            assert "restarting from the start (no checkpoint yet)" in store.events(job.id)[
                -2].message
            (allocator.config.data_dir / "jobs" / job.id / "checkpoint" / "c.pt").write_text("")
        elif failure == 2:
            assert "restarting from the last checkpoint" in store.events(job.id)[-2].message
    record = store.get_job(job.id)
    assert record.state is JobState.FAILED
    assert "replica 1 was killed by SIGKILL" in record.reason
    assert "max_failures=2" in record.reason


def test_launch_errors_count_as_failures(store, fake_backend, make_allocator):
    allocator = make_allocator()
    job = store.add_job(make_spec("a", max_failures=0), now=0.0)
    fake_backend.fail_next_launch = "no such program"
    allocator.tick(1.0)
    record = store.get_job(job.id)
    assert record.state is JobState.FAILED and "no such program" in record.reason


def test_corrupt_checkpoints_fail_the_job_at_once_with_the_reason(store, fake_backend,
                                                                 make_allocator):
    """Defect 9: a replica that found only corrupt checkpoints (exit 76) fails the job
    at once, saying so, instead of burning its retries."""
    allocator = make_allocator()
    job = store.add_job(make_spec("a", max_replicas=2, max_failures=5), now=0.0)
    allocator.tick(1.0)
    fake_backend.exit_replica(job.id, 0, CORRUPT_CHECKPOINT_EXIT_CODE)
    allocator.tick(2.0)
    allocator.tick(3.0)
    record = store.get_job(job.id)
    assert record.state is JobState.FAILED and record.num_launches == 1
    assert "corrupt checkpoints" in record.reason
    assert any("corrupt checkpoints" in e.message for e in store.events(job.id))


def test_cancel_pending_and_running_jobs(store, fake_backend, make_allocator):
    allocator = make_allocator()
    running = store.add_job(make_spec("a", max_replicas=4), now=0.0)
    allocator.tick(1.0)
    waiting = store.add_job(make_spec("b", min_replicas=4), now=1.0)
    store.request_cancel(waiting.id, now=2.0)
    store.request_cancel(running.id, now=2.0)
    allocator.tick(2.0)
    allocator.tick(2.5)
    assert states(store) == {running.id: JobState.CANCELLED, waiting.id: JobState.CANCELLED}
    assert fake_backend.live_jobs() == []


def test_a_cancelled_job_is_cancelling_until_its_replicas_stop(store, fake_backend,
                                                                 make_allocator):
    fake_backend.exit_on_stop = False
    allocator = make_allocator()
    job = store.add_job(make_spec("a", max_replicas=2), now=0.0)
    allocator.tick(1.0)
    store.request_cancel(job.id, now=2.0)
    allocator.tick(2.0)
    assert store.get_job(job.id).state is JobState.CANCELLING
    assert fake_backend.stop_requests(job.id) == [False]
    fake_backend.finish(job.id, RESCALE_EXIT_CODE)
    allocator.tick(3.0)
    assert store.get_job(job.id).state is JobState.CANCELLED
    kinds = [e.kind for e in store.events(job.id)]
    assert "Cancelling" in kinds and "Rescaling" not in kinds, kinds


def test_a_job_cancelled_while_rescaling_shows_cancelling(store, fake_backend, make_allocator):
    fake_backend.exit_on_stop = False
    allocator = make_allocator()
    a = store.add_job(make_spec("a"), now=0.0)
    allocator.tick(1.0)
    store.add_job(make_spec("b"), now=2.0)
    allocator.request_round()
    allocator.tick(2.0)
    assert store.get_job(a.id).state is JobState.RESCALING
    store.request_cancel(a.id, now=2.5)
    allocator.tick(2.5)
    assert store.get_job(a.id).state is JobState.CANCELLING
    fake_backend.finish(a.id, RESCALE_EXIT_CODE)
    allocator.tick(3.0)
    assert store.get_job(a.id).state is JobState.CANCELLED


def test_replicas_that_ignore_sigterm_are_killed_after_the_grace(store, fake_backend,
                                                                 make_allocator):
    fake_backend.exit_on_stop = False
    allocator = make_allocator(stop_grace_s=5.0)
    job = store.add_job(make_spec("a"), now=0.0)
    allocator.tick(1.0)
    store.request_cancel(job.id, now=2.0)
    allocator.tick(2.0)
    allocator.tick(6.0)
    assert fake_backend.stop_requests(job.id) == [False]
    allocator.tick(7.5)
    assert fake_backend.stop_requests(job.id) == [False, True]
    fake_backend.finish(job.id, -9)
    allocator.tick(8.0)
    assert store.get_job(job.id).state is JobState.CANCELLED


def test_non_preemptible_jobs_keep_their_allocation(store, fake_backend, make_allocator):
    allocator = make_allocator()
    a = store.add_job(make_spec("a", preemptible=False), now=0.0)
    allocator.tick(1.0)
    b = store.add_job(make_spec("b"), now=2.0)
    allocator.request_round()
    allocator.tick(2.0)
    allocator.tick(3.0)
    assert store.get_job(a.id).state is JobState.RUNNING
    assert len(store.get_job(a.id).allocation) == 4
    assert store.get_job(b.id).state is JobState.PENDING  # its slots are still held


def test_an_infeasible_allocation_becomes_a_job_event(store, fake_backend, make_allocator):
    allocator = make_allocator(OvercommitPolicy())
    job = store.add_job(make_spec("a", max_replicas=3), now=0.0)
    allocator.tick(1.0)
    allocator.tick(100.0)  # the same reason again: one event, not one per round
    assert store.get_job(job.id).state is JobState.PENDING
    assert fake_backend.launches == []
    events = [e.message for e in store.events(job.id) if "infeasible" in e.message]
    assert len(events) == 1 and "3 replicas on" in events[0], events


def test_recovery_stops_orphans_and_resumes_without_duplicates(store, fake_backend,
                                                                make_allocator, tmp_path):
    first = make_allocator()
    a = store.add_job(make_spec("a", max_replicas=2), now=0.0)
    b = store.add_job(make_spec("b", max_replicas=2), now=0.0)
    first.tick(1.0)
    first.tick(2.0)
    assert states(store) == {a.id: JobState.RUNNING, b.id: JobState.RUNNING}
    # the server dies; a new one starts on the same store with a fresh backend
    backend = FakeBackend(fake_backend.nodes())
    second = Allocator(store, backend, first.policy, first.config, clock=lambda: 0.0)
    second.recover(10.0)
    assert len(backend.recovered) == 4
    assert all(r.exit_code == LOST_EXIT_CODE for r in store.replicas(generation=1))
    assert states(store) == {a.id: JobState.PENDING, b.id: JobState.PENDING}
    second.tick(11.0)
    second.tick(12.0)
    for job_id in (a.id, b.id):
        record = store.get_job(job_id)
        assert record.state is JobState.RUNNING and record.num_launches == 2
        assert len(store.replicas(job_id, live_only=True)) == 2
    assert [r.job_id for r in backend.launches].count(a.id) == 1


def test_a_backend_that_still_runs_a_launch_has_it_adopted_not_relaunched(
        store, fake_backend, make_allocator):
    first = make_allocator()
    a = store.add_job(make_spec("a", max_replicas=2), now=0.0)
    b = store.add_job(make_spec("b", max_replicas=2), now=0.0)
    c = store.add_job(make_spec("c", max_replicas=2), now=0.0)
    first.tick(1.0)
    first.tick(2.0)
    assert set(states(store).values()) == {JobState.RUNNING}
    store.request_cancel(c.id, 2.5)  # being cancelled: stopped, never adopted
    fake_backend.finish(b.id, 0)  # ended while no server watched: not adopted
    for rank in (0, 1):  # (as its launcher recorded)
        write_exit_status(exit_status_path(
            log_dir(first.config.data_dir, b.id), 1, rank), 0)
    # the server dies; a new one starts on the same store and the same (Slurm-like) work
    fake_backend.adopts = True
    launches_before = len(fake_backend.launches)
    second = Allocator(store, fake_backend, first.policy, first.config, clock=lambda: 3.0)
    second.recover()
    assert {r.job_id for r in fake_backend.adopted} == {a.id, b.id}
    assert {h["job"] for h in fake_backend.recovered} == {b.id, c.id}  # the rest stopped
    record = store.get_job(a.id)
    assert record.state is JobState.RUNNING and record.num_launches == 1
    assert len(store.replicas(a.id, live_only=True)) == 2
    assert any(e.message == "server restarted: launch 1 adopted; its replicas kept "
               "running under fake" for e in store.events(a.id))
    assert store.get_job(b.id).state is JobState.SUCCEEDED  # from its exit statuses
    second.tick(4.0)
    second.tick(5.0)
    assert [r.job_id for r in fake_backend.launches[launches_before:]].count(a.id) == 0
    fake_backend.finish(a.id, 0)  # the adopted launch ends under the new server
    second.tick(6.0)
    assert store.get_job(a.id).state is JobState.SUCCEEDED
    assert [r.exit_code for r in store.replicas(a.id)] == [0, 0]


def test_shutdown_checkpoints_and_requeues(store, fake_backend, make_allocator):
    allocator = make_allocator()
    job = store.add_job(make_spec("a"), now=0.0)
    allocator.tick(1.0)
    allocator.shutdown(grace_s=1.0)
    record = store.get_job(job.id)
    assert record.state is JobState.PENDING and record.num_failures == 0
    assert [r.exit_code for r in store.replicas(job.id)] == [RESCALE_EXIT_CODE] * 4
    assert record.target_allocation == record.allocation


@pytest.mark.parametrize(("code", "counted"), [(3, True), (-9, True), (-15, False)])
def test_exits_during_a_rescale(store, fake_backend, make_allocator, code, counted):
    """A crash while stopping counts as a failure; death by our own SIGTERM (the agent
    was not ready to take it) does not: the job resumes from its last checkpoint."""
    fake_backend.exit_on_stop = False
    allocator = make_allocator()
    a = store.add_job(make_spec("a"), now=0.0)
    allocator.tick(1.0)
    store.add_job(make_spec("b"), now=2.0)
    allocator.request_round()
    allocator.tick(2.0)
    assert store.get_job(a.id).state is JobState.RESCALING
    fake_backend.finish(a.id, code)
    allocator.tick(3.0)
    if counted:
        assert store.get_job(a.id).state is JobState.PENDING  # backing off
        allocator.tick(4.0)
    record = store.get_job(a.id)
    assert record.num_failures == int(counted)
    assert record.state is JobState.STARTING and len(record.allocation) == 2


def test_a_fresh_start_over_corrupt_checkpoints_is_an_event(store, fake_backend,
                                                            make_allocator, tmp_path):
    """Defect 9, ``on_corrupt_checkpoint: fresh``: the agent sets corrupt checkpoints
    aside and starts over; the job's events say so (once)."""
    allocator = make_allocator()
    job = store.add_job(make_spec("a", on_corrupt_checkpoint="fresh"), now=0.0)
    allocator.tick(1.0)
    assert fake_backend.launches[-1].environments("h", 1)[0].on_corrupt_checkpoint == "fresh"
    checkpoint = tmp_path / "jobs" / job.id / "checkpoint"
    (checkpoint / "checkpoint-00000003.pt.corrupt").write_bytes(b"x")
    for second in (20.0, 40.0):
        allocator.request_round()
        allocator.tick(second)
    messages = [e.message for e in store.events(job.id) if "started over" in e.message]
    assert len(messages) == 1 and "checkpoint-00000003.pt.corrupt" in messages[0]


def test_the_loop_and_its_launch_supervisor_form_no_import_circle() -> None:
    """The supervisor has its own small configuration and owns its state (the loop tells
    each operation the time), so it imports nothing of the loop, not even for typing."""
    from tests.test_import_cycles import PACKAGE, import_cycles

    cycles = import_cycles(PACKAGE, type_checking=True, within="pollux.service")
    around = [sorted(c) for c in cycles
              if any(m.endswith(".allocator") or m.endswith(".launches") for m in c)]
    assert around == [], around
