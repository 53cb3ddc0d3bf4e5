"""Dashboard sessions: what a browser holds instead of the server token.

Opening ``/?token=<token>`` (checked by :mod:`pollux.service.http.auth`) creates a session of
two random secrets, kept in this server's memory only:

* the **session cookie** (``pollux_session_<port>``; ``HttpOnly``, ``SameSite=Strict``,
  ``Path=/``, ``Secure`` over TLS) opens pages only: the dashboard, its assets, ``/docs``
  and the schema. Browsers send cookies of 127.0.0.1 to every port of it, so a page
  another user serves on 127.0.0.1:9999 may receive it: alone it reads no data and
  changes nothing.
* the **CSRF token**, handed to the dashboard in the redirect's URL fragment (which no
  browser sends to any server) and kept by its script in ``sessionStorage`` (which is
  per origin: scheme, host *and* port), must come with every other request of the
  session as the ``X-CSRF-Token`` header: reads, and the one change a session may make,
  cancelling a job. A session cannot submit jobs (which run commands): that needs the
  token itself.

``pollux dashboard`` gets the browser a session without the token ever entering it: it
asks the server (with the token) for a one-time login link, ``/?login=<code>``, good for
one use within a minute, which the guard redeems like a ``?token=`` link.

A session is bound to the origin it was opened on (scheme, host and port): a request
naming another ``Host``, sent from another ``Origin``, or that the browser marks as not
same-origin (``Sec-Fetch-Site``), is refused. Sessions expire (``ttl_s``, 8 hours by
default) and end with the server; at most ``max_sessions`` live at once (the oldest go).
"""

from __future__ import annotations

import hmac
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

SESSION_COOKIE = "pollux_session"
"""Prefix of the session cookie's name, ``pollux_session_<port>``: one per server port,
as a browser keeps one cookie jar for every port of a host."""
CSRF_HEADER = "X-CSRF-Token"
CSRF_FRAGMENT = "csrf"
"""Name of the CSRF token in the URL fragment the ``?token=`` link redirects to."""
SESSION_TTL_S = 8 * 3600.0
MAX_SESSIONS = 256
LOGIN_QUERY = "login"
"""Query parameter of a one-time login link (``pollux dashboard``)."""
LOGIN_TTL_S = 60.0
MAX_LOGINS = 64

Origin = tuple[str, str, int]
"""(scheme, host, port) of a web origin, host lower-case and without brackets."""

PAGE_PATH = re.compile(r"^/(?:$|static/.*|docs(?:/.*)?|openapi\.json|favicon\.ico)$")
"""Paths a session cookie opens without its CSRF token (nothing but shipped pages)."""
SESSION_CHANGES = re.compile(r"^/api/jobs/[^/]+/cancel$")
"""The only state-changing routes a session may call (with its CSRF token)."""
DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(scheme: str, netloc: str) -> Origin | None:
    """The origin of ``scheme://netloc``; None when it cannot be one."""
    scheme = scheme.lower()
    if scheme not in DEFAULT_PORTS or not netloc or "@" in netloc:
        return None
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        host, _, rest = netloc[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else None)
    else:
        host, _, port_text = netloc.partition(":")
    if port_text is None or not host:
        return None
    if port_text == "":
        return scheme, host, DEFAULT_PORTS[scheme]
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return scheme, host, int(port_text)


def parse_origin(header: str) -> Origin | None:
    """The origin of an ``Origin`` header (None for "null" or anything malformed)."""
    scheme, sep, rest = header.strip().partition("://")
    if not sep or "/" in rest:
        return None
    return origin_of(scheme, rest)


def cookie_name(origin: Origin) -> str:
    """The session cookie of the server at ``origin``: two servers on one host do not
    overwrite each other's sessions."""
    return f"{SESSION_COOKIE}_{origin[2]}"


def format_origin(origin: Origin | None) -> str:
    """``scheme://host:port`` (IPv6 hosts in brackets); "(none)" for None."""
    if origin is None:
        return "(none)"
    scheme, host, port = origin
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


@dataclass(frozen=True)
class Session:
    id: str
    """The cookie's value."""
    csrf: str
    """The CSRF token every API request of the session carries."""
    origin: Origin
    """Where the session was opened: only requests to this origin may use it."""
    expires_at: float
    user: str | None = None
    """The registered user who opened it (None: the server's account, by its token)."""

    def csrf_matches(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), self.csrf.encode())


class Sessions:
    """The live sessions of one server (in memory; a restart ends them all)."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, max_sessions: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._live: OrderedDict[str, Session] = OrderedDict()
        self._logins: OrderedDict[str, tuple[float, str | None]] = OrderedDict()
        self._lock = threading.Lock()

    def create_login(self, user: str | None = None) -> str:
        """A one-time login code (``/?login=<code>``) for ``user`` (None: the server's
        account), good for ``LOGIN_TTL_S``."""
        code = secrets.token_urlsafe(32)
        with self._lock:
            self._logins[code] = (self._clock() + LOGIN_TTL_S, user)
            while len(self._logins) > MAX_LOGINS:
                self._logins.popitem(last=False)
        return code

    def redeem_login(self, code: str) -> tuple[bool, str | None]:
        """Whether ``code`` is a live login code, and the user it was made for; it is
        used up either way."""
        with self._lock:
            login = self._logins.pop(code, None)
        if login is None or login[0] <= self._clock():
            return False, None
        return True, login[1]

    def create(self, origin: Origin, user: str | None = None) -> Session:
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), origin,
                          self._clock() + self.ttl_s, user)
        with self._lock:
            self._live[session.id] = session
            while len(self._live) > self.max_sessions:
                self._live.popitem(last=False)
        return session

    def find(self, session_id: str | None) -> Session | None:
        """The live session of this cookie value, else None (expired ones are dropped)."""
        if not session_id:
            return None
        with self._lock:
            session = self._live.get(session_id)
            if session is not None and session.expires_at <= self._clock():
                del self._live[session_id]
                return None
        return session
