"""Injected SQLite faults for the store tests: a write connection whose statements fail
with "database is locked" at random moments, as a busy database would; hints stored
unvalidated, as an older or damaged server could have left them."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import numpy as np

from pollux.service.storage.store import JobStore


class FlakyWrites:
    """Wraps the store's write connection: each statement (ROLLBACK aside) starts, with
    probability ``rate``, an episode of ``burst`` consecutive "database is locked" errors
    (a long burst outlasts the store's retries: the write fails for good), until
    ``episodes`` episodes were injected."""

    def __init__(self, store: JobStore, seed: int, episodes: int = 20, rate: float = 0.05,
                 bursts: tuple[int, ...] = (1, 1, 2, 30),
                 message: str = "database is locked") -> None:
        self.real = store.db._writer
        self.rng = np.random.default_rng(seed)
        self.episodes_left = episodes
        self.rate = rate
        self.bursts = bursts
        self.failing = 0
        self.injected = 0
        """Statements failed so far."""
        self.failed_for_good = 0
        self.message = message
        store.db._writer = self  # type: ignore[assignment]

    @property
    def in_transaction(self) -> bool:
        return self.real.in_transaction

    def cursor(self) -> _FlakyCursor:
        return _FlakyCursor(self.real.cursor(), self)

    def should_fail(self) -> bool:
        if self.failing == 0 and self.episodes_left > 0 and self.rng.random() < self.rate:
            self.episodes_left -= 1
            self.failing = int(self.rng.choice(self.bursts))
            self.failed_for_good += self.failing > 10
        if self.failing > 0:
            self.failing -= 1
            self.injected += 1
            return True
        return False

    def close(self) -> None:
        self.real.close()


class _FlakyCursor:
    def __init__(self, cursor: sqlite3.Cursor, owner: FlakyWrites) -> None:
        self._cursor = cursor
        self._owner = owner

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        if sql != "ROLLBACK" and self._owner.should_fail():
            raise sqlite3.OperationalError(self._owner.message)
        return self._cursor.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def write_stored_hints(store: JobStore, job_id: str, raw: Any, now: float) -> None:
    """Put ``raw`` in the job's hints column as an older (or damaged) server could have:
    a string as it is, anything else as its JSON, with no validation."""
    text = raw if isinstance(raw, str) else json.dumps(raw)
    store.db.write(lambda cur: cur.execute(
        "UPDATE jobs SET hints=?, hints_updated_at=? WHERE id=?", (text, now, job_id)))
