"""The server's Unix socket, through which the CLI of the same machine talks to it.

A TCP port proves nothing: after a server dies, any local user may listen on its port,
and a client that trusted ``server.json`` would hand that process the token. The server
therefore also listens on ``<data dir>/server.sock`` (mode 0600, in the 0700 data
directory: no other user can reach it or put anything in its place;
:func:`pollux.service.http.local_socket.bind_local_socket`), and the local CLI connects
there, checking that the process behind it runs as this user (or root,
``SO_PEERCRED``) before a byte of the request -- token included -- is sent
(:mod:`pollux.client.transport`). A socket nobody answers on means ``server.json`` is
stale: the CLI says so and stops.

Once users are registered (``pollux user add``), the socket is opened to every local user
(mode 0666, the data directory 0711: searchable, not listable; every file in it stays
private): the server knows each connection's Unix account from the kernel
(``SO_PEERCRED``) and serves a registered user as that user, with no token; another
user's CLI reaches it through ``--data-dir``, naming the server ``LOCAL_HOST``, and
checks that the process behind it runs as the directory's owner. The last user removed,
both are made private again.

Unix socket paths are limited to about 108 bytes; a longer one is reached through
``/proc/self/fd/<directory fd>/server.sock`` (Linux).

A contract of the server and its clients: standard library only (no layer).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

from pollux.errors import UntrustedPeerError

LOCAL_HOST = "localhost"
"""The ``Host`` other local users' clients name over the shared socket (they cannot read
``server.json``, so they do not know the server's address): the server accepts it on
that socket only (a browser cannot reach a Unix socket: no DNS rebinding there)."""
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
