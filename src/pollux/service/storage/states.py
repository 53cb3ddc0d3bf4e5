"""Job states of the scheduler service and the transitions between them."""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    """Lifecycle of a job in the service.

    ``PENDING``: accepted, no replicas running (waiting for an allocation or for the
    resources of its allocation to be freed). ``STARTING``: replicas are being launched.
    ``RUNNING``: every replica is up. The three *stopping* states: replicas were asked to
    checkpoint and stop (SIGTERM) because the allocation changed (``RESCALING``), the job
    was cancelled (``CANCELLING``), or a replica failed and the others are stopped before
    the job restarts from its checkpoint or fails (``FAILING``).
    ``SUCCEEDED``/``FAILED``/``CANCELLED`` are final; every ``FAILED`` carries a reason.
    """

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESCALING = "Rescaling"
    CANCELLING = "Cancelling"
    FAILING = "Failing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES

    @property
    def has_replicas(self) -> bool:
        """Whether replicas of the job may be alive in this state."""
        return self in (JobState.STARTING, JobState.RUNNING) or self.is_stopping

    @property
    def is_stopping(self) -> bool:
        """Whether the replicas were asked to stop and the service waits for them."""
        return self in STOPPING_STATES


STOPPING_STATES: frozenset[JobState] = frozenset(
    {JobState.RESCALING, JobState.CANCELLING, JobState.FAILING})
LIVE_STATES: frozenset[JobState] = frozenset({JobState.STARTING, JobState.RUNNING}
                                             | STOPPING_STATES)
"""States in which replicas may be alive."""
FINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES: frozenset[JobState] = frozenset({JobState.PENDING} | LIVE_STATES)

ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.STARTING, JobState.FAILED, JobState.CANCELLED}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.PENDING, JobState.SUCCEEDED,
                                  JobState.FAILED, JobState.CANCELLED} | STOPPING_STATES),
    JobState.RUNNING: frozenset({JobState.PENDING, JobState.SUCCEEDED, JobState.FAILED,
                                 JobState.CANCELLED} | STOPPING_STATES),
    JobState.RESCALING: frozenset({JobState.STARTING, JobState.PENDING, JobState.SUCCEEDED,
                                   JobState.FAILED, JobState.CANCELLED, JobState.CANCELLING}),
    JobState.CANCELLING: frozenset({JobState.PENDING, JobState.SUCCEEDED, JobState.FAILED,
                                    JobState.CANCELLED}),
    JobState.FAILING: frozenset({JobState.PENDING, JobState.SUCCEEDED, JobState.FAILED,
                                 JobState.CANCELLED, JobState.CANCELLING}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
"""Which state may follow which; the store refuses anything else."""


def can_transition(current: JobState, target: JobState) -> bool:
    return target in ALLOWED_TRANSITIONS[current]
