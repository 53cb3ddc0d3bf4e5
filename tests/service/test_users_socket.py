"""Issue 32: on the server's machine a registered user needs no token: once users are
registered, the server's local socket admits other local users and knows each by the
kernel's peer uid (SO_PEERCRED); an account that is no registered user is refused, and
no header makes one user another. Needs root (to act as other Unix accounts)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pollux.cli.main import main
from pollux.client import PolluxClient, locate_server
from pollux.errors import PolluxError, ServiceError
from tests.service.e2e_helpers import ServerProcess


def _has_accounts(*names: str) -> bool:
    try:
        for name in names:
            pwd.getpwnam(name)
    except KeyError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="acts as other Unix users: needs root"),
    pytest.mark.skipif(not _has_accounts("nobody", "daemon"),
                       reason="needs the accounts nobody and daemon"),
]

SPEC = {"name": "mine", "command": ["true"], "working_dir": "/tmp", "max_replicas": 1,
        "env": {"SECRET": "root-only"}}


def as_uid(uid: int, body: Callable[[], Any]) -> Any:
    """Run ``body`` in a child process running as ``uid``; its result (JSON), or the
    error it raised as ``{"error": status or type, "detail": ...}``."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork in a threaded process
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                result = body()
            except ServiceError as exc:
                result = {"error": exc.status, "detail": str(exc)}
            except PolluxError as exc:
                result = {"error": type(exc).__name__, "detail": str(exc)}
            os.write(write_end, json.dumps(result).encode())
        except BaseException:  # noqa: BLE001 - report anything, exit the child
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(b"".join(chunks))


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data directory other users may search the way to (pytest's are 0700)."""
    parent = Path(tempfile.mkdtemp(prefix="pollux-users-", dir="/tmp"))
    parent.chmod(0o711)
    yield parent / "data"
    shutil.rmtree(parent, ignore_errors=True)


def test_local_users_are_known_by_their_unix_account(data_dir: Path, capsys):
    nobody = pwd.getpwnam("nobody").pw_uid
    unregistered = pwd.getpwnam("daemon").pw_uid
    server = ServerProcess(data_dir)
    try:
        root = server.start()
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700  # no users: private
        theirs = root.submit(SPEC)  # the server's own account's job
        assert main(["user", "add", "nobody", "--team", "vision", "--json",
                     "--data-dir", str(data_dir)]) == 0
        added = json.loads(capsys.readouterr().out)
        assert added["name"] == "nobody" and added["token"].startswith("pollux-user-")
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o711
        assert stat.S_IMODE((data_dir / "server.sock").stat().st_mode) == 0o666

        def as_nobody() -> dict[str, Any]:
            with PolluxClient(locate_server(data_dir=data_dir)) as client:
                me = client.whoami()
                job = client.submit({**SPEC, "env": {}})
                rows = client.jobs()
                try:
                    client.cancel(theirs["id"])
                    cancelled = True
                except ServiceError as exc:
                    cancelled = exc.status
                try:
                    client.job(theirs["id"])
                    read = True
                except ServiceError as exc:
                    read = exc.status
                return {"me": me["name"], "job": job, "rows": rows,
                        "cancelled": cancelled, "read": read,
                        "dashboard": client.dashboard_login()["url"]}

        seen = as_uid(nobody, as_nobody)
        assert seen["me"] == "nobody"
        assert (seen["job"]["owner"], seen["job"]["team"]) == ("nobody", "vision")
        assert {row["id"]: row["owner"] for row in seen["rows"]} == {
            theirs["id"]: None, seen["job"]["id"]: "nobody"}
        assert seen["cancelled"] == 403 and seen["read"] == 403
        assert seen["dashboard"] == root.address.url  # its link names the server's port
        assert "root-only" not in json.dumps(seen)
        assert not any(j["cancel_requested"] for j in root.jobs())

        def claim_to_be_someone_else() -> dict[str, Any]:
            """Headers naming a user do not make a request theirs."""
            with PolluxClient(locate_server(data_dir=data_dir)) as client:
                response = client._transport.request("GET", "/api/whoami", headers={
                    "X-Pollux-User": "nobody", "X-Remote-User": "nobody"})
                return {"status": response.status_code}

        refused = as_uid(unregistered, lambda: PolluxClient(
            locate_server(data_dir=data_dir)).whoami())
        assert refused["error"] == 401
        assert as_uid(unregistered, claim_to_be_someone_else) == {"status": 401}

        assert main(["user", "rm", "nobody", "--data-dir", str(data_dir)]) == 0
        assert as_uid(nobody, lambda: PolluxClient(
            locate_server(data_dir=data_dir)).whoami())["error"] in (401,
                                                                      "ServerUnreachableError")
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700  # no users left: private
    finally:
        server.cleanup()
