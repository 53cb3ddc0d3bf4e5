"""Who may call the API and how a request proves it: one guard for every route.

Every request must present the server's token, on loopback too:

* programs (the CLI, scripts, a dashboard's JavaScript) send the header
  ``Authorization: Bearer <token>``;
* a browser opens ``http://HOST:PORT/<any page>?token=<token>`` once: the guard answers
  with a redirect to the same page without the token and sets the token as an
  ``HttpOnly; SameSite=Strict`` cookie (``pollux_token``), which the browser then sends
  with its own same-origin requests (pages, ``fetch``) but never with another site's.

The token is the one given with ``--token``/``--token-file``, else one generated on
first start into ``<data dir>/token`` (mode 0600), which the CLI reads by itself.

Besides the token the guard checks, in this order and before any route runs: the
``Host`` header names this server (a page on another site that re-points its own DNS
name at 127.0.0.1 -- DNS rebinding -- is refused, 400), a browser's ``Origin`` is this
server (403), and a request body is sent as ``Content-Type: application/json`` (415; a
cross-site HTML form can only send form or text bodies). Routes listed as ``exempt``
(a job's hints, which carry the job's own token) skip only the token check and must
check their own token before revealing anything.

Routes are added to the app as usual; the guard covers every one of them (a dashboard at
``/`` or ``/metrics`` included) with no extra code.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from pollux.errors import ConfigError
from pollux.service.private import TOKEN_FILE

__all__ = ["TOKEN_FILE", "ApiAuth", "install_guard"]

logger = logging.getLogger(__name__)

TOKEN_COOKIE = "pollux_token"
"""Cookie a browser presents the token with (set by a ``?token=`` link)."""
TOKEN_QUERY = "token"
"""Query parameter of a link that hands the token to a browser."""
JSON_TYPE = "application/json"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


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


def allowed_hosts_for(bind_host: str, advertise_host: str | None = None) -> frozenset[str]:
    """Host names a request may address this server by: the bound address, loopback
    names when bound to loopback or every interface, the advertised address, and this
    machine's names when bound to every interface ("*" there: any IP literal)."""
    hosts = {strip_port(bind_host)}
    wildcard = bind_host in ("0.0.0.0", "::", "")
    loopback = bind_host == "localhost" or (is_ip_literal(strip_port(bind_host))
                                             and ipaddress.ip_address(
                                                 strip_port(bind_host)).is_loopback)
    if loopback or wildcard:
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
    """Mark the browser cookie ``Secure`` (served over TLS)."""

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


def presented_token(request: Request) -> str | None:
    """The token a request presents: the Bearer header, else the browser cookie."""
    return bearer_token(request) or request.cookies.get(TOKEN_COOKIE) or None


def _content_type_is_json(request: Request) -> bool:
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media_type == JSON_TYPE


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    return bool(request.headers.get("transfer-encoding")) or (length not in (None, "0"))


def _without_token_query(request: Request) -> str:
    query = [(k, v) for k, v in request.query_params.multi_items() if k != TOKEN_QUERY]
    return request.url.path + (f"?{urlencode(query)}" if query else "")


def install_guard(app: FastAPI, auth: ApiAuth,
                  exempt: Callable[[Request], bool] = lambda request: False) -> None:
    """Check every request to ``app`` as the module docstring says; ``exempt(request)``
    True skips the token check only (the route then checks its own token)."""

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        if not auth.accepts_host(request.headers.get("host")):
            return error_response(400, "this server does not answer to Host "
                                       f"{request.headers.get('host')!r}; address it by "
                                       "the address it is bound to", "Host")
        origin = request.headers.get("origin")
        if origin is not None and not auth.accepts_host(urlsplit(origin).netloc):
            return error_response(403, f"requests from pages of {origin!r} are refused",
                                  "Origin")
        link_token = request.query_params.get(TOKEN_QUERY)
        if link_token is not None and request.method == "GET":
            if not auth.accepts_token(link_token):
                return error_response(401, "wrong token in the link", "token")
            redirect = RedirectResponse(_without_token_query(request), status_code=303)
            redirect.set_cookie(TOKEN_COOKIE, link_token, httponly=True, samesite="strict",
                                secure=auth.secure_cookie, path="/")
            return redirect
        if not exempt(request) and not auth.accepts_token(presented_token(request)):
            return error_response(401, "missing or wrong token: send 'Authorization: "
                                       "Bearer <token>' (the token is in the server's data "
                                       "directory, file 'token')", "Authorization")
        if request.method in BODY_METHODS and (
                _has_body(request) or "content-type" in request.headers
        ) and not _content_type_is_json(request):
            return error_response(415, "send the body as JSON with 'Content-Type: "
                                       f"{JSON_TYPE}'", "Content-Type")
        response: Response = await call_next(request)
        return response


