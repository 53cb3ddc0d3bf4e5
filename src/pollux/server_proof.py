"""A server proves it holds the token before a client sends it over plain TCP.

Over plain HTTP nothing tells a client that the process on a port is the server: after a
server dies another user may listen there, or relay to the real server from a port of
its own. So before its first request with the token, a client sends
``GET /api/auth/proof?nonce=<random>`` without it, and the server answers
``HMAC-SHA256(token, "pollux-server-proof" | nonce | origin)`` where ``origin`` is the
server's own scheme, host (as the client named it) and the port it is *bound* to; the
client computes the same with the origin it connected to. A squatter cannot answer
(it lacks the token); a relay on another port gets an answer for the real server's port,
which does not match. Only then is the token sent. (HTTPS proves the server by its
certificate; the local CLI uses the Unix socket, :mod:`pollux.unix_socket`.)

A job's hints reporter (:mod:`pollux.torch.hints_reporter`) does the same before it
sends its hints token: it asks ``GET /api/auth/proof?nonce=<random>&job=<job id>`` and
the server answers with the HMAC keyed by *that job's* hints token (and the job id in
the message), which only the server and the job hold. For a job the server does not
know it answers with a key of its own, so the answer tells nothing.

A contract of the service and the in-job agent: standard library only (no layer).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import urlsplit

PROOF_PATH = "/api/auth/proof"
NONCE_PARAM = "nonce"
JOB_PARAM = "job"
"""With a job id: the proof is keyed by that job's hints token."""
DEFAULT_PORTS = {"http": 80, "https": 443}
NONCE_PATTERN = re.compile(r"^[0-9a-f]{32,128}$")
_CONTEXT = b"pollux-server-proof"


def server_proof(token: str, nonce: str, origin: str, job: str | None = None) -> str:
    """The answer to ``nonce`` of a server holding ``token`` at ``origin``
    (``scheme://host:port``); ``job``: ``token`` is that job's hints token."""
    parts = [_CONTEXT, nonce.encode(), origin.encode()]
    if job is not None:
        parts.append(b"job:" + job.encode())
    return hmac.new(token.encode(), b"\0".join(parts), hashlib.sha256).hexdigest()


def url_origin(url: str) -> str | None:
    """``scheme://host:port`` of ``url`` as the server formats its own (host lower-case,
    IPv6 in brackets, the scheme's default port when none is given); None when ``url``
    has none."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), parts.hostname
    if scheme not in DEFAULT_PORTS or not host or "@" in parts.netloc:
        return None
    port = DEFAULT_PORTS[scheme] if port is None else port
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def new_nonce() -> str:
    return secrets.token_hex(32)


def proof_matches(token: str, nonce: str, origin: str, answer: object,
                  job: str | None = None) -> bool:
    return isinstance(answer, str) and hmac.compare_digest(
        answer.encode(), server_proof(token, nonce, origin, job).encode())
