"""One launch's Slurm work and what it says about each replica.

A replica's status comes from the best evidence there is: the exit status its wrapper
recorded (:mod:`pollux.backends.exit_status`) first; then, in cluster mode, the Slurm
job's state (:mod:`pollux.backends.slurm.states`); in allocation mode, the replica's
``srun`` process. When Slurm cannot be asked, a replica without a recorded status is
UNKNOWN: never EXITED without evidence.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pollux.backends.base import ReplicaState, ReplicaStatus
from pollux.backends.exit_status import read_exit_status
from pollux.backends.slurm.states import Phase, SlurmState, job_state, replica_exit_code

CLUSTER = "cluster"
ALLOCATION = "allocation"
VANISHED = job_state("CANCELLED")
"""How a job Slurm no longer lists ended: killed (unless its replicas said otherwise)."""


@dataclass
class SlurmReplica:
    rank: int
    node: str
    step: str
    """The step's name (``pollux-<instance>-<job>-g<generation>-r<rank>``)."""
    status_path: Path
    process: subprocess.Popen[bytes] | None = None
    """Allocation mode: the replica's ``srun``."""
    exit_code: int | None = None

    def recorded(self) -> int | None:
        if self.exit_code is None:
            self.exit_code = read_exit_status(self.status_path)
        return self.exit_code


@dataclass
class SlurmLaunch:
    job_id: str
    generation: int
    name: str
    mode: str
    slurm_job_id: str
    replicas: list[SlurmReplica]
    submitted_at: float = 0.0
    """``time.monotonic()`` of the submission."""
    withdrawn: bool = False
    """Cancelled by the backend because it waited too long for its resources."""
    pending_signal: str | None = None
    """A stop that Slurm could not be told yet (``TERM`` or ``KILL``): sent again."""
    cancelled_requeue: bool = False
    adopted: bool = False
    """Taken over from a previous server process (allocation mode: watched through the
    allocation's steps, having no ``srun`` of this process)."""
    last_phase: Phase | None = None
    state_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return all(r.exit_code is not None for r in self.replicas)

    def handle(self, replica: SlurmReplica, instance_id: str) -> dict[str, Any]:
        return {"backend": "slurm", "instance": instance_id, "mode": self.mode,
                "slurm_job_id": self.slurm_job_id, "slurm_job_name": self.name,
                "slurm_step": replica.step, "generation": self.generation,
                "status_file": str(replica.status_path)}

    # --- statuses ---------------------------------------------------------------------

    def unknown(self) -> list[ReplicaStatus]:
        """Slurm could not be asked: what the replicas recorded, UNKNOWN otherwise."""
        statuses = []
        for replica in self.replicas:
            code = replica.recorded()
            statuses.append(ReplicaStatus(replica.rank, ReplicaState.UNKNOWN) if code is None
                            else ReplicaStatus(replica.rank, ReplicaState.EXITED, code))
        return statuses

    def from_job(self, entry: Mapping[str, Any] | None) -> list[ReplicaStatus]:
        """Cluster mode: the statuses ``squeue``'s ``entry`` for the job gives (None: Slurm
        no longer lists the job)."""
        state: SlurmState = VANISHED if entry is None else job_state(entry.get("job_state"))
        self.state_name = "gone" if entry is None else str(entry.get("job_state"))
        phase = state.phase
        if (entry is not None and phase is Phase.WAITING
                and int(entry.get("restart_cnt") or 0) > 0):
            phase = Phase.REQUEUED  # requeued and waiting to run again: it will not
        self.last_phase = phase
        statuses = []
        for replica in self.replicas:
            code = replica.recorded()
            if code is not None:
                statuses.append(ReplicaStatus(replica.rank, ReplicaState.EXITED, code))
            elif phase is Phase.WAITING:
                statuses.append(ReplicaStatus(replica.rank, ReplicaState.STARTING))
            elif phase in (Phase.RUNNING, Phase.ENDING):
                statuses.append(ReplicaStatus(replica.rank, ReplicaState.RUNNING))
            else:  # ENDED or REQUEUED: the replica is gone and left no status
                replica.exit_code = replica_exit_code(state, None)
                statuses.append(ReplicaStatus(replica.rank, ReplicaState.EXITED,
                                              replica.exit_code))
        return statuses

    def from_steps(self, steps: Mapping[str, str]) -> list[ReplicaStatus]:
        """Allocation mode, a launch adopted from a previous server (no ``srun`` of this
        process to wait for): the statuses the allocation's live ``steps`` (name -> id)
        give. A replica whose step is gone without a recorded status was killed."""
        statuses = []
        for replica in self.replicas:
            code = replica.recorded()
            if code is None and replica.step not in steps:
                code = replica.exit_code = replica_exit_code(VANISHED, None)
            statuses.append(ReplicaStatus(replica.rank, ReplicaState.RUNNING) if code is None
                            else ReplicaStatus(replica.rank, ReplicaState.EXITED, code))
        return statuses

    def from_processes(self) -> list[ReplicaStatus]:
        """Allocation mode: each replica's ``srun`` process (and recorded status)."""
        statuses = []
        for replica in self.replicas:
            code = replica.exit_code
            if code is None and replica.process is not None:
                returned = replica.process.poll()
                if returned is not None:
                    recorded = read_exit_status(replica.status_path)
                    code = replica.exit_code = returned if recorded is None else recorded
            elif code is None:
                code = replica.recorded()
            statuses.append(ReplicaStatus(replica.rank, ReplicaState.RUNNING) if code is None
                            else ReplicaStatus(replica.rank, ReplicaState.EXITED, code))
        return statuses
