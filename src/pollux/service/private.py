"""Private files of the data directory: the directory itself (0700), the job store and
the API token (0600). The data directory holds every job's environment (often API keys)
and hints token, and the token that lets anyone run commands as the server's user.

A private directory is only as safe as the directories above it: another user who may
write one of them can move the data directory aside and put her own in its place, then
read the logs, plant checkpoints, or have the job's output appended to a file of her
choosing. So, as ssh does for its files, every ancestor must belong to root or to this
user and be writable by no one else, unless it is sticky (``/tmp``: there nobody renames
or removes another's entries); :func:`check_ancestors` refuses the data directory
otherwise, naming the ancestor."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from pollux.data_dir import DATA_DIR_MARKERS, TOKEN_FILE
from pollux.errors import ConfigError

logger = logging.getLogger(__name__)

def make_private_dir(directory: Path) -> None:
    """Create ``directory`` (mode 0700) or make an existing one private: it holds the
    job store (every job's environment and hints token) and the API token. A directory
    another user owns is refused; group or world access is removed, with a warning."""
    check_ancestors(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_ancestors(directory.resolve())
    info = directory.stat()
    if info.st_uid != os.getuid():
        raise ConfigError("data_dir", str(directory),
                          f"belongs to another user (uid {info.st_uid}); use a directory of "
                          "your own")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o066:  # read or write; search alone (0711: users reach the socket) is kept
        if not _is_data_dir(directory):
            raise ConfigError("data_dir", str(directory),
                              f"is open to other users (mode {mode:o}) and holds files that "
                              "are not Pollux's, so it is not made private for you (that "
                              "would lock others out of them); give --data-dir a directory "
                              "of its own, or run 'chmod 700' on it yourself")
        logger.warning("data directory %s was open to other users (mode %o); made it 0700",
                       directory, mode)
        directory.chmod(0o700)


def check_ancestors(directory: Path) -> None:
    """Refuse ``directory`` when a directory above it (its real path's, and the path's
    as given) belongs to a user other than root and this one, or is writable by group
    or others without the sticky bit."""
    seen: set[Path] = set()
    for path in (Path(os.path.abspath(directory)), Path(os.path.realpath(directory))):
        for ancestor in path.parents:
            if ancestor in seen:
                continue
            seen.add(ancestor)
            try:
                info = os.stat(ancestor)
            except OSError:
                continue  # not there yet: created below one that is checked
            mode = stat.S_IMODE(info.st_mode)
            if info.st_uid not in (0, os.getuid()):
                raise ConfigError("data_dir", str(directory),
                                  f"{ancestor} above it belongs to another user (uid "
                                  f"{info.st_uid}), who could move the data directory aside "
                                  "and put her own in its place; use a directory whose "
                                  "every parent is yours or root's")
            if mode & 0o022 and not mode & stat.S_ISVTX:
                raise ConfigError("data_dir", str(directory),
                                  f"{ancestor} above it is writable by other users (mode "
                                  f"{mode:o}, not sticky), who could move the data directory "
                                  "aside and put their own in its place; use a directory "
                                  f"under one only you can write, or 'chmod go-w {ancestor}'")


def _is_data_dir(directory: Path) -> bool:
    """Empty, or already a Pollux data directory: safe to make private. Anything else
    (``/``, a home directory, a shared project folder) is left as it is."""
    try:
        with os.scandir(directory) as entries:
            names = {entry.name for entry in entries}
    except OSError:
        return False
    return not names or any(marker in names for marker in DATA_DIR_MARKERS)


def make_private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists; remove group/world access
    from an existing one."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            path.chmod(mode & 0o600)


def new_token(data_dir: Path) -> tuple[str, Path]:
    """A fresh random token, written to ``<data_dir>/token`` (mode 0600) in place of the
    previous one: a generated token lasts as long as its server (a restart revokes it,
    and with it whatever copies were made of it)."""
    path = data_dir / TOKEN_FILE
    tmp = path.with_name(TOKEN_FILE + ".tmp")
    tmp.unlink(missing_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.replace(tmp, path)
    return token, path
