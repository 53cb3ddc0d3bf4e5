"""How the store keeps the replicas of each launch: one row per (job, generation, rank)
with the backend's handle as JSON. A launch's rows are written before its processes
start (intents) and replaced by what the backend started (see
:meth:`~pollux.service.storage.store.JobStore.begin_launch`).

Functions of one open cursor or connection: the store calls them inside its transactions.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from pollux.service.storage.records import ReplicaRecord

logger = logging.getLogger(__name__)

INTENT_KEY = "intent"
"""In a replica's handle: recorded before the backend started it (see
:meth:`JobStore.begin_launch`), not confirmed since."""
_INSERT = ("INSERT OR REPLACE INTO replicas(job_id, generation, rank, node, handle, "
           "started_at, exit_code, exited_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")


def insert_intents(cur: sqlite3.Cursor, job_id: str, generation: int,
                   allocation: Sequence[str], intent: Mapping[str, Any], now: float) -> None:
    """A row per replica of ``allocation``, its handle ``intent`` marked as an intent."""
    handle = json.dumps({**dict(intent), INTENT_KEY: True, "generation": generation})
    cur.executemany(_INSERT, [(job_id, generation, rank, node, handle, now, None, None)
                              for rank, node in enumerate(allocation)])


def insert_replica(cur: sqlite3.Cursor, record: ReplicaRecord) -> None:
    cur.execute(_INSERT, (record.job_id, record.generation, record.rank, record.node,
                          json.dumps(dict(record.handle)), record.started_at,
                          record.exit_code, record.exited_at))


def confirm_intents(cur: sqlite3.Cursor, job_id: str, generation: int,
                    replicas: Sequence[ReplicaRecord]) -> None:
    cur.executemany("UPDATE replicas SET node=?, handle=?, started_at=? WHERE job_id=? AND "
                    "generation=? AND rank=?",
                    [(r.node, json.dumps(dict(r.handle)), r.started_at, job_id, generation,
                      r.rank) for r in replicas])


def delete_intents(cur: sqlite3.Cursor, job_id: str, generation: int) -> None:
    """Remove the launch's replicas still marked as intents (not confirmed, not exited)."""
    rows = cur.execute("SELECT rank, handle FROM replicas WHERE job_id=? AND generation=? "
                       "AND exit_code IS NULL", (job_id, generation)).fetchall()
    for rank, handle in rows:
        if _is_intent(handle):
            cur.execute("DELETE FROM replicas WHERE job_id=? AND generation=? AND rank=?",
                        (job_id, generation, rank))


def select_replicas(conn: sqlite3.Connection, job_id: str | None = None,
                    live_only: bool = False, generation: int | None = None
                    ) -> list[ReplicaRecord]:
    """Replicas, optionally of one job / one generation / not yet seen exiting; a row
    whose handle does not read back is logged and skipped."""
    clauses: list[str] = []
    params: list[str | int] = []
    if job_id is not None:
        clauses.append("job_id=?")
        params.append(job_id)
    if generation is not None:
        clauses.append("generation=?")
        params.append(generation)
    if live_only:
        clauses.append("exit_code IS NULL")
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = conn.execute("SELECT job_id, generation, rank, node, handle, started_at, "
                        f"exit_code, exited_at FROM replicas{where} ORDER BY job_id, "
                        "generation, rank", params).fetchall()
    replicas = []
    for r in rows:
        try:
            handle = json.loads(r[4])
            if not isinstance(handle, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            logger.error("replica %s of job %s launch %s: damaged handle (%s); skipped",
                         r[2], r[0], r[1], exc)
            continue
        replicas.append(ReplicaRecord(r[0], r[1], r[2], r[3], handle, r[5], r[6], r[7]))
    return replicas


def _is_intent(handle: str) -> bool:
    try:
        return bool(json.loads(handle).get(INTENT_KEY))
    except (ValueError, AttributeError):
        return False
