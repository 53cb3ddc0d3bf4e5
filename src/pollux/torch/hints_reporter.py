"""Reporting the job's hints to the scheduler, off the training thread.

The target comes from the launcher (``POLLUX_HINTS_TARGET``): an ``http(s)://`` URL
(the JSON is POSTed with ``Authorization: Bearer <POLLUX_HINTS_TOKEN>``) or a file path
(written atomically: temp file, then rename). Over plain HTTP the token is sent only
after the process on the port has proved it is the server holding the job's token
(:mod:`pollux.server_proof`, asked again after any failed send), as the CLI does: a
program that took the server's port after it died, or relays it from another port,
never gets the token. A daemon thread sends the latest hints
every ``interval_s``; ``update`` only swaps a reference, so a slow or dead scheduler can
never stall training. Standard library only (``urllib``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from pollux.models import JobHints
from pollux.server_proof import (
    JOB_PARAM,
    NONCE_PARAM,
    PROOF_PATH,
    new_nonce,
    proof_matches,
    url_origin,
)

logger = logging.getLogger(__name__)


def _is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


class UnprovenServer(OSError):
    """The process at the hints URL did not prove it is the server: the token was kept."""


def hints_job(target: str) -> str | None:
    """The job id of a hints URL (``.../jobs/<job id>/hints``), or None."""
    parts = [p for p in urlsplit(target).path.split("/") if p]
    if len(parts) >= 3 and parts[-1] == "hints" and parts[-3] == "jobs":
        return parts[-2]
    return None


def prove_server(target: str, token: str, timeout_s: float = 5.0) -> None:
    """Have the server at hints URL ``target`` prove it holds the job's ``token``
    (:mod:`pollux.server_proof`); raises :class:`UnprovenServer` when it does not."""
    origin, job = url_origin(target), hints_job(target)
    if origin is None or job is None:
        raise UnprovenServer(f"{target} is no hints URL of a Pollux server "
                             "(.../jobs/<job id>/hints): the token is not sent there")
    nonce = new_nonce()
    url = f"{origin}{PROOF_PATH}?{urlencode({NONCE_PARAM: nonce, JOB_PARAM: job})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            answer = json.loads(response.read(4096)).get("proof")
    except (OSError, ValueError, AttributeError) as exc:
        raise UnprovenServer(f"{origin} did not prove it is the Pollux server ({exc}); "
                             "the hints token was not sent") from exc
    if not proof_matches(token, nonce, origin, answer, job):
        raise UnprovenServer(f"{origin} did not prove it is the Pollux server holding "
                             "this job's token (the port may belong to another program "
                             "now); the hints token was not sent")


def send_hints(target: str, hints: dict[str, Any], *, token: str | None = None,
               timeout_s: float = 5.0) -> None:
    """Deliver one hints document to a URL or a file; raises OSError on failure. Over
    plain HTTP call :func:`prove_server` first (:class:`HintsReporter` does)."""
    body = json.dumps(hints, sort_keys=True).encode()
    if _is_url(target):
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(target, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
        return
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(body)
    os.replace(tmp, path)


class HintsReporter:
    """Sends the latest :class:`JobHints` every ``interval_s`` from a daemon thread."""

    def __init__(self, target: str, *, token: str | None = None, interval_s: float = 30.0,
                 timeout_s: float = 5.0) -> None:
        self.target = target
        self.token = token
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._latest: dict[str, Any] | None = None
        self._sent: dict[str, Any] | None = None
        self._proven = not (token and target.lower().startswith("http://"))
        """Whether the server proved itself (or need not: no token, HTTPS, a file)."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.num_sent = 0
        self.num_failed = 0
        self._thread = threading.Thread(target=self._run, name="pollux-hints", daemon=True)
        self._thread.start()

    def update(self, hints: JobHints, *, urgent: bool = False) -> None:
        """Replace the hints to send; ``urgent`` sends them now instead of at the next tick."""
        with self._lock:
            self._latest = hints.to_dict()
        if urgent:
            self._wake.set()

    def _send_latest(self) -> None:
        with self._lock:
            latest = self._latest
        if latest is None or latest == self._sent:
            return
        try:
            if not self._proven:
                assert self.token is not None
                prove_server(self.target, self.token, self.timeout_s)
                self._proven = True
            send_hints(self.target, latest, token=self.token, timeout_s=self.timeout_s)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            if self.token and self.target.lower().startswith("http://"):
                self._proven = False  # whoever answers next proves itself again
            self.num_failed += 1
            log = logger.warning if self.num_failed in (1, 10, 100) else logger.debug
            log("could not report hints to %s (%d failures): %s", self.target,
                self.num_failed, exc)
            return
        self._sent = latest
        self.num_sent += 1

    def _run(self) -> None:
        while True:
            self._send_latest()
            if self._stop.is_set():
                return
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is pending (waiting at most ``timeout_s``) and stop the thread."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
