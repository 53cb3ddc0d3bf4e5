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
certificate; the local CLI uses the Unix socket, :mod:`pollux.service.local_socket`.)
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

PROOF_PATH = "/api/auth/proof"
NONCE_PARAM = "nonce"
NONCE_PATTERN = re.compile(r"^[0-9a-f]{32,128}$")
_CONTEXT = b"pollux-server-proof"


def server_proof(token: str, nonce: str, origin: str) -> str:
    """The answer to ``nonce`` of a server holding ``token`` at ``origin``
    (``scheme://host:port``)."""
    message = b"\0".join((_CONTEXT, nonce.encode(), origin.encode()))
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def new_nonce() -> str:
    return secrets.token_hex(32)


def proof_matches(token: str, nonce: str, origin: str, answer: object) -> bool:
    return isinstance(answer, str) and hmac.compare_digest(
        answer.encode(), server_proof(token, nonce, origin).encode())
