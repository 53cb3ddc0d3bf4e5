"""Hostile inputs against the service: what a malicious job, a local user or a web page
in a browser could send. Each test names the defect of issue #13 it guards against;
every one failed on the service before that issue was fixed."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pollux.errors import JobSpecError
from pollux.models.hints import JobHints
from pollux.service.http.api import MAX_BODY_BYTES, create_app
from pollux.service.http.auth import ApiAuth, allowed_hosts_for
from pollux.service.http.sessions import cookie_name
from pollux.service.storage.store import JobStore
from tests.address_space import address_space_limited
from tests.service.service_builders import AUTH_HEADERS, TEST_TOKEN, make_auth, make_spec
from tests.service.store_faults import write_stored_hints

with warnings.catch_warnings():  # starlette 1.0 asks for the httpx2 fork; httpx works
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

SPEC = {"name": "evil", "command": ["sh", "-c", "id > proof"], "working_dir": "/tmp"}
HINTS = {"init_batch_size": 32, "max_batch_size": 512, "local_bsz_bounds": [16, 128]}


@pytest.fixture
def service(make_service):
    return make_service()


@pytest.fixture
def client(service):
    with TestClient(create_app(service, make_auth())) as test_client:
        yield test_client


# --- defect 2: nobody gets in uninvited --------------------------------------------------

@pytest.mark.parametrize(("method", "path"), [
    ("get", "/api/health"), ("get", "/api/jobs"), ("post", "/api/jobs"),
    ("get", "/api/nodes"), ("get", "/api/cluster"), ("get", "/api/jobs/x"),
    ("post", "/api/jobs/x/cancel"), ("get", "/api/jobs/x/logs"), ("get", "/openapi.json"),
    ("get", "/docs"), ("get", "/"), ("get", "/metrics")])
def test_every_route_needs_the_token_on_loopback_too(client, method, path):
    response = getattr(client, method)(path)
    assert response.status_code == 401, (path, response.text)
    assert response.json()["field"] == "Authorization"
    wrong = getattr(client, method)(path, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


def test_a_cross_site_form_post_cannot_submit(client, service):
    """A page in the user's browser posts a text/plain 'form' (no preflight): refused
    for its missing token and, even with one, for its content type."""
    form = client.post("/api/jobs", content=json.dumps(SPEC),
                       headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert form.status_code in (401, 403)
    for content_type in ("text/plain", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", None):
        headers = dict(AUTH_HEADERS)
        if content_type is not None:
            headers["Content-Type"] = content_type
        response = client.post("/api/jobs", content=json.dumps(SPEC).encode(), headers=headers)
        assert response.status_code == 415, (content_type, response.text)
        assert response.json()["field"] == "Content-Type"
    assert service.store.list_jobs() == []
    ok = client.post("/api/jobs", json={**SPEC, "command": ["true"]}, headers=AUTH_HEADERS)
    assert ok.status_code == 201


def test_foreign_host_and_origin_are_refused(client):
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 sends
    Host: evil.example -- refused even with a valid token."""
    rebound = client.get("/api/jobs", headers={**AUTH_HEADERS, "Host": "evil.example:8470"})
    assert rebound.status_code == 400 and rebound.json()["field"] == "Host"
    foreign = client.get("/api/jobs", headers={**AUTH_HEADERS, "Origin": "http://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["field"] == "Origin"
    assert client.get("/api/jobs", headers=AUTH_HEADERS).status_code == 200


@pytest.mark.parametrize(("bind", "advertise", "host", "ok"), [
    ("127.0.0.1", None, "127.0.0.1:8470", True), ("127.0.0.1", None, "localhost:8470", True),
    ("127.0.0.1", None, "[::1]:8470", True), ("127.0.0.1", None, "evil.example:8470", False),
    ("127.0.0.1", None, "10.0.0.1:8470", False), ("10.0.0.5", None, "10.0.0.5", True),
    ("10.0.0.5", None, "localhost", False), ("0.0.0.0", None, "192.168.1.9:8470", True),
    ("0.0.0.0", "head.example", "head.example:8470", True),
    ("0.0.0.0", None, "evil.example:8470", False), ("127.0.0.1", None, "", False)])
def test_host_rule(bind, advertise, host, ok):
    assert ApiAuth("t", allowed_hosts_for(bind, advertise)).accepts_host(host) is ok


def test_hints_route_does_not_reveal_which_jobs_exist(client, service):
    job_id = client.post("/api/jobs", json=SPEC, headers=AUTH_HEADERS).json()["id"]
    token = service.store.get_job(job_id).hints_token
    other = client.post("/api/jobs", json=SPEC, headers=AUTH_HEADERS).json()["id"]
    as_job = {"Authorization": f"Bearer {token}"}
    answers = {ref: client.post(f"/api/jobs/{ref}/hints", json=HINTS, headers=as_job)
               for ref in (other, "evil-99", "nope")}
    assert {ref: r.status_code for ref, r in answers.items()} == dict.fromkeys(answers, 403)
    assert len({r.json()["detail"].replace(ref, "") for ref, r in answers.items()}) == 1
    guesses = {ref: client.post(f"/api/jobs/{ref}/hints", json=HINTS).status_code
               for ref in (other, "nope")}
    assert guesses == {other: 401, "nope": 401}


SESSION_COOKIE = cookie_name(("http", "testserver", 80))


def test_a_token_link_sets_a_strict_cookie_for_browsers(client):
    """How a browser (the dashboard) logs in: ``?token=`` once, then a session cookie of
    its own (never the token: issue 23) and the page's CSRF token."""
    assert client.get("/api/jobs?token=wrong", follow_redirects=False).status_code == 401
    link = client.get(f"/api/jobs?token={TEST_TOKEN}&x=1", follow_redirects=False)
    assert link.status_code == 303 and link.headers["location"] == "/api/jobs?x=1"
    cookie = link.headers["set-cookie"].lower()
    assert f"{SESSION_COOKIE}=" in cookie and "httponly" in cookie
    assert "samesite=strict" in cookie and TEST_TOKEN not in cookie
    session = link.cookies[SESSION_COOKIE]
    # the client's jar may already hold the cookie for the test host (httpx2 keeps
    # a redirect's cookies): start from an empty jar so that only the cookie set here
    # is sent
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, session)
    assert client.get("/").status_code == 200
    assert client.get("/api/jobs").status_code == 403  # no CSRF token: pages only
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, "forged")
    assert client.get("/").status_code == 401


@pytest.mark.parametrize(("change", "field"), [
    ({"name": "evil\n"}, "name"),
    ({"name": "../../etc"}, "name"),
    ({"env": {"PATH\n": "/tmp"}}, "env.'PATH\\n'"),
    ({"env": {"LD_PRELOAD": "x" * (130 << 10)}}, "env"),
    ({"env": {"POLLUX_HINTS_TOKEN": "stolen"}}, "env.POLLUX_HINTS_TOKEN"),
    ({"command": ["sh", "-c", "x" * (130 << 10)]}, "command"),
    ({"command": ["sh\x00", "-c", "id"]}, "command"),
    ({"working_dir": "tmp"}, "working_dir"),
    ({"max_replicas": 10**30}, "max_replicas"),
    ({"restart_delay_s": float("inf")}, "restart_delay_s"),
    ({"resources": {"gpu": 1, "memory": "9" * 400}}, "resources.memory"),
    ({"__proto__": {}}, "__proto__"),
])
def test_hostile_submits_are_refused_naming_the_field(client, service, change, field):
    body = json.dumps({**SPEC, **change}).replace("Infinity", "1e999")
    response = client.post("/api/jobs", content=body, headers={
        **AUTH_HEADERS, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert service.store.list_jobs() == []


# --- defect 6 and 10: bodies that exhaust memory or the parser ---------------------------

def run_asgi(app: Any, method: str, path: str, chunks: Any, headers: list[tuple[bytes, bytes]]
             ) -> tuple[int, dict[str, Any]]:
    """One request straight through the ASGI app, its body sent chunk by chunk."""
    sent: list[dict[str, Any]] = []
    iterator = iter(chunks)

    async def receive() -> dict[str, Any]:
        chunk = next(iterator, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("127.0.0.1", 8470),
             "client": ("127.0.0.1", 5000), "headers": headers}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body)


def test_a_huge_chunked_body_is_cut_off_at_the_limit(service):
    """400 MiB sent chunked (no Content-Length): reading stops just past the limit."""
    chunk = b"x" * (64 << 10)
    consumed = []

    def endless() -> Any:
        for _ in range((400 << 20) // len(chunk)):
            consumed.append(len(chunk))
            yield chunk

    status, body = run_asgi(create_app(service, make_auth()), "POST", "/api/jobs", endless(),
                            [(b"host", b"testserver"), (b"transfer-encoding", b"chunked"),
                             (b"content-type", b"application/json"),
                             (b"authorization", f"Bearer {TEST_TOKEN}".encode())])
    assert status == 413 and body["field"] == "body"
    assert sum(consumed) <= MAX_BODY_BYTES + len(chunk)


@pytest.mark.parametrize("depth", [100, 5000, 200000])
def test_deeply_nested_json_is_a_400(client, depth):
    body = "[" * depth + "]" * depth
    for path in ("/api/jobs", "/api/jobs/evil-1/hints"):
        response = client.post(path, content=body, headers={
            **AUTH_HEADERS, "Content-Type": "application/json"})
        assert response.status_code in (400, 413), (path, response.text)
        assert response.json()["field"] == "body"


# --- defect 3: the store and the token are private ---------------------------------------

def test_store_files_are_private_even_in_an_open_directory(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    old = os.umask(0o022)
    try:
        store = JobStore(data_dir / "pollux.db")
        store.add_job(make_spec(), 0.0)
        store.close()
    finally:
        os.umask(old)
    for name in ("pollux.db", "pollux.db-wal", "pollux.db-shm"):
        path = data_dir / name
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, name


def test_an_open_data_directory_is_made_private(tmp_path, caplog):
    from pollux.service.runner import data_dir_lock

    data_dir = tmp_path / "shared"
    data_dir.mkdir()
    data_dir.chmod(0o777)
    (data_dir / "pollux.db").touch(mode=0o644)
    (data_dir / "pollux.db").chmod(0o644)
    with data_dir_lock(data_dir):
        pass
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert "open to other users" in caplog.text
    assert stat.S_IMODE((data_dir / "server.lock").stat().st_mode) == 0o600


def test_an_open_directory_of_other_files_is_refused_not_chmodded(tmp_path):
    """``--data-dir /`` (or a home or shared folder) must not be made 0700: that locks
    every other user out of it. It is refused, naming the fix, and left as it was."""
    from pollux.errors import ConfigError
    from pollux.service.runner import data_dir_lock

    shared = tmp_path / "project"
    shared.mkdir()
    shared.chmod(0o755)
    (shared / "notes.txt").write_text("someone else's")
    with pytest.raises(ConfigError, match="directory of its own"), data_dir_lock(shared):
        pass
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert sorted(p.name for p in shared.iterdir()) == ["notes.txt"]


def test_files_written_beside_the_store_are_private(tmp_path):
    from pollux.service.config import HttpConfig, ServerConfig
    from pollux.service.runner import write_server_file

    old = os.umask(0o022)
    try:
        write_server_file(ServerConfig(data_dir=tmp_path, http=HttpConfig(token="t")), "http://127.0.0.1:1")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "server.json").stat().st_mode) == 0o600



# --- defect 10: a reference means one job -------------------------------------------------

def test_job_ids_and_names_never_collide(store):
    """A job named like another job's id could shadow it (``describe x-1`` / ``cancel
    x-1`` took whichever came first); now neither direction can happen."""
    first = store.add_job(make_spec("x"), 0.0)
    assert first.id == "x-1"
    with pytest.raises(JobSpecError) as info:
        store.add_job(make_spec("x-1"), 1.0)  # would be found under x-1 as well
    assert info.value.field == "name"
    named = store.add_job(make_spec("x-3"), 2.0)  # seq 2 or 3: no clash yet
    later = [store.add_job(make_spec("x"), 3.0 + i) for i in range(3)]
    ids = {first.id, named.id, *(job.id for job in later)}
    names = {"x", "x-3"}
    assert not ids & names, ids
    assert store.find_job("x-3").id == named.id


# --- defect 1: no job can stall the cluster -----------------------------------------------

finite = st.floats(0.0, 1e6, allow_nan=False)
extreme_number = st.one_of(st.integers(-2**70, 2**70), st.floats(), st.booleans(),
                           st.text(max_size=4), st.none())
valid_params = st.fixed_dictionaries({
    "alpha_c": finite, "beta_c": finite, "alpha_n": finite, "beta_n": finite,
    "alpha_r": finite, "beta_r": finite, "gamma": st.floats(1.0, 10.0)})
in_bounds_hints = st.fixed_dictionaries(
    {"init_batch_size": st.integers(1, 2**30), "max_batch_size": st.integers(1, 2**30),
     "local_bsz_bounds": st.lists(st.integers(1, 2**30), min_size=2, max_size=2)},
    optional={"accumulation": st.booleans(), "throughput_params": valid_params,
              "grad_stats": st.fixed_dictionaries({"sqr": st.floats(0, 1e30),
                                                   "var": st.floats(0, 1e30)}),
              "max_profiled_replicas": st.integers(0, 2**30),
              "batch_size": st.integers(1, 2**30), "local_bsz": st.integers(1, 2**30),
              "accum_steps": st.integers(0, 2**30), "epoch": st.integers(0, 2**30),
              "progress": st.floats(0, 1e18)})
stored_junk = st.dictionaries(
    st.sampled_from(["init_batch_size", "max_batch_size", "local_bsz_bounds",
                     "throughput_params", "grad_stats", "batch_size", "local_bsz", "x"]),
    st.one_of(extreme_number, st.lists(extreme_number, max_size=3),
              st.dictionaries(st.sampled_from(["alpha_c", "gamma", "sqr", "var"]),
                              extreme_number, max_size=4)), max_size=8)


@pytest.fixture
def pollux_service(make_service, fake_backend):
    service = make_service(policy="pollux")
    for name in ("a", "b", "c"):
        service.submit({"name": name, "command": ["true"], "working_dir": "/tmp",
                        "max_replicas": 4})
    return service


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hints=st.lists(st.one_of(in_bounds_hints, stored_junk), min_size=1, max_size=3))
def test_no_hints_stall_the_allocation_loop(pollux_service, hints):
    """Any hints a job could post (in bounds) or an older server could have stored (not
    validated): every round completes, every job is scheduled, and the API answers."""
    service = pollux_service
    jobs = service.store.list_jobs()
    now = 1000.0 + service.allocator.num_rounds * 100.0
    for record, raw in zip(jobs, hints):
        write_stored_hints(service.store, record.id, raw, now)
    before = service.allocator.num_rounds
    service.allocator.request_round()
    with address_space_limited(4 << 30):
        service.allocator.tick(now + 1.0)
    assert service.allocator.num_rounds == before + 1
    decision = service.allocator.last_decision
    assert decision is not None and set(decision.allocations) <= {r.id for r in jobs}
    with TestClient(create_app(service, make_auth()), headers=AUTH_HEADERS) as client:
        listing = client.get("/api/jobs")
        assert listing.status_code == 200, listing.text
        for record in jobs:
            assert client.get(f"/api/jobs/{record.id}").status_code == 200


def test_hints_claiming_a_billion_replicas_cost_no_memory(pollux_service):
    """The hints fuzz's one spike (a round took 11.5 GB; the suite was once OOM-killed):
    a job's model is probed at the replica count its hints say it profiled, and the
    speedup memo grew a (nodes x replicas) table that wide: 16 GiB for 2**30. The job
    must be scheduled with its model, in a round that maps well under 512 MiB more."""
    service = pollux_service
    bad = service.store.list_jobs()[0]
    params = {"alpha_c": 0.1, "beta_c": 0.01, "alpha_n": 0.1, "beta_n": 0.01,
              "alpha_r": 0.1, "beta_r": 0.01, "gamma": 1.5}
    service.store.set_hints(bad.id, JobHints.from_dict(
        {"init_batch_size": 32, "max_batch_size": 1024, "local_bsz_bounds": [16, 128],
         "throughput_params": params, "max_profiled_replicas": 2**30}), 1.0)
    with address_space_limited(512 << 20):
        service.allocator.tick(2.0)
    assert service.allocator.num_rounds == 1
    messages = [e.message for e in service.store.events(bad.id)]
    assert not any("without a model" in m for m in messages), messages
    assert bad.id in service.allocator.last_decision.allocations


def test_a_job_whose_model_fails_is_scheduled_without_it_and_told(pollux_service):
    """The reported case: 2**64 stored by an older server. The round used to raise for
    every job; now the job runs as one without a model and its events say why."""
    service = pollux_service
    bad = service.store.list_jobs()[0]
    write_stored_hints(service.store, bad.id, {"init_batch_size": 2**64, "max_batch_size": 2**65,
                                               "local_bsz_bounds": [1, 2**64]}, 1.0)
    service.allocator.tick(2.0)
    assert service.allocator.num_rounds == 1
    decision = service.allocator.last_decision
    assert decision is not None
    assert set(decision.allocations) == {r.id for r in service.store.list_jobs()}
    messages = [e.message for e in service.store.events(bad.id)]
    assert any("hints not used" in m and "without a model" in m for m in messages), messages
