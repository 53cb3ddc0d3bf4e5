"""Hostile: a job store that was lost or damaged, and a data directory that cannot be
written, at start. The server refuses, in one line naming the path and the fix, to start
on a store that lost jobs (deleted, its WAL lost, emptied, garbled); ``--recover``
restores the newest backup the server made and sets aside what it cannot place; job ids
and their directories are never reused (a new job never reads a lost job's checkpoint
or shows its logs); start-up failures of the data directory (read-only, full) are one
line, never a traceback, and leave no ``token.tmp`` behind."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pollux.cli.main import main
from pollux.errors import StartupError
from pollux.service.config import PolicyConfig, ServerConfig, StoreConfig
from pollux.service.server import build_service
from pollux.service.storage.states import JobState
from tests.service.conftest import EQUAL_SHARE
from tests.service.service_builders import make_spec


def _service(data_dir: Path, fake_backend, recover: bool = False):  # type: ignore[no-untyped-def]
    return build_service(ServerConfig(data_dir=data_dir, policy=PolicyConfig(EQUAL_SHARE),
                                      store=StoreConfig(recover=recover)),
                         None, fake_backend)


def _submit(service, count: int, prefix: str = "j") -> list[str]:  # type: ignore[no-untyped-def]
    ids = []
    for i in range(count):
        record = service.store.add_job(make_spec(f"{prefix}{i % 3}"), float(i))
        checkpoint = service.data_dir / "jobs" / record.id / "checkpoint"
        checkpoint.mkdir(parents=True, exist_ok=True)
        (checkpoint / "state.txt").write_text(f"checkpoint of {record.id}")
        ids.append(record.id)
    return ids


def _remove_store(data_dir: Path) -> None:
    for name in ("pollux.db", "pollux.db-wal", "pollux.db-shm"):
        (data_dir / name).unlink(missing_ok=True)


def test_a_deleted_store_is_refused_then_recovered_without_reusing_ids(tmp_path, fake_backend):
    data_dir = tmp_path / "data"
    service = _service(data_dir, fake_backend)
    old = _submit(service, 3)
    service.store.close()
    _service(data_dir, fake_backend).store.close()  # a start: its backup has the 3 jobs
    _remove_store(data_dir)
    with pytest.raises(StartupError) as refused:
        _service(data_dir, fake_backend)
    message = str(refused.value)
    assert "lacks 1 jobs" not in message and "lacks 3 jobs" in message, message
    assert str(data_dir / "pollux.db") in message and "--recover" in message
    recovered = _service(data_dir, fake_backend, recover=True)
    assert {r.id for r in recovered.store.list_jobs()} == set(old), "restored the backup"
    new = _submit(recovered, 3, prefix="j")
    assert not set(new) & set(old)
    recovered.store.close()
    # no backup at all: an empty store, the old jobs set aside, ids still fresh
    shutil.rmtree(data_dir / "backups")
    _remove_store(data_dir)
    fresh = _service(data_dir, fake_backend, recover=True)
    assert fresh.store.list_jobs() == []
    newest = _submit(fresh, 3)
    assert not set(newest) & set(old + new)
    assert all((data_dir / "lost" / j / "checkpoint" / "state.txt").exists() for j in old + new)
    for job_id in newest:  # a new job's directory holds nothing of another job
        assert (data_dir / "jobs" / job_id / "checkpoint" / "state.txt").read_text() == \
            f"checkpoint of {job_id}"
    fresh.store.close()


def test_a_lost_wal_is_detected(tmp_path, fake_backend):
    data_dir = tmp_path / "data"
    service = _service(data_dir, fake_backend)
    _submit(service, 45)
    service.store.db.checkpoint()
    _submit(service, 15, prefix="w")  # these are in the WAL only
    saved = (data_dir / "pollux.db").read_bytes()
    service.store.close()
    _remove_store(data_dir)
    (data_dir / "pollux.db").write_bytes(saved)  # as if the WAL were deleted
    with pytest.raises(StartupError, match="lacks 15 jobs"):
        _service(data_dir, fake_backend)


@pytest.mark.parametrize("damage", ["empty", "garbled", "truncated"])
def test_a_damaged_or_emptied_store_is_refused_and_recovered(tmp_path, fake_backend, damage):
    data_dir = tmp_path / "data"
    service = _service(data_dir, fake_backend)
    ids = _submit(service, 20)
    service.store.close()
    _service(data_dir, fake_backend).store.close()  # a start: the backup has all 20
    path = data_dir / "pollux.db"
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        if damage == "empty":
            handle.truncate(0)
        elif damage == "truncated":
            handle.truncate(size // 2)
        else:
            handle.write(b"garbage!" * 512)
    with pytest.raises(StartupError) as refused:
        _service(data_dir, fake_backend)
    assert str(path) in str(refused.value) and "--recover" in str(refused.value)
    recovered = _service(data_dir, fake_backend, recover=True)
    assert [r.id for r in recovered.store.list_jobs()] == ids
    assert all(r.state is JobState.PENDING for r in recovered.store.list_jobs())
    recovered.store.close()


def _cli_start(data_dir: Path, capsys) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    code = main(["server", "--data-dir", str(data_dir), "--port", "0", "--device", "cpu"])
    return code, capsys.readouterr().err


def test_a_damaged_store_at_start_is_one_line_from_the_cli(tmp_path, capsys):
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    (data_dir / "pollux.db").write_bytes(b"this is not a database" * 100)
    code, err = _cli_start(data_dir, capsys)
    assert code != 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("pollux: error")]
    assert len(lines) == 1 and str(data_dir / "pollux.db") in lines[0], err
    assert "--recover" in lines[0]


@pytest.fixture
def mount(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Mount a tmpfs with the given options (needs root; skipped where not allowed)."""
    mounted = []

    def make(name: str, options: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                              capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(where)
        return where
    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_read_only_data_dir_is_one_line(mount, capsys):
    data_dir = mount("ro", "ro,size=1m,mode=0700")
    code, err = _cli_start(data_dir, capsys)
    assert code != 0 and "Traceback" not in err, err
    assert str(data_dir / "server.lock") in err and "writ" in err, err


def test_a_full_disk_at_start_is_one_line_and_leaves_no_token_tmp(mount, capsys):
    disk = mount("full", "size=256k,mode=0700")
    data_dir = disk / "data"
    data_dir.mkdir(mode=0o700)
    with open(disk / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    code, err = _cli_start(data_dir, capsys)
    assert code != 0 and "Traceback" not in err, err
    assert "free space" in err and str(data_dir) in err, err
    assert not (data_dir / "token.tmp").exists()
