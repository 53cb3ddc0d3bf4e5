"""Registered users of the service, kept in the job store's ``users`` table.

A user has a name (on the server's machine, the name of the Unix account it is
identified as over the local socket), one or more teams (the first is where its jobs go
unless a submission names another), and two flags: a *team admin* acts on every job of
its teams, an *admin* on every job. Each user has one API token, shown once when the
user is added or the token rotated; the store keeps only its SHA-256 hash, so a copy of
the store (a backup, a stolen disk) yields no token that the server would accept. The
tokens are 256 random bits, so a hash cannot be reversed by guessing; no key
stretching is needed (that is for passwords people choose).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pollux.errors import ConfigError, UnknownUserError
from pollux.service.storage.sqlite_db import Database

__all__ = ["TOKEN_PREFIX", "UserRecord", "UserStore", "check_team_name", "check_user_name",
           "hash_token"]

TOKEN_PREFIX = "pollux-user-"
"""How a user token begins (the server token and the jobs' hints tokens do not)."""
USER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
"""A user name: a Unix account name (letters, digits, ``_.-``; not starting with a
digit, ``-`` or ``.``), at most 64 characters."""
TEAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_TEAMS_PER_USER = 64
MAX_USERS = 100_000


def check_user_name(name: object) -> str:
    if not isinstance(name, str) or not USER_NAME.match(name):
        raise ConfigError("name", name, "a user name is a Unix account name: letters, "
                                        "digits and _.- (not starting with a digit, - or "
                                        ".), at most 64 characters")
    return name


def check_team_name(team: object) -> str:
    if not isinstance(team, str) or not TEAM_NAME.match(team):
        raise ConfigError("team", team, "a team name is letters, digits and ._- (starting "
                                        "with a letter or digit), at most 64 characters")
    return team


def hash_token(token: str) -> str:
    """What the store keeps of a user token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_user_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class UserRecord:
    """One registered user (its token is not here: only its hash is stored)."""

    name: str
    teams: tuple[str, ...]
    """Its teams, the default one first."""
    team_admin: bool = False
    """Acts on every job of its teams (cancels, reads logs)."""
    admin: bool = False
    """Acts on every job."""
    created_at: float = 0.0
    token_rotated_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "teams": list(self.teams), "team_admin": self.team_admin,
                "admin": self.admin, "created_at": self.created_at,
                "token_rotated_at": self.token_rotated_at}


_COLUMNS = "name, teams, team_admin, admin, created_at, token_rotated_at"


def _user_from_row(row: Sequence[Any]) -> UserRecord:
    teams = json.loads(row[1])
    return UserRecord(str(row[0]), tuple(str(team) for team in teams), bool(row[2]),
                      bool(row[3]), float(row[4]), float(row[5]))


class UserStore:
    """The users of one job store (its :class:`~pollux.service.storage.sqlite_db.Database`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, name: str, teams: Sequence[str], now: float, team_admin: bool = False,
            admin: bool = False) -> tuple[UserRecord, str]:
        """Register ``name`` in ``teams`` (the first is its default); the new user and
        its token (returned here once: only its hash is stored)."""
        check_user_name(name)
        if not teams:
            raise ConfigError("team", [], "a user needs at least one team: --team T")
        if len(teams) > MAX_TEAMS_PER_USER:
            raise ConfigError("team", len(teams), f"at most {MAX_TEAMS_PER_USER} teams")
        unique = tuple(dict.fromkeys(check_team_name(team) for team in teams))
        token = new_user_token()

        def write(cur: sqlite3.Cursor) -> None:
            if cur.execute("SELECT 1 FROM users WHERE name=?", (name,)).fetchone():
                raise ConfigError("name", name, "a user by that name exists: rotate its "
                                                "token with 'pollux user token NAME', or "
                                                "remove it first")
            if cur.execute("SELECT COUNT(*) FROM users").fetchone()[0] >= MAX_USERS:
                raise ConfigError("name", name, f"at most {MAX_USERS} users")
            cur.execute(f"INSERT INTO users({_COLUMNS}, token_hash) VALUES (?, ?, ?, ?, ?, "
                        "?, ?)", (name, json.dumps(list(unique)), int(team_admin),
                                  int(admin), now, now, hash_token(token)))
        self.db.write(write)
        return UserRecord(name, unique, team_admin, admin, now, now), token

    def rotate(self, name: str, now: float) -> str:
        """A new token for ``name``; the old one stops working at once."""
        token = new_user_token()

        def write(cur: sqlite3.Cursor) -> None:
            cur.execute("UPDATE users SET token_hash=?, token_rotated_at=? WHERE name=?",
                        (hash_token(token), now, name))
            if cur.rowcount == 0:
                raise UnknownUserError(name)
        self.db.write(write)
        return token

    def remove(self, name: str) -> None:
        """Unregister ``name`` (its token and sessions stop working; its jobs keep their
        owner)."""
        def write(cur: sqlite3.Cursor) -> None:
            cur.execute("DELETE FROM users WHERE name=?", (name,))
            if cur.rowcount == 0:
                raise UnknownUserError(name)
        self.db.write(write)

    def get(self, name: str) -> UserRecord | None:
        row = self.db.read(lambda conn: conn.execute(
            f"SELECT {_COLUMNS} FROM users WHERE name=?", (name,)).fetchone())
        return None if row is None else _user_from_row(row)

    def by_token(self, token: str | None) -> UserRecord | None:
        """The user holding ``token``, else None (compared by hash: the store has no
        token to compare with)."""
        if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 256:
            return None
        digest = hash_token(token)
        row = self.db.read(lambda conn: conn.execute(
            f"SELECT {_COLUMNS}, token_hash FROM users WHERE token_hash=?",
            (digest,)).fetchone())
        if row is None or not secrets.compare_digest(str(row[6]), digest):
            return None
        return _user_from_row(row)

    def list(self) -> list[UserRecord]:
        rows = self.db.read(lambda conn: conn.execute(
            f"SELECT {_COLUMNS} FROM users ORDER BY name").fetchall())
        return [_user_from_row(row) for row in rows]

    def count(self) -> int:
        return int(self.db.read(lambda conn: conn.execute(
            "SELECT COUNT(*) FROM users").fetchone()[0]))
