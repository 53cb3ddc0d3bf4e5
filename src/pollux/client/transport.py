"""How the client's requests reach the server: one HTTP/1.1 connection (standard library
``http.client``), kept open between requests and opened again when the server closed it.

To the server's Unix socket (the local CLI's way, :mod:`pollux.unix_socket`) every new
connection is peer-checked (this user or root) before a byte is sent, and TLS, when the
server serves HTTPS, runs over it with the URL's host checked against the certificate;
otherwise to the URL's host and port, over TLS for ``https``. The standard library
only: ``pollux ls`` starts without loading an HTTP stack and its async machinery.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

from pollux.unix_socket import check_peer, short_path


class TransportError(Exception):
    """A request that got no answer: the connection failed or broke, or the answer was
    not HTTP."""


class ConnectFailed(TransportError):
    """No connection to the server could be opened (refused, unreachable, timed out, an
    untrusted peer, a TLS handshake that failed)."""


@dataclass(frozen=True)
class Response:
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not."""
        return json.loads(self.content)


class Sender(Protocol):
    """What the client sends its requests through: :class:`Transport`, or a test's
    stand-in (an in-process application)."""

    def request(self, method: str, path: str, *, json_body: Any = None,
                params: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> Response: ...

    def close(self) -> None: ...


class _UnixConnection(http.client.HTTPConnection):
    """HTTP (or HTTPS: ``context``) over the server's Unix socket at ``path``, its peer
    checked (``server_uid``, or this user); ``host``/``port`` only name the server
    (``Host``, the certificate)."""

    def __init__(self, path: Path, host: str, port: int | None, timeout_s: float,
                 context: ssl.SSLContext | None, server_uid: int | None) -> None:
        self.default_port = 80 if context is None else 443  # what ``Host`` leaves out
        super().__init__(host, port, timeout=timeout_s)
        self._path = path
        self._context = context
        self._server_uid = server_uid

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            with short_path(self._path) as name:
                sock.connect(name)
            check_peer(sock, self._path, self._server_uid)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _tls_context(tls_cert: str | None) -> ssl.SSLContext:
    """Trusting the server's own certificate ``tls_cert``, else the system's
    authorities."""
    return ssl.create_default_context(cafile=tls_cert)


class Transport:
    """Requests to the server at ``url`` (through the Unix socket ``socket_path`` when
    given, whose peer must run as ``server_uid``, or this user), one at a time on one
    kept-open connection."""

    def __init__(self, url: str, socket_path: str | None = None, tls_cert: str | None = None,
                 timeout_s: float = 15.0, server_uid: int | None = None) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        try:
            self._port = parts.port
        except ValueError:
            self._port = None
            scheme = "?"
        self._unusable = (None if scheme in ("http", "https") and parts.hostname else
                          f"{url!r} is not an http:// or https:// URL with a host and port")
        """Why no request can go to ``url`` (said when one is sent), or None."""
        self._host = parts.hostname or ""
        self._prefix = parts.path.rstrip("/")
        self._context = _tls_context(tls_cert) if scheme == "https" else None
        self._socket_path = None if socket_path is None else Path(socket_path)
        self._timeout_s = timeout_s
        self._server_uid = server_uid
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def _new_connection(self) -> http.client.HTTPConnection:
        if self._socket_path is not None:
            return _UnixConnection(self._socket_path, self._host, self._port, self._timeout_s,
                                   self._context, self._server_uid)
        if self._context is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout_s,
                                               context=self._context)
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)

    def _open(self) -> tuple[http.client.HTTPConnection, bool]:
        """The kept connection when the server has not closed it (nothing to read on an
        idle connection but its end), else a new one; and whether it was kept."""
        connection = self._connection
        if connection is not None and connection.sock is not None:
            readable, _, _ = select.select([connection.sock], [], [], 0)
            if not readable:
                return connection, True
        self.close()
        if self._unusable is not None:
            raise ConnectFailed(self._unusable)
        connection = self._new_connection()
        try:
            connection.connect()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise ConnectFailed(str(exc) or type(exc).__name__) from exc
        self._connection = connection
        return connection, False

    def request(self, method: str, path: str, *, json_body: Any = None,
                params: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> Response:
        """Send one request and read its whole answer. A GET on a kept connection that
        the server closed at that moment is sent again on a new one."""
        target = self._prefix + path + ("?" + urlencode(params) if params else "")
        body = None if json_body is None else json.dumps(json_body).encode()
        sent_headers = {"Accept": "application/json", **(headers or {})}
        if body is not None:
            sent_headers["Content-Type"] = "application/json"
        with self._lock:
            while True:
                connection, kept = self._open()
                try:
                    connection.request(method, target, body=body, headers=sent_headers)
                    answer = connection.getresponse()
                    content = answer.read()
                except (OSError, http.client.HTTPException) as exc:
                    self.close()
                    closed = isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError,
                                              ConnectionResetError))
                    if kept and closed and method == "GET":
                        continue
                    raise TransportError(f"{type(exc).__name__}: {exc}") from exc
                if answer.will_close:
                    self.close()
                return Response(answer.status, content)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
