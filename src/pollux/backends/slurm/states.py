"""Every Slurm job state, in one table: what it means for the replicas of a launch.

``squeue --json`` names a job's state (``job_state``: ``RUNNING``, ``NODE_FAIL``, ...).
Each state is one :class:`Phase`:

- ``WAITING``: not started yet (the replicas are STARTING);
- ``RUNNING``: the replicas run (or are paused by Slurm: still theirs);
- ``ENDING``: the job is ending; a replica is EXITED once its own exit status is
  recorded, RUNNING until then;
- ``ENDED``: over; each replica's exit status is the one its wrapper recorded, or, when
  the replica left none (killed by Slurm), the state's :attr:`SlurmState.lost_code`;
- ``REQUEUED``: Slurm requeued (or is requeueing) the job: its run is over, and the
  backend cancels it so that it never runs a launch twice.

A state the table does not know is an error (:class:`UnknownSlurmState`), never a guess.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from pollux.errors import BackendError


class Phase(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    ENDING = "ending"
    ENDED = "ended"
    REQUEUED = "requeued"


KILLED = -int(signal.SIGKILL)
"""Exit status of a replica Slurm killed without it recording its own."""
FAILED = 1


@dataclass(frozen=True)
class SlurmState:
    phase: Phase
    lost_code: int | None
    """Exit status of a replica that recorded none (ENDED/REQUEUED states)."""
    meaning: str


_TABLE = {
    "PENDING": SlurmState(Phase.WAITING, None, "waiting for resources"),
    "CONFIGURING": SlurmState(Phase.WAITING, None, "nodes being readied"),
    "POWER_UP_NODE": SlurmState(Phase.WAITING, None, "nodes powering up"),
    "RUNNING": SlurmState(Phase.RUNNING, None, "running"),
    "SUSPENDED": SlurmState(Phase.RUNNING, None, "suspended by Slurm"),
    "STOPPED": SlurmState(Phase.RUNNING, None, "stopped by SIGSTOP"),
    "SIGNALING": SlurmState(Phase.RUNNING, None, "being signalled"),
    "RESIZING": SlurmState(Phase.RUNNING, None, "being resized"),
    "COMPLETING": SlurmState(Phase.ENDING, KILLED, "completing"),
    "STAGE_OUT": SlurmState(Phase.ENDING, KILLED, "staging out"),
    "UPDATE_DB": SlurmState(Phase.ENDING, KILLED, "being recorded"),
    "COMPLETED": SlurmState(Phase.ENDED, FAILED, "completed"),
    "FAILED": SlurmState(Phase.ENDED, FAILED, "failed"),
    "CANCELLED": SlurmState(Phase.ENDED, KILLED, "cancelled"),
    "TIMEOUT": SlurmState(Phase.ENDED, KILLED, "reached its time limit"),
    "DEADLINE": SlurmState(Phase.ENDED, KILLED, "reached its deadline"),
    "NODE_FAIL": SlurmState(Phase.ENDED, KILLED, "lost a node"),
    "PREEMPTED": SlurmState(Phase.ENDED, KILLED, "preempted"),
    "BOOT_FAIL": SlurmState(Phase.ENDED, FAILED, "nodes failed to boot"),
    "OUT_OF_MEMORY": SlurmState(Phase.ENDED, KILLED, "ran out of memory"),
    "REVOKED": SlurmState(Phase.ENDED, KILLED, "revoked (federation)"),
    "SPECIAL_EXIT": SlurmState(Phase.REQUEUED, KILLED, "held after a special exit"),
    "REQUEUED": SlurmState(Phase.REQUEUED, KILLED, "requeued"),
    "REQUEUE_FED": SlurmState(Phase.REQUEUED, KILLED, "requeued (federation)"),
    "REQUEUE_HOLD": SlurmState(Phase.REQUEUED, KILLED, "requeued and held"),
    "RESV_DEL_HOLD": SlurmState(Phase.REQUEUED, KILLED, "held: reservation deleted"),
}
JOB_STATES = MappingProxyType(_TABLE)
"""Slurm job state name -> :class:`SlurmState`. Read-only."""


class UnknownSlurmState(BackendError):
    """A job state this backend does not know (a newer Slurm?)."""


def job_state(name: object) -> SlurmState:
    """The table's entry for ``name`` (``squeue --json``'s ``job_state``, a string or,
    in newer Slurm, a list whose first entry is the base state and the rest flags)."""
    names = [str(n) for n in name] if isinstance(name, list) else [str(name)]
    for key in names:  # a flag such as COMPLETING or REQUEUED outranks the base state
        if key in _TABLE and _TABLE[key].phase in (Phase.REQUEUED, Phase.ENDING):
            return _TABLE[key]
    if names and names[0] in _TABLE:
        return _TABLE[names[0]]
    raise UnknownSlurmState(f"Slurm job state {name!r} is unknown to the slurm backend")


def replica_exit_code(state: SlurmState, recorded: int | None) -> int:
    """The exit status of a replica of an ENDED/REQUEUED job: its own record, or the
    state's ``lost_code`` (never 0 without the replica's own record)."""
    if recorded is not None:
        return recorded
    return KILLED if state.lost_code is None else state.lost_code
