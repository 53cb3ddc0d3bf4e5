"""A replica's log with a budget: the newest output kept, the rest rotated away, and
never the last of the disk.

The replica's wrapper (:mod:`pollux.backends.exit_status`, and the Slurm step's
:mod:`pollux.backends.slurm.step_wrapper`) reads the command's output from a pipe and
writes it here, so one job cannot fill the disk of the job store:

- **budget**: ``replica-<r>.log`` holds at most half the budget; when a write would go
  beyond, it becomes ``replica-<r>.log.1`` (the previous ``.1`` is dropped) and a new
  ``replica-<r>.log`` starts with a marker line saying so. Both together stay within the
  budget (``--log-budget`` of ``pollux server``, :data:`DEFAULT_LOG_BUDGET_BYTES`).
- **reserve**: output is dropped (counted, and said in a marker line once there is room
  again) while writing it would leave less than :func:`disk_reserve_bytes` free on the
  log's filesystem: that room stays for the job store, so cancels, submits and state
  changes still work when logs have filled the rest.

Standard library only: the wrappers run it by path (``python -I``), importing nothing
else of Pollux.
"""

from __future__ import annotations

import errno
import os
import time

DEFAULT_LOG_BUDGET_BYTES = 64 << 20
"""Default budget of each replica's log (its two parts together)."""
MIN_LOG_BUDGET_BYTES = 64 << 10
MAX_LOG_BUDGET_BYTES = 1 << 40
MIN_RESERVE_BYTES = 8 << 20
MAX_RESERVE_BYTES = 1 << 30
RESERVE_FRACTION = 0.05
"""The disk reserve: 5% of the log's filesystem, at least 8 MiB, at most 1 GiB."""
DROP_PAUSE_S = 0.05
"""Pause after output dropped for want of disk: a command flooding a full disk then
waits on its pipe (at most 64 KiB per pause) instead of taking a core, and so does
its wrapper."""
ROTATED_SUFFIX = ".1"
OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def check_log_budget(budget_bytes: int) -> None:
    """Raise ValueError naming the bounds when ``budget_bytes`` is outside them."""
    if (isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int)
            or not MIN_LOG_BUDGET_BYTES <= budget_bytes <= MAX_LOG_BUDGET_BYTES):
        raise ValueError(f"log budget {budget_bytes!r}: give {MIN_LOG_BUDGET_BYTES} to "
                         f"{MAX_LOG_BUDGET_BYTES} bytes (64KiB to 1TiB)")


def disk_reserve_bytes(total_bytes: int) -> int:
    """Bytes of a filesystem of ``total_bytes`` that replica logs never use."""
    return int(min(MAX_RESERVE_BYTES, max(MIN_RESERVE_BYTES, total_bytes * RESERVE_FRACTION)))


def _size(value: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


class BoundedLog:
    """Appends to ``path`` within ``budget_bytes`` (rotating) and above the reserve."""

    def __init__(self, path: str, budget_bytes: int) -> None:
        check_log_budget(budget_bytes)
        self.path = path
        self.budget_bytes = budget_bytes
        self.part_bytes = budget_bytes // 2
        """Most bytes of each of the two parts."""
        self.num_dropped = 0
        """Bytes dropped since the last marker because the reserve was reached, or a
        write failed (a full disk)."""
        self.num_rotations = 0
        self._fd = os.open(path, OPEN_FLAGS, 0o600)
        self._size = os.fstat(self._fd).st_size
        info = os.fstatvfs(self._fd)
        self.reserve_bytes = disk_reserve_bytes(info.f_blocks * info.f_frsize)

    def _free_bytes(self) -> int:
        try:
            info = os.fstatvfs(self._fd)
        except OSError:
            return 0
        return int(info.f_bavail * info.f_frsize)

    def _rotate(self) -> None:
        """``path`` -> ``path.1`` (replacing it); a new ``path`` starts with a marker."""
        os.replace(self.path, self.path + ROTATED_SUFFIX)
        old, self._fd = self._fd, os.open(self.path, OPEN_FLAGS | os.O_TRUNC, 0o600)
        os.close(old)
        self._size = 0
        self.num_rotations += 1
        name = os.path.basename(self.path)
        self._append(f"=== pollux {_stamp()}: this log reached half its budget of "
                     f"{_size(self.budget_bytes)}; the output before is in {name}"
                     f"{ROTATED_SUFFIX}, older output was dropped ===\n".encode())

    def _append(self, data: bytes) -> bool:
        if self._free_bytes() - len(data) < self.reserve_bytes:
            return False
        try:
            written = os.write(self._fd, data)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
                raise
            return False
        self._size += written
        return written == len(data)

    def _say_dropped(self) -> None:
        if self.num_dropped and self._append(
                f"\n=== pollux {_stamp()}: {_size(self.num_dropped)} of output dropped: the "
                f"disk had less than {_size(self.reserve_bytes)} free, kept for the job "
                "store ===\n".encode()):
            self.num_dropped = 0

    def write(self, data: bytes) -> None:
        """Append ``data`` (its newest quarter of the budget when longer: a new part
        then starts), rotating first when the part would outgrow its half of the budget;
        dropped when over the reserve."""
        longest = self.part_bytes // 2
        cut = len(data) > longest
        if cut:  # its older bytes go the way of older output: a new part says so
            data = data[-longest:]
        if cut or self._size + len(data) > self.part_bytes:
            try:
                self._rotate()
            except OSError:
                self.num_dropped += len(data)
                return
        self._say_dropped()
        if not self._append(data):
            self.num_dropped += len(data)
            time.sleep(DROP_PAUSE_S)  # the command waits on its pipe instead of spinning

    def say(self, message: str) -> None:
        """A line of the wrapper's own (best effort)."""
        self.write(f"{message}\n".encode())

    def close(self) -> None:
        self._say_dropped()
        os.close(self._fd)
