"""How the CLI prints: rich tables on a terminal, whole lines when piped.

On a terminal, tables fit its width and live views redraw in place. When the output is
a file or a pipe, nothing is truncated (tables take the width they need), and live
views become a stream of lines, one per job event, as they happen.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import IO, Any, Protocol

from rich.console import Console

PIPE_WIDTH = 10_000
"""Console width when not on a terminal: wide enough that no table cell is cut."""


def is_terminal(stream: IO[str] | None = None) -> bool:
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def make_console() -> Console:
    """A console for stdout: the terminal's width, or no width limit when piped."""
    if is_terminal():
        return Console()
    return Console(width=PIPE_WIDTH, soft_wrap=True)


def event_line(when: float, job_id: str, kind: str, message: str) -> str:
    return f"{time.strftime('%H:%M:%S', time.localtime(when))} {job_id} {kind}: {message}"


class _JobSource(Protocol):
    def jobs(self) -> list[dict[str, Any]]: ...

    def job(self, ref: str) -> dict[str, Any]: ...


class EventFeed:
    """The job events a client has not printed yet, oldest first."""

    def __init__(self) -> None:
        self._printed: dict[str, int] = {}

    def new_events(self, client: _JobSource,
                   rows: Iterable[dict[str, Any]] | None = None) -> list[str]:
        """Lines for events logged since the last call (of every job)."""
        events = []
        for row in client.jobs() if rows is None else rows:
            job_id = row["id"]
            job = client.job(job_id)
            done = self._printed.get(job_id, 0)
            for event in job["events"][done:]:
                events.append((event["time"], job_id, event["kind"], event["message"]))
            self._printed[job_id] = len(job["events"])
        return [event_line(*event) for event in sorted(events, key=lambda e: e[0])]
