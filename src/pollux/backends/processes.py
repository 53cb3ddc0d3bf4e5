"""Process helpers for the local backend (Linux /proc where available)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name, or None."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (tells a reused pid apart)."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19])


def is_alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    fields = _stat_fields(pid)
    if fields is not None:
        return fields[0] != "Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not PROC.is_dir()


def marked_processes(env_name: str, value: str) -> list[int]:
    """Live processes of this user whose environment has ``env_name=value``."""
    if not PROC.is_dir():
        return []
    marker = f"{env_name}={value}".encode()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and is_alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to a process group; a group that is gone is fine."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (from /proc)."""
    if not PROC.is_dir():
        return []
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and len(fields) > 2 and fields[0] != "Z" \
                    and fields[2] == str(pgid):
                found.append(int(entry.name))
    return sorted(found)


def kill_group_but(pgid: int, spared: int, rounds: int = 5) -> int:
    """SIGKILL every process of group ``pgid`` except ``spared`` (a replica's wrapper,
    left to end what escaped the group and record the status); how many."""
    return _kill_rounds(lambda: [p for p in group_members(pgid) if p != spared], rounds)


def kill_marked(env_name: str, value: str, rounds: int = 5, spared: int | None = None
                ) -> int:
    """SIGKILL every live process of this user whose environment has ``env_name=value``
    (those that left their process group: ``setsid``, daemons) but ``spared``, again
    while new ones appear (a fork meanwhile); how many were killed. An empty ``value``
    matches none."""
    if not value:
        return 0
    return _kill_rounds(lambda: [p for p in marked_processes(env_name, value)
                                 if p != spared], rounds)


def _kill_rounds(find: Callable[[], list[int]], rounds: int) -> int:
    num_killed = 0
    for _ in range(rounds):
        found = find()
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                num_killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return num_killed
