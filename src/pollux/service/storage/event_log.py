"""Each job's event log in the store: what happened to it, oldest first, a repeat of a
recent event coalesced into it (a count and the last time) instead of added again.

Functions of one open cursor or connection: :class:`~pollux.service.storage.store.JobStore`
calls them inside its transactions.
"""

from __future__ import annotations

import sqlite3

from pollux.service.storage.records import JobEvent
from pollux.service.storage.states import JobState

COALESCE_WINDOW = 4
"""An event repeating one of its job's last this-many events (same kind and message)
is coalesced into it (a count and the last time) instead of being added: a job whose
batch size flips between two values adds two events, not one a second."""
STATE_KINDS = frozenset(state.value for state in JobState)
"""Event kinds of state changes: never coalesced (each is one step of the history)."""
_COLUMNS = "job_id, time, kind, message, repeats, last_time"


def append_event(cur: sqlite3.Cursor, job_id: str, now: float, kind: str,
                 message: str) -> None:
    """Add an event to the job's log, or count it as a repeat of a recent one."""
    if kind not in STATE_KINDS:
        recent = cur.execute("SELECT id, kind, message FROM events WHERE job_id=? "
                             "ORDER BY id DESC LIMIT ?", (job_id, COALESCE_WINDOW)).fetchall()
        for event_id, recent_kind, recent_message in recent:
            if recent_kind == kind and recent_message == message:
                cur.execute("UPDATE events SET repeats=repeats+1, last_time=? WHERE id=?",
                            (now, event_id))
                return
    cur.execute("INSERT INTO events(job_id, time, kind, message) VALUES (?, ?, ?, ?)",
                (job_id, now, kind, message))


def read_events(conn: sqlite3.Connection, job_id: str, limit: int | None = None,
                offset: int = 0) -> list[JobEvent]:
    """The job's events, oldest first; with ``limit``, the newest ``limit`` after
    skipping the ``offset`` newest."""
    if limit is None:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE job_id=? ORDER BY id",
                            (job_id,)).fetchall()
    else:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE job_id=? ORDER BY id DESC "
                            "LIMIT ? OFFSET ?", (job_id, max(0, limit), max(0, offset))
                            ).fetchall()[::-1]
    return [JobEvent(*row) for row in rows]


def count_events(conn: sqlite3.Connection, job_id: str) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM events WHERE job_id=?",
                            (job_id,)).fetchone()[0])


def has_event(conn: sqlite3.Connection | sqlite3.Cursor, job_id: str, kind: str) -> bool:
    return conn.execute("SELECT 1 FROM events WHERE job_id=? AND kind=?",
                        (job_id, kind)).fetchone() is not None
