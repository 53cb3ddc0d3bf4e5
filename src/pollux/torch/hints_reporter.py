"""Reporting the job's hints to the scheduler, off the training thread.

The target comes from the launcher (``POLLUX_HINTS_TARGET``): an ``http(s)://`` URL
(the JSON is POSTed with ``Authorization: Bearer <POLLUX_HINTS_TOKEN>``) or a file path
(written atomically: temp file, then rename). A daemon thread sends the latest hints
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

from pollux.models import JobHints

logger = logging.getLogger(__name__)


def _is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def send_hints(target: str, hints: dict[str, Any], *, token: str | None = None,
               timeout_s: float = 5.0) -> None:
    """Deliver one hints document to a URL or a file; raises OSError on failure."""
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
            send_hints(self.target, latest, token=self.token, timeout_s=self.timeout_s)
        except (OSError, urllib.error.URLError, ValueError) as exc:
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
