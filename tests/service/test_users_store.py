"""The job store's users table and the owner/team of jobs: a store written before them
opens with every job kept; users keep only their tokens' hashes."""

from __future__ import annotations

import json
import sqlite3
import stat
from pathlib import Path

import pytest

from pollux.errors import ConfigError, UnknownUserError
from pollux.service.private import make_private_dir
from pollux.service.storage.store import JobStore
from pollux.service.storage.users import TOKEN_PREFIX, UserStore, hash_token
from tests.service.service_builders import make_spec

OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, name TEXT NOT NULL,
    spec TEXT NOT NULL, state TEXT NOT NULL, reason TEXT,
    allocation TEXT NOT NULL DEFAULT '[]', target_allocation TEXT,
    num_launches INTEGER NOT NULL DEFAULT 0, num_failures INTEGER NOT NULL DEFAULT 0,
    num_rescales INTEGER NOT NULL DEFAULT 0, cancel_requested INTEGER NOT NULL DEFAULT 0,
    hints TEXT, hints_updated_at REAL, hints_token TEXT NOT NULL,
    attained_service_s REAL NOT NULL DEFAULT 0, submitted_at REAL NOT NULL,
    started_at REAL, finished_at REAL, updated_at REAL NOT NULL, gpu_type TEXT);
CREATE TABLE replicas (job_id TEXT NOT NULL REFERENCES jobs(id), generation INTEGER NOT NULL,
    rank INTEGER NOT NULL, node TEXT NOT NULL, handle TEXT NOT NULL, started_at REAL NOT NULL,
    exit_code INTEGER, exited_at REAL, PRIMARY KEY (job_id, generation, rank));
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs(id), time REAL NOT NULL, kind TEXT NOT NULL,
    message TEXT NOT NULL, repeats INTEGER NOT NULL DEFAULT 0, last_time REAL);
"""


def test_a_store_from_before_users_upgrades_keeping_every_job(tmp_path: Path):
    path = tmp_path / "pollux.db"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA)
    spec = json.dumps(make_spec("old").to_dict())
    conn.execute("INSERT INTO jobs(id, name, spec, state, hints_token, submitted_at, "
                 "updated_at) VALUES ('old-1', 'old', ?, 'Running', 'tok', 1.0, 2.0)", (spec,))
    conn.execute("INSERT INTO events(job_id, time, kind, message) VALUES ('old-1', 1.0, "
                 "'submitted', 'accepted as old-1')")
    conn.commit()
    conn.close()
    store = JobStore(path)
    try:
        old = store.get_job("old-1")
        assert (old.state.value, old.owner, old.team, old.hints_token) == (
            "Running", None, None, "tok")
        assert [e.message for e in store.events("old-1")] == ["accepted as old-1"]
        new = store.add_job(make_spec("new"), 3.0, owner="alice", team="vision")
        assert (store.get_job(new.id).owner, store.get_job(new.id).team) == ("alice", "vision")
        users = UserStore(store.db)
        assert users.count() == 0
        users.add("alice", ["vision"], 4.0)
        assert users.count() == 1
    finally:
        store.close()
    reopened = JobStore(path)  # opening again changes nothing
    try:
        assert [j.id for j in reopened.list_jobs()] == ["old-1", new.id]
        assert UserStore(reopened.db).get("alice") is not None
    finally:
        reopened.close()


def test_users_keep_only_token_hashes(store: JobStore):
    users = UserStore(store.db)
    alice, token = users.add("alice", ["vision", "nlp", "vision"], 1.0, team_admin=True)
    assert alice.teams == ("vision", "nlp") and alice.team_admin and not alice.admin
    assert token.startswith(TOKEN_PREFIX) and len(token) > 40
    stored = store.db.read(lambda conn: conn.execute("SELECT * FROM users").fetchall())
    assert token not in str(stored) and hash_token(token) in str(stored)
    assert users.by_token(token) == alice
    assert users.by_token(hash_token(token)) is None
    rotated = users.rotate("alice", 2.0)
    assert users.by_token(token) is None and users.by_token(rotated) is not None
    users.remove("alice")
    assert users.by_token(rotated) is None and users.get("alice") is None
    with pytest.raises(UnknownUserError):
        users.remove("alice")
    with pytest.raises(UnknownUserError):
        users.rotate("alice", 3.0)


@pytest.mark.parametrize(("name", "teams", "field"), [
    ("9lives", ["a"], "name"), ("-rf", ["a"], "name"), ("a" * 65, ["a"], "name"),
    ("ok", [], "team"), ("ok", ["bad team"], "team"), ("ok", ["../x"], "team"),
])
def test_bad_users_are_refused_naming_the_field(store: JobStore, name, teams, field):
    with pytest.raises(ConfigError) as refused:
        UserStore(store.db).add(name, teams, 1.0)
    assert refused.value.field == field


def test_a_data_directory_shared_for_its_socket_stays_searchable(tmp_path: Path):
    """0711 (what registered users need to reach the socket) is kept across restarts; a
    directory others may list or write is still made private."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "pollux.db").touch()
    shared.chmod(0o711)
    make_private_dir(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o711
    shared.chmod(0o755)
    make_private_dir(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o700


def test_a_user_name_is_added_once(store: JobStore):
    users = UserStore(store.db)
    users.add("alice", ["vision"], 1.0)
    with pytest.raises(ConfigError, match="exists"):
        users.add("alice", ["nlp"], 2.0)
    assert users.get("alice").teams == ("vision",)  # type: ignore[union-attr]
