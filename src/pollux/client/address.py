"""Where the server is and which token to send it.

The server is found from ``--server URL``, else ``$POLLUX_SERVER``, else the
``server.json`` a running server writes in its data directory
(:mod:`pollux.data_dir`). The server of that record is reached through its Unix socket
(see :mod:`pollux.unix_socket`), never its TCP port, and only once it answers there as
this user; the token from ``--token-file`` (mode 0600), ``$POLLUX_TOKEN``, or the token
file the server recorded (never from the command line: see :mod:`pollux.tokens`). The
server of another user's data directory (whose ``server.json`` this user cannot read) is
reached through its shared socket, with no token, once the process behind it runs as the
directory's owner.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pollux.data_dir import SERVER_FILE, SOCKET_FILE, default_data_dir
from pollux.errors import ServerUnreachableError, UntrustedPeerError
from pollux.tokens import read_token_file, token_from_environment
from pollux.unix_socket import LOCAL_HOST, probe


@dataclass(frozen=True)
class ServerAddress:
    url: str
    token: str | None = None
    tls_cert: str | None = None
    """Certificate to trust for an ``https`` URL (the server's own, from server.json);
    None: the system's trusted authorities."""
    socket: str | None = None
    """The server's Unix socket: requests go there (the URL then only names the server
    in ``Host`` and for TLS), never to the URL's TCP port."""
    server_uid: int | None = None
    """The Unix user the process behind ``socket`` must run as (None: this user): for
    another user's server, the owner of its data directory."""


def server_address(record: dict[str, Any]) -> ServerAddress:
    """The address and token of a running server from its ``server.json`` record."""
    token_file = record.get("token_file")
    return ServerAddress(str(record["url"]).rstrip("/"),
                         None if not token_file else read_token_file(token_file),
                         record.get("tls_cert"), record.get("socket"))


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def local_socket_of(record: dict[str, Any], server_file: Path) -> str:
    """The Unix socket of the server that wrote ``record``, once a process of this user
    (or root) answers on it; a stale record is an error saying so."""
    path = record.get("socket")
    machine = record.get("machine")
    if machine and machine != socket.gethostname():
        raise ServerUnreachableError(
            f"the server of {server_file.parent} runs on {machine}, not on this machine, "
            "and its Unix socket works there only: pass --server URL (with --token-file "
            "FILE or $POLLUX_TOKEN)")
    if not path:
        raise ServerUnreachableError(
            f"{server_file} names no local socket (an older pollux server wrote it): "
            "restart the server, or pass --server URL with --token-file")
    try:
        probe(Path(path))
    except UntrustedPeerError as exc:
        raise ServerUnreachableError(f"{exc}; {server_file} is not trusted") from exc
    except OSError as exc:
        pid = record.get("pid")
        fate = "is gone" if not _alive(pid) else "does not answer"
        raise ServerUnreachableError(
            f"{server_file} is stale: no server answers on {path} ({exc.strerror or exc}); "
            f"the server that wrote it (pid {pid}) {fate}. Start one with 'pollux server "
            f"--data-dir {server_file.parent}'. Nothing was sent to its old port "
            f"({record.get('url')}), which another program may hold now") from exc
    return str(path)


def shared_socket_of(directory: Path) -> ServerAddress:
    """The server of another user's data directory, reached through its Unix socket,
    which the server opens to local users once users are registered; the server knows
    who connects from the socket's peer uid, so no token is sent, and the process behind
    the socket must run as the directory's owner."""
    path = directory / SOCKET_FILE
    try:
        owner = directory.stat().st_uid
        probe(path, server_uid=owner)
    except UntrustedPeerError as exc:
        raise ServerUnreachableError(f"{exc}; not trusting {path}") from exc
    except OSError as exc:
        raise ServerUnreachableError(
            f"the pollux server of {directory} belongs to another user and does not "
            f"answer on {path} ({exc.strerror or exc}): it opens that socket to other local "
            "users once it has registered users ('pollux user add NAME --team T', run by "
            "its owner)") from exc
    return ServerAddress(f"http://{LOCAL_HOST}", None, None, str(path), owner)


def locate_server(server: str | None = None, data_dir: str | os.PathLike[str] | None = None,
                  token: str | None = None, token_file: str | None = None) -> ServerAddress:
    """Where the server is and which token to send (see the module docstring)."""
    directory = Path(data_dir) if data_dir is not None else default_data_dir()
    record: dict[str, Any] = {}
    server_file = directory / SERVER_FILE
    try:
        if server_file.is_file():
            record = json.loads(server_file.read_text())
    except PermissionError:  # another user's server: its shared socket, by peer uid
        if server is None and not os.environ.get("POLLUX_SERVER"):
            return shared_socket_of(directory)
    except (OSError, json.JSONDecodeError):
        record = {}
    url = server or os.environ.get("POLLUX_SERVER") or record.get("url")
    if not url:
        raise ServerUnreachableError(
            f"no server found: none is running on {directory} (no {SERVER_FILE}); start one "
            "with 'pollux server' or pass --server URL")
    if token is None and token_file is not None:
        token = read_token_file(token_file)
    if token is None:
        token = token_from_environment()
    same_server = url.rstrip("/") == str(record.get("url", "")).rstrip("/")
    if not same_server:  # a server named by URL: TCP, with a token given for it
        return ServerAddress(url.rstrip("/"), token)
    local = local_socket_of(record, server_file)  # before reading its token
    if token is None and record.get("token_file"):
        token = read_token_file(record["token_file"])
    return ServerAddress(url.rstrip("/"), token, record.get("tls_cert"), local)
