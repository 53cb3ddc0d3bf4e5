"""The REST API's client: one method per call, answers as the JSON the server sends.

Errors become :class:`~pollux.errors.ServiceError` (the status, the message and the
field the server named) or :class:`~pollux.errors.ServerUnreachableError`. A server
named by a plain-HTTP URL first proves it holds the token (:mod:`pollux.server_proof`);
one reached through its Unix socket is checked by its peer's user
(:mod:`pollux.client.transport`), one over HTTPS by its certificate.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any
from urllib.parse import quote

from pollux.client.address import ServerAddress
from pollux.client.transport import ConnectFailed, Sender, Transport, TransportError
from pollux.errors import ServerUnreachableError, ServiceError
from pollux.server_proof import NONCE_PARAM, PROOF_PATH, new_nonce, proof_matches, url_origin

DEFAULT_TIMEOUT_S = 15.0


class PolluxClient:
    """Thin wrapper over the REST API; errors become ServiceError with the field."""

    def __init__(self, address: ServerAddress, timeout_s: float = DEFAULT_TIMEOUT_S,
                 transport: Sender | None = None) -> None:
        self._auth = {"Authorization": f"Bearer {address.token}"} if address.token else {}
        self._proven = (not address.token or address.socket is not None
                        or address.url.lower().startswith("https://"))
        """Whether the peer has proved it is the server (or need not: no token to give,
        the Unix socket's peer check, or HTTPS's certificate)."""
        self.address = address
        self._transport: Sender = transport or Transport(
            address.url, address.socket, address.tls_cert, timeout_s, address.server_uid)
        """Where requests go: the server at ``address`` unless ``transport`` is given."""

    def __enter__(self) -> PolluxClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    def _prove_server(self) -> None:
        """Plain HTTP: have the server prove it holds the token before sending it (see
        :mod:`pollux.server_proof`)."""
        assert self.address.token is not None
        url = self.address.url
        origin = url_origin(url)
        nonce = new_nonce()
        try:
            response = self._transport.request("GET", PROOF_PATH, params={NONCE_PARAM: nonce})
            answer = response.json().get("proof") if response.status_code == 200 else None
            reason = f"it answered {response.status_code}"
        except ConnectFailed as exc:
            raise ServerUnreachableError(f"cannot reach the server at {url}: {exc}") from exc
        except (TransportError, ValueError, AttributeError) as exc:
            answer, reason = None, f"{type(exc).__name__}: {exc}"
        if origin is None or not proof_matches(self.address.token, nonce, origin, answer):
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
            response = self._transport.request(method, path, **kwargs)
        except TransportError as exc:
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
        result: dict[str, Any] = self._call("POST", "/api/jobs", json_body=spec,
                                            params=params)
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
        result: dict[str, Any] = self._call("POST", "/api/users", json_body={
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
             limit: int = 65536, rotated: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = {"replica": replica, "offset": offset, "limit": limit}
        if rotated:
            params["rotated"] = "true"
        result: dict[str, Any] = self._call(
            "GET", f"/api/jobs/{quote(ref, safe='')}/logs", params=params)
        return result
