"""How the guard tells who a request comes from (the rules of what each may do are in
:mod:`pollux.service.http.authorization`).

In order:

1. ``Authorization: Bearer <token>``: the server token is the server's own account; a
   user token (``pollux-user-...``) is its user, looked up by the token's hash;
2. over the local socket, when users are registered: the peer's Unix uid, which the
   kernel reports for the connection (``SO_PEERCRED``; nothing the client sends can
   change it): the server's own uid (or root) is the server's account; another uid is
   the registered user named as its Unix account, else nobody;
3. a dashboard session (cookie and CSRF token): the identity that opened it, looked up
   again at every request (a removed user's sessions stop working).

No header, cookie or query parameter names a user: an identity is only ever proven.
Without registered users only the server token (and its sessions) open the API, as
before users existed.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass, field

from pollux.service.http.authorization import SERVER_ACCOUNT, Principal
from pollux.service.storage.users import UserStore

__all__ = ["Identities", "unix_account"]


def unix_account(uid: int) -> str | None:
    """The name of the Unix account ``uid``, or None when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


@dataclass(frozen=True)
class Identities:
    """The identities one server accepts besides its own token."""

    users: UserStore | None = None
    """The registered users (None: only the server token)."""
    server_uid: int = field(default_factory=os.getuid)
    """The server's own Unix account: over the local socket it is the server's account."""

    def configured(self) -> bool:
        """Whether users are registered (else everything is as without users)."""
        return self.users is not None and self.users.count() > 0

    def by_user_token(self, token: str | None) -> Principal | None:
        """The user whose token ``token`` is (None: no such user)."""
        if self.users is None or token is None:
            return None
        user = self.users.by_token(token)
        return None if user is None else Principal(user)

    def by_peer_uid(self, uid: int | None) -> Principal | None:
        """The identity of a local-socket peer running as ``uid`` (None: over TCP, no
        users registered, or an account that is not a registered user)."""
        if uid is None or not self.configured():
            return None
        if uid in (self.server_uid, 0):
            return SERVER_ACCOUNT
        name = unix_account(uid)
        assert self.users is not None
        user = None if name is None else self.users.get(name)
        return None if user is None else Principal(user)

    def by_session_user(self, name: str | None) -> Principal | None:
        """The identity of a dashboard session opened by ``name`` (None: the server's
        account), or None when that user is no longer registered."""
        if name is None:
            return SERVER_ACCOUNT
        user = None if self.users is None else self.users.get(name)
        return None if user is None else Principal(user)
