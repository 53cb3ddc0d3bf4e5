"""Hostile: a damaged job store. One row with broken JSON or an unknown state is
skipped, with an event naming it, and every other job is still served (job list,
dashboard, /metrics, describe of the others); a store whose pages are overwritten
answers one clear error naming the store and the fix, never "503 retry" forever."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from tests.service.conftest import EQUAL_SHARE  # noqa: F401 - the fixtures' policy

SPEC = {"name": "ok", "command": ["python", "train.py"], "working_dir": "/tmp",
        "max_replicas": 1}


def _corrupt(service, job_id: str, sql: str) -> None:  # type: ignore[no-untyped-def]
    with contextlib.closing(sqlite3.connect(service.store.path)) as conn:
        conn.execute(sql, (job_id,))
        conn.commit()


@pytest.mark.parametrize("sql", [
    "UPDATE jobs SET spec='{\"name\": broken' WHERE id=?",
    "UPDATE jobs SET state='Exploded' WHERE id=?",
    "UPDATE jobs SET allocation='not json' WHERE id=?",
])
def test_a_bad_row_is_skipped_with_an_event_and_the_rest_served(client, service, sql):
    ids = [client.post("/api/jobs", json={**SPEC, "name": f"ok{i}"}).json()["id"]
           for i in range(3)]
    _corrupt(service, ids[1], sql)
    listed = client.get("/api/jobs")
    assert listed.status_code == 200, listed.text
    assert [job["id"] for job in listed.json()] == [ids[0], ids[2]]
    dashboard = client.get("/api/dashboard")
    assert dashboard.status_code == 200, dashboard.text
    assert [job["id"] for job in dashboard.json()["jobs"]] == [ids[0], ids[2]]
    metrics = client.get("/metrics")
    assert metrics.status_code in (200, 404), metrics.text  # 404: no prometheus_client
    assert client.get(f"/api/jobs/{ids[2]}").status_code == 200
    service.allocator.tick()  # the loop goes on around it
    assert client.get(f"/api/jobs/{ids[0]}").json()["state"] != "Pending"
    bad = client.get(f"/api/jobs/{ids[1]}")
    assert bad.status_code == 500 and ids[1] in bad.json()["detail"], bad.text
    assert "damaged" in bad.json()["detail"]
    events = service.store.events(ids[1])
    assert [e.kind for e in events].count("damaged") == 1, events  # once, not per read
    assert ids[1] in events[-1].message


def test_overwritten_pages_answer_one_clear_error_not_retry_forever(client, service):
    for i in range(40):
        client.post("/api/jobs", json={**SPEC, "name": f"ok{i}"})
    path = service.store.path
    with contextlib.closing(sqlite3.connect(path)) as conn:  # every page in the file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    size = path.stat().st_size
    page = 4096
    with open(path, "r+b") as handle:  # two pages past the schema's
        for number in (2, 3):
            if (number + 1) * page <= size:
                handle.seek(number * page)
                handle.write(b"\xa5" * page)
    for _ in range(3):
        response = client.get("/api/jobs")
        assert response.status_code == 500, response.text
        assert "Retry-After" not in response.headers
        detail = response.json()["detail"]
        assert str(path) in detail and "damaged" in detail and "--recover" in detail
