"""The job store knows itself: checked at every start, backed up, recovered on demand.

At start (:func:`open_checked_store`) the server opens ``<data dir>/pollux.db`` and
refuses to run on a store that lost jobs, with one line naming the path and the fix:

- a file SQLite cannot read (garbled, truncated: ``PRAGMA quick_check`` fails);
- a store without jobs while the newest backup has some (deleted or emptied);
- job directories (``<data dir>/jobs/<id>``, made when a job is accepted) of jobs the
  store does not hold: its WAL or pages were lost or damaged.

Every start that passes makes a backup (``<data dir>/backups/pollux-<time>.db``, the
newest :data:`KEEP_BACKUPS` kept), and the running server one every hour. ``pollux server --recover`` sets a damaged store aside
(``<data dir>/damaged-<time>/``), restores the newest backup that reads back (or starts
an empty store when there is none) and moves the directories of jobs the store does not
hold to ``<data dir>/lost/`` (their checkpoints and logs stay there for you). Job ids and
directories are never reused: a new job's sequence number continues past every job
directory found (in ``jobs/`` and ``lost/``), and the data directory's instance id (which
names its replicas and Slurm work) is kept in ``<data dir>/instance_id`` as well, so a
lost store does not orphan the replicas it started.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from pollux.data_dir import BACKUPS_DIR, INSTANCE_FILE, JOBS_DIR, LOST_DIR, STORE_FILE
from pollux.errors import StartupError, StoreError, StoreUnavailableError
from pollux.service.private import make_private_file
from pollux.service.storage.store import JobStore

logger = logging.getLogger(__name__)

KEEP_BACKUPS = 3
RECOVER_FIX = ("run `pollux server --recover` (it sets the store aside, restores the newest "
               "backup in {backups} and moves the directories of jobs it lacks to {lost})")
SEQ_SUFFIX = re.compile(r"-(\d+)$")


def store_path(data_dir: Path) -> Path:
    return data_dir / STORE_FILE


def _fix(data_dir: Path) -> str:
    return RECOVER_FIX.format(backups=data_dir / BACKUPS_DIR, lost=data_dir / LOST_DIR)


def open_checked_store(data_dir: Path, recover: bool = False) -> JobStore:
    """The data directory's job store, checked (see the module); ``recover``: restore
    first (``pollux server --recover``). Raises StartupError naming the path and fix."""
    path = store_path(data_dir)
    if recover:
        try:
            recover_store(data_dir)
        except (OSError, StoreError) as exc:
            raise StartupError(path, f"cannot recover the job store ({exc})",
                               f"free space in {data_dir} or make it writable, and run "
                               "`pollux server --recover` again") from exc
    problem = damage(path)
    if problem is not None:
        raise StartupError(path, problem, _fix(data_dir))
    try:
        store = JobStore(path, jobs_dir=data_dir / JOBS_DIR)
    except StoreUnavailableError as exc:  # full, read-only, locked: not damage
        raise StartupError(path, f"cannot open the job store ({exc.detail})",
                           f"free space in {data_dir} or make it writable, and start "
                           "again") from exc
    except OSError as exc:
        raise StartupError(path, f"cannot open the job store ({exc.strerror or exc})",
                           f"free space in {data_dir} or make it writable, and start "
                           "again") from exc
    except StoreError as exc:
        raise StartupError(path, f"cannot open the job store ({exc})", _fix(data_dir)) from exc
    try:
        check_complete(store, data_dir)
        continue_sequence(store, data_dir)
        keep_instance_id(store, data_dir)
        backup(store, data_dir)
    except BaseException:
        store.close()
        raise
    return store


def damage(path: Path) -> str | None:
    """What is wrong with the store file at ``path`` that SQLite can tell (None: it reads
    back whole, or there is none yet)."""
    if not path.exists():
        return None
    if path.stat().st_size == 0:
        return None  # empty: judged by what else the data directory holds
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as conn:
            rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as exc:
        return f"the job store cannot be read ({exc})"
    if [tuple(r) for r in rows] != [("ok",)]:
        detail = "; ".join(str(r[0]) for r in rows[:3])
        return f"the job store is damaged (quick_check: {detail})"
    return None


def _job_ids(store: JobStore) -> set[str]:
    rows = store.db.read(lambda conn: conn.execute("SELECT id FROM jobs").fetchall())
    return {str(r[0]) for r in rows}


def _dirs(directory: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    except FileNotFoundError:
        return []


def check_complete(store: JobStore, data_dir: Path) -> None:
    """Refuse a store that lost jobs: directories of jobs it lacks, or no jobs at all
    while its newest backup has some."""
    known = _job_ids(store)
    missing = [name for name in _dirs(data_dir / JOBS_DIR) if name not in known]
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise StartupError(store.path, f"the job store lacks {len(missing)} jobs whose "
                           f"directories are in {data_dir / JOBS_DIR} ({shown}): its database "
                           "or WAL was lost or damaged", _fix(data_dir))
    if not known:
        newest = _newest_readable_backup(data_dir)
        if newest is not None and _count_jobs(newest) > 0:
            raise StartupError(store.path, f"the job store is empty but the backup {newest} "
                               f"holds {_count_jobs(newest)} jobs", _fix(data_dir))


def continue_sequence(store: JobStore, data_dir: Path) -> None:
    """Make new job ids continue past every job directory there is (``jobs/``, ``lost/``),
    so that no id, and no directory, is ever reused."""
    highest = 0
    for directory in (data_dir / JOBS_DIR, data_dir / LOST_DIR):
        for name in _dirs(directory):
            match = SEQ_SUFFIX.search(name)
            if match:
                highest = max(highest, int(match.group(1)))
    if highest:
        store.continue_sequence_past(highest)


def keep_instance_id(store: JobStore, data_dir: Path) -> str:
    """The data directory's instance id: the store's, else the one in ``instance_id``
    (a store recreated after a loss keeps naming its replicas as before), else new;
    written to both."""
    path = data_dir / INSTANCE_FILE
    try:
        kept = path.read_text().strip() or None
    except FileNotFoundError:
        kept = None
    instance = store.meta_setdefault("instance_id", kept or os.urandom(8).hex())
    if kept != instance:
        tmp = path.with_name(INSTANCE_FILE + ".tmp")
        tmp.unlink(missing_ok=True)
        make_private_file(tmp)
        tmp.write_text(instance + "\n")
        os.replace(tmp, path)
    return instance


def backup(store: JobStore, data_dir: Path, now: float | None = None) -> Path:
    """A consistent copy of the store in ``<data dir>/backups`` (the newest
    :data:`KEEP_BACKUPS` kept)."""
    directory = data_dir / BACKUPS_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    target = directory / f"pollux-{stamp}.db"
    tmp = directory / f".pollux-{stamp}.db.tmp"
    tmp.unlink(missing_ok=True)
    make_private_file(tmp)

    def copy(conn: sqlite3.Connection) -> None:
        with closing(sqlite3.connect(tmp)) as out:
            conn.backup(out)
    try:
        store.db.read(copy)
        os.replace(tmp, target)
    except (OSError, StoreError) as exc:
        tmp.unlink(missing_ok=True)
        raise StartupError(target, f"cannot back up the job store ({exc})",
                           f"free space in {directory} (or make it writable) and start again"
                           ) from exc
    for old in _backups(data_dir)[KEEP_BACKUPS:]:
        old.unlink(missing_ok=True)
    return target


def _backups(data_dir: Path) -> list[Path]:
    """Backups, newest first."""
    return sorted((data_dir / BACKUPS_DIR).glob("pollux-*.db"), reverse=True)


def _newest_readable_backup(data_dir: Path) -> Path | None:
    for candidate in _backups(data_dir):
        if damage(candidate) is None:
            return candidate
    return None


def _count_jobs(path: Path) -> int:
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])
    except sqlite3.Error:
        return 0


def recover_store(data_dir: Path) -> None:
    """``pollux server --recover``: set the store aside, restore the newest readable
    backup (none: start empty), move directories of jobs it lacks to ``lost/``."""
    path = store_path(data_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    aside = data_dir / f"damaged-{stamp}"
    present = [p for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()]
    if present:
        aside.mkdir(mode=0o700, exist_ok=True)
        for item in present:
            os.replace(item, aside / item.name)
        logger.warning("recover: the job store was set aside in %s", aside)
    newest = _newest_readable_backup(data_dir)
    if newest is not None:
        tmp = path.with_name(STORE_FILE + ".restoring")
        tmp.unlink(missing_ok=True)
        shutil.copyfile(newest, tmp)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        logger.warning("recover: restored the backup %s", newest)
    else:
        logger.warning("recover: no readable backup in %s; starting an empty store",
                       data_dir / BACKUPS_DIR)
    store = JobStore(path)
    try:
        known = _job_ids(store)
    finally:
        store.close()
    lost = [name for name in _dirs(data_dir / JOBS_DIR) if name not in known]
    if lost:
        (data_dir / LOST_DIR).mkdir(mode=0o700, exist_ok=True)
        for name in lost:
            target, n = data_dir / LOST_DIR / name, 1
            while target.exists():
                target, n = data_dir / LOST_DIR / f"{name}.{n}", n + 1
            os.replace(data_dir / JOBS_DIR / name, target)
        logger.warning("recover: %d jobs the store lacks moved to %s: %s", len(lost),
                       data_dir / LOST_DIR, ", ".join(lost[:10]))
