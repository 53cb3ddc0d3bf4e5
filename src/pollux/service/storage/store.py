"""The job store: SQLite in WAL mode, one transaction per change.

Holds jobs (spec, state, allocation, counters, latest hints, hints token), the replicas
each launch started (with the backend's handle, so a restarted server can find and stop
orphans; rows: :mod:`pollux.service.storage.replica_rows`) and an event log per job
(:mod:`pollux.service.storage.event_log`). Every method is one transaction: a crash at
any moment leaves either the state before it or the state after it. Writes hitting a
transient error are retried; one that fails for good (or a full disk) raises
StoreUnavailableError with nothing changed; reads never wait behind writes
(:mod:`pollux.service.storage.sqlite_db`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pollux.errors import (
    ConfigError,
    JobSpecError,
    StoreDamagedError,
    StoreError,
    UnknownJobError,
)
from pollux.job_spec import JobSpec
from pollux.models.hints import JobHints
from pollux.service.private import make_private_file
from pollux.service.storage.event_log import append_event, count_events, has_event, read_events
from pollux.service.storage.records import (
    JOB_COLUMNS,
    UPDATABLE_COLUMNS,
    JobDecoder,
    JobEvent,
    JobRecord,
    ReplicaRecord,
    encode_column,
    encode_hints,
)
from pollux.service.storage.replica_rows import (
    confirm_intents,
    delete_intents,
    insert_intents,
    insert_replica,
    select_replicas,
)
from pollux.service.storage.sqlite_db import Database
from pollux.service.storage.states import JobState, can_transition
from pollux.service.storage.store_schema import create_schema

logger = logging.getLogger(__name__)

DAMAGED_EVENT = "damaged"
"""Kind of the event naming a job whose stored record does not read back."""


class JobStore:
    """SQLite job store; safe to share between the API threads and the allocation loop."""

    def __init__(self, path: Path | str, synchronous: str = "FULL",
                 retry_s: float = 5.0, jobs_dir: Path | None = None) -> None:
        """``synchronous``: SQLite's durability level; FULL survives power loss, OFF
        (tests only) survives a process crash but not an OS crash. ``retry_s``: how long
        a write hitting a transient error ("database is locked") is retried.
        ``jobs_dir``: where each job's directory is made when it is accepted; an id
        whose directory exists already is never given (it belonged to a job this store
        lost)."""
        self.jobs_dir = jobs_dir
        if synchronous not in ("FULL", "NORMAL", "OFF"):
            raise ConfigError("synchronous", synchronous, "choose FULL, NORMAL or OFF")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # 0600 before SQLite opens it: its WAL and shared-memory files copy the mode
        for name in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
            if name == self.path or name.exists():
                make_private_file(name)
        self.db = Database(self.path, synchronous, retry_s)
        self._decoder = JobDecoder()
        """Rows as records, each job's spec and hints parsed once (and the policy for
        stored hints that no longer parse: see :class:`JobDecoder`)."""
        self._damaged: set[str] = set()
        """Jobs whose rows were found damaged (reported once per process)."""

        self.db.write(create_schema)

    def close(self) -> None:
        self.db.close()

    # --- meta -------------------------------------------------------------------------

    def meta(self, key: str, default: str | None = None) -> str | None:
        row = self.db.read(lambda conn: conn.execute(
            "SELECT value FROM meta WHERE key=?", (key,)).fetchone())
        return default if row is None else str(row[0])

    def meta_setdefault(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless present; return the stored value."""
        def write(cur: sqlite3.Cursor) -> str:
            cur.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)", (key, value))
            return str(cur.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()[0])
        return self.db.write(write)

    # --- jobs -------------------------------------------------------------------------

    def add_job(self, spec: JobSpec, now: float, owner: str | None = None,
                team: str | None = None) -> JobRecord:
        """Accept a job (Pending) of ``owner`` in ``team`` (None: the server's own, no
        team) with a fresh hints token; its id is ``name-seq``. Ids and
        names never collide (so a reference means one job): a name that is another job's
        id is refused, and a sequence number whose id would be another job's name is
        skipped."""
        token = secrets.token_urlsafe(24)
        text = json.dumps(spec.to_dict())

        def write(cur: sqlite3.Cursor) -> str:
            if cur.execute("SELECT 1 FROM jobs WHERE id=?", (spec.name,)).fetchone():
                raise JobSpecError("name", spec.name, "is the id of another job; pick "
                                                      "another name")
            while True:
                cur.execute(
                    "INSERT INTO jobs(id, name, spec, state, hints_token, submitted_at, "
                    "updated_at, owner, team) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (f"tmp-{token}", spec.name, text,
                     JobState.PENDING.value, token, now, now, owner, team))
                seq = int(cur.lastrowid or 0)
                job_id = f"{spec.name}-{seq}"
                if not (cur.execute("SELECT 1 FROM jobs WHERE name=?", (job_id,)).fetchone()
                        or (self.jobs_dir is not None
                            and os.path.lexists(self.jobs_dir / job_id))):
                    break
                cur.execute("DELETE FROM jobs WHERE seq=?", (seq,))
            cur.execute("UPDATE jobs SET id=? WHERE seq=?", (job_id, seq))
            append_event(cur, job_id, now, "submitted", f"accepted as {job_id}")
            return job_id
        job_id = self.db.write(write)
        self._decoder.remember_spec(job_id, text, spec)
        if self.jobs_dir is not None:  # after the commit: a directory always has its job
            try:
                self.jobs_dir.mkdir(mode=0o700, exist_ok=True)
                (self.jobs_dir / job_id).mkdir(mode=0o700)
            except OSError as exc:  # e.g. a full disk: its first launch makes it
                logger.warning("job %s: cannot make its directory now (%s)", job_id, exc)
        return self.get_job(job_id)

    def continue_sequence_past(self, seq: int) -> None:
        """Make the next job's sequence number greater than ``seq``."""
        def write(cur: sqlite3.Cursor) -> None:
            row = cur.execute("SELECT seq FROM sqlite_sequence WHERE name='jobs'").fetchone()
            if row is None:
                cur.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('jobs', ?)", (seq,))
            elif int(row[0]) < seq:
                cur.execute("UPDATE sqlite_sequence SET seq=? WHERE name='jobs'", (seq,))
        self.db.write(write)

    def get_job(self, job_id: str) -> JobRecord:
        row = self.db.read(lambda conn: conn.execute(
            f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs WHERE id=?", (job_id,)).fetchone())
        if row is None:
            raise UnknownJobError(job_id)
        return self._decode(row)

    def _decode(self, row: Sequence[Any]) -> JobRecord:
        """A job row as a record; a row that does not read back (broken JSON, an unknown
        state) raises StoreDamagedError naming the job, after an event saying so (once);
        hints that do not parse leave a job without hints (see :class:`JobDecoder`)."""
        try:
            return self._decoder.record(row)
        except (ValueError, TypeError, KeyError, AttributeError, JobSpecError) as exc:
            job_id = str(row[0])
            self._report_damaged(job_id, f"{type(exc).__name__}: {exc}"[:300])
            raise StoreDamagedError(self.path, str(exc)[:300], job_id=job_id) from exc

    def _decoded(self, rows: Iterable[Sequence[Any]]) -> list[JobRecord]:
        """The rows that read back; each damaged one is skipped (see :meth:`_decode`)."""
        records = []
        for row in rows:
            try:
                records.append(self._decode(row))
            except StoreDamagedError:
                continue
        return records

    def _report_damaged(self, job_id: str, detail: str) -> None:
        if job_id in self._damaged:
            return
        self._damaged.add(job_id)
        logger.error("job %s: its record in the job store %s is damaged (%s); it is "
                     "skipped (restore a backup with `pollux server --recover`)", job_id,
                     self.path, detail)

        def write(cur: sqlite3.Cursor) -> None:
            if not has_event(cur, job_id, DAMAGED_EVENT):
                append_event(cur, job_id, time.time(), DAMAGED_EVENT,
                             f"the record of job {job_id} is damaged ({detail}); it is "
                             "skipped in job lists, the dashboard and /metrics")
        try:
            self.db.write(write)
        except StoreError:  # a full or damaged store: the log line has it
            pass

    def find_job(self, ref: str) -> JobRecord:
        """A job by id, or by name when exactly one job (the latest active one) has it."""
        def read(conn: sqlite3.Connection) -> Any:
            row = conn.execute(
                f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs WHERE id=?", (ref,)).fetchone()
            if row is None:
                rows = conn.execute(
                    f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs WHERE name=? ORDER BY seq",
                    (ref,)).fetchall()
                if len(rows) > 1:
                    raise UnknownJobError(ref, "several jobs have that name; use the job id")
                row = rows[0] if rows else None
            return row
        row = self.db.read(read)
        if row is None:
            raise UnknownJobError(ref)
        return self._decode(row)

    def list_jobs(self, states: Iterable[JobState] | None = None) -> list[JobRecord]:
        query = f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs"
        params: tuple[str, ...] = ()
        if states is not None:
            wanted = tuple(s.value for s in states)
            if not wanted:
                return []
            query += f" WHERE state IN ({', '.join('?' * len(wanted))})"
            params = wanted
        rows = self.db.read(lambda conn: conn.execute(query + " ORDER BY seq",
                                                      params).fetchall())
        return self._decoded(rows)

    def list_recent(self, finished_limit: int, finished_offset: int = 0) -> list[JobRecord]:
        """Every job not finished, and a page of the finished ones: the newest
        ``finished_limit`` after skipping the ``finished_offset`` newest; in submission
        order, as :meth:`list_jobs`. Bounded however many finished jobs the store holds."""
        columns = ", ".join(JOB_COLUMNS)
        final = tuple(s.value for s in JobState if s.is_final)
        live = tuple(s.value for s in JobState if not s.is_final)
        marks = ", ".join("?" * len(final))

        def read(conn: sqlite3.Connection) -> list[Any]:  # both by the state index
            active = conn.execute(f"SELECT {columns} FROM jobs WHERE state IN "
                                  f"({', '.join('?' * len(live))})", live).fetchall()
            finished = conn.execute(
                f"SELECT {columns} FROM jobs WHERE state IN ({marks}) ORDER BY seq DESC "
                "LIMIT ? OFFSET ?", (*final, max(0, finished_limit),
                                     max(0, finished_offset))).fetchall()
            return sorted(active + finished, key=lambda row: row[1])
        return self._decoded(self.db.read(read))

    def count_by_state(self) -> dict[JobState, int]:
        """How many jobs are in each state (a state no job is in: 0)."""
        rows = self.db.read(lambda conn: conn.execute(
            "SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
        counts = dict.fromkeys(JobState, 0)
        for state, count in rows:
            try:
                counts[JobState(state)] += int(count)
            except ValueError:  # a damaged row: skipped where it is read
                continue
        return counts

    def transition(self, job_id: str, target: JobState, now: float, message: str,
                   reason: str | None = None, **updates: Any) -> JobRecord:
        """Move a job to ``target`` (checked against the allowed transitions), updating
        ``updates`` columns and logging an event, in one transaction."""
        self.db.write(lambda cur: self._transition(cur, job_id, target, now, message,
                                                   reason, updates))
        return self.get_job(job_id)

    def _transition(self, cur: sqlite3.Cursor, job_id: str, target: JobState, now: float,
                    message: str, reason: str | None, updates: Mapping[str, Any]) -> None:
        if target is JobState.FAILED and not reason:
            raise StoreError(f"job {job_id}: a Failed state needs a reason")
        row = cur.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise UnknownJobError(job_id)
        current = JobState(row[0])
        if not can_transition(current, target):
            raise StoreError(f"job {job_id}: illegal transition {current.value} -> "
                             f"{target.value}")
        columns = dict(updates)
        columns["reason"] = reason
        if target.is_final:
            columns.setdefault("finished_at", now)
        self._update(cur, job_id, now, state=target.value, **columns)
        append_event(cur, job_id, now, target.value, message)

    def update_job(self, job_id: str, now: float, event: str | None = None,
                   **updates: Any) -> JobRecord:
        """Change non-state columns (optionally logging an event), in one transaction."""
        def write(cur: sqlite3.Cursor) -> None:
            if cur.execute("SELECT 1 FROM jobs WHERE id=?", (job_id,)).fetchone() is None:
                raise UnknownJobError(job_id)
            self._update(cur, job_id, now, **updates)
            if event:
                append_event(cur, job_id, now, "info", event)
        self.db.write(write)
        return self.get_job(job_id)

    def _update(self, cur: sqlite3.Cursor, job_id: str, now: float, **updates: Any) -> None:
        bad = set(updates) - UPDATABLE_COLUMNS - {"state"}
        if bad:
            raise StoreError(f"cannot update column(s) {sorted(bad)}")
        updates["updated_at"] = now
        columns = sorted(updates)
        cur.execute(f"UPDATE jobs SET {', '.join(c + '=?' for c in columns)} WHERE id=?",
                    (*(encode_column(c, updates[c]) for c in columns), job_id))

    def add_service(self, amounts_s: Mapping[str, float], now: float) -> None:
        """Add attained service (replica-seconds) to several jobs at once."""
        def write(cur: sqlite3.Cursor) -> None:
            for job_id, amount in amounts_s.items():
                cur.execute("UPDATE jobs SET attained_service_s = attained_service_s + ? "
                            "WHERE id=?", (float(amount), job_id))
        self.db.write(write)

    def set_hints(self, job_id: str, hints: JobHints, now: float) -> None:
        text = encode_hints(hints)

        def write(cur: sqlite3.Cursor) -> None:
            cur.execute("UPDATE jobs SET hints=?, hints_updated_at=? WHERE id=?",
                        (text, now, job_id))
            if cur.rowcount == 0:
                raise UnknownJobError(job_id)
        self.db.write(write)
        self._decoder.remember_hints(job_id, text, hints)

    def request_cancel(self, job_id: str, now: float) -> JobRecord:
        def write(cur: sqlite3.Cursor) -> None:
            row = cur.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is None:
                raise UnknownJobError(job_id)
            if not JobState(row[0]).is_final:
                cur.execute("UPDATE jobs SET cancel_requested=1, updated_at=? WHERE id=?",
                            (now, job_id))
                append_event(cur, job_id, now, "cancel", "cancellation requested")
        self.db.write(write)
        return self.get_job(job_id)

    # --- launches: intent before effect ----------------------------------------------

    def begin_launch(self, job_id: str, generation: int, allocation: Sequence[str],
                     intent: Mapping[str, Any], now: float, message: str,
                     **updates: Any) -> JobRecord:
        """Record a launch before any of its processes start, in one transaction: the
        job moves to Starting (with ``updates``) and every replica of ``allocation`` is
        stored with ``intent`` as its handle (the backend, the job dir, the generation),
        so a server killed at any instant of the launch leaves a store that names every
        replica that may run (:mod:`pollux.service.loop.recovery` settles them from the
        evidence: exit status files, processes and Slurm jobs found by name)."""
        def write(cur: sqlite3.Cursor) -> None:
            columns = dict(updates, allocation=tuple(allocation), num_launches=generation)
            self._transition(cur, job_id, JobState.STARTING, now, message,
                             columns.pop("reason", None), columns)
            insert_intents(cur, job_id, generation, allocation, intent, now)
        self.db.write(write)
        return self.get_job(job_id)

    def confirm_launch(self, job_id: str, generation: int,
                       replicas: Sequence[ReplicaRecord]) -> None:
        """Replace a launch's intents by what the backend started, in one transaction."""
        self.db.write(lambda cur: confirm_intents(cur, job_id, generation, replicas))

    def abandon_launch(self, job_id: str, generation: int) -> None:
        """Forget the unconfirmed intents of a launch the backend refused (it started
        nothing, or cleaned up what it started)."""
        self.db.write(lambda cur: delete_intents(cur, job_id, generation))

    # --- replicas ---------------------------------------------------------------------

    def add_replica(self, record: ReplicaRecord) -> None:
        self.db.write(lambda cur: insert_replica(cur, record))

    def mark_replica_exited(self, job_id: str, generation: int, rank: int, exit_code: int,
                            now: float) -> None:
        self.db.write(lambda cur: cur.execute(
            "UPDATE replicas SET exit_code=?, exited_at=? WHERE job_id=? AND "
            "generation=? AND rank=? AND exit_code IS NULL",
            (int(exit_code), now, job_id, generation, rank)))

    def replicas(self, job_id: str | None = None, live_only: bool = False,
                 generation: int | None = None) -> list[ReplicaRecord]:
        """Replicas, optionally of one job / one generation / not yet seen exiting."""
        return self.db.read(lambda conn: select_replicas(conn, job_id, live_only, generation))

    # --- events -----------------------------------------------------------------------

    def add_event(self, job_id: str, now: float, kind: str, message: str) -> None:
        self.db.write(lambda cur: append_event(cur, job_id, now, kind, message))

    def events(self, job_id: str, limit: int | None = None, offset: int = 0
               ) -> list[JobEvent]:
        """The job's events, oldest first; with ``limit``, the newest ``limit`` after
        skipping the ``offset`` newest."""
        return self.db.read(lambda conn: read_events(conn, job_id, limit, offset))

    def count_events(self, job_id: str) -> int:
        return self.db.read(lambda conn: count_events(conn, job_id))
