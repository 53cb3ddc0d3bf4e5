"""Hostile: a full disk under the launcher wrapper. A command that exited 0 whose status
cannot be written is "unknown", never failed: the wrapper keeps the status aside and
writes it once it can; the job is recorded Succeeded then and never runs again."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pollux.backends.exit_status import (
    fallback_status_path,
    read_exit_status,
    status_pending,
    wrapped_command,
)
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore


def _wait(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _blocked_status_path(tmp_path: Path) -> tuple[Path, Path]:
    """A status path that cannot be written (its directory is a file), as on a full
    disk; making ``blocker`` a directory is space coming back."""
    blocker = tmp_path / "logs"
    blocker.write_text("not a directory")
    return blocker, blocker / "replica-0.launch-1.exit"


def test_an_unwritable_status_is_unknown_until_written_never_a_failure(tmp_path):
    blocker, status = _blocked_status_path(tmp_path)
    runs = tmp_path / "runs.txt"
    wrapper = subprocess.Popen(wrapped_command(status, ["/bin/sh", "-c", f"echo ran >> {runs}"]),
                               stderr=subprocess.PIPE)
    try:
        _wait(lambda: runs.exists(), 10, "the command to run")
        time.sleep(1.0)
        assert wrapper.poll() is None, "the wrapper gave up on the status (exit " \
                                       f"{wrapper.returncode})"
        assert status_pending(status) and read_exit_status(status) == 0
        blocker.unlink()
        blocker.mkdir()  # space is back
        assert wrapper.wait(timeout=10) == 0
        assert read_exit_status(status) == 0 and status.is_file()
        assert not status_pending(status) and not fallback_status_path(status).exists()
        assert runs.read_text() == "ran\n"
    finally:
        wrapper.kill()
        wrapper.wait()
        assert wrapper.stderr is not None
        wrapper.stderr.close()
        fallback_status_path(status).unlink(missing_ok=True)


def test_sigterm_while_waiting_exits_as_the_command_did(tmp_path):
    _, status = _blocked_status_path(tmp_path)
    wrapper = subprocess.Popen(wrapped_command(status, ["/bin/sh", "-c", "exit 3"]),
                               stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: status_pending(status), 10, "the status to be kept aside")
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=10) == 3
        assert read_exit_status(status) == 3  # from the fallback, for a restarted server
    finally:
        wrapper.kill()
        wrapper.wait()
        fallback_status_path(status).unlink(missing_ok=True)


def test_a_fallback_planted_by_others_is_not_believed(tmp_path):
    _, status = _blocked_status_path(tmp_path)
    fallback = fallback_status_path(status)
    fallback.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(fallback.parent, 0o777)  # a directory others can write into
    try:
        fallback.write_text(f'{{"exit_code": 0, "status_file": "{status}"}}')
        assert read_exit_status(status) is None and not status_pending(status)
    finally:
        fallback.unlink(missing_ok=True)
        os.chmod(fallback.parent, 0o700)


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 4 MiB tmpfs (needs root; skipped where mounting is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path) -> None:
    with open(path, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
        except OSError:
            pass


def test_a_job_ending_on_a_full_disk_succeeds_once_space_returns(tmp_path, small_disk):
    from pollux.backends.local import LocalBackend
    from pollux.service.loop.allocator import Allocator, AllocatorConfig
    from tests.service.service_builders import make_spec
    from tests.service.service_test_policies import EqualSharePolicy

    data = small_disk / "data"
    store = JobStore(data / "pollux.db", synchronous="OFF", retry_s=0.1)
    backend = LocalBackend("diskfull", num_nodes=1, slots_per_node=1, device="cpu")
    allocator = Allocator(store, backend, EqualSharePolicy(), AllocatorConfig(
        data_dir=data, interval_s=0.5, stop_grace_s=5.0, poll_interval_s=0.05))
    runs, go = tmp_path / "runs.txt", tmp_path / "go"
    job = store.add_job(make_spec("full", max_replicas=1, working_dir=str(tmp_path), command=[
        "/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; echo ran >> {runs}"]),
        now=time.time()).id

    def tick_until(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, (what, store.events(job))
            try:
                allocator.tick()
            except Exception:  # noqa: BLE001 - the loop logs and ticks again
                pass
            time.sleep(0.05)

    try:
        tick_until(lambda: store.get_job(job).state is JobState.RUNNING, 15, "running")
        _fill(small_disk / "filler")
        go.touch()  # the command exits 0 now, on a full disk
        _wait(lambda: runs.exists(), 10, "the command to end")
        until = time.monotonic() + 2.0
        tick_until(lambda: time.monotonic() > until, 5, "two seconds of a full disk")
        record = store.get_job(job)
        assert record.state is JobState.RUNNING and record.num_failures == 0, \
            store.events(job)
        assert [s.state.value for s in backend.poll(job)] == ["unknown"]
        (small_disk / "filler").unlink()  # space is back
        tick_until(lambda: store.get_job(job).state.is_final, 15, "the job to end")
        record = store.get_job(job)
        assert record.state is JobState.SUCCEEDED and record.num_launches == 1, \
            store.events(job)
        assert runs.read_text() == "ran\n"
    finally:
        backend.close()
        store.close()
