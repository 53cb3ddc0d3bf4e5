"""Hostile conditions against a live ``pollux server`` process: a second local user, the
server killed while a job finishes, a recovery slowed by a replica that ignores SIGTERM,
TLS. Each test names the defect of issue #13 it guards against."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.service.e2e_helpers import FINAL_STATES, REPO, ServerProcess, wait_until

FAKE_JOB = str(Path(__file__).resolve().parents[1] / "backends" / "fake_job.py")
SYSTEM_PYTHON = "/usr/bin/python3"
"""An interpreter another user can run (the test's own may sit under /root)."""


def fake_job_spec(name: str, *args: str) -> dict[str, Any]:
    return {"name": name, "command": [sys.executable, FAKE_JOB, *args],
            "working_dir": str(REPO), "max_failures": 0}


@pytest.fixture
def live_server(tmp_path):
    process = ServerProcess(tmp_path / "data")
    yield process
    process.cleanup()


def other_user() -> tuple[int, int] | None:
    """(uid, gid) of an unprivileged user this test can act as, or None."""
    if os.getuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK):
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


@pytest.mark.timeout(120)
def test_another_local_user_cannot_run_commands_or_read_secrets(tmp_path):
    """Defects 2 and 3: a second local user submitted ``sh -c 'id > proof'`` (it ran as
    the server's user) and could read the store. The data directory sits in a folder
    everyone may enter, as a shared machine's would."""
    user = other_user()
    if user is None:
        pytest.skip("needs root (to act as 'nobody') and /usr/bin/python3")
    shared = Path(tempfile.mkdtemp(prefix="pollux-shared-"))
    try:
        shared.chmod(0o755)
        server = ServerProcess(shared / "data")
        try:
            client = server.start()
            url = server.clients[-1].address.url
            client.submit(fake_job_spec("mine", "--steps", "1"))
            proof = shared / "proof"
            attack = f"""
import json, urllib.request, urllib.error
spec = {{"name": "evil", "command": ["sh", "-c", "id > {proof}"], "working_dir": "/tmp"}}
results = {{}}
for name, headers in [("no_token", {{"Content-Type": "application/json"}}),
                      ("text_plain", {{"Content-Type": "text/plain"}})]:
    request = urllib.request.Request("{url}/api/jobs", data=json.dumps(spec).encode(),
                                     headers=headers, method="POST")
    try:
        results[name] = urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as exc:
        results[name] = exc.code
for name in ("token", "pollux.db", "server.json"):
    try:
        open("{shared / 'data'}/" + name, "rb").read(1)
        results[name] = "read"
    except OSError as exc:
        results[name] = type(exc).__name__
import socket
try:
    socket.socket(socket.AF_UNIX).connect("{shared / 'data' / 'server.sock'}")
    results["server.sock"] = "connected"
except OSError as exc:
    results["server.sock"] = type(exc).__name__
print(json.dumps(results))
"""
            done = subprocess.run([SYSTEM_PYTHON, "-I", "-c", attack], user=user[0],
                                  group=user[1], capture_output=True, text=True, timeout=60,
                                  cwd="/")
            assert done.returncode == 0, done.stderr
            results = json.loads(done.stdout)
            assert results == {"no_token": 401, "text_plain": 401,
                               "token": "PermissionError", "pollux.db": "PermissionError",
                               "server.json": "PermissionError",
                               "server.sock": "PermissionError"}, results
            assert [job["name"] for job in client.jobs()] == ["mine"]
            time.sleep(1.0)
            assert not proof.exists()
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.timeout(120)
def test_a_job_that_finished_during_an_outage_never_runs_again(live_server):
    """Defect 4: recovery requeued every job it found running, so one that had finished
    while the server was down ran a second time."""
    client = live_server.start()
    job_id = client.submit(fake_job_spec("short", "--steps", "40", "--step-s", "0.05"))["id"]
    logs = live_server.data_dir / "jobs" / job_id / "logs"
    wait_until(lambda: client.job(job_id)["state"] == "Running", 30, "the job to run")
    live_server.kill()
    wait_until(lambda: (logs / "replica-0.launch-1.exit").exists(), 30,
               "the job to finish while the server is down")
    client = live_server.start()
    wait_until(lambda: client.job(job_id)["state"] in FINAL_STATES, 60, "the recovery")
    job = client.job(job_id)
    assert job["state"] == "Succeeded", job["events"]
    assert job["launches"] == 1
    assert "while the server was down" in job["events"][-1]["message"]
    runs = sorted(p.name for p in (logs.parent / "checkpoint").glob("env-*.json"))
    assert runs == ["env-0-0.json"]  # one launch, one replica, never started again


@pytest.mark.timeout(120)
def test_the_api_answers_while_recovery_waits_for_a_stubborn_replica(live_server):
    """Defect 5: recovery ran before the HTTP server started, so a replica ignoring
    SIGTERM kept the API silent for --stop-grace (+10 s)."""
    client = live_server.start()
    job_id = client.submit(fake_job_spec("stubborn", "--steps", "100000",
                                         "--ignore-sigterm"))["id"]
    wait_until(lambda: client.job(job_id)["state"] == "Running", 30, "the job to run")
    live_server.kill()
    (live_server.data_dir / "server.json").unlink()  # left behind by the killed server
    client = live_server.start()
    started = time.monotonic()
    rows = client.jobs()
    answered_s = time.monotonic() - started
    assert answered_s < 2.0
    assert [(r["id"], r["recovering"]) for r in rows] == [(job_id, True)]
    assert client.health()["status"] == "ok"


@pytest.mark.timeout(120)
def test_tls_serves_https_that_the_cli_trusts(live_server, tmp_path):
    """Defect 7: there was no way to encrypt the API beyond loopback."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    live_server.args += ["--tls-cert", str(cert), "--tls-key", str(key)]
    client = live_server.start()
    assert client.address.url.startswith("https://127.0.0.1:")
    assert client.health()["status"] == "ok"
    plain = client.address.url.replace("https://", "http://")
    with pytest.raises(Exception):  # noqa: B017,PT011 - any refusal of plain HTTP will do
        urllib.request.urlopen(f"{plain}/api/health", timeout=5).read()
