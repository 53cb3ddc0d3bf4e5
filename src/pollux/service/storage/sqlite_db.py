"""The job store's connections to its SQLite file: one writer, a pool of readers.

Writes go through one connection, one transaction at a time (:meth:`Database.write`);
a transient error ("database is locked", "busy") rolls the transaction back and runs
it again after a growing pause, up to ``retry_s`` in all; an error that outlasts it,
or a full disk, rolls back and raises :class:`~pollux.errors.StoreUnavailableError`,
leaving the store exactly as it was. Reads (:meth:`Database.read`) use connections of
their own (SQLite WAL: a reader sees the last commit and never waits for a writer), so
an external write lock on the file, or a slow write, does not hold up the API.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pollux.errors import StoreDamagedError, StoreUnavailableError

logger = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT_MARKERS = ("locked", "busy")
"""SQLite errors worth retrying: another connection holds a lock for now."""
FULL_MARKERS = ("full", "no space")
"""SQLite errors of a full disk (SQLITE_FULL, an ENOSPC from the VFS)."""
DAMAGED_MARKERS = ("malformed", "not a database", "corrupt")
"""SQLite errors of a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB)."""
NUM_READERS = 4
"""Read connections at most (each holds two files open: the database and its WAL)."""
BUSY_TIMEOUT_S = 2.0
"""How long SQLite itself waits for another connection's lock, per attempt."""
FIRST_PAUSE_S = 0.02
MAX_PAUSE_S = 0.5


def is_transient(exc: sqlite3.Error) -> bool:
    message = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and any(
        marker in message for marker in TRANSIENT_MARKERS)


def is_damaged(exc: sqlite3.Error) -> bool:
    """A damaged file (SQLITE_CORRUPT, SQLITE_NOTADB): retrying cannot help."""
    message = str(exc).lower()
    return any(marker in message for marker in DAMAGED_MARKERS)


def is_full(exc: BaseException) -> bool:
    message = str(exc).lower()
    return any(marker in message for marker in FULL_MARKERS)


class Database:
    """Connections to one SQLite file in WAL mode; safe to share between threads."""

    def __init__(self, path: Path, synchronous: str, retry_s: float = 5.0) -> None:
        self.path = path
        self.synchronous = synchronous
        self.retry_s = retry_s
        """Total pause between attempts of a write (or read) hitting a transient error."""
        self._write_lock = threading.Lock()
        self._writer = self._connect()
        self._writer.execute("PRAGMA journal_mode=WAL")
        self._readers: queue.LifoQueue[sqlite3.Connection] = queue.LifoQueue()
        self._reader_slots = threading.BoundedSemaphore(NUM_READERS)
        self._opened: list[sqlite3.Connection] = [self._writer]
        self._opened_lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                               timeout=BUSY_TIMEOUT_S)
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def close(self) -> None:
        with self._write_lock, self._opened_lock:
            for conn in self._opened:
                conn.close()
            self._opened.clear()

    def _retrying(self, attempt: Callable[[], T], what: str) -> T:
        """Run ``attempt`` until it does not hit a transient error, pausing longer each
        time, for at most ``retry_s`` of pauses; raise StoreUnavailableError after."""
        pause_s, paused_s, tries = FIRST_PAUSE_S, 0.0, 0
        while True:
            tries += 1
            try:
                return attempt()
            except sqlite3.Error as exc:
                if is_damaged(exc):
                    raise StoreDamagedError(self.path, str(exc)) from exc
                if is_full(exc):
                    raise StoreUnavailableError(self.path, str(exc), full=True) from exc
                if not is_transient(exc) or paused_s >= self.retry_s:
                    raise StoreUnavailableError(
                        self.path, f"{exc} ({what}; {tries} attempts over "
                                   f"{paused_s:.1f} s)") from exc
                wait_s = min(pause_s, self.retry_s - paused_s)
                time.sleep(max(0.0, wait_s))
                paused_s += wait_s
                pause_s = min(MAX_PAUSE_S, pause_s * 2)
            except OSError as exc:  # e.g. the WAL file cannot grow
                raise StoreUnavailableError(self.path, str(exc), full=is_full(exc)) from exc

    def write(self, body: Callable[[sqlite3.Cursor], T]) -> T:
        """Run ``body`` in one IMMEDIATE transaction, retried whole on transient errors;
        errors of ``body`` itself (a StoreError) roll back and pass through."""
        def attempt() -> T:
            with self._write_lock:
                cur = self._writer.cursor()
                cur.execute("BEGIN IMMEDIATE")
                try:
                    result = body(cur)
                    cur.execute("COMMIT")
                except BaseException:
                    if self._writer.in_transaction:
                        try:
                            cur.execute("ROLLBACK")
                        except sqlite3.Error:
                            logger.exception("cannot roll back a failed store write")
                    raise
                return result
        return self._retrying(attempt, "write")

    def read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``body`` on a read connection of the pool (never behind a writer)."""
        with self._reader_slots:
            try:
                conn = self._readers.get_nowait()
            except queue.Empty:
                conn = self._retrying(self._open_reader, "open a reader")
            try:
                return self._retrying(lambda: body(conn), "read")
            finally:
                self._readers.put(conn)

    def checkpoint(self) -> None:
        """Copy the WAL into the database file and empty it (e.g. before a backup)."""
        self.write_outside_transaction("PRAGMA wal_checkpoint(TRUNCATE)")

    def write_outside_transaction(self, sql: str) -> None:
        """One statement on the write connection outside a transaction (pragmas)."""
        def attempt() -> None:
            with self._write_lock:
                self._writer.execute(sql).fetchall()
        self._retrying(attempt, sql)

    def _open_reader(self) -> sqlite3.Connection:
        conn = self._connect()
        conn.execute("PRAGMA query_only=ON")
        with self._opened_lock:
            self._opened.append(conn)
        return conn
