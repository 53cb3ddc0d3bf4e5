"""Slurm's answers about the backend's live work, shared by the polls of one round.

One ``squeue`` (cluster mode: the launches' Slurm jobs; allocation mode: the
allocation's steps) serves every job's poll for :data:`POLL_CACHE_S`. Once Slurm was
found unreachable, polls are answered "unreachable" for :data:`UNREACHABLE_QUIET_S`
without asking again: a Slurm client takes seconds to give up on a controller that is
down, and the allocation loop must not wait that long once per job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from pollux.backends.slurm.commands import SlurmCommands, SlurmUnavailable

POLL_CACHE_S = 0.5
"""How long one ``squeue`` answer serves the polls of all jobs."""
UNREACHABLE_QUIET_S = 2.0
"""After Slurm was found unreachable, how long polls report it without asking again."""

T = TypeVar("T")


class SlurmWatch:
    """Cached reads of live work (see the module)."""

    def __init__(self, commands: SlurmCommands) -> None:
        self.commands = commands
        self._jobs: tuple[float, frozenset[str], dict[str, dict[str, Any]]] | None = None
        self._steps: tuple[float, dict[str, str]] | None = None
        self._quiet_until = 0.0

    def forget(self) -> None:
        """Ask Slurm afresh at the next read (after the backend changed its work)."""
        self._jobs = self._steps = None

    def _read(self, read: Callable[[], T]) -> T:
        if time.monotonic() < self._quiet_until:
            raise SlurmUnavailable("Slurm was unreachable moments ago")
        try:
            return read()
        except SlurmUnavailable:
            self._quiet_until = time.monotonic() + UNREACHABLE_QUIET_S
            raise

    def jobs(self, ids: frozenset[str]) -> dict[str, dict[str, Any]]:
        """Slurm's entries of the jobs ``ids`` by job id (absent: Slurm no longer lists
        it)."""
        now = time.monotonic()
        cache = self._jobs
        if cache is not None and now - cache[0] < POLL_CACHE_S and ids <= cache[1]:
            return cache[2]  # fresh, and asked about every live launch (new ones too)
        entries = self._read(lambda: {str(j.get("job_id")): j
                                      for j in self.commands.jobs(sorted(ids))}
                             if ids else {})
        self._jobs = (now, ids, entries)
        return entries

    def steps(self, allocation: str) -> dict[str, str]:
        """The allocation's live steps, name -> step id."""
        now = time.monotonic()
        if self._steps is not None and now - self._steps[0] < POLL_CACHE_S:
            return self._steps[1]
        steps = self._read(lambda: self.commands.steps(allocation))
        self._steps = (now, steps)
        return steps
