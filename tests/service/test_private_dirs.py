"""Hostile: another local user who can write a directory above the data directory (and
so swap the data directory for her own), or who created the exit-status fallback
directory first. Both are refused at start, naming the directory and the fix."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from pollux.backends.exit_status import (
    check_fallback_dir,
    fallback_dir,
    read_exit_status,
    wrapped_command,
)
from pollux.backends.local import LocalBackend
from pollux.errors import ConfigError
from pollux.service.private import make_private_dir

OTHER_UID = 65534
"""``nobody``: the other user (chown needs root)."""
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def test_a_parent_others_can_write_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=rf"{shared} above it is writable by other users"):
        make_private_dir(shared / "me" / "data")
    assert not (shared / "me").exists()  # refused before anything was created
    shared.chmod(0o1777)  # sticky, as /tmp: nobody renames another's entries
    make_private_dir(shared / "me" / "data")
    assert (shared / "me" / "data").stat().st_mode & 0o777 == 0o700


def test_a_link_to_a_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "data").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(shared / "data")
    with pytest.raises(ConfigError, match="writable by other users"):
        make_private_dir(tmp_path / "link")


@needs_root
def test_a_parent_another_user_owns_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigError, match=rf"{theirs} above it belongs to another user"):
        make_private_dir(theirs / "data")


@needs_root
def test_a_fallback_dir_another_user_created_first_is_refused(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert fallback_dir() == runtime / "pollux-exit-status"  # private: used
    squatted = runtime / "pollux-exit-status"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, OTHER_UID, OTHER_UID)
    assert "another user (uid 65534) owns it" in (check_fallback_dir(squatted) or "")
    with pytest.raises(ConfigError, match="exit status fallback dir.*another user"):
        LocalBackend("fallback-squat", num_nodes=1, slots_per_node=1, device="cpu")
    squatted.rmdir()
    LocalBackend("fallback-squat", num_nodes=1, slots_per_node=1, device="cpu")
    assert squatted.stat().st_mode & 0o777 == 0o700 and squatted.stat().st_uid == os.getuid()


def test_a_runtime_dir_that_is_not_private_is_not_used(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o755)
    runtime.chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert fallback_dir().parent != runtime
    assert fallback_dir().name == f"pollux-exit-status-{os.getuid()}"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/run")
    assert not str(fallback_dir()).startswith("relative")


def test_the_wrapper_keeps_a_status_in_the_fallback_dir_it_was_given(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    blocker = tmp_path / "logs"
    blocker.write_text("a file: the status cannot be written below it")
    status = blocker / "replica-0.launch-1.exit"
    wrapper = subprocess.Popen(wrapped_command(status, ["sh", "-c", "exit 4"],
                                               fallback=fallback_dir()),
                               env={**os.environ, "XDG_RUNTIME_DIR": "/nonexistent"},
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while read_exit_status(status) is None:  # read from the server's side
            assert time.monotonic() < deadline, "no status kept aside"
            time.sleep(0.05)
        assert read_exit_status(status) == 4
        assert any((runtime / "pollux-exit-status").iterdir())
    finally:
        wrapper.kill()
        wrapper.wait()
