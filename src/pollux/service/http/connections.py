"""The HTTP server's guard against idle, slow and too many connections.

uvicorn closes a keep-alive connection left idle after a response, but nothing closes
one that never sends a request, or sends its headers or body a byte at a time; each
holds a file descriptor, and past the process's open-files limit the server can no
longer accept, open its job store or start replicas. :func:`guarded_protocol` makes an
h11 protocol class for one server that

- closes a connection whose request headers have not all arrived ``header_timeout_s``
  after it opened (or after the first byte of a later request on it), and one whose body
  has not all arrived ``body_timeout_s`` after its headers;
- keeps at most ``max_connections`` open: a new one beyond evicts the oldest connection
  that has no request in progress (or is itself refused when all are busy);
- over TLS, counts a connection from the moment it is accepted, its handshake included
  (:func:`guarded_protocol` with ``ssl_context``: the guard does the TLS itself, so a
  connection that never finishes its handshake is in the table, evictable, and closed
  ``header_timeout_s`` after it opened; uvicorn would only see it once the handshake is
  done, leaving a flood of half-open handshakes uncounted).

:func:`connection_limits` sizes ``max_connections`` below the open-files limit, leaving
room for the store, the launcher and the connections accepted in one burst.
:class:`OncePerCause` is a logging filter that lets one record per cause through per
interval, so a flood of failing connections cannot flood the log.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import logging
import resource
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from pollux.errors import ConfigError

logger = logging.getLogger(__name__)

ACCEPT_BACKLOG = 128
"""How many connections asyncio accepts in one go at most (its ``backlog``)."""
LISTEN_BACKLOG = 2048
"""The kernel's queue of connections not accepted yet (set once the server listens): a
long queue keeps a flood of connections from dropping new ones' SYNs (a client would
wait a second for its retransmission) while the server accepts and evicts."""
RESERVED_FILES = 128
"""Open files kept free of connections for the store, the launcher and the runtime."""
PEER_UID_STATE = "pollux_peer_uid"
"""Key of a Unix-socket request's peer uid in its ASGI ``scope["state"]`` (set by the
connection, never from anything the client sends)."""
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    """Connections open at once; more evict the oldest idle one."""
    header_timeout_s: float = 5.0
    """A request's headers must all arrive within this long."""
    body_timeout_s: float = 15.0
    """A request's body must all arrive within this long after its headers."""
    keep_alive_s: float = 5.0
    """An idle keep-alive connection is closed after this long (uvicorn's timer)."""


def connection_limits(open_files_limit: int | None = None) -> ConnectionLimits:
    """Limits for a process allowed ``open_files_limit`` files (default: this process's
    soft RLIMIT_NOFILE): connections stay ``RESERVED_FILES`` plus two accept bursts
    below it (at least 16 connections)."""
    if open_files_limit is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        open_files_limit = 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)
    room = open_files_limit - RESERVED_FILES - 2 * ACCEPT_BACKLOG
    return ConnectionLimits(max_connections=max(16, min(room, 4096)))


def unix_peer_uid(transport: asyncio.BaseTransport) -> int | None:
    """The user id of the process at the other end of a Unix-socket connection
    (``SO_PEERCRED``, as the kernel recorded it at connect time); None over TCP."""
    sock = transport.get_extra_info("socket")
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return None
    return int(_PEERCRED.unpack(raw)[1])


class ConnectionTable:
    """The open connections of one server, oldest first, and the evictions done."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open: dict[GuardedProtocol, float] = {}
        self.num_evicted = 0
        self.num_timed_out = 0

    def admit(self, protocol: GuardedProtocol) -> bool:
        """Register ``protocol``; when over the limit close the oldest idle connection
        (True) or, none being idle, refuse ``protocol`` (False)."""
        self.open[protocol] = time.monotonic()
        if len(self.open) <= self.limits.max_connections:
            return True
        for other in self.open:
            if other is not protocol and not other.in_request():
                self.num_evicted += 1
                other.drop("evicted: too many connections")
                return True
        self.open.pop(protocol, None)
        self.num_evicted += 1
        return False

    def forget(self, protocol: GuardedProtocol) -> None:
        self.open.pop(protocol, None)


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with header/body deadlines and the connection table."""

    table: ConnectionTable
    handshake: HandshakeGuard | None = None
    """Over TLS: the connection's guard while it was handshaking (its entry in the table
    is replaced by this protocol's)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._watching: str | None = None
        super().connection_made(transport)
        uid = unix_peer_uid(transport)
        if uid is not None:  # the kernel's word, in every request's scope["state"]
            self.app_state = {**self.app_state, PEER_UID_STATE: uid}
        if self.handshake is not None:
            self.handshake.handshaken()
        if not self.table.admit(self):
            self.drop("refused: too many connections, all busy")
            return
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.table.forget(self)
        self._cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        self._cancel()  # idle now: uvicorn's keep-alive timer takes over
        super().on_response_complete()
        if self.in_request():  # a pipelined request started
            self._watch()

    def in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _watch(self) -> None:
        """Arm the deadline of what the connection waits for from the client."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.in_request():
            if self.cycle.more_body:
                self._arm("body", self.table.limits.body_timeout_s)
            else:
                self._cancel()  # the app has the whole request: no deadline of ours
        else:  # waiting for a request's headers (nothing, or a part of them, came)
            self._arm("headers", self.table.limits.header_timeout_s)

    def _arm(self, what: str, timeout_s: float) -> None:
        if self._watching == what:
            return  # a deadline is never pushed back by more bytes
        self._cancel()
        self._watching = what
        self._deadline = self.loop.call_later(timeout_s, self._expired, what, timeout_s)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._watching = None

    def _expired(self, what: str, timeout_s: float) -> None:
        self._deadline = None
        self.table.num_timed_out += 1
        self.drop(f"the request's {what} did not arrive within {timeout_s:g} s")

    def drop(self, why: str) -> None:
        """Close the connection at once (its file descriptor is freed now)."""
        self._cancel()
        self.table.forget(self)
        logger.debug("closing an HTTP connection: %s", why)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class HandshakeGuard(asyncio.sslproto.SSLProtocol):
    """TLS of one accepted connection, in the connection table from the start: evictable
    (it has no request in progress) and closed when its handshake is not done within the
    header deadline."""

    table: ConnectionTable

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw: asyncio.BaseTransport | None = transport
        self._in_table = self.table.admit(self)  # type: ignore[arg-type]
        super().connection_made(transport)
        if not self._in_table:
            self.drop("refused: too many connections, all busy")

    def handshaken(self) -> None:
        """The handshake is done: the HTTP protocol takes this connection's place."""
        self.table.forget(self)  # type: ignore[arg-type]
        self._in_table = False

    def in_request(self) -> bool:
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.table.forget(self)  # type: ignore[arg-type]
        super().connection_lost(exc)

    def drop(self, why: str) -> None:
        self.table.forget(self)  # type: ignore[arg-type]
        logger.debug("closing a TLS connection: %s", why)
        if self._raw is not None and not self._raw.is_closing():
            self._raw.abort()  # type: ignore[attr-defined]


def tls_protocol(http_class: type[GuardedProtocol], table: ConnectionTable,
                 ssl_context: ssl.SSLContext) -> Callable[..., asyncio.Protocol]:
    """A protocol factory for uvicorn (its ``http``, with no ``ssl`` of its own) that
    wraps each connection's ``http_class`` in a :class:`HandshakeGuard`."""
    guard_class = type("PolluxHandshakeGuard", (HandshakeGuard,), {"table": table})
    timeout_s = table.limits.header_timeout_s

    def create(config: Any, server_state: Any, app_state: Any,
               _loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
        loop = _loop or asyncio.get_event_loop()
        app = http_class(config=config, server_state=server_state, app_state=app_state,
                         _loop=_loop)
        guard = guard_class(loop, app, ssl_context, None, server_side=True,
                            ssl_handshake_timeout=timeout_s)
        app.handshake = guard
        return guard

    return create


def server_tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The server's TLS context (as uvicorn builds one from its certificate and key)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("tls_cert", cert_file, f"cannot load it with --tls-key "
                          f"{key_file} ({exc}); give a PEM certificate (chain) and its "
                          "private key") from exc
    return context


def deepen_backlog(server_class: type[Any]) -> type[Any]:
    """A subclass of uvicorn's ``Server`` whose sockets get ``LISTEN_BACKLOG`` once it
    serves (uvicorn listens with its ``backlog``, which is also asyncio's accept burst)."""

    async def startup(self: Any, sockets: list[Any] | None = None) -> None:
        await server_class.startup(self, sockets=sockets)
        for sock in sockets or ():
            sock.listen(LISTEN_BACKLOG)

    return type("PolluxUvicornServer", (server_class,), {"startup": startup})


def guarded_protocol(limits: ConnectionLimits, ssl_context: ssl.SSLContext | None = None
                     ) -> tuple[Callable[..., asyncio.Protocol], ConnectionTable]:
    """An h11 protocol class for one server (pass it as uvicorn's ``http``), and the
    table of its connections; with ``ssl_context``, a factory doing the TLS too (give
    uvicorn no certificate then: see :func:`tls_protocol`)."""
    table = ConnectionTable(limits)
    http_class = type("PolluxH11Protocol", (GuardedProtocol,), {"table": table})
    if ssl_context is None:
        return http_class, table
    return tls_protocol(http_class, table, ssl_context), table


class OncePerCause(logging.Filter):
    """Lets the first record of each cause (logger, message template, exception type)
    through, then at most one per ``interval_s``, telling how many were held back."""

    def __init__(self, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[Any, ...], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        exc_type = record.exc_info[0] if record.exc_info else None
        key = (record.name, str(record.msg), exc_type)
        now = self.clock()
        with self._lock:
            last, held = self._seen.get(key, (None, 0))
            if last is not None and now - last < self.interval_s:
                self._seen[key] = (last, held + 1)
                return False
            self._seen[key] = (now, 0)
            if len(self._seen) > 4096:  # bounded: forget the oldest causes
                for old in sorted(self._seen, key=lambda k: self._seen[k][0])[:2048]:
                    del self._seen[old]
        if held:
            record.msg = f"{record.msg} ({held} more like it held back in the last " \
                         f"{self.interval_s:g} s)"
        return True
