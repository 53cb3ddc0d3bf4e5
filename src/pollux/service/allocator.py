"""The allocation loop: snapshot -> policy -> apply the decision through a backend.

Every ``interval_s`` (and soon after a submission, a completion or a failure) the loop
builds a snapshot of the active jobs from the store, asks the policy for allocations and
applies them: a running job whose allocation changed is asked to checkpoint and stop
(SIGTERM) and is relaunched on its new allocation once all its replicas have exited with
the rescale code; a pending job is launched once the resources of its allocation are
free. Between rounds the loop polls the backend: a replica that dies otherwise restarts
the job from its last checkpoint, up to ``max_failures`` times, then the job is Failed.

Only this loop changes job states (the API only adds jobs, stores hints and flags
cancellations), so there are no races between state changes.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pollux.backends.base import Backend, LaunchRequest, ReplicaState, ReplicaStatus, rank_order
from pollux.cluster_spec import allocation_gpu_type, gpu_types_of
from pollux.errors import BackendError, MixedGpuTypesError
from pollux.jobenv import CORRUPT_CHECKPOINT_EXIT_CODE, RESCALE_EXIT_CODE
from pollux.policies.autoscaling import Autoscaler, ScalingDecision
from pollux.policies.base import Allocation, JobInfo, Policy, PolicyDecision
from pollux.policies.decision import check_decision
from pollux.policies.snapshot import Snapshot, SpeedupCache, job_infos, without_models
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.service.decisions import fits, subtract
from pollux.service.explain import hints_of, replicas_text, rescale_reason
from pollux.service.recovery import LOST_EXIT_CODE, JobNotices, job_dir, recover_jobs
from pollux.service.snapshot import (
    HintsCache,
    active_records,
    job_reports,
    previous_allocations,
)
from pollux.service.states import ACTIVE_STATES, LIVE_STATES, JobState
from pollux.service.store import JobRecord, JobStore, ReplicaRecord

logger = logging.getLogger(__name__)

class StopCause(Enum):
    """Why the loop asked a job's replicas to stop."""

    RESCALE = "rescale"
    FAILURE = "failure"
    CANCEL = "cancel"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class AllocatorConfig:
    data_dir: Path
    """Checkpoints go to ``<data_dir>/jobs/<id>/checkpoint``, logs to ``.../logs``."""
    interval_s: float = 30.0
    """Seconds between scheduling rounds."""
    poll_interval_s: float = 0.5
    """Seconds between polls of the backend for replica exits."""
    stop_grace_s: float = 60.0
    """Seconds replicas get to checkpoint and exit after SIGTERM before SIGKILL."""
    hints_url: str | None = None
    """Hints endpoint with a ``{job_id}`` placeholder; None: no hints target."""
    relaunch_backoff_s: float = 1.0
    """Wait before relaunching a job after its first failure; doubled after each more."""
    relaunch_backoff_max_s: float = 60.0
    """Longest wait before relaunching a failed job."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "vanished"
    if code == LOST_EXIT_CODE:
        return "was lost with its server"
    if code == CORRUPT_CHECKPOINT_EXIT_CODE:
        return ("found only corrupt checkpoints and did not start over (its log says why; "
                "on_corrupt_checkpoint: fresh starts over)")
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Allocator:
    """Drives jobs through their states; one instance per server, one thread."""

    def __init__(self, store: JobStore, backend: Backend, policy: Policy,
                 config: AllocatorConfig, clock: Callable[[], float] = time.time,
                 autoscaler: Autoscaler | None = None,
                 on_round: Callable[[float], None] | None = None) -> None:
        self.store = store
        self.backend = backend
        self.policy = policy
        self.config = config
        self.clock = clock
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
        self._hints = HintsCache()
        self._speedups = SpeedupCache(guarded=True)
        self._infeasible: dict[str, str] = {}
        self._round_due_at = 0.0
        self._last_tick_at: float | None = None
        self._stop_deadlines: dict[str, float] = {}
        self._stop_causes: dict[str, StopCause] = {}
        self._killed: set[str] = set()
        self._relaunch_not_before: dict[str, float] = {}
        self._notices = JobNotices(store, config.data_dir)
        self.recovering_jobs: frozenset[str] = frozenset()
        """Jobs of a previous server whose replicas :meth:`recover` is still stopping."""
        """Job id -> time before which a failed job is not relaunched (back-off)."""
        self._marked_exits: set[tuple[str, int, int]] = set()
        self._wake = threading.Event()
        self._shutting_down = False

    # --- driving ----------------------------------------------------------------------

    def request_round(self) -> None:
        """Run a scheduling round at the next tick (e.g. after a submission)."""
        self._round_due_at = 0.0
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set; errors in one tick are logged, not fatal."""
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # keep scheduling whatever one round did
                logger.exception("allocation loop tick failed")
            self._wake.wait(self.config.poll_interval_s)
            self._wake.clear()

    def tick(self, now: float | None = None) -> None:
        """Poll replicas, handle cancellations, run a round when due, launch what fits."""
        now = self.clock() if now is None else now
        self._account_service(now)
        self._poll(now)
        self._cancel_requested(now)
        if now >= self._round_due_at:
            self._round_due_at = now + self.config.interval_s
            self.schedule_round(now)
        self._launch_ready(now)
        self._enforce_stop_deadlines(now)

    # --- scheduling -------------------------------------------------------------------

    def schedule_round(self, now: float) -> None:
        """One round, in the simulator's order: the active jobs' records (their reports
        through :mod:`pollux.policies.snapshot`); with an autoscaler, its desired size
        passed to the backend; the policy asked on the nodes there are then; its decision
        checked (infeasible allocations become job events) and applied."""
        records = active_records(self.store.list_jobs(ACTIVE_STATES))
        nodes = tuple(self.backend.nodes())
        jobs = job_infos(job_reports(records, self._hints), now, self._speedups,
                         throughput_speedups=self.autoscaler is not None,
                         gpu_types=tuple(gpu_types_of(nodes)))
        if not jobs and self.autoscaler is None:
            return
        if self.autoscaler is not None:
            self._resize(self.autoscaler, jobs)
            nodes = tuple(self.backend.nodes())
        snapshot = Snapshot(now, jobs, nodes, previous_allocations(records, nodes))
        decision = PolicyDecision(allocations={})
        if jobs:
            started_s = time.perf_counter()
            try:
                decision = self.policy.optimize(list(snapshot.jobs), list(snapshot.nodes),
                                                dict(snapshot.previous_allocations))
            except Exception as exc:  # never a round that fails for all: retry without models
                logger.exception("policy failed; retrying the round without the jobs' models")
                snapshot = Snapshot(now, without_models(jobs), nodes,
                                    snapshot.previous_allocations)
                decision = self.policy.optimize(list(snapshot.jobs), list(snapshot.nodes),
                                                dict(snapshot.previous_allocations))
                for record in records:
                    self.store.add_event(
                        record.id, now, "info",
                        f"scheduling round failed ({type(exc).__name__}: {exc}); this round "
                        "treats every job as one without a model")
            self._report_round(time.perf_counter() - started_s)
        self._notices.unusable_models({**self._hints.problems(), **self._speedups.problems()},
                                      records, now)
        self._notices.fresh_starts(records, now)
        decision = check_decision(decision, snapshot)
        self.num_rounds += 1
        self.last_snapshot, self.last_decision = snapshot, decision
        gpu_types = ({n.name: n.gpu_type for n in nodes}
                     if len(gpu_types_of(nodes)) > 1 else None)
        for record in records:
            self._record_infeasible(record.id, decision.infeasible.get(record.id), now)
            self._apply(record, decision.allocations.get(record.id, ()), now,
                        len(records) - 1, gpu_types)

    def _report_round(self, round_s: float) -> None:
        if self.on_round is None:
            return
        try:
            self.on_round(round_s)
        except Exception:  # telemetry must never stop scheduling
            logger.exception("cannot report the scheduling round")

    def _resize(self, autoscaler: Autoscaler, jobs: Sequence[JobInfo]) -> None:
        """Ask the autoscaler for the cluster's size and pass it to the backend."""
        scaling = autoscaler.decide(jobs, len(self.backend.nodes()))
        self.last_scaling = scaling
        try:
            self.backend.request_cluster_size(scaling.num_nodes)
        except Exception:  # a backend that cannot resize must not stop scheduling
            logger.exception("cannot pass the desired cluster size on")

    def _record_infeasible(self, job_id: str, reason: str | None, now: float) -> None:
        """An event when the policy's allocation of the job cannot be applied (once per
        reason, not every round)."""
        if reason is None:
            self._infeasible.pop(job_id, None)
        elif self._infeasible.get(job_id) != reason:
            self._infeasible[job_id] = reason
            self.store.add_event(job_id, now, "warning",
                                 f"policy {self.policy.name}: allocation infeasible: {reason}")

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
        why = rescale_reason(hints_of(record.hints), record.allocation, new, num_other_jobs,
                             gpu_types)
        self._request_stop(record.id, StopCause.RESCALE, now)
        self.store.transition(record.id, JobState.RESCALING, now,
                              f"{verb} replicas: {why}; asked replicas to checkpoint and stop",
                              target_allocation=new, num_rescales=record.num_rescales + 1)

    def _launch_ready(self, now: float) -> None:
        records = self.store.list_jobs(ACTIVE_STATES)
        infos = {n.name: n for n in self.backend.nodes()}
        nodes = {name: dict(n.resources) for name, n in infos.items()}
        free = subtract(nodes, [(r.allocation, r.spec) for r in records
                                if r.state.has_replicas])
        for record in records:
            target = record.target_allocation
            if (record.state is not JobState.PENDING or not target
                    or record.cancel_requested
                    or now < self._relaunch_not_before.get(record.id, now)):
                continue
            if any(node not in nodes for node in target):
                self.store.update_job(record.id, now, target_allocation=None)
                continue
            try:
                gpu_type = allocation_gpu_type(target, infos)
            except MixedGpuTypesError as exc:  # e.g. nodes whose types changed since
                self.store.update_job(record.id, now, target_allocation=None,
                                      event=f"not launched: {exc}")
                continue
            if fits(free, target, record.spec):
                free = subtract(free, [(target, record.spec)])
                self._launch(record, target, now,
                             None if gpu_type == DEFAULT_GPU_TYPE else gpu_type)

    def _launch(self, record: JobRecord, target: Allocation, now: float,
                gpu_type: str | None = None) -> None:
        generation = record.num_launches + 1
        allocation = rank_order(target)
        where = ", ".join(f"{node} x{allocation.count(node)}" for node in dict.fromkeys(allocation))
        record = self.store.transition(
            record.id, JobState.STARTING, now,
            f"launch {generation}: {replicas_text(len(allocation))} on {where}"
            + ("" if gpu_type is None else f" (GPU type {gpu_type})"),
            allocation=allocation, target_allocation=None, num_launches=generation,
            started_at=record.started_at or now, reason=record.reason, gpu_type=gpu_type)
        directory = job_dir(self.config.data_dir, record.id)
        request = LaunchRequest(
            job_id=record.id, generation=generation, spec=record.spec, allocation=allocation,
            checkpoint_dir=str(directory / "checkpoint"), log_dir=str(directory / "logs"),
            hints_target=(None if self.config.hints_url is None
                          else self.config.hints_url.format(job_id=record.id)),
            hints_token=record.hints_token, gpu_type=gpu_type)
        (directory / "checkpoint").mkdir(parents=True, exist_ok=True)
        (directory / "logs").mkdir(parents=True, exist_ok=True)
        try:
            launched = self.backend.launch(request)
        except BackendError as exc:
            self._failed_launch(record, f"launch failed: {exc}", now)
            return
        for replica in launched:
            self.store.add_replica(ReplicaRecord(record.id, generation, replica.rank,
                                                 replica.node, replica.handle, now, None, None))

    # --- replica exits ----------------------------------------------------------------

    def _poll(self, now: float) -> None:
        for record in self.store.list_jobs(LIVE_STATES):
            statuses = self.backend.poll(record.id)
            exits: dict[int, int | None] = {}
            for status in statuses:
                if status.state is ReplicaState.EXITED:
                    exits[status.rank] = status.exit_code
                    key = (record.id, record.num_launches, status.rank)
                    if key not in self._marked_exits and status.exit_code is not None:
                        self._marked_exits.add(key)
                        self.store.mark_replica_exited(record.id, record.num_launches,
                                                       status.rank, status.exit_code, now)
            if not statuses:
                self._launch_ended(record, {0: None}, now)
            elif len(exits) == len(statuses):
                self._launch_ended(record, exits, now)
            elif not record.state.is_stopping:
                self._check_running(record, statuses, exits, now)

    def _check_running(self, record: JobRecord, statuses: list[ReplicaStatus],
                       exits: Mapping[int, int | None], now: float) -> None:
        abnormal = {rank: code for rank, code in exits.items() if code != 0}
        if abnormal:
            rank, code = min(abnormal.items())
            self._request_stop(record.id, StopCause.FAILURE, now)
            self.store.transition(record.id, JobState.FAILING, now,
                                  f"replica {rank} {describe_exit(code)}; stopping the others "
                                  "to restart from the last checkpoint",
                                  reason=f"replica {rank} {describe_exit(code)}")
        elif (record.state is JobState.STARTING
              and all(s.state is not ReplicaState.STARTING for s in statuses)):
            self.store.transition(record.id, JobState.RUNNING, now,
                                  "all replicas running" if len(statuses) > 1
                                  else "the replica is running")

    def _launch_ended(self, record: JobRecord, exits: Mapping[int, int | None],
                      now: float) -> None:
        """Every replica of the latest launch has exited: decide what comes next."""
        self.backend.release(record.id)
        self._marked_exits = {key for key in self._marked_exits if key[0] != record.id}
        self._stop_deadlines.pop(record.id, None)
        cause = self._stop_causes.pop(record.id, None)
        forced = record.id in self._killed
        self._killed.discard(record.id)
        self.request_round()
        codes = list(exits.values())
        if codes and all(code == 0 for code in codes):
            self.store.transition(record.id, JobState.SUCCEEDED, now,
                                  f"all {len(codes)} replicas exited 0" if len(codes) > 1
                                  else "the replica exited 0")
            return
        if record.cancel_requested:
            self.store.transition(record.id, JobState.CANCELLED, now, "cancelled")
            return
        tolerated = {0, RESCALE_EXIT_CODE}
        if cause in (StopCause.RESCALE, StopCause.SHUTDOWN) and not forced:
            # killed by our SIGTERM before the agent could take it (e.g. while starting):
            # not a fault of the job; it resumes from its last checkpoint
            tolerated.add(-int(signal.SIGTERM))
        failures = {rank: code for rank, code in exits.items() if code not in tolerated}
        if failures:
            rank, code = min(failures.items())
            corrupt = [r for r, c in failures.items() if c == CORRUPT_CHECKPOINT_EXIT_CODE]
            if corrupt:  # relaunching would find the same checkpoints: fail now
                rank, code = min(corrupt), CORRUPT_CHECKPOINT_EXIT_CODE
            self._failed_launch(record, f"replica {rank} {describe_exit(code)}" if corrupt
                                else record.reason or f"replica {rank} {describe_exit(code)}",
                                now, fatal=bool(corrupt))
            return
        unclean = sorted(rank for rank, code in exits.items() if code not in (0, RESCALE_EXIT_CODE))
        message = ("replicas checkpointed and stopped" if not unclean else
                   f"replicas stopped ({len(unclean)} starting up or finishing, before the "
                   "agent could take the signal; the job resumes from its last checkpoint)")
        target = record.target_allocation
        self.store.transition(record.id, JobState.PENDING, now,
                              ("server shutting down: " if self._shutting_down else "")
                              + message,
                              target_allocation=record.allocation if target is None else target)

    def _failed_launch(self, record: JobRecord, reason: str, now: float,
                       fatal: bool = False) -> None:
        """A launch failed: relaunch after a back-off (doubling per failure), or fail the
        job past ``max_failures`` or at once when ``fatal`` (a relaunch cannot help)."""
        failures = record.num_failures + 1
        limit = record.spec.max_failures
        if fatal or failures > limit:
            self._relaunch_not_before.pop(record.id, None)
            self.store.transition(record.id, JobState.FAILED, now,
                                  f"failure {failures}: {reason}",
                                  reason=reason if fatal else f"{reason} (failure {failures}, "
                                                              f"more than max_failures={limit})",
                                  num_failures=failures)
            return
        delay_s = min(self.config.relaunch_backoff_max_s,
                      self.config.relaunch_backoff_s * 2 ** (failures - 1))
        self._relaunch_not_before[record.id] = now + delay_s
        target = record.target_allocation
        self.store.transition(
            record.id, JobState.PENDING, now,
            f"failure {failures} of {limit} tolerated ({reason}); restarting "
            + ("from the last checkpoint" if self._has_checkpoint(record.id)
               else "from the start (no checkpoint yet)") + f" in {delay_s:g} s",
            reason=reason, num_failures=failures,
            target_allocation=record.allocation if target is None else target)

    def _has_checkpoint(self, job_id: str) -> bool:
        """Whether the job wrote anything in its checkpoint directory."""
        directory = job_dir(self.config.data_dir, job_id) / "checkpoint"
        try:
            return any(directory.iterdir())
        except OSError:
            return False

    def _cancel_requested(self, now: float) -> None:
        for record in self.store.list_jobs(ACTIVE_STATES):
            if not record.cancel_requested:
                continue
            if record.state is JobState.PENDING:
                self.store.transition(record.id, JobState.CANCELLED, now, "cancelled")
                self.request_round()
            elif record.state in (JobState.STARTING, JobState.RUNNING):
                self._request_stop(record.id, StopCause.CANCEL, now)
                self.store.transition(record.id, JobState.CANCELLING, now,
                                      "cancelling: asked replicas to checkpoint and stop")
            elif record.state in (JobState.RESCALING, JobState.FAILING):
                # already stopping: the launch ends as Cancelled
                self.store.transition(record.id, JobState.CANCELLING, now,
                                      "cancelling: replicas are already stopping")

    def _request_stop(self, job_id: str, cause: StopCause, now: float) -> None:
        """Ask the replicas to checkpoint and stop; SIGKILL them after the grace."""
        self.backend.stop(job_id)
        self._stop_causes[job_id] = cause
        self._stop_deadlines[job_id] = now + self.config.stop_grace_s

    def _enforce_stop_deadlines(self, now: float) -> None:
        for job_id, deadline in list(self._stop_deadlines.items()):
            if now >= deadline and job_id not in self._killed:
                self._killed.add(job_id)
                self.backend.stop(job_id, force=True)
                self.store.add_event(job_id, now, "info",
                                     f"replicas did not stop within {self.config.stop_grace_s}"
                                     " s of SIGTERM; killed")

    def _account_service(self, now: float) -> None:
        last, self._last_tick_at = self._last_tick_at, now
        if last is None or now <= last:
            return
        running = self.store.list_jobs([JobState.RUNNING])
        if running:
            self.store.add_service({r.id: len(r.allocation) * (now - last) for r in running},
                                   now)

    # --- server lifecycle -------------------------------------------------------------

    def recover(self, now: float) -> None:
        """At startup: stop replicas a previous server left behind, record how each ended
        (the status its launcher wrote, else lost), mark a job whose replicas all exited
        0 as Succeeded -- it finished while the server was down and never runs again --
        and requeue the others (they resume from their checkpoints). Call before the
        first tick; jobs are listed in ``recovering_jobs`` meanwhile."""
        jobs = self.store.list_jobs(LIVE_STATES)
        self.recovering_jobs = frozenset(r.id for r in jobs)
        recover_jobs(self.store, self.backend, jobs, self.config.data_dir,
                     self.config.stop_grace_s, now)
        self.recovering_jobs = frozenset()
        self.request_round()

    def recover_and_run(self, stop: threading.Event) -> None:
        """:meth:`recover`, then :meth:`run` (the loop thread's whole life, so that the
        API answers while a slow recovery waits for old replicas to stop)."""
        try:
            self.recover(self.clock())
        except Exception:  # a failed recovery must not leave the service without a loop
            logger.exception("recovery failed; scheduling anyway")
            self.recovering_jobs = frozenset()
        self.run(stop)

    def shutdown(self, grace_s: float) -> None:
        """Ask every live replica to checkpoint and stop, wait up to ``grace_s``, kill the
        rest, and requeue their jobs so a restarted server resumes them."""
        now = self.clock()
        self._shutting_down = True
        live = self.store.list_jobs(LIVE_STATES)
        for record in live:
            self._request_stop(record.id, StopCause.SHUTDOWN, now)
        deadline = time.monotonic() + grace_s
        pending = {r.id for r in live}
        while pending and time.monotonic() < deadline:
            pending = {job_id for job_id in pending
                       if any(s.state is not ReplicaState.EXITED
                              for s in self.backend.poll(job_id))}
            if pending:
                time.sleep(0.1)
        for job_id in pending:
            self._killed.add(job_id)
            self.backend.stop(job_id, force=True)
        self._poll(self.clock())
        for record in self.store.list_jobs(LIVE_STATES):
            self.store.transition(record.id, JobState.PENDING, now, "server shut down",
                                  target_allocation=record.allocation)
