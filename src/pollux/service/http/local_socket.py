"""The server's Unix socket, through which the CLI of the same machine talks to it.

A TCP port proves nothing: after a server dies, any local user may listen on its port,
and a client that trusted ``server.json`` would hand that process the token. The server
therefore also listens on ``<data dir>/server.sock`` (mode 0600, in the 0700 data
directory: no other user can reach it or put anything in its place), and the local CLI
connects there, checking that the process behind it runs as this user (or root,
``SO_PEERCRED``) before a byte of the request -- token included -- is sent. A socket
nobody answers on means ``server.json`` is stale: the CLI says so and stops.

Once users are registered (``pollux user add``), the socket is opened to every local user
(mode 0666, the data directory 0711: searchable, not listable; every file in it stays
private): the server knows each connection's Unix account from the kernel
(``SO_PEERCRED``) and serves a registered user as that user, with no token; another
user's CLI reaches it through ``--data-dir`` and checks that the process behind it runs
as the directory's owner. The last user removed, both are made private again.

Unix socket paths are limited to about 108 bytes; a longer one is reached through
``/proc/self/fd/<directory fd>/server.sock`` (Linux).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import stat
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpcore
import httpx

from pollux.errors import ConfigError, UntrustedPeerError

SOCKET_FILE = "server.sock"
"""The server's Unix socket in its data directory."""
MAX_SUN_PATH = 100
"""Longest path bound or connected directly (the kernel's limit is 107 bytes)."""
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@contextlib.contextmanager
def short_path(path: Path) -> Iterator[str]:
    """A name of ``path`` short enough for ``bind``/``connect``."""
    if len(os.fsencode(path)) <= MAX_SUN_PATH:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def bind_local_socket(data_dir: Path) -> socket.socket:
    """Listen on ``<data_dir>/server.sock`` (mode 0600), replacing a stale one (the
    caller holds the data directory's lock: no live server owns it)."""
    path = data_dir / SOCKET_FILE
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ConfigError("data_dir", str(data_dir), f"{path} exists and is not a "
                                                         "socket; remove it")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.fchmod(sock.fileno(), 0o600)  # Linux creates the file with this mode (& ~umask)
        with short_path(path) as name:
            sock.bind(name)
        os.chmod(path, 0o600)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError("data_dir", str(data_dir), f"cannot listen on {path}: {exc}"
                          ) from exc
    return sock


def share_local_socket(data_dir: Path, shared: bool) -> None:
    """Open the socket to every local user (``shared``: registered users are
    configured; the data directory becomes 0711, searchable but not listable, and the
    socket 0666: the server tells users apart by their peer uid), or close it to all but
    this user again (0700 and 0600)."""
    path = data_dir / SOCKET_FILE
    try:
        os.chmod(data_dir, 0o711 if shared else 0o700)
        if path.exists():
            os.chmod(path, 0o666 if shared else 0o600)
    except OSError as exc:
        raise ConfigError("data_dir", str(data_dir), f"cannot change the mode of {path}: "
                                                     f"{exc}") from exc


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a connected Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return int(_PEERCRED.unpack(raw)[1])


def check_peer(sock: socket.socket, path: Path | str, server_uid: int | None = None) -> None:
    """Refuse a peer that is neither ``server_uid`` (default: this user) nor root."""
    uid = peer_uid(sock)
    expected = os.getuid() if server_uid is None else server_uid
    if uid not in (expected, 0):
        whom = "you" if server_uid is None else "the owner of the data directory"
        raise UntrustedPeerError(f"the process behind {path} runs as uid {uid}, not as "
                                 f"{whom} (uid {expected}): not sending it anything")


def probe(path: Path, timeout_s: float = 5.0, server_uid: int | None = None) -> None:
    """Connect to the server's socket and check its peer; OSError when nobody answers
    (FileNotFoundError, ConnectionRefusedError) or the peer is untrusted."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        with short_path(path) as name:
            sock.connect(name)
        check_peer(sock, path, server_uid)


class _PeerCheckedBackend(httpcore.SyncBackend):
    """httpcore's network backend, checking the peer of every Unix socket it opens."""

    def __init__(self, server_uid: int | None = None) -> None:
        self.server_uid = server_uid

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
                            ) -> httpcore.NetworkStream:
        with short_path(Path(path)) as name:
            stream = super().connect_unix_socket(name, timeout, socket_options)
        try:
            check_peer(stream.get_extra_info("socket"), path, self.server_uid)
        except OSError as exc:
            stream.close()
            raise httpcore.ConnectError(str(exc)) from exc
        return stream


def local_transport(path: Path, tls_cert: str | None, server_uid: int | None = None
                    ) -> httpx.HTTPTransport:
    """An httpx transport to the server's Unix socket at ``path`` (requests keep their
    URL: its host names the server in ``Host``, and for ``https`` the certificate is
    checked against it, trusting ``tls_cert``)."""
    context = ssl.create_default_context(cafile=tls_cert)
    transport = httpx.HTTPTransport(uds=str(path), verify=context)
    transport._pool = httpcore.ConnectionPool(  # the same pool, peer-checked connections
        ssl_context=context, uds=str(path), network_backend=_PeerCheckedBackend(server_uid),
        max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)
    return transport
