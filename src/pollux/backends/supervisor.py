"""A replica's command run as the child of its wrapper, with its whole process tree.

The wrapper (:mod:`pollux.backends.exit_status`, :mod:`pollux.backends.slurm.step_wrapper`)
starts the command through :class:`Supervised`, which

- makes the wrapper a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a
  process the command leaves behind, even one that left its process group and session
  with ``setsid`` and was orphaned, becomes the wrapper's child instead of init's, so
  it can still be found and ended;
- copies the command's output (stdout and stderr, one pipe) into the replica's
  :class:`~pollux.backends.replica_log.BoundedLog`;
- when the command ends (by itself, or stopped through the signals the wrapper passes
  on), ends every process still below the wrapper (SIGKILL) before the exit status is
  recorded: a replica is over only when nothing of it runs, so its GPU slot shown free
  is free.

Where there is no subreaper (not Linux) the server ends the process group instead.
Standard library only: the wrappers run it by path.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
READ_BYTES = 1 << 16
POLL_S = 0.1
DRAIN_S = 2.0
"""How long output is still read after the tree has been ended (what the pipe holds)."""
KILL_ROUNDS = 50
PROC = Path("/proc")


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where it
    cannot be."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Live processes below ``root`` (from /proc's parent links), deepest last."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir(PROC) if e.isdigit()]
    except OSError:
        return []
    for name in entries:
        try:
            text = (PROC / name / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


class Supervised:
    """``command`` as this process's child, its output into ``log`` (a BoundedLog, or
    None: inherited), its process tree ended with it."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str] | None = None,
                 log: Any = None) -> None:
        self.command = list(command)
        self.env = None if env is None else dict(env)
        self.log = log
        self.subreaper = become_subreaper()
        self.exit_code: int | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the command (raises OSError when it cannot be)."""
        out = subprocess.PIPE if self.log is not None else None
        self._process = subprocess.Popen(self.command, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT if out else None)

    @property
    def started(self) -> bool:
        return self._process is not None

    def send_signal(self, signum: int) -> None:
        """Pass ``signum`` to the command while it runs (safe in a signal handler)."""
        if self._process is not None and self.exit_code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signum)

    def _reap(self) -> None:
        """Collect every ended child (the command, and orphans reparented here)."""
        assert self._process is not None
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == self._process.pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self._process.returncode = self.exit_code
        if self.exit_code is None and self._process.returncode is not None:
            self.exit_code = self._process.returncode  # reaped by Popen itself

    def _pump(self, timeout_s: float) -> bool:
        """Copy what the pipe holds into the log, waiting up to ``timeout_s``; False at
        its end (every writer gone)."""
        assert self._process is not None and self._process.stdout is not None
        pipe = self._process.stdout.fileno()
        ready, _, _ = select.select([pipe], [], [], timeout_s)
        if not ready:
            return True
        data = os.read(pipe, READ_BYTES)
        if not data:
            return False
        self.log.write(data)
        return True

    def end_tree(self) -> int:
        """SIGKILL every process still below this one; how many were found (without a
        subreaper: none, the server ends the process group once the wrapper exits)."""
        assert self._process is not None
        if not self.subreaper:
            return 0  # the server ends the process group once the wrapper has exited
        num_found = 0
        for _ in range(KILL_ROUNDS):
            left = descendants(os.getpid())
            if not left:
                break
            num_found += len(left)
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
            self._reap()
        return num_found

    def wait(self) -> int:
        """Until the command ends (copying its output); then end what it left behind,
        read the rest of its output, and return its exit status (-N: signal N)."""
        assert self._process is not None
        reading = self.log is not None
        while self.exit_code is None:
            if reading:
                reading = self._pump(POLL_S)
            else:
                time.sleep(POLL_S / 2)
            self._reap()
        num_left = self.end_tree()
        if reading:
            deadline = time.monotonic() + DRAIN_S
            while reading and time.monotonic() < deadline:
                reading = self._pump(max(0.0, deadline - time.monotonic()))
        if self._process.stdout is not None:
            self._process.stdout.close()
        if num_left and self.log is not None:
            self.log.say(f"=== pollux: the command ended; {num_left} processes it left "
                         "behind were killed ===")
        self._reap()
        return self.exit_code
