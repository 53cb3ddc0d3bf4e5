"""What a restarted server does about its predecessor's jobs, and the job events the
allocation loop adds about a job's own state (unusable hints, fresh starts).

At startup (:func:`recover_jobs`): the replicas a previous server left behind are asked
to checkpoint and stop (killed after the grace), each replica's exit status is taken
from the file its launcher wrote (:mod:`pollux.backends.exit_status`; "lost" when there
is none), a job whose replicas of its latest launch all exited 0 is recorded as
Succeeded -- it finished while the server was down and never runs again -- and every
other job is requeued to resume from its last checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from pollux.backends.base import Backend
from pollux.backends.exit_status import exit_status_path, read_exit_status
from pollux.jobenv import CORRUPT_SUFFIX
from pollux.service.records import JobRecord
from pollux.service.states import JobState
from pollux.service.store import JobStore

logger = logging.getLogger(__name__)

LOST_EXIT_CODE = -1000
"""Recorded for replicas that outlived their server and left no exit status."""


def job_dir(data_dir: Path, job_id: str) -> Path:
    return data_dir / "jobs" / job_id


def recover_jobs(store: JobStore, backend: Backend, jobs: Sequence[JobRecord],
                 data_dir: Path, grace_s: float, now: float) -> None:
    """Settle ``jobs`` (those a previous server had replicas of), as the module says."""
    live = store.replicas(live_only=True)
    stopped = backend.recover([r.handle for r in live], grace_s)
    if stopped:
        logger.warning("stopped %d replicas left by a previous server: %s",
                       len(stopped), ", ".join(stopped))
    for replica in live:
        recorded = read_exit_status(exit_status_path(
            job_dir(data_dir, replica.job_id) / "logs", replica.generation, replica.rank))
        store.mark_replica_exited(replica.job_id, replica.generation, replica.rank,
                                  LOST_EXIT_CODE if recorded is None else recorded, now)
    for record in jobs:
        codes = [r.exit_code for r in store.replicas(record.id,
                                                     generation=record.num_launches)]
        if codes and all(code == 0 for code in codes):
            store.transition(record.id, JobState.SUCCEEDED, now,
                             f"all {len(codes)} replicas exited 0 while the server was "
                             "down (as their launcher recorded)")
            continue
        target = record.target_allocation
        store.transition(
            record.id, JobState.PENDING, now,
            f"server restarted: launch {record.num_launches} stopped; resuming from the "
            "last checkpoint", reason=record.reason,
            target_allocation=record.allocation if target is None else target)


class JobNotices:
    """Events about what a job did to itself, each added once."""

    def __init__(self, store: JobStore, data_dir: Path) -> None:
        self.store = store
        self.data_dir = data_dir
        self._models: set[tuple[str, float | None]] = set()
        self._corrupt: dict[str, set[str]] = {}

    def unusable_models(self, problems: Mapping[str, str], records: Sequence[JobRecord],
                        now: float) -> None:
        """Per hints update, each job whose hints' model is not used, and why."""
        updated_at = {r.id: r.hints_updated_at for r in records}
        for job_id, problem in problems.items():
            key = (job_id, updated_at.get(job_id))
            if job_id in updated_at and key not in self._models:
                self._models.add(key)
                self.store.add_event(job_id, now, "info",
                                     f"hints not used: {problem}; scheduled as a job "
                                     "without a model (perfect scaling) until new hints")

    def fresh_starts(self, records: Sequence[JobRecord], now: float) -> None:
        """Each checkpoint an agent set aside as corrupt before starting over
        (``on_corrupt_checkpoint: fresh``)."""
        for record in records:
            if not record.state.has_replicas:
                continue
            directory = job_dir(self.data_dir, record.id) / "checkpoint"
            found = sorted(p.name for p in directory.glob(f"*{CORRUPT_SUFFIX}"))
            if not found:
                continue
            if record.id not in self._corrupt:  # after a restart: what events already say
                self._corrupt[record.id] = {name for e in self.store.events(record.id)
                                            for name in found if name in e.message}
            new = [name for name in found if name not in self._corrupt[record.id]]
            if new:
                self._corrupt[record.id].update(new)
                self.store.add_event(record.id, now, "checkpoint",
                                     "every checkpoint was corrupt; the job started over "
                                     "from scratch (on_corrupt_checkpoint: fresh); set "
                                     f"aside: {', '.join(new)}")
