"""The REST API through FastAPI's TestClient, on the fake backend."""

from __future__ import annotations

import json
import warnings
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pollux.service.http.api import create_app
from pollux.service.storage.states import JobState
from tests.service.service_builders import make_auth

with warnings.catch_warnings():  # starlette 1.0 asks for the httpx2 fork; httpx works
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

SPEC = {"name": "digits", "command": ["python", "train.py"], "working_dir": "/tmp",
        "max_replicas": 2}
HINTS = {"init_batch_size": 32, "max_batch_size": 512, "local_bsz_bounds": [16, 128],
         "batch_size": 64, "epoch": 1}


def test_submit_list_describe_cancel(client, service):
    created = client.post("/api/jobs", json=SPEC)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert job_id == "digits-1" and created.json()["state"] == "Pending"
    service.allocator.tick()
    rows = client.get("/api/jobs").json()
    assert [(r["id"], r["state"], r["replicas"]) for r in rows] == [(job_id, "Starting", 2)]
    detail = client.get(f"/api/jobs/{job_id}").json()
    assert detail["spec"]["name"] == "digits" and detail["launches"] == 1
    assert [e["kind"] for e in detail["events"]] == ["submitted", "Starting"]
    assert client.get("/api/jobs/digits").json()["id"] == job_id  # by unique name
    nodes = client.get("/api/nodes").json()
    assert sum(n["jobs"].get(job_id, 0) for n in nodes) == 2
    assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 202
    service.allocator.tick()
    service.allocator.tick()
    assert service.store.get_job(job_id).state is JobState.CANCELLED
    assert client.get("/api/health").json()["policy"].endswith("EqualSharePolicy")


@pytest.mark.parametrize(("body", "status", "field"), [
    (b"{not json", 400, "body"),
    (b"[1, 2]", 422, "spec"),
    (json.dumps({**SPEC, "max_replicas": -2}).encode(), 422, "max_replicas"),
    (json.dumps({**SPEC, "resources": {"gpu": "one"}}).encode(), 422, "resources.gpu"),
    (json.dumps({k: v for k, v in SPEC.items() if k != "command"}).encode(), 422, "command"),
    (json.dumps({**SPEC, "min_replicas": 5, "max_replicas": 5}).encode(), 422, "min_replicas"),
    (json.dumps({**SPEC, "resources": {"gpu": 3}}).encode(), 422, "min_replicas"),
    (f'{{"name": "x", "command": "true", "working_dir": "/", "max_replicas": {10**400}}}'
     .encode(), 422, "max_replicas"),  # 401 digits: float() overflows
    (f'{{"name": "x", "command": "true", "working_dir": "/", "restart_delay_s": {10**310}}}'
     .encode(), 422, "restart_delay_s"),
    (f'{{"name": "x", "command": "true", "working_dir": "/", "resources": {{"memory": '
     f'{10**309}}}}}'.encode(), 422, "resources.memory"),
])
def test_bad_submissions_name_the_field(client, body, status, field):
    response = client.post("/api/jobs", content=body,
                           headers={"content-type": "application/json"})
    assert response.status_code == status
    assert response.json()["field"] == field
    assert field in response.json()["detail"] or status == 400


def test_unknown_jobs_and_bad_queries(client):
    assert client.get("/api/jobs/nope").status_code == 404
    assert client.post("/api/jobs/nope/cancel").status_code == 404
    client.post("/api/jobs", json=SPEC)
    response = client.get("/api/jobs/digits-1/logs", params={"replica": "x"})
    assert response.status_code == 422 and response.json()["field"] == "replica"
    assert client.get("/api/jobs/digits-1/logs").status_code == 404  # no log yet


def test_logs_by_offset_and_tail(client, service):
    job_id = client.post("/api/jobs", json=SPEC).json()["id"]
    log = service.data_dir / "jobs" / job_id / "logs" / "replica-1.log"
    log.parent.mkdir(parents=True)
    log.write_text("line one\nline two\n")
    first = client.get(f"/api/jobs/{job_id}/logs", params={"replica": 1, "limit": 9}).json()
    assert first["text"] == "line one\n" and first["next_offset"] == 9
    rest = client.get(f"/api/jobs/{job_id}/logs",
                      params={"replica": 1, "offset": first["next_offset"]}).json()
    assert rest["text"] == "line two\n"
    tail = client.get(f"/api/jobs/{job_id}/logs", params={"replica": 1, "offset": -4}).json()
    assert tail["text"] == "two\n"


def test_token_is_required_on_every_request(make_service):
    service = make_service()
    with TestClient(create_app(service, make_auth("s3cret"))) as client:
        for method, path in [("get", "/api/health"), ("get", "/api/jobs"),
                             ("post", "/api/jobs"), ("get", "/api/nodes"),
                             ("get", "/openapi.json")]:
            response = getattr(client, method)(path)
            assert response.status_code == 401, path
            assert response.json()["field"] == "Authorization"
        wrong = client.get("/api/jobs", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        good = client.post("/api/jobs", json=SPEC, headers={"Authorization": "Bearer s3cret"})
        assert good.status_code == 201


def test_hints_need_the_jobs_own_token(make_service):
    service = make_service()
    with TestClient(create_app(service, make_auth("admin"))) as client:
        auth = {"Authorization": "Bearer admin"}
        a = client.post("/api/jobs", json=SPEC, headers=auth).json()["id"]
        b = client.post("/api/jobs", json=SPEC, headers=auth).json()["id"]
        token_a = service.store.get_job(a).hints_token
        token_b = service.store.get_job(b).hints_token
        as_a = {"Authorization": f"Bearer {token_a}"}
        assert client.post(f"/api/jobs/{b}/hints", json=HINTS, headers=as_a).status_code == 403
        assert client.post(f"/api/jobs/{b}/hints", json=HINTS).status_code == 401
        assert service.store.get_job(b).hints is None
        # a job token opens nothing else
        assert client.get("/api/jobs", headers=as_a).status_code == 401
        assert client.post(f"/api/jobs/{a}/hints", json=HINTS, headers=as_a).status_code == 204
        assert service.store.get_job(a).hints.batch_size == 64
        bad = client.post(f"/api/jobs/{b}/hints", json={"init_batch_size": 32},
                          headers={"Authorization": f"Bearer {token_b}"})
        assert bad.status_code == 422 and bad.json()["field"] == "max_batch_size"
        # a job token learns nothing about other jobs, existing or not (no enumeration)
        assert client.post("/api/jobs/zzz/hints", json=HINTS, headers=as_a).status_code == 403
        assert client.post("/api/jobs/zzz/hints", json=HINTS, headers=auth).status_code == 404
        rows = client.get("/api/jobs", headers=auth).json()
        assert [r["batch_size"] for r in rows] == [64, None]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats()
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=10), children, max_size=4), max_leaves=10)
spec_like = st.fixed_dictionaries({}, optional={
    key: json_values for key in ["name", "command", "working_dir", "env", "resources",
                                 "min_replicas", "max_replicas", "preemptible",
                                 "restart_delay_s", "max_failures", "extra"]})
hints_like = st.fixed_dictionaries({}, optional={
    key: json_values for key in ["init_batch_size", "max_batch_size", "local_bsz_bounds",
                                 "accumulation", "throughput_params", "grad_stats",
                                 "batch_size", "epoch", "progress"]})


def post_json(client: Any, path: str, body: Any, headers: dict[str, str] | None = None
              ) -> Any:
    """POST ``body`` as Python's json writes it (NaN and Infinity included)."""
    return client.post(path, content=json.dumps(body),
                       headers={"content-type": "application/json", **(headers or {})})


def check_error(response: Any, allowed: set[int]) -> None:
    assert response.status_code in allowed, (response.status_code, response.text)
    if response.status_code >= 400:
        body = response.json()
        assert body["field"], body
        assert isinstance(body["detail"], str) and body["detail"]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(spec_like, json_values))
def test_any_submission_is_accepted_or_refused_naming_a_field(client, body):
    check_error(post_json(client, "/api/jobs", body), {201, 400, 422})


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(hints_like, json_values))
def test_any_hints_are_stored_or_refused_naming_a_field(client, service, body):
    if not service.store.list_jobs():
        client.post("/api/jobs", json=SPEC)
    record = service.store.list_jobs()[0]
    response = post_json(client, f"/api/jobs/{record.id}/hints", body,
                         {"Authorization": f"Bearer {record.hints_token}"})
    check_error(response, {204, 400, 422})


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ref=st.text(min_size=1, max_size=20).filter(lambda s: s not in (".", "..")).map(
           lambda s: quote(s, safe="")),
       params=st.dictionaries(st.sampled_from(["replica", "offset", "limit"]),
                              st.text(max_size=8) | st.integers().map(str), max_size=3))
def test_malformed_paths_and_queries_get_4xx(client, ref, params):
    for response in (client.get(f"/api/jobs/{ref}/logs", params=params),
                     client.get(f"/api/jobs/{ref}"),
                     client.post(f"/api/jobs/{ref}/cancel")):
        check_error(response, {200, 202, 404, 422})
