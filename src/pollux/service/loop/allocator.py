"""The allocation loop: snapshot -> policy -> apply the decision through a backend.

Every ``interval_s`` (and soon after a submission, a completion or a failure) the loop
asks the round (:mod:`pollux.policies.round`) about the active jobs and applies its
allocations: a running job whose allocation changed is asked to checkpoint and stop, to
be relaunched on its new one; launches, replica exits, failures and stops are
:mod:`pollux.service.loop.launches`, driven from this loop's thread. Only this loop
changes job states (the API only adds jobs, stores hints and flags cancellations), so
there are no races between state changes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pollux.backends.base import Backend, rank_order
from pollux.cluster_spec import gpu_types_of
from pollux.policies.autoscaling import Autoscaler, ScalingDecision
from pollux.policies.base import Allocation, NodeInfo, Policy, PolicyDecision
from pollux.policies.round import RoundRequest, SchedulingRound
from pollux.policies.snapshot import Snapshot
from pollux.service.loop.explain import rescale_reason
from pollux.service.loop.launches import LaunchSupervisor, StopCause, SupervisorConfig
from pollux.service.loop.recovery import JobNotices, Recovery
from pollux.service.loop.snapshot import (
    active_records,
    held_allocation,
    hints_problems,
    job_report,
    teams_for_round,
)
from pollux.service.storage.records import JobRecord
from pollux.service.storage.states import ACTIVE_STATES, LIVE_STATES, JobState
from pollux.service.storage.store import JobStore
from pollux.teams import Teams

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AllocatorConfig(SupervisorConfig):
    """The launch supervisor's configuration (data directory, stop grace, hints target,
    relaunch back-off, team accounts) and the loop's own."""

    interval_s: float = 30.0
    """Seconds between scheduling rounds."""
    poll_interval_s: float = 0.5
    """Seconds between polls of the backend for replica exits."""
    gpu_type_speeds: Mapping[str, float] = field(default_factory=dict)
    """Declared relative GPU type speeds; the others are learned from the jobs' hints
    (:func:`pollux.policies.snapshot.learned_type_speeds`)."""
    teams: Teams | None = None
    """The server's teams file: the policy shares the cluster between its teams (each job
    in its record's team); None: between jobs."""


class Allocator:
    """Drives jobs through their states; one instance per server, one thread."""

    def __init__(self, store: JobStore, backend: Backend, policy: Policy,
                 config: AllocatorConfig, clock: Callable[[], float] = time.time,
                 autoscaler: Autoscaler | None = None,
                 on_round: Callable[[float], None] | None = None,
                 monotonic: Callable[[], float] | None = None) -> None:
        self.store = store
        self.backend = backend
        self.config = config
        self.clock = clock
        """Wall-clock time: what records and events are stamped with."""
        self.monotonic = monotonic if monotonic is not None else (
            time.monotonic if clock is time.time else clock)
        """What round intervals, attained service, stop deadlines and back-offs are
        measured on, so that a wall-clock step neither stops rounds nor adds service
        (default: ``time.monotonic`` with the wall clock, else ``clock`` itself)."""
        self.autoscaler = autoscaler
        """Asked every round (idle rounds too) for the cluster's size, which goes to the
        backend's ``request_cluster_size`` before the policy runs; None: no autoscaling."""
        self.on_round = on_round
        """Called after each round's policy call (rounds with jobs) with its wall time in
        seconds, e.g. to record telemetry; an error in it is logged, never fatal."""
        self.num_rounds = 0
        self.last_snapshot: Snapshot | None = None
        self.last_decision: PolicyDecision | None = None
        self.last_scaling: ScalingDecision | None = None
        self.type_speeds: dict[str, float] = dict(config.gpu_type_speeds)
        """GPU type -> relative speed used in the latest round (declared and learned)."""
        self.round = SchedulingRound(policy, autoscaler, guarded=True,
                                     declared_type_speeds=config.gpu_type_speeds)
        """The scheduling round this loop gathers reports for and carries out."""
        self._round_due_at = 0.0
        self._last_tick_at: float | None = None
        """Monotonic time of the previous tick."""
        self._mono = 0.0
        """Monotonic time of the current tick."""
        self._recovery: Recovery | None = None
        """A recovery going on in the background (see :meth:`recover_and_run`)."""
        self._recovery_retry_at = 0.0
        self._notices = JobNotices(store, config.data_dir)
        self.launches = LaunchSupervisor(store, backend, config,
                                         on_ended=self.request_round)
        """Carries out the decisions: launches, replica exits, stops, relaunches."""
        self._wake = threading.Event()

    # --- driving ----------------------------------------------------------------------

    def request_round(self) -> None:
        """Run a scheduling round at the next tick (e.g. after a submission)."""
        self._round_due_at = 0.0
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set; errors in one tick are logged (the same error
        once a minute, with how often it recurred), never fatal."""
        failing: dict[str, tuple[float, int]] = {}
        while not stop.is_set():
            try:
                self.tick()
                failing.clear()
            except Exception as exc:  # keep scheduling whatever one round did
                cause = f"{type(exc).__name__}: {exc}"
                last, repeats = failing.get(cause, (-1e18, 0))
                if time.monotonic() - last >= 60.0:
                    logger.exception("allocation loop tick failed" + (
                        f" ({repeats} more times in the last minute)" if repeats else ""))
                    failing[cause] = (time.monotonic(), 0)
                else:
                    failing[cause] = (last, repeats + 1)
            self._wake.wait(self.config.poll_interval_s)
            self._wake.clear()

    def tick(self, now: float | None = None) -> None:
        """Poll replicas, handle cancellations, run a round when due, launch what fits.
        ``now`` (tests) stands for both the wall-clock and the monotonic time."""
        if self._recovery is not None:  # first: its events are stamped as they happen
            self._advance_recovery(self.monotonic() if now is None else now)
        if now is None:
            now, mono = self.clock(), self.monotonic()
        else:
            mono = now
        self._mono = mono
        self._account_service(now, mono)
        self.launches.poll(now, mono)
        self.launches.cancel_requested(now, mono)
        if mono >= self._round_due_at:
            self._round_due_at = mono + self.config.interval_s
            self.schedule_round(now)
        self.launches.launch_ready(now, mono)
        self.launches.enforce_stop_deadlines(now, mono)

    @property
    def policy(self) -> Policy:
        """The policy the round asks."""
        return self.round.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.round.policy = policy

    @property
    def recovering_jobs(self) -> frozenset[str]:
        """Jobs of a previous server whose replicas :meth:`recover` is still stopping."""
        return self.launches.recovering

    # --- scheduling -------------------------------------------------------------------

    def schedule_round(self, now: float) -> None:
        """One round (:mod:`pollux.policies.round`) on the active jobs, carried out."""
        records = active_records(self.store.list_jobs(ACTIVE_STATES))
        nodes = tuple(self.backend.nodes())
        held = {r.id: held_allocation(r) for r in records}
        reports = tuple(job_report(r, self.round.adaptive_jobs) for r in records)
        request = RoundRequest(now, reports, nodes,
                               {job_id: alloc for job_id, alloc in held.items() if alloc},
                               teams=teams_for_round(self.config.teams, reports))
        reply = self.round.schedule(request, self._resize)
        if len(gpu_types_of(nodes)) > 1:
            self.type_speeds = dict(reply.type_speeds)
        if reply.scaling is not None:
            self.last_scaling = reply.scaling
        if reply.snapshot is None:
            return
        if reply.snapshot.jobs:
            self._report_round(reply.policy_s)
        for event in reply.events:
            self.store.add_event(event.job, now, event.level, event.message)
        self._notices.unusable_models({**hints_problems(records), **reply.unusable_models},
                                      records, now)
        self._notices.fresh_starts(records, now)
        self.num_rounds += 1
        self.last_snapshot, self.last_decision = reply.snapshot, reply.decision
        nodes = reply.snapshot.nodes
        gpu_types = ({n.name: n.gpu_type for n in nodes}
                     if len(gpu_types_of(nodes)) > 1 else None)
        for record in records:
            if record.id in self.recovering_jobs:
                continue  # a previous server's: left alone until recovery settles it
            self._apply(record, reply.decision.allocations.get(record.id, ()), now,
                        len(records) - 1, gpu_types)

    def _report_round(self, round_s: float) -> None:
        if self.on_round is None:
            return
        try:
            self.on_round(round_s)
        except Exception:  # telemetry must never stop scheduling
            logger.exception("cannot report the scheduling round")

    def _resize(self, num_nodes_by_type: Mapping[str, int]) -> tuple[NodeInfo, ...]:
        """Pass the nodes wanted per GPU type to the backend; the nodes there are now."""
        try:
            self.backend.request_nodes_by_type(num_nodes_by_type)
        except Exception:  # a backend that cannot resize must not stop scheduling
            logger.exception("cannot pass the desired cluster size on")
        return tuple(self.backend.nodes())

    def _apply(self, record: JobRecord, new: Allocation, now: float,
               num_other_jobs: int = 0, gpu_types: Mapping[str, str] | None = None) -> None:
        new = rank_order(new)
        if record.state is JobState.PENDING or record.state.is_stopping:
            if record.target_allocation != new:
                self.store.update_job(record.id, now, target_allocation=new)
            return
        if sorted(new) == sorted(record.allocation):
            if record.target_allocation is not None:
                self.store.update_job(record.id, now, target_allocation=None)
            return
        if not record.spec.preemptible:
            logger.info("job %s is not preemptible; keeping its allocation", record.id)
            return
        verb = "preempted" if not new else f"rescale {len(record.allocation)} -> {len(new)}"
        why = rescale_reason(record.hints, record.allocation, new, num_other_jobs,
                             gpu_types)
        self.launches.request_stop(record.id, StopCause.RESCALE, now, self._mono)
        self.store.transition(record.id, JobState.RESCALING, now,
                              f"{verb} replicas: {why}; asked replicas to checkpoint and stop",
                              target_allocation=new, num_rescales=record.num_rescales + 1)

    def _account_service(self, now: float, mono: float) -> None:
        """Replica-seconds since the previous tick for every running job, measured on
        the monotonic clock."""
        last, self._last_tick_at = self._last_tick_at, mono
        if last is None or mono <= last:
            return
        running = [r for r in self.store.list_jobs([JobState.RUNNING])
                   if r.id not in self.recovering_jobs]
        if running:
            self.store.add_service({r.id: len(r.allocation) * (mono - last) for r in running},
                                   now)

    # --- server lifecycle -------------------------------------------------------------

    def recover(self, now: float | None = None) -> None:
        """At startup: stop replicas a previous server left behind, record how each ended
        (the status its launcher wrote, else lost), mark a job whose replicas all exited
        0 as Succeeded -- it finished while the server was down and never runs again --
        and requeue the others (they resume from their checkpoints). Call before the
        first tick; jobs are listed in ``recovering_jobs`` meanwhile. (``now`` is
        unused: each event carries the time it happens.)"""
        recovery = self._begin_recovery()
        recovery.stop_orphans()
        if recovery.error is not None:
            raise recovery.error
        self._finish_recovery(recovery)

    def recover_and_run(self, stop: threading.Event) -> None:
        """:meth:`recover`, then :meth:`run` (the loop thread's whole life, so that the
        API answers while a slow recovery waits for old replicas to stop). With a
        backend that allows it, the old replicas are stopped in the background while
        the loop schedules the other jobs on the nodes they do not hold."""
        try:
            if self.backend.recovers_alongside_launches:
                self._recovery = self._begin_recovery()
                self._recovery.start(self.wake)
            else:
                self.recover()
        except Exception:  # a failed recovery must not leave the service without a loop
            logger.exception("recovery failed; scheduling anyway")
            self.launches.recovery_ended()
            self._recovery = None
        self.run(stop)

    def _begin_recovery(self) -> Recovery:
        recovery = Recovery(self.store, self.backend, self.config.data_dir,
                            self.config.stop_grace_s, self.clock)
        recovery.adopt()
        self.launches.recovery_began(recovery.job_ids)
        return recovery

    def _advance_recovery(self, mono: float) -> None:
        """Settle a background recovery once its orphans are stopped (a failed stop is
        tried again every 10 s; the jobs stay recovering meanwhile)."""
        recovery = self._recovery
        if recovery is None or recovery.running or mono < self._recovery_retry_at:
            return
        if recovery.error is not None:
            logger.error("recovery could not stop a previous server's replicas (%s); "
                         "trying again in 10 s", recovery.error)
            self._recovery_retry_at = mono + 10.0
            recovery.start(self.wake)
            return
        self._finish_recovery(recovery)
        self._recovery = None

    def _finish_recovery(self, recovery: Recovery) -> None:
        recovery.settle()
        self.launches.recovery_ended()
        self.request_round()

    def shutdown(self, grace_s: float) -> None:
        """Ask every live replica to checkpoint and stop, wait up to ``grace_s``, kill the
        rest, and requeue their jobs so a restarted server resumes them."""
        now = self.clock()
        self.launches.stop_all(now, grace_s)
        self.launches.poll(self.clock(), self.monotonic())
        for record in self.store.list_jobs(LIVE_STATES):
            self.store.transition(record.id, JobState.PENDING, now, "server shut down",
                                  target_allocation=record.allocation)
