"""Private files of the data directory: the directory itself (0700), the job store and
the API token (0600). The data directory holds every job's environment (often API keys)
and hints token, and the token that lets anyone run commands as the server's user."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from pollux.errors import ConfigError

logger = logging.getLogger(__name__)

TOKEN_FILE = "token"
"""The generated API token's file in the data directory (mode 0600)."""


def make_private_dir(directory: Path) -> None:
    """Create ``directory`` (mode 0700) or make an existing one private: it holds the
    job store (every job's environment and hints token) and the API token. A directory
    another user owns is refused; group or world access is removed, with a warning."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = directory.stat()
    if info.st_uid != os.getuid():
        raise ConfigError("data_dir", str(directory),
                          f"belongs to another user (uid {info.st_uid}); use a directory of "
                          "your own")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        logger.warning("data directory %s was open to other users (mode %o); made it 0700",
                       directory, mode)
        directory.chmod(0o700)


def make_private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists; remove group/world access
    from an existing one."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            path.chmod(mode & 0o600)


def load_or_create_token(data_dir: Path) -> tuple[str, Path]:
    """The token in ``<data_dir>/token``, generated (mode 0600) when there is none; a
    token file that others can read is made private again, with a warning."""
    path = data_dir / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            logger.warning("token file %s was readable by others (mode %o); made it 0600 -- "
                           "replace the token if others may have read it", path, mode)
            path.chmod(0o600)
        token = path.read_text().strip()
        if not token:
            raise ConfigError("token_file", str(path), "is empty; delete it to generate a "
                                                       "new token") from None
        return token, path
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip(), path
