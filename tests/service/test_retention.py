"""Hostile: a store that only grows. Finished jobs past the retention (a count and an
age) are pruned with their directories, the active ones never; an event repeated over
and over (a batch size flipping every second) is coalesced; ``/api/jobs`` and
``describe`` page by query parameters with today's shapes; the dashboard's query is
bounded however many jobs the store holds."""

from __future__ import annotations

from pathlib import Path

from pollux.data_dir import job_dir
from pollux.service.loop.retention import Retention, prune_finished
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore
from tests.service.service_builders import make_spec


def _finished(store: JobStore, data_dir: Path, count: int, now: float,
              prefix: str = "f") -> list[str]:
    ids = []
    for i in range(count):
        job_id = store.add_job(make_spec(f"{prefix}{i}"), now).id
        store.transition(job_id, JobState.CANCELLED, now + i, "cancelled")
        (job_dir(data_dir, job_id) / "logs").mkdir(parents=True)
        (job_dir(data_dir, job_id) / "logs" / "replica-0.log").write_text("old\n")
        ids.append(job_id)
    return ids


def test_finished_jobs_past_the_count_or_age_are_pruned_with_their_files(tmp_path):
    data_dir = tmp_path / "data"
    store = JobStore(data_dir / "pollux.db", synchronous="OFF")
    old = _finished(store, data_dir, 30, now=1000.0)
    active = store.add_job(make_spec("active"), 1000.0).id
    store.add_event(old[-1], 1100.0, "info", "kept")
    pruned = prune_finished(store, data_dir, 2000.0, Retention(keep_count=10, keep_s=1e9),
                            batch=7)
    assert pruned == old[:20]
    assert [r.id for r in store.list_jobs()] == [*old[20:], active]
    assert not any(job_dir(data_dir, j).exists() for j in old[:20])
    assert all(job_dir(data_dir, j).exists() for j in old[20:])
    assert store.events(old[0]) == [] and store.events(old[-1])[-1].message == "kept"
    # by age: finished at 1020..1029; 1,000 s of retention at 2,025 keeps 1025..1029
    pruned = prune_finished(store, data_dir, 2025.0, Retention(keep_count=100, keep_s=1000))
    assert pruned == old[20:25]
    assert [r.id for r in store.list_jobs()] == [*old[25:], active]
    store.close()


def test_a_flipping_batch_size_is_coalesced_not_one_event_a_second(tmp_path):
    store = JobStore(tmp_path / "pollux.db", synchronous="OFF")
    job = store.add_job(make_spec("flip"), 0.0).id
    for second in range(600):
        message = "batch size 32 -> 64" if second % 2 else "batch size 64 -> 32"
        store.add_event(job, float(second), "Batch size", message)
    assert store.count_events(job) == 3, store.events(job)  # submitted + the two flips
    flips = store.events(job)[1:]
    assert {e.repeats for e in flips} == {299} and max(e.last_time or 0 for e in flips) == 599
    store.close()


def test_jobs_and_describe_page_by_query_parameters_in_todays_shapes(client, service):
    spec = {"name": "p", "command": ["python", "train.py"], "working_dir": "/tmp",
            "max_replicas": 1}
    ids = [client.post("/api/jobs", json={**spec, "name": f"p{i}"}).json()["id"]
           for i in range(12)]
    for job_id in ids[:10]:
        client.post(f"/api/jobs/{job_id}/cancel")
    service.allocator.tick()
    everything = client.get("/api/jobs").json()
    assert [j["id"] for j in everything] == ids
    page = client.get("/api/jobs", params={"limit": 3}).json()
    assert [j["id"] for j in page] == [*ids[7:10], *ids[10:]], "active ones always listed"
    assert set(page[0]) == set(everything[0]), "the same shape"
    older = client.get("/api/jobs", params={"limit": 3, "offset": 3}).json()
    assert [j["id"] for j in older] == [*ids[4:7], *ids[10:]]
    assert client.get("/api/jobs", params={"limit": -1}).status_code == 422
    for i in range(30):
        service.store.add_event(ids[0], float(i), "info", f"note {i}")
    detail = client.get(f"/api/jobs/{ids[0]}", params={"events_limit": 5}).json()
    assert [e["message"] for e in detail["events"]] == [f"note {i}" for i in range(25, 30)]
    before = client.get(f"/api/jobs/{ids[0]}",
                        params={"events_limit": 5, "events_offset": 5}).json()
    assert [e["message"] for e in before["events"]] == [f"note {i}" for i in range(20, 25)]
    assert set(detail) == set(client.get(f"/api/jobs/{ids[0]}").json())


def test_the_dashboard_query_is_bounded(client, service):
    from pollux.service.http.dashboard import DASHBOARD_FINISHED_JOBS

    finished = _finished(service.store, service.data_dir, DASHBOARD_FINISHED_JOBS + 50,
                         now=1.0)
    active = service.store.add_job(make_spec("live"), 2.0).id
    jobs = client.get("/api/dashboard").json()["jobs"]
    assert [j["id"] for j in jobs] == [*finished[-DASHBOARD_FINISHED_JOBS:], active]
