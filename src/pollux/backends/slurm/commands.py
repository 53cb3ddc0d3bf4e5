"""Slurm's standard commands, run as subprocesses: ``sbatch``, ``srun``, ``scancel``,
``squeue --json``, ``sinfo --json`` and ``scontrol``.

Every command runs with an allow list of the server's environment
(:func:`~pollux.backends.slurm.script.client_environment`: ``PATH``, ``HOME``, the
locale, ``SLURM_CONF``...), so ``SLURM_CONF`` is honoured as by any Slurm tool while no
``SBATCH_*``, ``SALLOC_*``, ``SRUN_*`` or ``SQUEUE_*`` variable changes what a command
does. A command that fails
because the controller cannot be reached (or times out) is retried a few times with a
short back-off; when it still fails, :class:`SlurmUnavailable` says so, and the backend
reports "no evidence now" instead of guessing. A command Slurm refuses (bad option,
unknown job) raises :class:`SlurmCommandError` at once.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pollux.backends.slurm.script import client_environment
from pollux.errors import SlurmCommandError, SlurmUnavailable

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_RETRIES = 1
RETRY_DELAY_S = 0.5
UNREACHABLE_PATTERNS = (
    "unable to contact slurm controller", "connection refused", "socket timed out",
    "connect failure", "zero bytes were transmitted", "slurm_persist_conn",
    "communication connection failure", "unable to establish", "timed out",
    "slurm temporarily unable", "resource temporarily unavailable",
)
"""Error text (lower case) that means "the controller is not reachable now"."""
SLURM_JOB_ID_RE = re.compile(r"^(\d+)")
HOSTFILE_ENV = "SLURM_HOSTFILE"
"""The one option variable a launch's ``sbatch`` is given (its task layout)."""


def _hostfile(env: Mapping[str, str]) -> dict[str, str]:
    return {HOSTFILE_ENV: env[HOSTFILE_ENV]} if HOSTFILE_ENV in env else {}


@dataclass(frozen=True)
class SlurmCommands:
    """How to run Slurm's commands (the same for every call)."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    retries: int = DEFAULT_RETRIES
    env: Mapping[str, str] | None = None
    """Environment the commands' allow list is taken from; None: the server's."""

    def run(self, args: Sequence[str], *, stdin: str | None = None,
            env: Mapping[str, str] | None = None, retries: int | None = None) -> str:
        """``args``'s standard output; retried while the controller is unreachable.
        ``env``: the whole environment, as given; default: :attr:`env`'s allow list."""
        attempts = 1 + (self.retries if retries is None else retries)
        last = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(RETRY_DELAY_S * attempt)
            try:
                done = subprocess.run(
                    list(args), input=stdin, capture_output=True, text=True,
                    timeout=self.timeout_s, check=False,
                    env=dict(env) if env is not None else client_environment(self.env))
            except subprocess.TimeoutExpired:
                last = f"{args[0]} timed out after {self.timeout_s:.0f} s"
                continue
            except OSError as exc:
                raise SlurmUnavailable(f"cannot run {args[0]}: {exc}") from exc
            if done.returncode == 0:
                return done.stdout
            last = (done.stderr or done.stdout).strip()
            if not any(p in last.lower() for p in UNREACHABLE_PATTERNS):
                raise SlurmCommandError(f"{' '.join(args[:2])} failed: {last}")
        raise SlurmUnavailable(f"{args[0]}: Slurm is unreachable ({last})")

    def json(self, args: Sequence[str]) -> dict[str, Any]:
        out = self.run(args)
        try:
            data = json.loads(out)
        except ValueError as exc:
            raise SlurmUnavailable(f"{args[0]} --json printed no JSON: {out[:200]!r}") from exc
        if not isinstance(data, dict):
            raise SlurmUnavailable(f"{args[0]} --json printed {type(data).__name__}")
        errors = [e for e in data.get("errors") or [] if e]
        if errors:
            raise SlurmUnavailable(f"{args[0]} reported errors: {errors}")
        return data

    # --- reading ----------------------------------------------------------------------

    def jobs(self, job_ids: Sequence[str] = ()) -> list[dict[str, Any]]:
        """``squeue --json``'s jobs (all, or those of ``job_ids``), finished ones included
        while Slurm keeps them (``MinJobAge``)."""
        args = ["squeue", "--json", "--states=all"]
        if job_ids:
            args.append(f"--jobs={','.join(job_ids)}")
        try:
            jobs = self.json(args).get("jobs")
        except SlurmCommandError as exc:
            if job_ids and "invalid job id" in str(exc).lower():
                return []  # every one of them is gone
            raise
        wanted = set(job_ids)  # 22.05's --json answers with every job, whatever the filter
        return [j for j in jobs or [] if isinstance(j, dict)
                and (not wanted or str(j.get("job_id")) in wanted)]

    def nodes(self) -> list[dict[str, Any]]:
        """``sinfo --json``'s nodes."""
        nodes = self.json(["sinfo", "--json"]).get("nodes")
        return [n for n in nodes or [] if isinstance(n, dict)]

    def steps(self, job_id: str) -> dict[str, str]:
        """Step name -> step id (``JOB.STEP``) of a running job."""
        out = self.run(["squeue", "--steps", "--noheader", "--format=%i|%j",
                        f"--jobs={job_id}"])
        steps = {}
        for line in out.splitlines():
            step_id, _, name = line.strip().partition("|")
            if step_id and name:
                steps[name] = step_id
        return steps

    # --- acting -----------------------------------------------------------------------

    def sbatch(self, script: str, env: Mapping[str, str], options: Sequence[str] = ()) -> str:
        """Submit ``script`` with ``options`` (on the command line, one argument each)
        and the client environment ``env`` (its allow list applies, plus
        ``SLURM_HOSTFILE``); returns the Slurm job id. Never retried: a submission that
        timed out may have been accepted (the backend then finds it by name)."""
        out = self.run(["sbatch", "--parsable", *options], stdin=script,
                       env={**client_environment(env), **_hostfile(env)}, retries=0)
        match = SLURM_JOB_ID_RE.match(out.strip())
        if match is None:
            raise SlurmCommandError(f"sbatch printed no job id: {out.strip()!r}")
        return match.group(1)

    def signal(self, target: str, signal_name: str, full: bool = False) -> None:
        """``scancel --signal`` to the steps of ``target`` (a job or ``JOB.STEP``); with
        ``full`` to the batch shell too."""
        args = ["scancel", f"--signal={signal_name}"]
        if full:
            args.append("--full")
        self._scancel([*args, target])

    def cancel(self, target: str) -> None:
        """End a job (or step): SIGTERM, SIGKILL after Slurm's ``KillWait``."""
        self._scancel(["scancel", target])

    def _scancel(self, args: list[str]) -> None:
        try:
            self.run(args)
        except SlurmCommandError as exc:
            text = str(exc).lower()
            if "already completing or completed" in text or "invalid job id" in text:
                return  # nothing left to signal
            raise
