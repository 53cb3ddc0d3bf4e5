"""What a restarted server does about its predecessor's jobs, and the job events the
allocation loop adds about a job's own state (unusable hints, fresh starts).

At startup (:class:`Recovery`): a running job whose replicas the backend can watch again
(Slurm's work outlives the server) is adopted as it runs. The other replicas a previous
server left behind are asked to checkpoint and stop (killed after the grace), each
replica's exit status is taken from the file its launcher wrote
(:mod:`pollux.backends.exit_status`; "lost" when there is none), a job whose replicas of
its latest launch all exited 0 is recorded as Succeeded -- it finished while the server
was down and never runs again -- and every other job is requeued to resume from its
last checkpoint.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pollux.backends.base import Backend, LiveReplica
from pollux.backends.exit_status import exit_status_path, read_exit_status
from pollux.data_dir import checkpoint_dir, log_dir
from pollux.jobenv import CORRUPT_SUFFIX
from pollux.service.storage.records import JobRecord
from pollux.service.storage.replica_rows import INTENT_KEY
from pollux.service.storage.states import LIVE_STATES, JobState
from pollux.service.storage.store import JobStore

logger = logging.getLogger(__name__)

LOST_EXIT_CODE = -1000
"""Recorded for replicas that outlived their server and left no exit status."""


class Recovery:
    """Settling the jobs a previous server had replicas of (as the module says): first
    their replicas are stopped (:meth:`stop_orphans`, which waits up to the stop grace:
    run it in the background with :meth:`start` where the backend allows it, so that
    scheduling goes on meanwhile), then the jobs are settled in the store
    (:meth:`settle`, from the allocation loop). Events carry the time they happen."""

    def __init__(self, store: JobStore, backend: Backend, data_dir: Path, grace_s: float,
                 clock: Callable[[], float]) -> None:
        self.store = store
        self.backend = backend
        self.data_dir = data_dir
        self.grace_s = grace_s
        self.clock = clock
        self.jobs = store.list_jobs(LIVE_STATES)
        self.job_ids = frozenset(r.id for r in self.jobs)
        self.live = store.replicas(live_only=True)
        self.stopped: list[str] | None = None
        """What :meth:`stop_orphans` stopped, once it has returned."""
        self.error: Exception | None = None
        self._thread: threading.Thread | None = None

    def adopt(self) -> set[str]:
        """Offer the backend the launches it may take over: jobs Starting or Running, not
        being cancelled, whose latest launch's replicas are all live; the jobs it adopts
        keep running (an event says so) and leave this recovery. A launch whose intents
        were never confirmed (the server died while starting it) is never offered: its
        replicas are found by the backend's own marks (names, environment) and stopped,
        and its exit statuses settle it. Call before
        :meth:`stop_orphans`; returns the adopted job ids."""
        live: dict[str, list[LiveReplica]] = {}
        for r in self.live:
            live.setdefault(r.job_id, []).append(
                LiveReplica(r.job_id, r.generation, r.rank, r.node, r.handle))
        offered = [replica for job in self.jobs
                   if job.state in (JobState.STARTING, JobState.RUNNING)
                   and not job.cancel_requested and job.id in live
                   and all(r.generation == job.num_launches and not r.handle.get(INTENT_KEY)
                           for r in live[job.id])
                   and len(live[job.id]) == len(self.store.replicas(
                       job.id, generation=job.num_launches))
                   for replica in live[job.id]]
        if not offered:
            return set()
        try:
            adopted = self.backend.adopt(offered) & {r.job_id for r in offered}
        except Exception as exc:  # noqa: BLE001 - then they are stopped and resumed
            logger.warning("the backend could not adopt the previous server's launches "
                           "(%s); they are stopped and resumed from their checkpoints", exc)
            return set()
        for job in self.jobs:
            if job.id in adopted:
                self.store.add_event(job.id, self.clock(), "info",
                                     f"server restarted: launch {job.num_launches} adopted; "
                                     f"its replicas kept running under {self.backend.name}")
        self.jobs = [job for job in self.jobs if job.id not in adopted]
        self.job_ids = frozenset(job.id for job in self.jobs)
        self.live = [r for r in self.live if r.job_id not in adopted]
        return adopted

    def stop_orphans(self) -> None:
        self.error = None
        try:
            self.stopped = self.backend.recover([r.handle for r in self.live], self.grace_s)
        except Exception as exc:  # noqa: BLE001 - kept for the loop to report and retry
            self.error = exc
            return
        if self.stopped:
            logger.warning("stopped %d replicas left by a previous server: %s",
                           len(self.stopped), ", ".join(self.stopped))

    def start(self, on_done: Callable[[], None]) -> None:
        """:meth:`stop_orphans` in a thread of its own; ``on_done`` when it returns."""
        def work() -> None:
            try:
                self.stop_orphans()
            finally:
                on_done()
        self._thread = threading.Thread(target=work, name="pollux-recovery", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def settle(self) -> None:
        """Record how each replica ended and each job's next state (after the orphans
        were stopped); safe to run again after a store error (what is done stays)."""
        for replica in self.live:
            recorded = read_exit_status(exit_status_path(
                log_dir(self.data_dir, replica.job_id), replica.generation,
                replica.rank))
            self.store.mark_replica_exited(
                replica.job_id, replica.generation, replica.rank,
                LOST_EXIT_CODE if recorded is None else recorded, self.clock())
        for job in self.jobs:
            record = self.store.get_job(job.id)
            if record.state not in LIVE_STATES:
                continue  # settled by an earlier try
            codes = [r.exit_code for r in self.store.replicas(
                record.id, generation=record.num_launches)]
            if codes and all(code == 0 for code in codes):
                self.store.transition(record.id, JobState.SUCCEEDED, self.clock(),
                                      f"all {len(codes)} replicas exited 0 while the server "
                                      "was down (as their launcher recorded)")
                continue
            target = record.target_allocation
            self.store.transition(
                record.id, JobState.PENDING, self.clock(),
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
            directory = checkpoint_dir(self.data_dir, record.id)
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
