"""The job store's tables (SQLite), and the columns added to them since their first
release (added to an older store when it is opened; a table added later, such as
``users``, is created in an older store the same way: nothing stored is lost)."""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    allocation TEXT NOT NULL DEFAULT '[]',
    target_allocation TEXT,
    num_launches INTEGER NOT NULL DEFAULT 0,
    num_failures INTEGER NOT NULL DEFAULT 0,
    num_rescales INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    hints TEXT,
    hints_updated_at REAL,
    hints_token TEXT NOT NULL,
    attained_service_s REAL NOT NULL DEFAULT 0,
    submitted_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    updated_at REAL NOT NULL,
    gpu_type TEXT
);
CREATE TABLE IF NOT EXISTS replicas (
    job_id TEXT NOT NULL REFERENCES jobs(id),
    generation INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    node TEXT NOT NULL,
    handle TEXT NOT NULL,
    started_at REAL NOT NULL,
    exit_code INTEGER,
    exited_at REAL,
    PRIMARY KEY (job_id, generation, rank)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs(id),
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job_id, id);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, seq);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    teams TEXT NOT NULL,
    team_admin INTEGER NOT NULL DEFAULT 0,
    admin INTEGER NOT NULL DEFAULT 0,
    token_hash TEXT UNIQUE NOT NULL,
    created_at REAL NOT NULL,
    token_rotated_at REAL NOT NULL
);
"""
ADDED_JOB_COLUMNS = (("gpu_type", "TEXT"), ("owner", "TEXT"), ("team", "TEXT"))
"""Columns added to ``jobs`` later: the GPU type of its launch; the user who submitted
it and the team it runs in (NULL for jobs stored before users: the server's own)."""
ADDED_EVENT_COLUMNS = (("repeats", "INTEGER NOT NULL DEFAULT 0"), ("last_time", "REAL"))
"""Columns added to ``events`` later: how often an event was repeated (coalesced) and
when it last was."""


def create_schema(cur: sqlite3.Cursor) -> None:
    """Create the tables (of a new store) and add the columns an older one lacks."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            cur.execute(statement)
    for table, added in (("jobs", ADDED_JOB_COLUMNS), ("events", ADDED_EVENT_COLUMNS)):
        present = {row[1] for row in cur.execute(f"PRAGMA table_info({table})")}
        for column, sql_type in added:
            if column not in present:
                cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
