"""The client's HTTP transport (standard library): one kept connection, opened again
when the server closed it, a change never sent twice, TLS trusting the server's own
certificate, and a URL it cannot use refused with the URL named."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pollux.client import PolluxClient, ServerAddress
from pollux.client.transport import ConnectFailed, Transport, TransportError
from pollux.errors import ServerUnreachableError, ServiceError


class Recorder(ThreadingHTTPServer):
    """Answers every request with its method, path and the connection's number; a
    ``/drop`` request is read and the connection closed without an answer."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.connections = 0
        self.requests: list[tuple[str, str, bytes]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: Recorder

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1
            self.number = self.server.connections

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.requests.append((self.command, self.path, body))
        if self.path.startswith("/drop"):
            self.close_connection = True
            return
        self.close_connection = self.path.startswith("/bye")  # without saying so
        status = 404 if self.path.startswith("/missing") else 200
        data = json.dumps({"detail": "no such job", "field": "job"} if status == 404 else
                          {"path": self.path, "connection": self.number,
                           "body": body.decode()}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_one_connection_carries_every_request(recorder: Recorder) -> None:
    transport = Transport(recorder.url)
    answers = [transport.request("GET", "/a", params={"n": i}).json() for i in range(5)]
    post = transport.request("POST", "/jobs", json_body={"name": "x"}).json()
    transport.close()
    assert [a["path"] for a in answers] == [f"/a?n={i}" for i in range(5)]
    assert {a["connection"] for a in answers} == {post["connection"]} == {1}
    assert json.loads(post["body"]) == {"name": "x"} and recorder.connections == 1


def test_a_connection_the_server_closed_is_opened_again(recorder: Recorder) -> None:
    transport = Transport(recorder.url)
    first = transport.request("GET", "/bye").json()  # answered, then closed (keep-alive idle)
    again = transport.request("GET", "/b").json()
    assert (first["connection"], again["connection"]) == (1, 2)
    assert [path for _, path, _ in recorder.requests] == ["/bye", "/b"]
    transport.close()


def test_a_read_the_server_dropped_is_tried_once_more_then_fails(recorder: Recorder) -> None:
    transport = Transport(recorder.url)
    transport.request("GET", "/a")
    with pytest.raises(TransportError, match="RemoteDisconnected|ConnectionReset"):
        transport.request("GET", "/drop")  # no answer: an error, not a guess
    assert transport.request("GET", "/b").json()["connection"] == 3
    assert [path for _, path, _ in recorder.requests] == ["/a", "/drop", "/drop", "/b"]
    transport.close()


def test_a_change_is_never_sent_twice(recorder: Recorder) -> None:
    with PolluxClient(ServerAddress(recorder.url)) as client:
        client.health()  # a kept connection, where sending again would be tempting
        with pytest.raises(ServerUnreachableError, match="cannot reach the server"):
            client._call("POST", "/drop", json_body={"name": "once"})
    assert [m for m, _, _ in recorder.requests] == ["GET", "POST"]


def test_refusals_carry_the_servers_message_and_field(recorder: Recorder) -> None:
    with PolluxClient(ServerAddress(recorder.url)) as client:
        with pytest.raises(ServiceError) as refused:
            client._call("GET", "/missing")
    assert (refused.value.status, refused.value.field) == (404, "job")
    assert "no such job" in str(refused.value)


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1", "localhost", "http://h:99999"])
def test_an_unusable_url_is_refused_naming_it(url: str) -> None:
    with pytest.raises(ConnectFailed, match="is not an http"):
        Transport(url).request("GET", "/api/health")
    with PolluxClient(ServerAddress(url)) as client, \
            pytest.raises(ServerUnreachableError, match=f"cannot reach the server at {url}"):
        client.health()


def test_nobody_listening_is_unreachable() -> None:
    with PolluxClient(ServerAddress("http://127.0.0.1:9")) as client, \
            pytest.raises(ServerUnreachableError, match="cannot reach the server"):
        client.health()


def test_https_trusts_the_servers_own_certificate(recorder: Recorder, tmp_path: Path
                                                  ) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    recorder.socket = context.wrap_socket(recorder.socket, server_side=True)
    url = recorder.url.replace("http://", "https://")
    trusted = Transport(url, tls_cert=str(cert))
    assert trusted.request("GET", "/tls").json()["path"] == "/tls"
    trusted.close()
    with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
        Transport(url).request("GET", "/tls")  # the system's authorities do not know it
