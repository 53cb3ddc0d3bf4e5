"""Issue 23, defect 3 over TCP: a client given a server's URL (``--server``,
``$POLLUX_SERVER``) and a token sent ``Authorization: Bearer <token>`` to whatever
listened on that port. Now, over plain HTTP, the server first proves it holds the token
(an HMAC of the client's nonce and the server's own origin, bound port included): a
squatter cannot, and a relay on another port answers for the wrong port."""

from __future__ import annotations

import socket
import threading
import warnings

import httpx
import pytest

from pollux.cli.main import main
from pollux.client import PolluxClient, ServerAddress
from pollux.errors import ServerUnreachableError
from pollux.server_proof import server_proof
from pollux.service.http.api import create_app
from pollux.service.http.auth import ApiAuth
from tests.service.e2e_helpers import ServerProcess
from tests.service.service_builders import TEST_TOKEN
from tests.service.test_auth_local_socket import Squatter

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

NONCE = "ab" * 16


class Relay:
    """Listens on a port of its own and pipes every connection to ``upstream``,
    recording what the client sends."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.received = bytearray()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.accepter = threading.Thread(target=self._serve, daemon=True)
        self.accepter.start()

    def _pipe(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if record:
                    self.received += chunk
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.connections += [client, server]
            for args in ((client, server, True), (server, client, False)):
                thread = threading.Thread(target=self._pipe, args=args, daemon=True)
                thread.start()
                self.threads.append(thread)

    def close(self) -> None:
        """Stop accepting, end every piped connection and close its sockets (left open,
        they were collected during a later test and failed it with a ResourceWarning)."""
        self.sock.close()
        self.accepter.join(timeout=5)
        for connection in self.connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self.threads:
            thread.join(timeout=5)
        for connection in self.connections:
            connection.close()


def test_the_server_answers_a_challenge_for_its_own_bound_port(service):
    auth = ApiAuth(TEST_TOKEN, frozenset({"127.0.0.1"}), port=8470)
    with TestClient(create_app(service, auth), base_url="http://127.0.0.1:9999") as client:
        answer = client.get(f"/api/auth/proof?nonce={NONCE}")
        assert answer.status_code == 200
        assert answer.json()["proof"] == server_proof(TEST_TOKEN, NONCE, "http://127.0.0.1:8470")
        assert answer.json()["proof"] != server_proof(TEST_TOKEN, NONCE, "http://127.0.0.1:9999")
        for bad in ("", "xyz", "ab" * 100):
            assert client.get(f"/api/auth/proof?nonce={bad}").status_code == 422


@pytest.mark.timeout(120)
def test_tcp_clients_send_the_token_only_to_the_server_itself(tmp_path, capsys):
    server = ServerProcess(tmp_path / "data")
    squatter = relay = None
    try:
        local = server.start()
        token, url = local.address.token, local.address.url
        assert token
        with PolluxClient(ServerAddress(url, token)) as direct:  # TCP, the real server
            assert direct.health()["status"] == "ok"
        # pollux dashboard: a one-time link, never the token, for the browser
        assert main(["dashboard", "--data-dir", str(server.data_dir)]) == 0
        link = capsys.readouterr().out.strip()
        assert link.startswith(f"{url}/?login=") and token not in link
        with httpx.Client(timeout=10) as browser:
            first = browser.get(link, follow_redirects=False)
            assert first.status_code == 303 and first.cookies
            assert browser.get(link, follow_redirects=False).status_code == 401
        squatter = Squatter(0)
        squatted = f"http://127.0.0.1:{squatter.sock.getsockname()[1]}"
        with PolluxClient(ServerAddress(squatted, token), timeout_s=3) as client, \
                pytest.raises(ServerUnreachableError, match="did not prove"):
            client.jobs()
        assert token.encode() not in squatter.received
        assert b"Authorization" not in squatter.received
        relay = Relay(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        with PolluxClient(ServerAddress(f"http://127.0.0.1:{relay.port}", token)) as client, \
                pytest.raises(ServerUnreachableError, match="did not prove"):
            client.jobs()
        assert b"/api/auth/proof" in relay.received  # it did relay the challenge ...
        assert token.encode() not in relay.received  # ... but never got the token
    finally:
        for helper in (squatter, relay):
            if helper is not None:
                helper.close()
        server.cleanup()


def test_a_job_is_proved_the_server_with_its_own_hints_token(service):
    auth = ApiAuth(TEST_TOKEN, frozenset({"127.0.0.1"}), port=8470)
    with TestClient(create_app(service, auth), base_url="http://127.0.0.1:9999") as client:
        job = client.post("/api/jobs", json={"name": "digits", "command": ["python", "t.py"],
                                             "working_dir": "/tmp"},
                          headers={"Authorization": f"Bearer {TEST_TOKEN}"}).json()["id"]
        hints_token = service.job_for_hints(job).hints_token
        answer = client.get(f"/api/auth/proof?nonce={NONCE}&job={job}").json()["proof"]
        origin = "http://127.0.0.1:8470"
        assert answer == server_proof(hints_token, NONCE, origin, job)
        assert answer != server_proof(TEST_TOKEN, NONCE, origin)  # not the API token's
        unknown = client.get(f"/api/auth/proof?nonce={NONCE}&job=nope-1").json()["proof"]
        assert len(unknown) == len(answer) and unknown != answer  # no oracle of jobs
        assert client.get(f"/api/auth/proof?nonce={NONCE}&job=").status_code == 422

