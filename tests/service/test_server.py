"""Server wiring: the bind/token rule, one server per data directory, policy loading,
finding the server from the CLI side."""

from __future__ import annotations

import json
import stat

import pytest

from pollux.cli.main import main
from pollux.client import locate_server
from pollux.errors import ConfigError, ServerUnreachableError
from pollux.service.config import HttpConfig, ServerConfig
from pollux.service.http.auth import is_loopback
from pollux.service.http.local_socket import bind_local_socket
from pollux.service.private import new_token
from pollux.service.runner import data_dir_lock


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("localhost", True), ("::1", True), ("127.0.0.2", True),
    ("0.0.0.0", False), ("10.1.2.3", False), ("::", False), ("example.org", False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_every_address_gets_a_token(tmp_path):
    """Defect 2: a token is now always required (generated when not given), so binding
    beyond loopback no longer needs an explicit one."""
    assert ServerConfig(data_dir=tmp_path, http=HttpConfig(host="0.0.0.0")).http.token is None
    token, path = new_token(tmp_path)
    assert len(token) >= 32 and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, _ = new_token(tmp_path)  # every start: a new one, the old one revoked
    assert again != token and path.read_text().strip() == again


def test_one_server_per_data_directory(tmp_path):
    with data_dir_lock(tmp_path), pytest.raises(ConfigError, match="another pollux server"), \
            data_dir_lock(tmp_path):
        pass
    with data_dir_lock(tmp_path):  # released when the first one ended
        pass


def test_the_cli_finds_the_server_and_its_token(tmp_path, monkeypatch):
    monkeypatch.delenv("POLLUX_SERVER", raising=False)
    monkeypatch.delenv("POLLUX_TOKEN", raising=False)
    with pytest.raises(ServerUnreachableError, match="no server found"):
        locate_server(data_dir=tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    token_file.chmod(0o600)
    (tmp_path / "server.json").write_text(json.dumps(
        {"url": "http://127.0.0.1:9/", "pid": 1, "token_file": str(token_file),
         "socket": str(tmp_path / "server.sock")}))
    with pytest.raises(ServerUnreachableError, match="is stale"):  # nobody on the socket
        locate_server(data_dir=tmp_path)
    with bind_local_socket(tmp_path):  # a server listening (this process)
        assert locate_server(data_dir=tmp_path).token == "s3cret"
        assert locate_server(data_dir=tmp_path).url == "http://127.0.0.1:9"
        assert locate_server(data_dir=tmp_path).socket == str(tmp_path / "server.sock")
        assert locate_server(data_dir=tmp_path, token="other").token == "other"
    record = json.loads((tmp_path / "server.json").read_text())
    (tmp_path / "server.json").write_text(json.dumps({**record, "machine": "elsewhere"}))
    with pytest.raises(ServerUnreachableError, match="runs on elsewhere, not on this"):
        locate_server(data_dir=tmp_path)  # a data dir shared with another machine
    monkeypatch.setenv("POLLUX_SERVER", "http://elsewhere:1")
    assert locate_server(data_dir=tmp_path).token is None  # not that server's token file
    assert locate_server(data_dir=tmp_path).socket is None
    # nothing listens there: a runtime failure, not a usage error
    assert main(["ls", "--data-dir", str(tmp_path), "--server", "http://127.0.0.1:9"]) == 1
