"""A replica's bounded log: within its budget (the newest output kept, the older rotated
away with a marker line), and never into the disk's reserve for the job store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pollux.backends.exit_status import read_exit_status, wrapped_command
from pollux.backends.replica_log import (
    MIN_LOG_BUDGET_BYTES,
    BoundedLog,
    check_log_budget,
    disk_reserve_bytes,
)

MARKER_ALLOWANCE = 1024
"""Bytes of the marker lines a log may hold beyond its budget."""


def on_disk(path: Path) -> int:
    rotated = Path(f"{path}.1")
    return path.stat().st_size + (rotated.stat().st_size if rotated.exists() else 0)


@settings(max_examples=25, deadline=None)
@example([32646, 66560, 32767])  # a cut chunk once put a wrong "dropped" marker inside
@given(st.lists(st.integers(min_value=1, max_value=300_000), min_size=1, max_size=40))
def test_a_log_keeps_its_budget_and_the_newest_output(tmp_path_factory, sizes):
    path = tmp_path_factory.mktemp("log") / "replica-0.log"
    log = BoundedLog(str(path), MIN_LOG_BUDGET_BYTES * 4)
    written = b""
    for number, size in enumerate(sizes):
        chunk = (f"{number}:".encode() * size)[:size]
        log.write(chunk)
        written += chunk
    log.close()
    assert on_disk(path) <= log.budget_bytes + MARKER_ALLOWANCE
    assert log.num_dropped == 0  # nothing for want of disk
    text = path.read_bytes()
    assert b"of output dropped" not in text
    rotated = Path(f"{path}.1")
    if log.num_rotations:
        first, _, rest = text.partition(b"\n")
        assert first.startswith(b"=== pollux") and b"replica-0.log.1" in first
        text = rotated.read_bytes() + rest
    # the newest output, in order across the two parts (less what their markers took)
    newest = written[-min(len(written), log.part_bytes // 2 - MARKER_ALLOWANCE):]
    assert text.endswith(newest)


def test_budgets_are_bounded():
    for bad in (0, MIN_LOG_BUDGET_BYTES - 1, 1 << 50, True, 1.5):
        with pytest.raises(ValueError, match="log budget"):
            check_log_budget(bad)  # type: ignore[arg-type]
    assert disk_reserve_bytes(64 << 20) == 8 << 20
    assert disk_reserve_bytes(1 << 40) == 1 << 30


def test_the_wrapper_bounds_a_command_that_floods_its_output(tmp_path):
    log = tmp_path / "replica-0.log"
    status = tmp_path / "replica-0.launch-1.exit"
    flood = "import sys\nfor i in range(200000): sys.stdout.write(f'line {i}\\n')\n"
    done = subprocess.run(wrapped_command(status, [sys.executable, "-c", flood], log=log,
                                          log_budget_bytes=256 << 10), timeout=60)
    assert done.returncode == 0 and read_exit_status(status) == 0
    assert on_disk(log) <= (256 << 10) + MARKER_ALLOWANCE
    assert log.read_text().endswith("line 199999\n")
    assert "reached half its budget" in log.read_text()
    assert os.stat(log).st_mode & 0o077 == 0


def test_a_log_path_that_is_a_link_is_not_followed(tmp_path):
    target = tmp_path / "someone-elses-file"
    target.write_text("keep me\n")
    log = tmp_path / "replica-0.log"
    log.symlink_to(target)
    with pytest.raises(OSError):
        BoundedLog(str(log), MIN_LOG_BUDGET_BYTES)
    assert target.read_text() == "keep me\n"
