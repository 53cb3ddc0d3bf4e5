"""Issue 32, ``/metrics`` with registered users, hostile first: the per-job figures that
``/api/jobs`` hides from other users (goodput, batch size: read from the job's own hints)
are in a user's scrape for the jobs that user may read only; what every user sees of every
job (replicas, restarts), the cluster and the teams stay in everyone's. The server's token
and an admin's see every job's figures (the one token Prometheus scrapes with)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from pollux.service.http.api import create_app
from tests.service.service_builders import AUTH_HEADERS, make_auth
from tests.service.test_metrics import HINTS

parser = pytest.importorskip("prometheus_client.parser")

with warnings.catch_warnings():  # starlette 1.0 asks for the httpx2 fork; httpx works
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

PRIVATE = ("pollux_job_goodput_samples_per_second", "pollux_job_batch_size")
SHARED = ("pollux_job_replicas", "pollux_job_restarts_total")


def scrape(client: Any) -> dict[str, set[str]]:
    """Per-job sample name -> the jobs it is given for; other samples -> {""}."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    found: dict[str, set[str]] = {}
    for family in parser.text_string_to_metric_families(response.text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).add(sample.labels.get("job", ""))
    return found


@pytest.fixture
def world(service: Any) -> dict[str, Any]:
    """alice and bob in vision, vic an admin of vision, carol in nlp, root an admin; one
    running job each of alice and carol, both with hints (a goodput)."""
    app = create_app(service, make_auth())
    admin = TestClient(app, headers=AUTH_HEADERS)
    clients = {"server": admin}
    for name, teams, roles in (("alice", ["vision"], {}), ("bob", ["vision"], {}),
                               ("vic", ["vision"], {"team_admin": True}),
                               ("carol", ["nlp"], {}), ("root", ["ops"], {"admin": True})):
        token = admin.post("/api/users", json={"name": name, "teams": teams, **roles}
                           ).json()["token"]
        clients[name] = TestClient(app, headers={"Authorization": f"Bearer {token}"})
    jobs = {}
    for owner in ("alice", "carol"):
        response = clients[owner].post("/api/jobs", json={
            "name": owner, "command": ["true"], "working_dir": "/tmp", "max_replicas": 2})
        assert response.status_code == 201, response.text
        jobs[owner] = response.json()["id"]
    service.allocator.tick()
    for job_id in jobs.values():
        token = service.store.get_job(job_id).hints_token
        assert admin.post(f"/api/jobs/{job_id}/hints", json=HINTS,
                          headers={"Authorization": f"Bearer {token}"}).status_code == 204
    yield {"clients": clients, "jobs": jobs}
    for client in clients.values():
        client.close()


@pytest.mark.parametrize(("who", "readable"), [
    ("alice", {"alice"}), ("bob", set()), ("carol", {"carol"}), ("vic", {"alice"}),
    ("root", {"alice", "carol"}), ("server", {"alice", "carol"})])
def test_a_scrape_shows_the_private_job_figures_of_readable_jobs_only(world, who,
                                                                      readable):
    jobs = world["jobs"]
    scraped = scrape(world["clients"][who])
    for name in PRIVATE:
        assert scraped.get(name, set()) == {jobs[owner] for owner in readable}, (who, name)
    for name in SHARED:
        assert scraped[name] == set(jobs.values()), (who, name)
    assert scraped["pollux_gpus_allocated"] == {""} and "pollux_jobs" in scraped


def test_no_query_or_header_widens_a_users_scrape(world):
    bob, jobs = world["clients"]["bob"], world["jobs"]
    for params, headers in (({"job": jobs["alice"]}, {}), ({"user": "alice"}, {}),
                            ({}, {"X-Pollux-User": "alice"}), ({}, {"X-Forwarded-User": "root"})):
        text = bob.get("/metrics", params=params, headers=headers).text
        assert f'pollux_job_goodput_samples_per_second{{job="{jobs["alice"]}"}}' not in text
        assert f'pollux_job_batch_size{{job="{jobs["alice"]}"}}' not in text
