"""Retention: how long finished jobs stay in the store, and their pruning.

A finished job (Succeeded, Failed, Cancelled) is kept while it is among the newest
``keep_count`` finished jobs and finished less than ``keep_s`` ago (``pollux server
--keep-finished``, ``--keep-finished-days``); past either bound its directory
(checkpoints, logs) is removed first, then its rows (the job, its replicas and events) in
one transaction, so a crash in between leaves a job whose files are gone, never files
whose job is gone (which the start-up check reads as a lost store). A directory that
cannot be removed keeps its job (logged), to be tried again at the next pruning.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pollux.data_dir import job_dir
from pollux.errors import ConfigError, PolluxError, StoreError
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore

logger = logging.getLogger(__name__)

PRUNE_BATCH = 500
"""Jobs deleted per store transaction (a short write: the API's writes wait behind it)."""


FINAL = tuple(state.value for state in JobState if state.is_final)


def finished_to_prune(store: JobStore, now: float, keep_count: int, keep_s: float,
                      batch: int) -> list[str]:
    """Up to ``batch`` finished jobs past retention: finished more than ``keep_s`` ago,
    or older than the newest ``keep_count`` finished ones; oldest first."""
    marks = ", ".join("?" * len(FINAL))
    rows = store.db.read(lambda conn: conn.execute(
        f"SELECT id FROM jobs WHERE state IN ({marks}) AND (COALESCE(finished_at, "
        f"updated_at) < ? OR seq NOT IN (SELECT seq FROM jobs WHERE state IN ({marks}) "
        "ORDER BY seq DESC LIMIT ?)) ORDER BY seq LIMIT ?",
        (*FINAL, now - keep_s, *FINAL, max(0, keep_count), batch)).fetchall())
    return [str(row[0]) for row in rows]


def delete_jobs(store: JobStore, job_ids: Sequence[str]) -> int:
    """Delete finished jobs with their replicas and events (a job not finished, or gone,
    is left alone), in one transaction; returns how many were deleted."""
    def write(cur: sqlite3.Cursor) -> int:
        deleted = 0
        for job_id in job_ids:
            row = cur.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is None or row[0] not in FINAL:
                continue
            cur.execute("DELETE FROM events WHERE job_id=?", (job_id,))
            cur.execute("DELETE FROM replicas WHERE job_id=?", (job_id,))
            cur.execute("DELETE FROM jobs WHERE id=?", (job_id,))
            deleted += 1
        return deleted
    return store.db.write(write)


@dataclass(frozen=True)
class Retention:
    keep_count: int = 10_000
    """Finished jobs kept at most (the newest)."""
    keep_s: float = 30 * 86_400.0
    """Finished jobs kept at most this long after they finished."""
    interval_s: float = 600.0
    """How often the server prunes (and once at start)."""

    def __post_init__(self) -> None:
        if not isinstance(self.keep_count, int) or not 0 <= self.keep_count <= 10**9:
            raise ConfigError("keep_finished", self.keep_count,
                              "give a whole number of jobs, 0..1000000000")
        if not 0 <= self.keep_s <= 1e11:
            raise ConfigError("keep_finished_days", self.keep_s / 86_400.0,
                              "give a number of days >= 0")
        if not self.interval_s > 0:
            raise ConfigError("interval_s", self.interval_s, "must be > 0 seconds")


def prune_finished(store: JobStore, data_dir: Path, now: float, retention: Retention,
                   batch: int = PRUNE_BATCH) -> list[str]:
    """Remove the finished jobs past ``retention`` (files, then rows); returns their ids."""
    pruned: list[str] = []
    stuck: set[str] = set()
    while True:
        candidates = [job_id for job_id in finished_to_prune(
            store, now, retention.keep_count, retention.keep_s, batch + len(stuck))
            if job_id not in stuck][:batch]
        if not candidates:
            return pruned
        removable = []
        for job_id in candidates:
            directory = job_dir(data_dir, job_id)
            try:
                if directory.is_symlink():
                    directory.unlink()
                elif directory.exists():
                    shutil.rmtree(directory)
                removable.append(job_id)
            except OSError as exc:
                logger.warning("job %s not pruned: cannot remove %s (%s)", job_id,
                               directory, exc)
                stuck.add(job_id)
        if removable:
            delete_jobs(store, removable)
            pruned.extend(removable)


class Pruner:
    """Prunes in a thread of its own: at start, then every ``retention.interval_s``."""

    def __init__(self, store: JobStore, data_dir: Path, retention: Retention,
                 clock: Callable[[], float], backup: Callable[[], object] | None = None,
                 backup_interval_s: float = 3600.0) -> None:
        """``backup``: called every ``backup_interval_s`` too (the store's backups)."""
        self.backup = backup
        self.backup_interval_s = backup_interval_s
        self.store = store
        self.data_dir = data_dir
        self.retention = retention
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> list[str]:
        try:
            pruned = prune_finished(self.store, self.data_dir, self.clock(), self.retention)
        except StoreError as exc:  # a busy, full or damaged store: next time
            logger.warning("pruning finished jobs failed (%s); trying again later", exc)
            return []
        if pruned:
            logger.info("pruned %d finished jobs past retention (%s ...)", len(pruned),
                        ", ".join(pruned[:5]))
        return pruned

    def start(self) -> None:
        def loop() -> None:
            backed_up = time.monotonic()  # the start made one
            while not self._stop.is_set():
                self.run_once()
                if (self.backup is not None
                        and time.monotonic() - backed_up >= self.backup_interval_s):
                    backed_up = time.monotonic()
                    try:
                        self.backup()
                    except PolluxError as exc:
                        logger.warning("the job store's backup failed: %s", exc)
                self._stop.wait(min(self.retention.interval_s, self.backup_interval_s))
        self._thread = threading.Thread(target=loop, name="pollux-retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
