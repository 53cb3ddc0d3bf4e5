"""Launching jobs' replicas and handling how each launch ends.

The allocation loop (:mod:`pollux.service.loop.allocator`) decides allocations; this module
carries them out through the backend: a pending job with a target is launched once its
resources are free (never across GPU types), replica exits are polled and recorded, a
replica that fails stops the others and the job restarts from its last checkpoint after a
back-off (up to ``max_failures``), replicas asked to stop get ``stop_grace_s`` to
checkpoint before SIGKILL, and cancellations are carried out.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from pollux.backends.base import Backend, LaunchRequest, ReplicaState, ReplicaStatus, rank_order
from pollux.capacity import fits, subtract
from pollux.cluster_spec import allocation_gpu_type
from pollux.data_dir import checkpoint_dir, job_dir, log_dir
from pollux.errors import BackendError, MixedGpuTypesError, StoreError
from pollux.jobenv import CORRUPT_CHECKPOINT_EXIT_CODE, RESCALE_EXIT_CODE
from pollux.policies.base import Allocation
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.service.loop.explain import describe_exit, replicas_text
from pollux.service.storage.records import JobRecord, ReplicaRecord
from pollux.service.storage.states import ACTIVE_STATES, LIVE_STATES, JobState
from pollux.service.storage.store import JobStore

logger = logging.getLogger(__name__)


class StopCause(Enum):
    """Why the loop asked a job's replicas to stop."""

    RESCALE = "rescale"
    FAILURE = "failure"
    CANCEL = "cancel"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class SupervisorConfig:
    """What carrying out launches needs (the loop's configuration extends it)."""

    data_dir: Path
    """Checkpoints go to ``<data_dir>/jobs/<id>/checkpoint``, logs to ``.../logs``."""
    stop_grace_s: float = 60.0
    """Seconds replicas get to checkpoint and exit after SIGTERM before SIGKILL."""
    hints_url: str | None = None
    """Hints endpoint with a ``{job_id}`` placeholder; None: no hints target."""
    relaunch_backoff_s: float = 1.0
    """Wait before relaunching a job after its first failure; doubled after each more."""
    relaunch_backoff_max_s: float = 60.0
    """Longest wait before relaunching a failed job."""
    team_accounts: Mapping[str, str] = field(default_factory=dict)
    """The account each team's launches are charged to; a team not named: the backend's
    default."""


class LaunchSupervisor:
    """Launches, polls, stops and relaunches the jobs' replicas; owned by the allocator
    and driven from its thread (``on_ended`` is called when a launch ends, so that the
    allocator schedules a round soon). Each operation is told the time: ``now`` (the wall
    clock, which stamps records) and ``mono`` (the loop's monotonic time, which stop
    deadlines and relaunch back-offs are measured on)."""

    def __init__(self, store: JobStore, backend: Backend, config: SupervisorConfig,
                 on_ended: Callable[[], None]) -> None:
        self.store = store
        self.backend = backend
        self.config = config
        self.on_ended = on_ended
        self.shutting_down = False
        self._stop_deadlines: dict[str, float] = {}
        self._stop_causes: dict[str, StopCause] = {}
        self._killed: set[str] = set()
        self._relaunch_not_before: dict[str, float] = {}
        """Job id -> time before which a failed job is not relaunched (back-off)."""
        self._marked_exits: set[tuple[str, int, int]] = set()
        self._unknown: dict[str, str] = {}
        """Job id -> the kind of evidence the backend lacks for it now (one event each)."""
        self._recovering: frozenset[str] = frozenset()
        self._mono = 0.0
        """The monotonic time the latest operation was told."""

    @property
    def recovering(self) -> frozenset[str]:
        """Jobs of a previous server whose recovery is under way: left alone here."""
        return self._recovering

    def recovery_began(self, job_ids: frozenset[str]) -> None:
        """Leave ``job_ids`` alone until :meth:`recovery_ended`."""
        self._recovering = frozenset(job_ids)

    def recovery_ended(self) -> None:
        self._recovering = frozenset()

    def launch_ready(self, now: float, mono: float) -> None:
        """Launch each pending job whose target allocation's resources are free (after
        its relaunch back-off; a target spanning GPU types is dropped with an event)."""
        self._mono = mono
        records = self.store.list_jobs(ACTIVE_STATES)
        infos = {n.name: n for n in self.backend.nodes()}
        nodes = {name: dict(n.resources) for name, n in infos.items()}
        free = subtract(nodes, [(r.allocation, r.spec.resources.as_policy_resources())
                                for r in records if r.state.has_replicas])
        for record in records:
            target = record.target_allocation
            if (record.state is not JobState.PENDING or not target
                    or record.cancel_requested
                    or mono < self._relaunch_not_before.get(record.id, mono)):
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
            per_replica = record.spec.resources.as_policy_resources()
            if fits(free, target, per_replica):
                free = subtract(free, [(target, per_replica)])
                self._launch(record, target, now,
                             None if gpu_type == DEFAULT_GPU_TYPE else gpu_type)

    def _launch(self, record: JobRecord, target: Allocation, now: float,
                gpu_type: str | None = None) -> None:
        directory = job_dir(self.config.data_dir, record.id)
        checkpoints = checkpoint_dir(self.config.data_dir, record.id)
        logs = log_dir(self.config.data_dir, record.id)
        try:
            checkpoints.mkdir(parents=True, exist_ok=True)
            logs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. a full disk: the job stays pending, tried again
            logger.warning("job %s not launched: cannot create %s: %s", record.id,
                           directory, exc)
            return
        generation = record.num_launches + 1
        allocation = rank_order(target)
        where = ", ".join(f"{node} x{allocation.count(node)}" for node in dict.fromkeys(allocation))
        # intent before effect: every replica is in the store before any process starts
        record = self.store.begin_launch(
            record.id, generation, allocation,
            {"backend": self.backend.name, "job_dir": str(directory)}, now,
            f"launch {generation}: {replicas_text(len(allocation))} on {where}"
            + ("" if gpu_type is None else f" (GPU type {gpu_type})"),
            target_allocation=None, started_at=record.started_at or now,
            reason=record.reason, gpu_type=gpu_type)
        request = LaunchRequest(
            job_id=record.id, generation=generation, spec=record.spec, allocation=allocation,
            checkpoint_dir=str(checkpoints), log_dir=str(logs),
            hints_target=(None if self.config.hints_url is None
                          else self.config.hints_url.format(job_id=record.id)),
            hints_token=record.hints_token, gpu_type=gpu_type,
            account=self.config.team_accounts.get(record.team or ""))
        try:
            launched = self.backend.launch(request)
        except Exception as exc:  # noqa: BLE001 - whatever it was, nothing was started
            if not isinstance(exc, BackendError):
                logger.exception("job %s: the backend's launch raised", record.id)
            try:  # best effort: an intent left behind is settled as lost at a restart
                self.store.abandon_launch(record.id, generation)
            except StoreError as store_exc:
                logger.warning("job %s: cannot forget the intents of launch %d: %s",
                               record.id, generation, store_exc)
            self._failed_launch(record, f"launch failed: {exc}", now)
            return
        self.store.confirm_launch(record.id, generation, [
            ReplicaRecord(record.id, generation, replica.rank, replica.node, replica.handle,
                          now, None, None) for replica in launched])

    # --- replica exits ----------------------------------------------------------------

    def poll(self, now: float, mono: float) -> None:
        """Record replica exits; a launch whose replicas all exited ends (see
        :meth:`_launch_ended`), a failed replica stops the others. Only the backend's
        evidence ends a launch: a replica it reports UNKNOWN, a poll that raises
        BackendError and a launch the backend knows nothing of leave the job as it is
        (polled again next time), never failed or relaunched."""
        self._mono = mono
        for record in self.store.list_jobs(LIVE_STATES):
            if record.id in self.recovering:
                continue
            statuses = self._statuses(record, now)
            if statuses is None:
                continue
            exits: dict[int, int | None] = {}
            for status in statuses:
                if status.state is ReplicaState.EXITED:
                    exits[status.rank] = status.exit_code
                    self._record_exit(record, status, now)
            if len(exits) == len(statuses):
                self._launch_ended(record, exits, now)
            elif not record.state.is_stopping:
                self._check_running(record, statuses, exits, now)

    def _statuses(self, record: JobRecord, now: float) -> list[ReplicaStatus] | None:
        """The replicas' statuses by the backend's evidence, or None when it has none for
        the job now. A launch the backend knows nothing of (``poll`` returns []) is
        judged from the exits already recorded in the store, if every replica has one."""
        try:
            statuses = self.backend.poll(record.id)
        except BackendError as exc:
            self._no_evidence(record, "error", f"the backend cannot tell now ({exc})", now)
            return None
        if not statuses:
            recorded = self.store.replicas(record.id, generation=record.num_launches)
            if recorded and all(r.exit_code is not None for r in recorded):
                return [ReplicaStatus(r.rank, ReplicaState.EXITED, r.exit_code)
                        for r in recorded]
            self._no_evidence(record, "forgotten", "the backend has no record of its "
                                                   "replicas", now)
            return None
        unknown = [s.rank for s in statuses if s.state is ReplicaState.UNKNOWN]
        if unknown:
            self._no_evidence(record, "unknown", "the backend has no evidence now of "
                              + ("replica " if len(unknown) == 1 else "replicas ")
                              + ", ".join(map(str, unknown)), now)
        elif self._unknown.pop(record.id, None) is not None:
            logger.info("job %s: the backend has evidence of its replicas again", record.id)
        return statuses

    def _no_evidence(self, record: JobRecord, kind: str, what: str, now: float) -> None:
        """Once per job and kind of missing evidence: an event and a warning."""
        if self._unknown.get(record.id) == kind:
            return
        message = (f"launch {record.num_launches}: {what}; the job is neither failed nor "
                   "relaunched until the backend knows how its replicas are")
        self.store.add_event(record.id, now, "warning", message)
        self._unknown[record.id] = kind
        logger.warning("job %s: %s", record.id, message)

    def _record_exit(self, record: JobRecord, status: ReplicaStatus, now: float) -> None:
        key = (record.id, record.num_launches, status.rank)
        if key not in self._marked_exits and status.exit_code is not None:
            self.store.mark_replica_exited(record.id, record.num_launches, status.rank,
                                           status.exit_code, now)
            self._marked_exits.add(key)  # only once the store has it

    def _check_running(self, record: JobRecord, statuses: list[ReplicaStatus],
                       exits: Mapping[int, int | None], now: float) -> None:
        abnormal = {rank: code for rank, code in exits.items() if code != 0}
        if abnormal:
            rank, code = min(abnormal.items())
            self.request_stop(record.id, StopCause.FAILURE, now, self._mono)
            self.store.transition(record.id, JobState.FAILING, now,
                                  f"replica {rank} {describe_exit(code)}; stopping the others "
                                  "to restart from the last checkpoint",
                                  reason=f"replica {rank} {describe_exit(code)}")
        elif (record.state is JobState.STARTING
              and all(s.state in (ReplicaState.RUNNING, ReplicaState.EXITED)
                      for s in statuses)):
            self.store.transition(record.id, JobState.RUNNING, now,
                                  "all replicas running" if len(statuses) > 1
                                  else "the replica is running")

    def _launch_ended(self, record: JobRecord, exits: Mapping[int, int | None],
                      now: float) -> None:
        """Every replica of the latest launch has exited: record what comes next, then
        forget the launch. A store write that fails leaves everything as it was (the
        backend keeps the launch), so the next poll decides again from the same
        evidence."""
        self._settle(record, exits, self._stop_causes.get(record.id),
                     record.id in self._killed, now)
        self.backend.release(record.id)
        self._marked_exits = {key for key in self._marked_exits if key[0] != record.id}
        self._stop_deadlines.pop(record.id, None)
        self._stop_causes.pop(record.id, None)
        self._killed.discard(record.id)
        self._unknown.pop(record.id, None)
        self.on_ended()

    def _settle(self, record: JobRecord, exits: Mapping[int, int | None],
                cause: StopCause | None, forced: bool, now: float) -> None:
        """The job's next state after its launch ended (store writes only)."""
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
                              ("server shutting down: " if self.shutting_down else "")
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
        target = record.target_allocation
        self.store.transition(
            record.id, JobState.PENDING, now,
            f"failure {failures} of {limit} tolerated ({reason}); restarting "
            + ("from the last checkpoint" if self._has_checkpoint(record.id)
               else "from the start (no checkpoint yet)") + f" in {delay_s:g} s",
            reason=reason, num_failures=failures,
            target_allocation=record.allocation if target is None else target)
        self._relaunch_not_before[record.id] = self._mono + delay_s

    def _has_checkpoint(self, job_id: str) -> bool:
        """Whether the job wrote anything in its checkpoint directory."""
        directory = checkpoint_dir(self.config.data_dir, job_id)
        try:
            return any(directory.iterdir())
        except OSError:
            return False

    def cancel_requested(self, now: float, mono: float) -> None:
        """Carry out the cancellations the API flagged."""
        self._mono = mono
        for record in self.store.list_jobs(ACTIVE_STATES):
            if not record.cancel_requested or record.id in self.recovering:
                continue
            if record.state is JobState.PENDING:
                self.store.transition(record.id, JobState.CANCELLED, now, "cancelled")
                self.on_ended()
            elif record.state in (JobState.STARTING, JobState.RUNNING):
                self.request_stop(record.id, StopCause.CANCEL, now, mono)
                self.store.transition(record.id, JobState.CANCELLING, now,
                                      "cancelling: asked replicas to checkpoint and stop")
            elif record.state in (JobState.RESCALING, JobState.FAILING):
                # already stopping: the launch ends as Cancelled
                self.store.transition(record.id, JobState.CANCELLING, now,
                                      "cancelling: replicas are already stopping")

    def request_stop(self, job_id: str, cause: StopCause, now: float, mono: float) -> None:
        """Ask the replicas to checkpoint and stop; SIGKILL them after the grace."""
        self._mono = mono
        self.backend.stop(job_id)
        self._stop_causes[job_id] = cause
        self._stop_deadlines[job_id] = mono + self.config.stop_grace_s

    def enforce_stop_deadlines(self, now: float, mono: float) -> None:
        self._mono = mono
        for job_id, deadline in list(self._stop_deadlines.items()):
            if mono >= deadline and job_id not in self._killed:
                self._killed.add(job_id)
                self.backend.stop(job_id, force=True)
                self.store.add_event(job_id, now, "info",
                                     f"replicas did not stop within {self.config.stop_grace_s}"
                                     " s of SIGTERM; killed")

    def stop_all(self, now: float, grace_s: float) -> None:
        """Ask every live replica to checkpoint and stop, wait up to ``grace_s`` and kill
        the rest (the caller then polls, which records how each launch ended)."""
        self.shutting_down = True
        live = self.store.list_jobs(LIVE_STATES)
        for record in live:
            self.request_stop(record.id, StopCause.SHUTDOWN, now, self._mono)
        deadline = time.monotonic() + grace_s
        pending = {r.id for r in live}
        while pending and time.monotonic() < deadline:
            pending = {job_id for job_id in pending if not self._all_exited(job_id)}
            if pending:
                time.sleep(0.1)
        for job_id in pending:
            self._killed.add(job_id)
            self.backend.stop(job_id, force=True)

    def _all_exited(self, job_id: str) -> bool:
        try:
            return all(s.state is ReplicaState.EXITED for s in self.backend.poll(job_id))
        except BackendError:
            return False
