"""Issue 32, hostile first: with registered users, no user reaches another user's job
(cancel, logs, environment, spec, events), submits into a team not theirs, or acts as
someone else by any header, cookie, query or token trick; a copied job store yields no
token the server accepts."""

from __future__ import annotations

import shutil
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest

from pollux.data_dir import job_dir
from pollux.service.http.api import create_app
from tests.service.service_builders import AUTH_HEADERS, make_auth

with warnings.catch_warnings():  # starlette 1.0 asks for the httpx2 fork; httpx works
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

SECRET = "hunter2-do-not-leak"
SPEC = {"name": "train", "command": ["python", "train.py"], "working_dir": "/tmp",
        "max_replicas": 1, "env": {"WANDB_API_KEY": SECRET}}


@pytest.fixture
def app(service: Any) -> Any:
    return create_app(service, make_auth())


@pytest.fixture
def admin(app: Any) -> Any:
    """The server's own account (the server token)."""
    with TestClient(app, headers=AUTH_HEADERS) as test_client:
        yield test_client


def add_user(server: Any, name: str, *teams: str, **roles: bool) -> str:
    response = server.post("/api/users", json={"name": name, "teams": list(teams), **roles})
    assert response.status_code == 201, response.text
    assert set(response.json()) >= {"name", "token"}
    return str(response.json()["token"])


def as_user(app: Any, token: str | None) -> Any:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return TestClient(app, headers=headers)


@pytest.fixture
def world(app: Any, admin: Any, service: Any) -> dict[str, Any]:
    """alice and bob in vision, carol in nlp, vic an admin of vision, root an admin;
    alice's job with a secret in its environment and in its log."""
    tokens = {"alice": add_user(admin, "alice", "vision"), "bob": add_user(admin, "bob", "vision"),
              "carol": add_user(admin, "carol", "nlp"),
              "vic": add_user(admin, "vic", "vision", team_admin=True),
              "root": add_user(admin, "root2", "ops", admin=True)}
    alice = as_user(app, tokens["alice"])
    created = alice.post("/api/jobs", json=SPEC)
    assert created.status_code == 201, created.text
    job = created.json()
    assert (job["owner"], job["team"]) == ("alice", "vision")
    logs = job_dir(service.data_dir, job["id"]) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "replica-0.log").write_text(f"step 1 loss 0.5 {SECRET}\n")
    return {"tokens": tokens, "job": job["id"], "alice": alice}


def test_a_user_cannot_cancel_another_users_job(app, world, service):
    bob = as_user(app, world["tokens"]["bob"])
    refused = bob.post(f"/api/jobs/{world['job']}/cancel")
    assert refused.status_code == 403
    assert refused.json()["field"] == "owner"
    assert "their own jobs only" in refused.json()["detail"]
    assert not service.store.get_job(world["job"]).cancel_requested
    carol = as_user(app, world["tokens"]["carol"])  # in another team
    assert carol.post(f"/api/jobs/{world['job']}/cancel").status_code == 403
    assert not service.store.get_job(world["job"]).cancel_requested


def test_a_user_cannot_read_another_users_logs_environment_spec_or_events(app, world):
    for name in ("bob", "carol"):
        other = as_user(app, world["tokens"][name])
        for path in (f"/api/jobs/{world['job']}", f"/api/jobs/{world['job']}/logs",
                     f"/api/jobs/{world['job']}/history", "/api/jobs/train/logs"):
            response = other.get(path)
            assert response.status_code == 403, (name, path, response.text)
            assert SECRET not in response.text
        # what everyone sees: name, owner, team, state, GPUs -- and nothing of the secret
        for path in ("/api/jobs", "/api/dashboard", "/api/nodes", "/metrics"):
            response = other.get(path)
            assert response.status_code in (200, 404), (path, response.text)
            assert SECRET not in response.text
        row = next(j for j in other.get("/api/jobs").json() if j["id"] == world["job"])
        assert (row["name"], row["owner"], row["team"], row["state"]) == (
            "train", "alice", "vision", "Pending")
    mine = world["alice"]
    assert mine.get(f"/api/jobs/{world['job']}").json()["spec"]["env"] == {
        "WANDB_API_KEY": SECRET}
    assert SECRET in mine.get(f"/api/jobs/{world['job']}/logs").json()["text"]


def test_team_admins_act_on_their_teams_jobs_and_admins_on_all(app, world, service):
    vic = as_user(app, world["tokens"]["vic"])
    assert SECRET in vic.get(f"/api/jobs/{world['job']}/logs").text
    carol_job = as_user(app, world["tokens"]["carol"]).post("/api/jobs", json=SPEC).json()["id"]
    assert vic.get(f"/api/jobs/{carol_job}").status_code == 403  # not vic's team
    assert vic.post(f"/api/jobs/{carol_job}/cancel").status_code == 403
    assert vic.post(f"/api/jobs/{world['job']}/cancel").status_code == 202
    assert service.store.get_job(world["job"]).cancel_requested
    root = as_user(app, world["tokens"]["root"])
    assert root.post(f"/api/jobs/{carol_job}/cancel").status_code == 202


def test_a_user_cannot_submit_into_a_team_not_theirs(app, world, service):
    before = len(service.store.list_jobs())
    carol = as_user(app, world["tokens"]["carol"])
    refused = carol.post("/api/jobs", json=SPEC, params={"team": "vision"})
    assert refused.status_code == 403 and refused.json()["field"] == "team"
    assert "nlp" in refused.json()["detail"]
    assert len(service.store.list_jobs()) == before
    ok = carol.post("/api/jobs", json=SPEC, params={"team": "nlp"})
    assert ok.status_code == 201 and ok.json()["team"] == "nlp"
    assert as_user(app, world["tokens"]["root"]).post(  # an admin names any team
        "/api/jobs", json=SPEC, params={"team": "vision"}).json()["team"] == "vision"


def test_every_route_of_one_job_is_guarded(app, world):
    """Each route naming a job (``{ref}``), present or added later, refuses a user who may
    not act on it (the hints route is the job's own, by its hints token)."""
    bob = as_user(app, world["tokens"]["bob"])
    checked = []
    for route in app.routes:
        path = getattr(route, "path", "")
        if "{ref}" not in path:
            continue
        for method in sorted(getattr(route, "methods", ()) - {"HEAD"}):
            response = bob.request(method, path.replace("{ref}", world["job"]))
            assert response.status_code == 403, (method, path, response.text)
            assert SECRET not in response.text
            checked.append((method, path))
    assert len(checked) >= 4


IMPERSONATION_HEADERS = [
    {"X-Pollux-User": "alice"}, {"X-Remote-User": "alice"}, {"X-Forwarded-User": "alice"},
    {"Remote-User": "alice"}, {"X-Auth-Request-User": "alice"},
    {"Authorization": "Bearer alice"}, {"Authorization": "Basic YWxpY2U6YWxpY2U="},
    {"Authorization": "Bearer pollux-user-alice"},
]


@pytest.mark.parametrize("headers", IMPERSONATION_HEADERS)
def test_no_header_makes_a_request_someone_else(app, world, service, headers):
    anonymous = TestClient(app)
    assert anonymous.get("/api/jobs", headers=headers).status_code == 401
    assert anonymous.post(f"/api/jobs/{world['job']}/cancel", headers=headers
                          ).status_code == 401
    bob = {"Authorization": f"Bearer {world['tokens']['bob']}"}
    if "Authorization" not in headers:  # bob claiming to be alice stays bob
        with as_user(app, None) as client:
            response = client.post(f"/api/jobs/{world['job']}/cancel",
                                   headers={**bob, **headers})
        assert response.status_code == 403
    assert not service.store.get_job(world["job"]).cancel_requested


def test_no_query_cookie_or_hash_opens_anything(app, world, service):
    anonymous = TestClient(app)
    for params in ({"user": "alice"}, {"as": "alice"}, {"owner": "alice"}):
        assert anonymous.get("/api/jobs", params=params).status_code == 401
    for cookie in ("pollux_session_80", "pollux_session", "pollux_user"):
        anonymous.cookies.set(cookie, "alice")
        assert anonymous.get("/api/jobs").status_code == 401
        anonymous.cookies.clear()
    digest = service.users.db.read(lambda conn: conn.execute(
        "SELECT token_hash FROM users WHERE name='alice'").fetchone()[0])
    for token in (digest, f"pollux-user-{digest}", world["tokens"]["alice"] + "x",
                  world["tokens"]["alice"][:-1]):
        assert as_user(app, token).get("/api/jobs").status_code == 401


def test_a_users_session_is_that_user(app, world):
    """A dashboard session opened with bob's token (or a login link bob asked for)
    reads and cancels as bob: alice's job stays out of its reach."""
    bob = as_user(app, None)
    opened = bob.get(f"/?token={world['tokens']['bob']}", follow_redirects=False)
    assert opened.status_code == 303
    csrf = opened.headers["location"].split("csrf=")[1]
    session = {"X-CSRF-Token": csrf}
    assert bob.get("/api/jobs", headers=session).status_code == 200
    overview = bob.get("/api/dashboard", headers=session).json()
    assert overview["user"] == "bob" and SECRET not in str(overview)
    row = next(job for job in overview["jobs"] if job["id"] == world["job"])
    assert row["may_act"] is False and row["owner"] == "alice"
    assert {team["team"] for team in overview["teams"]} >= {"vision"}
    assert bob.get(f"/api/jobs/{world['job']}", headers=session).status_code == 403
    assert bob.post(f"/api/jobs/{world['job']}/cancel", headers=session).status_code == 403
    alice = as_user(app, None)
    link = world["alice"].post("/api/dashboard/login").json()["path"]
    opened = alice.get(link, follow_redirects=False)
    csrf = opened.headers["location"].split("csrf=")[1]
    assert alice.get(f"/api/jobs/{world['job']}", headers={"X-CSRF-Token": csrf}
                     ).status_code == 200


def test_users_are_managed_by_the_servers_account_only(app, world, admin):
    root = as_user(app, world["tokens"]["root"])  # even an admin user
    for method, path in (("GET", "/api/users"), ("POST", "/api/users"),
                         ("DELETE", "/api/users/alice"), ("POST", "/api/users/alice/token")):
        response = root.request(method, path, json={"name": "eve", "teams": ["vision"]}
                                if method == "POST" else None)
        assert response.status_code == 403, (method, path, response.text)
    assert [u["name"] for u in admin.get("/api/users").json()] == [
        "alice", "bob", "carol", "root2", "vic"]
    assert "token" not in str(admin.get("/api/users").json()).replace("token_rotated_at", "")


def test_a_rotated_or_removed_token_stops_working(app, world, admin):
    browser = as_user(app, None)
    opened = browser.get(f"/?token={world['tokens']['bob']}", follow_redirects=False)
    session = {"X-CSRF-Token": opened.headers["location"].split("csrf=")[1]}
    assert browser.get("/api/jobs", headers=session).status_code == 200
    old = world["tokens"]["bob"]
    new = admin.post("/api/users/bob/token").json()["token"]
    assert as_user(app, old).get("/api/jobs").status_code == 401
    assert as_user(app, new).get("/api/jobs").status_code == 200
    assert admin.delete("/api/users/bob").status_code == 200
    assert as_user(app, new).get("/api/jobs").status_code == 401
    assert browser.get("/api/jobs", headers=session).status_code == 401  # its session too
    assert admin.delete("/api/users/bob").status_code == 404


def test_a_copied_store_yields_no_usable_token(app, world, service, tmp_path):
    """Everything a copy of the store holds (every text and blob of every table, the
    raw bytes of the file and its WAL) is tried as a token: none opens the API as a
    user, and no user token appears in it."""
    copy = tmp_path / "stolen"
    copy.mkdir()
    data_dir = Path(service.store.path).parent
    for name in ("pollux.db", "pollux.db-wal", "pollux.db-shm"):
        if (data_dir / name).exists():
            shutil.copy(data_dir / name, copy / name)
    raw = b"".join(path.read_bytes() for path in copy.iterdir())
    for token in world["tokens"].values():
        assert token.encode() not in raw
        assert token.split("pollux-user-")[1].encode() not in raw
    conn = sqlite3.connect(copy / "pollux.db")
    values: set[str] = set()
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'"):
        for row in conn.execute(f"SELECT * FROM {table}"):
            values.update(str(value) for value in row if isinstance(value, (str, bytes)))
    conn.close()
    assert len(values) > 10
    for value in values:
        for candidate in (value, f"pollux-user-{value}"):
            response = as_user(app, candidate).get("/api/users")
            assert response.status_code == 401, candidate
