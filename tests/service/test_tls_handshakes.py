"""Hostile: 1,100 connections to an HTTPS server whose open-files limit is 1,024, none
finishing its TLS handshake. Handshakes count against the connection guard's limit
(and end at its header deadline), so the API still answers."""

from __future__ import annotations

import http.client
import json
import os
import resource
import select
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest

from pollux.tokens import read_token_file
from tests.service.e2e_helpers import EQUAL_SHARE, REPO, wait_until

OPEN_FILES = 1024
NUM_CONNECTIONS = 1100
ATTACK_S = 4.0

pytestmark = pytest.mark.timeout(120)


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


class Handshaker:
    """Holds ``num`` TCP connections that never send a byte (a TLS handshake never
    begun), opening a new one for each the server closes, from a thread."""

    def __init__(self, host: str, port: int, num: int) -> None:
        self.address, self.num = (host, port), num
        self.opened = self.most_held = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        held: list[socket.socket] = []
        while not self._stop.is_set():
            while len(held) < self.num and not self._stop.is_set():
                sock = socket.socket()
                sock.settimeout(0.5)
                try:
                    sock.connect(self.address)
                except OSError:
                    sock.close()
                    break
                sock.setblocking(False)
                held.append(sock)
                self.opened += 1
            self.most_held = max(self.most_held, len(held))
            poller = select.poll()  # select() stops at descriptor 1023
            by_fd = {sock.fileno(): sock for sock in held}
            for fd in by_fd:
                poller.register(fd, select.POLLIN | select.POLLHUP)
            for fd, _ in poller.poll(100):  # closed by the server: open another
                held.remove(by_fd[fd])
                by_fd[fd].close()
        for sock in held:
            sock.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _health(url: str, token: str, context: ssl.SSLContext) -> int:
    parts = urlsplit(url)
    connection = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=5,
                                             context=context)
    try:
        connection.request("GET", "/api/health", headers={"Authorization": f"Bearer {token}"})
        return connection.getresponse().status
    except OSError:
        return 0
    finally:
        connection.close()


def test_unfinished_tls_handshakes_cannot_exhaust_the_server(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    data_dir, log_path = tmp_path / "data", tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "pollux.cli.main", "server", "--data-dir", str(data_dir),
             "--port", "0", "--nodes", "1", "--slots-per-node", "1", "--device", "cpu",
             "--policy", EQUAL_SHARE, "--tls-cert", str(cert), "--tls-key", str(key)],
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
        context = ssl.create_default_context(cafile=str(cert))
        assert _health(url, token, context) == 200
        parts = urlsplit(url)
        attacker = Handshaker(str(parts.hostname), int(parts.port or 0), NUM_CONNECTIONS)
        wait_until(lambda: attacker.opened >= NUM_CONNECTIONS, 30, "the connections")
        statuses = []
        deadline = time.monotonic() + ATTACK_S
        while time.monotonic() < deadline:
            statuses.append(_health(url, token, context))
            time.sleep(0.2)
        attack = {"opened": attacker.opened, "most_held": attacker.most_held}
        answered = statuses.count(200) / max(1, len(statuses))
        assert statuses and answered >= 0.9, f"{statuses} under the attack {attack}"
        print(f"answered {answered:.0%} of {len(statuses)} requests; attack {attack}")
    finally:
        if attacker is not None:
            attacker.close()
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
