"""The server's side of its Unix socket (why it has one, how clients trust it, and when
other local users may reach it: :mod:`pollux.unix_socket`)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from pollux.data_dir import SOCKET_FILE
from pollux.errors import ConfigError
from pollux.unix_socket import short_path


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
