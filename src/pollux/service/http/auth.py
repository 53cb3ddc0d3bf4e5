"""Who may call the API and how a request proves it: one guard for every route.

Every request must present the server's token, on loopback too, or belong to a
dashboard session bought with it:

* programs (the CLI, scripts, Prometheus) send the header
  ``Authorization: Bearer <token>``: everything the API offers;
* a browser opens ``http://HOST:PORT/?token=<token>`` once: the guard answers with a
  redirect to the page without the token and a session of its own (see
  :mod:`pollux.service.http.sessions`): a cookie that opens pages only, and a CSRF token the
  dashboard sends with each API request; a session reads and cancels, never submits.
  The raw token is never put in a cookie.

The token is the one given with ``--token-file``/``$POLLUX_TOKEN``, else one generated at
each start into ``<data dir>/token`` (mode 0600), which the CLI reads by itself.

Besides the token the guard checks, in this order and before any route runs: the
``Host`` header names this server (a page on another site that re-points its own DNS
name at 127.0.0.1 -- DNS rebinding -- is refused, 400), a browser's ``Origin`` is this
server's own origin, scheme, host and port compared (a page on another port of
127.0.0.1 is another origin; 403), and a request body is sent as ``Content-Type:
application/json`` (415; a cross-site HTML form can only send form or text bodies).
Routes listed as ``exempt`` (a job's hints, which carry the job's own token) skip only
the token check and must check their own token before revealing anything.

With registered users (``pollux user add``) a user's own token opens the API as that
user, and over the local socket the peer's Unix account does (see
:mod:`pollux.service.http.identities`); a dashboard session carries the identity that
opened it. Each request that passes carries its identity, and the routes apply the rules
of :mod:`pollux.service.http.authorization` (403 naming the rule).

Routes are added to the app as usual; the guard covers every one of them (a dashboard at
``/`` or ``/metrics`` included) with no extra code.
"""

from __future__ import annotations

import hmac
import html
import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from pollux.errors import ConfigError
from pollux.server_proof import (
    JOB_PARAM,
    NONCE_PARAM,
    NONCE_PATTERN,
    PROOF_PATH,
    server_proof,
)
from pollux.service.http.authorization import SERVER_ACCOUNT, Principal
from pollux.service.http.connections import PEER_UID_STATE
from pollux.service.http.identities import Identities
from pollux.service.http.sessions import (
    CSRF_FRAGMENT,
    CSRF_HEADER,
    LOGIN_QUERY,
    PAGE_PATH,
    SESSION_CHANGES,
    Origin,
    Session,
    Sessions,
    cookie_name,
    format_origin,
    origin_of,
    parse_origin,
)
from pollux.unix_socket import LOCAL_HOST  # accepted on the Unix socket only (no browser there)

__all__ = ["ApiAuth", "install_guard"]

logger = logging.getLogger(__name__)

TOKEN_QUERY = "token"
"""Query parameter of the link that opens a dashboard session in a browser."""
JSON_TYPE = "application/json"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
PAGE_HEADERS = MappingProxyType({
    "X-Frame-Options": "DENY",  # no page may frame the dashboard (clickjacking its
    "Content-Security-Policy": "frame-ancestors 'none'",  # cancel button)
    "Cross-Origin-Opener-Policy": "same-origin",  # an opener keeps no handle on it
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
})
"""Set on every answer the routes give."""


def error_response(status: int, message: str, field: str | None = None) -> JSONResponse:
    """The API's error shape: ``{"detail": message, "field": name}``."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"detail": message, "field": field}, status_code=status,
                        headers=headers)


def strip_port(host: str) -> str:
    """The host part of a ``Host`` header or netloc (IPv6 brackets removed)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address."""
    return host == "localhost" or is_ip_literal(host) and ipaddress.ip_address(host).is_loopback


def allowed_hosts_for(bind_host: str, advertise_host: str | None = None) -> frozenset[str]:
    """Host names a request may address this server by: the bound address, loopback
    names when bound to loopback or every interface, the advertised address, and this
    machine's names when bound to every interface ("*" there: any IP literal)."""
    hosts = {strip_port(bind_host)}
    wildcard = bind_host in ("0.0.0.0", "::", "")
    if is_loopback(strip_port(bind_host)) or wildcard:
        hosts |= {"127.0.0.1", "localhost", "::1"}
    if wildcard:
        hosts |= {"*", socket.gethostname().lower(), socket.getfqdn().lower()}
    if advertise_host:
        hosts.add(strip_port(advertise_host))
    return frozenset(hosts)


@dataclass(frozen=True)
class ApiAuth:
    """What the guard accepts: the token and the names this server answers to."""

    token: str
    allowed_hosts: frozenset[str]
    """Values the ``Host`` header may have (without port); "*" admits any IP literal."""
    secure_cookie: bool = False
    """Served over TLS: origins are ``https`` and the session cookie is ``Secure``."""
    port: int | None = None
    """The TCP port the server is bound to (its proof names it; None: the Host's)."""

    @property
    def scheme(self) -> str:
        return "https" if self.secure_cookie else "http"

    def __post_init__(self) -> None:
        if not self.token:
            raise ConfigError("token", self.token, "the API needs a non-empty token")

    def accepts_token(self, given: str | None) -> bool:
        return tokens_match(given, self.token)

    def accepts_host(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        host = strip_port(host_header)
        return host in self.allowed_hosts or ("*" in self.allowed_hosts
                                              and is_ip_literal(host))


def tokens_match(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; a missing token matches nothing."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, else None."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _content_type_is_json(request: Request) -> bool:
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media_type == JSON_TYPE


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    return bool(request.headers.get("transfer-encoding")) or (length not in (None, "0"))


def _without_token_query(request: Request) -> str:
    query = [(k, v) for k, v in request.query_params.multi_items()
             if k not in (TOKEN_QUERY, LOGIN_QUERY)]
    return request.url.path + (f"?{urlencode(query)}" if query else "")


HintsTokenOf = Callable[[str], "str | None"]
"""A job id's hints token (None: no such job, or it has none)."""


async def prove_server(request: Request, auth: ApiAuth, own: Origin,
                       hints_token_of: HintsTokenOf | None = None) -> Response:
    """Answer a client's challenge (see :mod:`pollux.server_proof`): the HMAC of
    its nonce and this server's origin, with the port this server is bound to; with a
    ``job`` parameter, keyed by that job's hints token (a job's hints reporter asks so
    before it sends the token), or for a job without one by a key of the server's."""
    nonce = request.query_params.get(NONCE_PARAM, "")
    if not NONCE_PATTERN.match(nonce):
        return error_response(422, "nonce: 32 to 128 lower-case hex digits", NONCE_PARAM)
    scheme, host, port = own
    origin = format_origin((scheme, host, port if auth.port is None else auth.port))
    job = request.query_params.get(JOB_PARAM)
    if job is None:
        proof = server_proof(auth.token, nonce, origin)
    elif not 0 < len(job) <= 200:
        return error_response(422, "job: a job id", JOB_PARAM)
    else:
        token = None if hints_token_of is None else await run_in_threadpool(
            hints_token_of, job)
        key = token or hmac.new(auth.token.encode(), b"pollux-no-such-job",
                                "sha256").hexdigest()  # the same answer shape: no oracle
        proof = server_proof(key, nonce, origin, job)
    return JSONResponse({"proof": proof}, headers={"Cache-Control": "no-store"})


def open_session(request: Request, auth: ApiAuth, sessions: Sessions,
                 own: Origin, user: str | None = None) -> Response:
    """Answer a valid ``?token=`` link: a new session, its cookie, and a redirect to the
    page without the token (the dashboard's CSRF token in the fragment). A link followed
    from another site's page gets the redirect as a page of this server (a browser would
    not send the strict cookie along a redirect another site started)."""
    session = sessions.create(own, user)
    target = _without_token_query(request)
    if request.url.path == "/":
        target += "#" + urlencode({CSRF_FRAGMENT: session.csrf})
    headers = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
    redirect: Response
    if request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
        link = html.escape(target, quote=True)
        redirect = HTMLResponse(f'<!doctype html><meta http-equiv="refresh" content="0;url='
                                f'{link}"><title>Pollux</title><a href="{link}">Pollux '
                                "dashboard</a>", headers=headers)
    else:
        redirect = RedirectResponse(target, status_code=303, headers=headers)
    redirect.set_cookie(cookie_name(own), session.id, max_age=int(sessions.ttl_s),
                        httponly=True, samesite="strict", secure=auth.secure_cookie, path="/")
    return redirect


def session_refusal(request: Request, session: Session | None,
                    own: Origin) -> Response | None:
    """Why a request with no valid token may not go on as ``session``'s, or None."""
    if session is None:
        return error_response(401, "missing or wrong token: send 'Authorization: Bearer "
                                   "<token>' (the token is in the server's data directory, "
                                   "file 'token'), or open the dashboard through its "
                                   "?token=<token> link", "Authorization")
    if own != session.origin:
        return error_response(403, "this dashboard session belongs to "
                                   f"{format_origin(session.origin)}, not {format_origin(own)}; open the "
                                   "?token= link of this address", "Host")
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site not in (None, "same-origin", "none"):
        return error_response(403, f"a {fetch_site} request may not use a dashboard "
                                   "session: only this server's own pages may",
                              "Sec-Fetch-Site")
    path, method = request.url.path, request.method
    if method in ("GET", "HEAD") and PAGE_PATH.match(path):
        return None
    if not session.csrf_matches(request.headers.get(CSRF_HEADER)):
        return error_response(403, f"a dashboard session must send its CSRF token in "
                                   f"'{CSRF_HEADER}' (the dashboard's page does; open the "
                                   "?token= link again to get a new one)", CSRF_HEADER)
    if method in ("GET", "HEAD") or (method == "POST" and SESSION_CHANGES.match(path)):
        return None
    return error_response(403, f"a dashboard session cannot {method} {path} (it can read "
                               "and cancel jobs): send 'Authorization: Bearer <token>'",
                          "Authorization")


def install_guard(app: FastAPI, auth: ApiAuth,
                  exempt: Callable[[Request], bool] = lambda request: False,
                  sessions: Sessions | None = None,
                  hints_token_of: HintsTokenOf | None = None,
                  identities: Identities | None = None) -> None:
    """Check every request to ``app`` as the module docstring says; ``exempt(request)``
    True skips the token check only (the route then checks its own token);
    ``sessions``: the dashboard sessions (default: new, in memory); ``hints_token_of``:
    a job's hints token, for the proofs asked by jobs' hints reporters; ``identities``:
    the registered users (default: none, the server token only). Each request that
    passes carries who it acts as in ``request.state.principal``
    (:mod:`pollux.service.http.identities`)."""
    live = sessions if sessions is not None else Sessions()
    app.state.sessions = live
    ids = identities if identities is not None else Identities()

    def identify_token(token: str | None) -> Principal | None:
        if auth.accepts_token(token):
            return SERVER_ACCOUNT
        return ids.by_user_token(token)

    def identify(request: Request) -> Principal | None:
        """The identity a request proves by its token or its socket's peer uid."""
        return identify_token(bearer_token(request)) or ids.by_peer_uid(
            request.scope.get("state", {}).get(PEER_UID_STATE))

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        host = request.headers.get("host")
        own = None if host is None else origin_of(auth.scheme, host)
        local_user = (PEER_UID_STATE in request.scope.get("state", {})
                      and own is not None and own[1] == LOCAL_HOST)
        if own is None or not (auth.accepts_host(host) or local_user):
            return error_response(400, "this server does not answer to Host "
                                       f"{host!r}; address it by the address it is bound to",
                                  "Host")
        origin = request.headers.get("origin")
        if origin is not None and parse_origin(origin) != own:
            return error_response(403, f"requests from pages of {origin!r} are refused: "
                                       f"only pages of {format_origin(own)} may call it", "Origin")
        if request.url.path == PROOF_PATH and request.method == "GET":
            return await prove_server(request, auth, own, hints_token_of)
        link_token = request.query_params.get(TOKEN_QUERY)
        if link_token is not None and request.method == "GET":
            opener = await run_in_threadpool(identify_token, link_token)
            if opener is None:
                return error_response(401, "wrong token in the link", "token")
            return open_session(request, auth, live, own, opener.name)
        login = request.query_params.get(LOGIN_QUERY)
        if login is not None and request.method == "GET":
            redeemed, user = live.redeem_login(login)
            if not redeemed:
                return error_response(401, "this login link was used or has expired; run "
                                           "'pollux dashboard' for a new one", LOGIN_QUERY)
            return open_session(request, auth, live, own, user)
        if not exempt(request):
            principal = (SERVER_ACCOUNT if auth.accepts_token(bearer_token(request))
                         else await run_in_threadpool(identify, request))
            if principal is None:
                session = live.find(request.cookies.get(cookie_name(own)))
                refused = session_refusal(request, session, own)
                if refused is not None:
                    return refused
                assert session is not None
                principal = (SERVER_ACCOUNT if session.user is None else
                             await run_in_threadpool(ids.by_session_user, session.user))
                if principal is None:
                    return error_response(401, f"user {session.user!r} of this dashboard "
                                               "session is no longer registered",
                                          "Authorization")
            request.state.principal = principal
        if request.method in BODY_METHODS and (
                _has_body(request) or "content-type" in request.headers
        ) and not _content_type_is_json(request):
            return error_response(415, "send the body as JSON with 'Content-Type: "
                                       f"{JSON_TYPE}'", "Content-Type")
        response: Response = await call_next(request)
        response.headers.update(PAGE_HEADERS)
        return response
