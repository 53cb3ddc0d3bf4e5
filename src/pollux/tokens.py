"""Where the server token comes from, kept out of every other user's sight.

The token lets its holder run any command as the server's user, so it is never taken
from a command line (``ps`` shows argv to every local user): the server and the CLI take
it from ``--token-file FILE`` (mode 0600, owned by the user: a file others can read is
refused) or the environment variable ``POLLUX_TOKEN`` (``/proc/<pid>/environ`` is
readable by its owner only), else the server generates one into its data directory. The
server removes ``POLLUX_TOKEN`` from its environment once read, so nothing it starts
(replicas, a local Ray) inherits it; replicas get their job's own hints token only.

A contract of the server and its clients: standard library only (no layer).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pollux.errors import ConfigError

TOKEN_ENV = "POLLUX_TOKEN"
"""Environment variable holding the token (server and CLI)."""
HIDDEN = "<hidden>"
"""What error messages show instead of a token."""


def argv_token_refused(flag: str = "--token") -> ConfigError:
    """The error for a token given on the command line."""
    return ConfigError(flag.lstrip("-"), HIDDEN,
                       f"{flag} is no longer accepted: a command line is visible to every "
                       "local user (ps). Put the token in a file only you can read and pass "
                       f"--token-file FILE (chmod 600 FILE), or set the environment "
                       f"variable {TOKEN_ENV}")


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in ``path``, which must be a file of this user that no one else can
    read (mode 0600 or stricter)."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("token_file", str(path), "is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid != os.getuid():
            raise ConfigError("token_file", str(path),
                              f"belongs to another user (uid {info.st_uid}); use a token "
                              "file of your own (chmod 600)")
        if mode & 0o077:
            raise ConfigError("token_file", str(path),
                              f"is readable by other users (mode {mode:o}): run 'chmod 600 "
                              f"{path}' and replace the token if others may have read it")
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError("token_file", str(path), f"cannot be read: {exc}") from exc
    if not token:
        raise ConfigError("token_file", str(path), "is empty")
    return token


def token_from_environment(remove: bool = False) -> str | None:
    """``$POLLUX_TOKEN`` (None when unset or empty); ``remove``: take it out of this
    process's environment so that no child inherits it."""
    value = os.environ.pop(TOKEN_ENV, None) if remove else os.environ.get(TOKEN_ENV)
    return value.strip() if value and value.strip() else None
