"""HTTP client of the scheduler service, used by the CLI (and the tests).

The server is found from ``--server URL``, else ``$POLLUX_SERVER``, else the
``server.json`` a running server writes in its data directory. The server of that
record is reached through its Unix socket (see :mod:`pollux.service.http.local_socket`), never
its TCP port, and only once it answers there as this user; the token from
``--token-file`` (mode 0600), ``$POLLUX_TOKEN``, or the token file the server recorded
(never from the command line: see :mod:`pollux.service.http.tokens`). A server named by a
plain-HTTP URL first proves it holds the token (:mod:`pollux.server_proof`).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from pollux.errors import ServerUnreachableError, ServiceError
from pollux.server_proof import NONCE_PARAM, PROOF_PATH, new_nonce, proof_matches
from pollux.service.http.local_socket import (
    SOCKET_FILE,
    UntrustedPeerError,
    local_transport,
    probe,
)
from pollux.service.http.sessions import format_origin, origin_of
from pollux.service.http.tokens import read_token_file, token_from_environment
from pollux.service.runner import SERVER_FILE
from pollux.service.server import default_data_dir

DEFAULT_TIMEOUT_S = 15.0
LOCAL_HOST = "localhost"
"""The host another user's client names over a server's shared socket (it cannot read
the server's ``server.json``, so it knows no address; the server accepts it there)."""


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


class PolluxClient:
    """Thin wrapper over the REST API; errors become ServiceError with the field."""

    def __init__(self, address: ServerAddress, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._auth = {"Authorization": f"Bearer {address.token}"} if address.token else {}
        self._proven = (not address.token or address.socket is not None
                        or address.url.lower().startswith("https://"))
        """Whether the peer has proved it is the server (or need not: no token to give,
        the Unix socket's peer check, or HTTPS's certificate)."""
        self.address = address
        verify: Any = True
        if address.tls_cert:
            verify = ssl.create_default_context(cafile=address.tls_cert)
        transport = (None if address.socket is None
                     else local_transport(Path(address.socket), address.tls_cert,
                                          address.server_uid))
        self._http = httpx.Client(base_url=address.url, timeout=timeout_s, verify=verify,
                                  transport=transport)

    def __enter__(self) -> PolluxClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _prove_server(self) -> None:
        """Plain HTTP: have the server prove it holds the token before sending it (see
        :mod:`pollux.server_proof`)."""
        assert self.address.token is not None
        url = self.address.url
        origin = origin_of(*urlsplit(url)[:2])
        nonce = new_nonce()
        try:
            response = self._http.get(PROOF_PATH, params={NONCE_PARAM: nonce})
            answer = response.json().get("proof") if response.status_code == 200 else None
            reason = f"it answered {response.status_code}"
        except httpx.ConnectError as exc:
            raise ServerUnreachableError(f"cannot reach the server at {url}: {exc}") from exc
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            answer, reason = None, f"{type(exc).__name__}: {exc}"
        if origin is None or not proof_matches(self.address.token, nonce,
                                               format_origin(origin), answer):
            raise ServerUnreachableError(
                f"the process at {url} did not prove it is the pollux server holding this "
                f"token ({reason}), so the token was not sent: the port may belong to "
                "another program now. On the server's machine use --data-dir (its Unix "
                "socket); across machines, HTTPS")
        self._proven = True

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        if not self._proven:
            self._prove_server()
        kwargs["headers"] = {**kwargs.get("headers", {}), **self._auth}
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServerUnreachableError(f"cannot reach the server at {self.address.url}: "
                                         f"{exc}") from exc
        if response.status_code >= 400:
            try:
                body = response.json()
                message, field = str(body.get("detail")), body.get("field")
            except (ValueError, AttributeError):
                message, field = response.text, None
            raise ServiceError(response.status_code, message, field)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def dashboard_login(self) -> dict[str, Any]:
        """A one-time dashboard link: ``{"path": "/?login=<code>", "expires_in_s": 60}``."""
        result: dict[str, Any] = self._call("POST", "/api/dashboard/login")
        return result

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/api/health")
        return result

    def submit(self, spec: dict[str, Any], team: str | None = None) -> dict[str, Any]:
        """Submit ``spec`` into ``team`` (None: the submitter's first team)."""
        params = {} if team is None else {"team": team}
        result: dict[str, Any] = self._call("POST", "/api/jobs", json=spec, params=params)
        return result

    def whoami(self) -> dict[str, Any]:
        """Who the server takes this client for (``GET /api/whoami``)."""
        result: dict[str, Any] = self._call("GET", "/api/whoami")
        return result

    def users(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/users")
        return result

    def add_user(self, name: str, teams: list[str], team_admin: bool = False,
                 admin: bool = False) -> dict[str, Any]:
        """Register a user; the answer carries its token (shown this once)."""
        result: dict[str, Any] = self._call("POST", "/api/users", json={
            "name": name, "teams": teams, "team_admin": team_admin, "admin": admin})
        return result

    def remove_user(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("DELETE", f"/api/users/{quote(name, safe='')}")
        return result

    def rotate_token(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST",
                                            f"/api/users/{quote(name, safe='')}/token")
        return result

    def teams(self) -> dict[str, Any]:
        """Each team's quota, GPUs in use, lent, borrowed and pending (``/api/teams``)."""
        result: dict[str, Any] = self._call("GET", "/api/teams")
        return result

    def jobs(self, finished: int | None = None) -> list[dict[str, Any]]:
        """Every job not finished, and the newest ``finished`` finished jobs (the server's
        default, 100, when None)."""
        path = "/api/jobs" if finished is None else f"/api/jobs?limit={int(finished)}"
        result: list[dict[str, Any]] = self._call("GET", path)
        return result

    def job(self, ref: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/jobs/{quote(ref, safe='')}")
        return result

    def cancel(self, ref: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/jobs/{quote(ref, safe='')}/cancel")
        return result

    def nodes(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/nodes")
        return result

    def cluster(self) -> dict[str, Any]:
        """Nodes now and the autoscaler's desired size (see ``GET /api/cluster``)."""
        result: dict[str, Any] = self._call("GET", "/api/cluster")
        return result

    def cluster_history(self) -> dict[str, Any]:
        """Recent rounds as columns (``GET /api/cluster/history``: round_s, slots_used...)."""
        result: dict[str, Any] = self._call("GET", "/api/cluster/history")
        return result

    def logs(self, ref: str, replica: int = 0, offset: int = 0,
             limit: int = 65536) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "GET", f"/api/jobs/{quote(ref, safe='')}/logs",
            params={"replica": replica, "offset": offset, "limit": limit})
        return result
