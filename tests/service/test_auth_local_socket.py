"""Issue 23, defect 3: the local CLI sent ``Authorization: Bearer <token>`` to whatever
listened on the port of a stale ``server.json`` (the server SIGKILLed, the port taken by
another user), and the generated token lived forever. Now the CLI talks to the server of
a data directory over the Unix socket in that private directory, after checking who runs
the process behind it; a stale ``server.json`` is reported, and no TCP port ever sees
the token."""

from __future__ import annotations

import json
import socket
import stat
import threading
from pathlib import Path

import pytest

from pollux.cli.main import main
from pollux.client import locate_server
from pollux.errors import ServerUnreachableError
from tests.service.e2e_helpers import ServerProcess


class Squatter:
    """A plain TCP server on ``port`` that records every byte it is sent."""

    def __init__(self, port: int) -> None:
        self.received = bytearray()
        self.connections = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.settimeout(1.0)
            try:
                while chunk := conn.recv(65536):
                    self.received += chunk
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def test_a_squatter_on_a_dead_servers_port_never_gets_the_token(tmp_path, capsys):
    server = ServerProcess(tmp_path / "data")
    squatter = None
    where = ("--data-dir", str(server.data_dir))
    try:
        client = server.start()
        token = client.address.token
        assert token
        record = json.loads((server.data_dir / "server.json").read_text())
        assert main(["ls", *where]) == 0
        sock_path = Path(record["socket"])
        assert sock_path.parent == server.data_dir
        assert stat.S_ISSOCK(sock_path.stat().st_mode)
        assert stat.S_IMODE(sock_path.stat().st_mode) & 0o077 == 0
        client.close()
        server.kill()  # SIGKILL: server.json stays behind
        assert (server.data_dir / "server.json").exists()
        squatter = Squatter(port_of(record["url"]))
        capsys.readouterr()
        assert main(["ls", *where]) == 1
        err = capsys.readouterr().err
        assert "stale" in err and "server.json" in err, err
        with pytest.raises(ServerUnreachableError, match="stale"):
            locate_server(data_dir=server.data_dir)
        assert token.encode() not in squatter.received
        assert b"Authorization" not in squatter.received
        assert squatter.connections == 0, bytes(squatter.received)
        squatter.close()
        squatter = None
        # a restart on the same data directory rotates the generated token
        client = server.start()
        assert client.address.token and client.address.token != token
        assert client.health()["status"] == "ok"
        assert main(["ls", *where]) == 0
    finally:
        if squatter is not None:
            squatter.close()
        server.cleanup()


def test_the_cli_reaches_its_server_even_when_server_json_names_a_squatted_port(
        tmp_path, capsys):
    """A live server; its record's TCP port now points at another process: the CLI
    still talks to the real server (its socket) and the port hears nothing."""
    server = ServerProcess(tmp_path / "data")
    squatter = Squatter(0)
    try:
        server.start()
        path = server.data_dir / "server.json"
        record = json.loads(path.read_text())
        fake_port = squatter.sock.getsockname()[1]
        record["url"] = f"http://127.0.0.1:{fake_port}"
        path.write_text(json.dumps(record))
        assert main(["ls", "--data-dir", str(server.data_dir)]) == 0, capsys.readouterr().err
        assert squatter.connections == 0 and not squatter.received
    finally:
        squatter.close()
        server.cleanup()


def test_a_long_data_dir_path_still_gets_its_socket(tmp_path):
    from pollux.service.http.local_socket import bind_local_socket
    from pollux.unix_socket import probe

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    with bind_local_socket(deep):
        probe(deep / "server.sock")


def test_a_socket_another_user_answers_on_gets_nothing(tmp_path, capsys):
    """A record naming a socket served by another user (here 'nobody'): refused before
    the request is sent."""
    import subprocess
    import tempfile
    import time

    from tests.service.test_adversarial_live import SYSTEM_PYTHON, other_user

    user = other_user()
    if user is None:
        pytest.skip("needs root (to act as 'nobody') and /usr/bin/python3")
    shared = Path(tempfile.mkdtemp(prefix="pollux-peer-"))
    shared.chmod(0o777)
    sock_path = shared / "server.sock"
    listener = subprocess.Popen(
        [SYSTEM_PYTHON, "-I", "-c",
         "import socket, sys, time; s = socket.socket(socket.AF_UNIX); "
         f"s.bind({str(sock_path)!r}); s.listen(4); "
         "import os; os.chmod(s.getsockname(), 0o777); "
         "c, _ = s.accept(); sys.stdout.buffer.write(c.recv(65536)); sys.stdout.flush()"],
        user=user[0], group=user[1], stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not sock_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        data = tmp_path / "data"
        data.mkdir(mode=0o700)
        token = data / "token"
        token.write_text("the-secret-token\n")
        token.chmod(0o600)
        (data / "server.json").write_text(json.dumps(
            {"url": "http://127.0.0.1:9", "pid": listener.pid, "socket": str(sock_path),
             "token_file": str(token)}))
        assert main(["ls", "--data-dir", str(data)]) == 1
        err = capsys.readouterr().err
        assert f"runs as uid {user[0]}" in err, err
        out, _ = listener.communicate(timeout=10)  # it saw a connection close, no bytes
        assert b"the-secret-token" not in out and out == b""
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
