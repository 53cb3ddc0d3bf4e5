"""Issue 23, defects 2 and 4: the dashboard cookie held the raw server token and was sent
by browsers to every port of 127.0.0.1 (a page another user served on 127.0.0.1:9999
received it), and the Origin check ignored scheme and port (a body-less no-cors POST from
http://127.0.0.1:9999 cancelled a job). Now the ``?token=`` link buys a session of its
own: a random cookie that opens pages only, bound to this server's origin, with a CSRF
token (given to the page in the URL fragment, never in a cookie) needed for every API
request; a session can read and cancel, never submit."""

from __future__ import annotations

import warnings
from urllib.parse import urlsplit

import pytest

from pollux.service.http.api import create_app
from pollux.service.http.auth import ApiAuth
from pollux.service.http.sessions import CSRF_HEADER, Sessions, cookie_name
from tests.service.service_builders import AUTH_HEADERS, TEST_TOKEN

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

HOST = "127.0.0.1:8470"
SESSION_COOKIE = cookie_name(("http", "127.0.0.1", 8470))
ORIGIN = f"http://{HOST}"
SPEC = {"name": "victim", "command": ["sleep", "60"], "working_dir": "/tmp"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def make_client(service, clock, tls: bool = False):
    auth = ApiAuth(TEST_TOKEN, frozenset({"127.0.0.1", "localhost"}), secure_cookie=tls)
    app = create_app(service, auth, sessions=Sessions(ttl_s=3600.0, clock=clock))
    scheme = "https" if tls else "http"
    return TestClient(app, base_url=f"{scheme}://{HOST}")


@pytest.fixture
def client(service, clock):
    with make_client(service, clock) as test_client:
        yield test_client


def log_in(client) -> tuple[str, str]:
    """Open the dashboard's link: (session cookie value, CSRF token)."""
    response = client.get(f"/?token={TEST_TOKEN}", follow_redirects=False)
    assert response.status_code == 303, response.text
    location = urlsplit(response.headers["location"])
    assert (location.path, location.query) == ("/", "")
    fragment = dict(part.split("=", 1) for part in location.fragment.split("&"))
    cookie = response.cookies.get(SESSION_COOKIE)
    assert cookie
    client.cookies.clear()
    return cookie, fragment["csrf"]


def as_session(cookie: str, csrf: str | None = None, **headers: str) -> dict[str, str]:
    sent = {"Cookie": f"{SESSION_COOKIE}={cookie}", **headers}
    if csrf is not None:
        sent[CSRF_HEADER] = csrf
    return sent


def test_the_link_sets_a_session_cookie_never_the_token(client, service, clock):
    response = client.get(f"/?token={TEST_TOKEN}", follow_redirects=False)
    set_cookies = response.headers.get_list("set-cookie")
    assert set_cookies and all(TEST_TOKEN not in c for c in set_cookies)
    cookie = set_cookies[0].lower()
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    for attribute in ("httponly", "samesite=strict", "path=/"):
        assert attribute in cookie, cookie
    assert "secure" not in cookie.replace("samesite", "")
    assert TEST_TOKEN not in response.headers["location"]
    with make_client(service, clock, tls=True) as tls_client:
        secure = tls_client.get(f"/?token={TEST_TOKEN}", follow_redirects=False)
        assert "; secure" in secure.headers["set-cookie"].lower()
    assert client.get("/?token=wrong", follow_redirects=False).status_code == 401


def test_the_cookie_alone_opens_pages_but_no_data(client):
    cookie, csrf = log_in(client)
    assert cookie != TEST_TOKEN and csrf != cookie
    for page in ("/", "/static/dashboard.js", "/docs", "/openapi.json"):
        assert client.get(page, headers=as_session(cookie)).status_code == 200, page
    for data in ("/api/jobs", "/api/dashboard", "/metrics", "/api/health"):
        refused = client.get(data, headers=as_session(cookie))
        assert refused.status_code == 403 and refused.json()["field"] == CSRF_HEADER, data
        assert client.get(data, headers=as_session(cookie, csrf)).status_code in (200, 404)
    assert client.get("/api/jobs", headers=as_session(cookie, "forged")).status_code == 403
    assert client.get("/api/jobs", headers=as_session("forged", csrf)).status_code == 401
    assert client.get("/api/jobs", headers={"Cookie": f"pollux_token={TEST_TOKEN}"}
                      ).status_code == 401  # the old cookie carried the token itself


def test_a_session_can_cancel_with_its_csrf_token_but_never_submit(client, service):
    job = client.post("/api/jobs", json=SPEC, headers=AUTH_HEADERS).json()["id"]
    cookie, csrf = log_in(client)
    submit = client.post("/api/jobs", json=SPEC, headers=as_session(cookie, csrf))
    assert submit.status_code == 403 and "cannot" in submit.json()["detail"]
    assert len(service.store.list_jobs()) == 1
    no_csrf = client.post(f"/api/jobs/{job}/cancel", headers=as_session(cookie))
    assert no_csrf.status_code == 403
    assert not service.store.get_job(job).cancel_requested
    ok = client.post(f"/api/jobs/{job}/cancel", headers=as_session(cookie, csrf))
    assert ok.status_code == 202, ok.text
    assert service.store.get_job(job).cancel_requested


@pytest.mark.parametrize("headers", [
    {"Origin": "http://127.0.0.1:9999"},        # another port of the same host
    {"Origin": "https://127.0.0.1:8470"},       # another scheme
    {"Origin": "http://localhost:8470"},        # another host name than the session's
    {"Origin": "null"},
    {"Host": "127.0.0.1:9999"},                 # a request for another port
    {"Host": "localhost:8470"},
    {"Sec-Fetch-Site": "same-site"},            # a page of 127.0.0.1:9999, says Chromium
    {"Sec-Fetch-Site": "cross-site"},
])
def test_a_session_is_bound_to_the_servers_origin(client, service, headers):
    job = client.post("/api/jobs", json=SPEC, headers=AUTH_HEADERS).json()["id"]
    cookie, csrf = log_in(client)
    read = client.get("/api/jobs", headers=as_session(cookie, csrf, **headers))
    assert read.status_code in (400, 401, 403), read.text
    cancel = client.post(f"/api/jobs/{job}/cancel", headers=as_session(cookie, csrf, **headers))
    assert cancel.status_code in (400, 401, 403), cancel.text
    assert not service.store.get_job(job).cancel_requested
    same = {"Origin": ORIGIN, "Sec-Fetch-Site": "same-origin"}
    assert client.get("/api/jobs", headers=as_session(cookie, csrf, **same)).status_code == 200


@pytest.mark.parametrize("origin", ["http://127.0.0.1:9999", "https://127.0.0.1:8470",
                                    "http://127.0.0.1", "http://evil.example:8470"])
def test_the_origin_check_compares_scheme_host_and_port(client, service, origin):
    """Defect 4 with the token itself: no foreign origin, even a port away, is served."""
    job = client.post("/api/jobs", json=SPEC, headers=AUTH_HEADERS).json()["id"]
    cancel = client.post(f"/api/jobs/{job}/cancel", headers={**AUTH_HEADERS, "Origin": origin})
    assert cancel.status_code == 403 and cancel.json()["field"] == "Origin"
    assert not service.store.get_job(job).cancel_requested
    assert client.get("/api/jobs", headers={**AUTH_HEADERS, "Origin": ORIGIN}).status_code == 200


def test_sessions_expire(client, clock):
    cookie, csrf = log_in(client)
    assert client.get("/api/jobs", headers=as_session(cookie, csrf)).status_code == 200
    clock.now += 3601
    assert client.get("/api/jobs", headers=as_session(cookie, csrf)).status_code == 401
    assert client.get("/", headers=as_session(cookie)).status_code == 401


def test_sessions_are_capped():
    sessions = Sessions(ttl_s=60.0, max_sessions=3, clock=lambda: 0.0)
    made = [sessions.create(("http", "127.0.0.1", 8470)) for _ in range(5)]
    assert sessions.find(made[0].id) is None and sessions.find(made[-1].id) == made[-1]
    assert len({s.id for s in made}) == 5 and len({s.csrf for s in made}) == 5


def test_two_servers_on_one_host_keep_their_own_sessions(service, clock):
    """Browsers keep one cookie jar for all ports of 127.0.0.1: each server's session
    cookie has its own name, so logging in to one does not log out of the other, and a
    session opened on one port is not the other's."""
    cookies = {}
    for port in (8470, 8471):
        auth = ApiAuth(TEST_TOKEN, frozenset({"127.0.0.1"}), port=port)
        with TestClient(create_app(service, auth, sessions=Sessions(clock=clock)),
                        base_url=f"http://127.0.0.1:{port}") as client:
            link = client.get(f"/?token={TEST_TOKEN}", follow_redirects=False)
            cookies[port] = link.cookies.get(cookie_name(("http", "127.0.0.1", port)))
    assert all(cookies.values()) and cookies[8470] != cookies[8471]


def test_no_page_of_another_origin_may_frame_the_dashboard(client):
    """A page on another port could frame the dashboard (its session works there) and
    trick a click on the cancel button."""
    cookie, _ = log_in(client)
    for path in ("/", "/docs"):
        page = client.get(path, headers=as_session(cookie))
        assert page.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_a_link_followed_from_another_site_still_logs_in(client):
    """A browser sends no strict cookie along a redirect that another site's page
    started, so such a link gets the redirect as a page of this server."""
    response = client.get(f"/?token={TEST_TOKEN}", follow_redirects=False,
                          headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 200 and TEST_TOKEN not in response.text
    assert 'http-equiv="refresh" content="0;url=/#csrf=' in response.text
    assert response.cookies.get(SESSION_COOKIE)


def test_a_login_link_is_single_use_short_lived_and_minted_by_the_token_only(client, clock):
    """``pollux dashboard`` asks for a one-time login link, so the token itself never
    goes into a browser (its history, or the argv of the command that opens it)."""
    cookie, csrf = log_in(client)
    assert client.post("/api/dashboard/login", headers=as_session(cookie, csrf)
                       ).status_code == 403  # a session cannot mint more sessions
    assert client.post("/api/dashboard/login").status_code == 401
    minted = client.post("/api/dashboard/login", headers=AUTH_HEADERS)
    assert minted.status_code == 201, minted.text
    path = minted.json()["path"]
    assert path.startswith("/?login=") and TEST_TOKEN not in path
    first = client.get(path, follow_redirects=False)
    assert first.status_code == 303 and first.cookies.get(SESSION_COOKIE)
    assert urlsplit(first.headers["location"]).query == ""  # the code leaves the URL too
    client.cookies.clear()
    again = client.get(path, follow_redirects=False)
    assert again.status_code == 401 and "pollux dashboard" in again.json()["detail"]
    late = client.post("/api/dashboard/login", headers=AUTH_HEADERS).json()["path"]
    clock.now += 61
    assert client.get(late, follow_redirects=False).status_code == 401
