"""Random event sequences through the allocation loop: capacity is never exceeded, no
job ever has two live launches, every job ends, every Failed has a reason."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.backends.fake import FakeBackend
from pollux.jobenv import RESCALE_EXIT_CODE
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore
from tests.service.service_builders import make_nodes, make_spec
from tests.service.service_test_policies import EqualSharePolicy

SLOTS = 2

event = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 2), st.integers(1, 4)),
    st.tuples(st.just("tick"), st.floats(0.1, 12.0)),
    st.tuples(st.just("finish"), st.integers(0, 7), st.sampled_from([0, 1, -9])),
    st.tuples(st.just("crash"), st.integers(0, 7), st.integers(0, 3)),
    st.tuples(st.just("ack_stops"), st.sampled_from([RESCALE_EXIT_CODE, -15])),
    st.tuples(st.just("cancel"), st.integers(0, 7)),
)


def check_invariants(store: JobStore, backend: FakeBackend) -> None:
    for count in backend.live_replicas_per_node().values():
        assert count <= SLOTS
    for job in store.list_jobs():
        assert "still has live replicas" not in (job.reason or "")
        if job.state is JobState.FAILED:
            assert job.reason
        live = store.replicas(job.id, live_only=True)
        assert {r.generation for r in live} <= {job.num_launches}


@settings(max_examples=60, deadline=None)
@given(st.lists(event, max_size=40))
def test_random_event_sequences_keep_the_invariants(events):
    with tempfile.TemporaryDirectory() as tmp:
        store = JobStore(Path(tmp) / "db", synchronous="OFF")
        backend = FakeBackend(make_nodes(2, SLOTS), exit_on_stop=False)
        allocator = Allocator(store, backend, EqualSharePolicy(),
                              AllocatorConfig(Path(tmp), interval_s=5.0, stop_grace_s=8.0))
        now = 0.0
        ids: list[str] = []
        for kind, *args in events:
            if kind == "submit":
                spec = make_spec(f"j{len(ids)}", min_replicas=args[0],
                                 max_replicas=max(args[0], args[1]), max_failures=2)
                ids.append(store.add_job(spec, now).id)
                allocator.request_round()
            elif kind == "tick":
                now += args[0]
                allocator.tick(now)
            elif kind in ("finish", "crash", "cancel") and ids:
                job_id = ids[args[0] % len(ids)]
                if kind == "cancel":
                    store.request_cancel(job_id, now)
                elif job_id in backend.live_jobs():
                    if kind == "finish":
                        backend.finish(job_id, args[1])
                    else:
                        ranks = len(backend.poll(job_id))
                        backend.exit_replica(job_id, args[1] % ranks, -9)
            elif kind == "ack_stops":
                for job_id in backend.stopping_jobs():
                    backend.finish(job_id, args[0])
            check_invariants(store, backend)
        # drain: every job eventually ends once its replicas finish
        for _ in range(40):
            now += 5.0
            allocator.tick(now)
            for job_id in backend.live_jobs():
                backend.finish(job_id, 0)
            check_invariants(store, backend)
        assert all(job.state.is_final for job in store.list_jobs()), [
            (j.id, j.state, j.spec.min_replicas) for j in store.list_jobs()]
        store.close()
