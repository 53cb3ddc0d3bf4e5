"""The data directory's layout: every name a server writes there, in one place.

A server keeps its state in one directory (``--data-dir``, else ``$POLLUX_DATA_DIR``,
else ``~/.pollux``); its clients find it there. This module names its files and folders;
what each holds, and who writes it, is said where it is named::

    <data dir>/                      mode 0700
        server.json                  the running server's address (SERVER_FILE)
        server.sock                  its Unix socket for local clients (SOCKET_FILE)
        server.lock                  held by the running server (LOCK_FILE)
        token                        a generated API token, mode 0600 (TOKEN_FILE)
        pollux.db                    the job store, SQLite (STORE_FILE)
        instance_id                  the store's identity (INSTANCE_FILE)
        backups/                     copies of the store (BACKUPS_DIR)
        lost/                        job folders the store lost track of (LOST_DIR)
        jobs/<job id>/               one folder per job (JOBS_DIR, job_dir)
            checkpoint/              the job's checkpoints (checkpoint_dir)
            logs/replica-<rank>.log  each replica's output (log_dir, replica_log)

A contract of the server, its clients and the backends: standard library only (no
layer), so that a client finds a server without loading it.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "POLLUX_DATA_DIR"
"""Environment variable naming the data directory when ``--data-dir`` is not given."""
DEFAULT_DIR_NAME = ".pollux"
"""The data directory under the home directory when neither is given."""

SERVER_FILE = "server.json"
"""The running server's record for its clients: ``url``, ``socket``, ``pid``,
``machine``, ``token_file``, ``tls_cert`` (removed when the server stops)."""
SOCKET_FILE = "server.sock"
"""The server's Unix socket (mode 0600), through which the local CLI talks to it."""
LOCK_FILE = "server.lock"
"""Locked by the running server: one server per data directory."""
TOKEN_FILE = "token"
"""The generated API token (mode 0600; a new token at every start of the server)."""
STORE_FILE = "pollux.db"
"""The job store (SQLite)."""
INSTANCE_FILE = "instance_id"
"""The identity of the job store, kept beside it to tell a replaced store."""
BACKUPS_DIR = "backups"
"""Backups of the job store."""
LOST_DIR = "lost"
"""Job folders the job store does not know, moved aside by ``pollux server --recover``."""
JOBS_DIR = "jobs"
"""One folder per job, named by the job's id."""
CHECKPOINT_DIR = "checkpoint"
"""A job's checkpoints, in its folder."""
LOGS_DIR = "logs"
"""A job's replica logs, in its folder."""

DATA_DIR_MARKERS = (STORE_FILE, LOCK_FILE)
"""A directory holding one of these is a Pollux data directory."""


def default_data_dir() -> Path:
    """``$POLLUX_DATA_DIR``, else ``~/.pollux``."""
    return Path(os.environ.get(DATA_DIR_ENV, Path.home() / DEFAULT_DIR_NAME))


def job_dir(data_dir: Path, job_id: str) -> Path:
    """The folder of job ``job_id``."""
    return data_dir / JOBS_DIR / job_id


def checkpoint_dir(data_dir: Path, job_id: str) -> Path:
    """Where job ``job_id`` keeps its checkpoints."""
    return job_dir(data_dir, job_id) / CHECKPOINT_DIR


def log_dir(data_dir: Path, job_id: str) -> Path:
    """Where the replicas of job ``job_id`` write their logs."""
    return job_dir(data_dir, job_id) / LOGS_DIR


ROTATED_LOG_SUFFIX = ".1"
"""A replica log's older part, once it reached half its budget
(:mod:`pollux.backends.replica_log`)."""


def replica_log(directory: str | os.PathLike[str], rank: int, rotated: bool = False) -> Path:
    """The log of replica ``rank`` in a job's log folder ``directory`` (``rotated``: its
    older part)."""
    return Path(directory) / (f"replica-{rank}.log" + (ROTATED_LOG_SUFFIX if rotated else ""))
