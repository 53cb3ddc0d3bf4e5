"""Job states of the scheduler service and the transitions between them."""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    """Lifecycle of a job in the service.

    ``PENDING``: accepted, no replicas running (waiting for an allocation or for the
    resources of its allocation to be freed). ``STARTING``: replicas are being launched.
    ``RUNNING``: every replica is up. ``RESCALING``: replicas were asked to checkpoint and
    stop (SIGTERM) because the allocation changed or the job was cancelled.
    ``SUCCEEDED``/``FAILED``/``CANCELLED`` are final; every ``FAILED`` carries a reason.
    """

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESCALING = "Rescaling"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES

    @property
    def has_replicas(self) -> bool:
        """Whether replicas of the job may be alive in this state."""
        return self in (JobState.STARTING, JobState.RUNNING, JobState.RESCALING)


FINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES: frozenset[JobState] = frozenset(
    {JobState.PENDING, JobState.STARTING, JobState.RUNNING, JobState.RESCALING})

ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.STARTING, JobState.FAILED, JobState.CANCELLED}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.RESCALING, JobState.PENDING,
                                  JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.RESCALING, JobState.PENDING, JobState.SUCCEEDED,
                                 JobState.FAILED, JobState.CANCELLED}),
    JobState.RESCALING: frozenset({JobState.STARTING, JobState.PENDING, JobState.SUCCEEDED,
                                   JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
"""Which state may follow which; the store refuses anything else."""


def can_transition(current: JobState, target: JobState) -> bool:
    return target in ALLOWED_TRANSITIONS[current]
