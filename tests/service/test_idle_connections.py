"""Hostile: another process holds 1,100 idle and half-sent connections to a server whose
open-files limit is 1,024. The API still answers (p95 < 1 s), a queued job runs once and
succeeds, and the server's log grows by less than 1 MB."""

from __future__ import annotations

import http.client
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from pollux.tokens import read_token_file
from tests.service.e2e_helpers import EQUAL_SHARE, REPO, wait_until

ATTACKER = Path(__file__).with_name("idle_attacker.py")
OPEN_FILES = 1024
NUM_CONNECTIONS = 1100
ATTACK_S = 12.0
REOPEN_PER_S = 100
"""The attacker opens a connection the server closed again, up to this many a second."""


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def _request(url: str, token: str, method: str = "GET", path: str = "/api/jobs",
             body: dict | None = None) -> tuple[float, int, dict | list | None]:
    """One request on a fresh connection: (seconds, status, JSON), 5 s at most."""
    parts = urlsplit(url)
    started = time.monotonic()
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        payload = None if body is None else json.dumps(body)
        connection.request(method, path, body=payload, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        response = connection.getresponse()
        data = json.loads(response.read() or b"null")
        return time.monotonic() - started, response.status, data
    except OSError:
        return time.monotonic() - started, 0, None
    finally:
        connection.close()


def test_idle_connections_do_not_stall_the_api_or_fail_jobs(tmp_path):
    data_dir = tmp_path / "data"
    log_path = tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "pollux.cli.main", "server", "--data-dir", str(data_dir),
             "--port", "0", "--nodes", "1", "--slots-per-node", "2", "--device", "cpu",
             "--interval", "1", "--policy", EQUAL_SHARE, "--stop-grace", "5"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            preexec_fn=_limit_open_files, start_new_session=True)
    attacker = None
    try:
        def ready() -> dict | None:
            assert server.poll() is None, log_path.read_text()
            try:
                return json.loads((data_dir / "server.json").read_text())
            except (OSError, ValueError):
                return None

        record = wait_until(ready, 60, "the server to start")
        url, token = record["url"], read_token_file(record["token_file"])
        parts = urlsplit(url)
        log_before = log_path.stat().st_size
        attacker = subprocess.Popen(
            [sys.executable, str(ATTACKER), str(parts.hostname), str(parts.port),
             str(NUM_CONNECTIONS), str(ATTACK_S), str(REOPEN_PER_S)], stdout=subprocess.PIPE,
            text=True)
        time.sleep(2.0)  # the attacker has opened its connections
        runs = tmp_path / "runs.txt"
        _, status, job = _request(url, token, "POST", "/api/jobs", {
            "name": "victim", "command": ["/bin/sh", "-c", f"echo ran >> {runs}"],
            "working_dir": str(tmp_path), "max_replicas": 1})
        assert status == 201, (status, job)
        assert isinstance(job, dict)
        latencies, final = [], None
        while attacker.poll() is None:
            seconds, status, data = _request(url, token, path=f"/api/jobs/{job['id']}")
            latencies.append(seconds if status == 200 else 5.0)
            if status == 200 and isinstance(data, dict):
                final = data
            time.sleep(0.1)
        assert attacker.stdout is not None
        attack = json.loads(attacker.stdout.read())
        assert attack["most_held"] >= 600, attack  # the attack really held connections
        p95 = float(np.percentile(latencies, 95))
        assert p95 < 1.0, f"API p95 {p95:.2f} s under the attack ({len(latencies)} requests)"
        assert final is not None and final["state"] == "Succeeded", final
        assert final["launches"] == 1 and runs.read_text() == "ran\n"
        growth = log_path.stat().st_size - log_before
        assert growth < 1 << 20, f"the server log grew {growth} bytes"
        print(f"API p95 {p95 * 1e3:.0f} ms over {len(latencies)} requests; attack {attack}; "
              f"log +{growth} B")
    finally:
        if attacker is not None:
            attacker.kill()
            attacker.wait()
            if attacker.stdout is not None:
                attacker.stdout.close()
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_repeated_log_records_are_held_back_per_cause():
    import logging

    from pollux.service.http.connections import OncePerCause

    now = [0.0]
    quiet = OncePerCause(interval_s=60.0, clock=lambda: now[0])

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, message,
                                 None, None)

    passed = [quiet.filter(record("Invalid HTTP request received.")) for _ in range(1000)]
    assert passed.count(True) == 1
    assert quiet.filter(record("another cause"))
    now[0] = 61.0
    again = record("Invalid HTTP request received.")
    assert quiet.filter(again) and "999 more like it" in str(again.msg)


def test_connection_limits_leave_room_below_the_open_files_limit():
    from pollux.service.http.connections import connection_limits

    limits = connection_limits(1024)
    assert 16 <= limits.max_connections <= 1024 - 128 - 256
    assert connection_limits(64).max_connections == 16
