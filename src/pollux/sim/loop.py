"""The round loop both simulators drive: time, arrivals, completions and scheduling rounds.

Every ``interval_s`` of simulated time the jobs that hold GPUs train, completed jobs
release theirs, arrived jobs join the active ones (in workload order), and a scheduling
round runs the way the service runs one: each active job's report becomes the policy's
:class:`~pollux.policies.base.JobInfo` through :mod:`pollux.policies.snapshot`, the
policy is asked, its decision is checked (:func:`~pollux.policies.decision.check_decision`;
an infeasible allocation becomes a job event, once per reason, and the job gets nothing)
and applied. A run stops when every job has completed, at ``max_time_s``, or after
:data:`MAX_IDLE_ROUNDS` rounds in which nothing runs and nothing is left to arrive.

The simulator (:mod:`pollux.sim.simulator`) supplies the hooks: how jobs train a round,
what a job reports, what happens before the policy (an autoscaler resizing the cluster)
and how an allocation is applied (which change is a restart, what is accounted).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from threadpoolctl import threadpool_limits

from pollux.cluster_spec import gpu_types_of
from pollux.policies.base import GPU, Allocation, JobInfo, NodeInfo, Policy
from pollux.policies.decision import check_decision
from pollux.policies.snapshot import JobReport, Snapshot, SpeedupCache, job_infos
from pollux.sim.job import SimJob
from pollux.sim.workload import Workload

logger = logging.getLogger(__name__)

ONE_GPU = MappingProxyType({GPU: 1.0})
"""Resources per replica of every simulated job."""
MAX_IDLE_ROUNDS = 100
"""Rounds in which nothing runs and nothing is left to arrive before the run is abandoned."""

J = TypeVar("J", bound=SimJob)


@dataclass(frozen=True)
class RoundLog:
    """What happened in one scheduling round."""

    time_s: float
    num_active: int
    """Jobs submitted and not completed."""
    gpus: Mapping[str, int] = field(default_factory=dict)
    """Job -> GPUs allocated after the round (jobs with none omitted)."""
    policy_s: float = 0.0
    """Wall seconds the policy spent on this round."""


def job_report(job: SimJob, restart_delay_s: float, **fields: Any) -> JobReport:
    """A simulated job's report with what every one shares (one GPU per replica,
    preemptible, its submission, service, restarts and replicas held); ``fields`` add the
    rest."""
    return JobReport(name=job.name, resources=ONE_GPU,
                     submission_time_s=job.spec.submission_time_s,
                     attained_service_s=job.attained_service_s,
                     num_restarts=job.num_restarts or 0, restart_delay_s=restart_delay_s,
                     num_held_replicas=len(job.allocation), **fields)


class RoundLoop(ABC, Generic[J]):
    """Runs one workload's jobs under one policy, round after round (module docstring).

    A subclass sets ``workload``, ``policy``, ``jobs`` and ``nodes`` and implements the
    hooks; :meth:`run_rounds` returns the rounds and the wall seconds they took."""

    workload: Workload
    policy: Policy
    jobs: tuple[J, ...]
    nodes: Sequence[NodeInfo]
    throughput_speedups: bool = False
    """Whether job records carry their throughput speedup (for the throughput autoscaler)."""

    def __init__(self, interval_s: float, max_time_s: float) -> None:
        self.interval_s = interval_s
        self.max_time_s = max_time_s
        self._speedups = SpeedupCache()
        self._infeasible: dict[str, str] = {}

    # -- hooks ---------------------------------------------------------------------------
    @abstractmethod
    def _report(self, job: J) -> JobReport:
        """What the driver knows of an active job and what the job reports."""

    @abstractmethod
    def _advance(self, active: Sequence[J], now_s: float) -> None:
        """Train the active jobs for one interval from ``now_s``."""

    @abstractmethod
    def _apply(self, job: J, allocation: Allocation) -> None:
        """Give ``job`` the allocation the checked decision holds for it (maybe empty)."""

    def _before_policy(self, jobs: Sequence[J], infos: Sequence[JobInfo], now_s: float
                       ) -> None:
        """What happens between the job records and the policy (default: nothing)."""

    # -- the loop ------------------------------------------------------------------------
    def run_rounds(self) -> tuple[tuple[RoundLog, ...], float]:
        """Simulate until every job completes (or nothing can run any more); the rounds
        and the wall seconds. BLAS is held to one thread meanwhile: the simulation is
        sequential, and a multi-threaded BLAS inside the many small throughput fits only
        spins on busy cores."""
        start = time.perf_counter()
        with threadpool_limits(limits=1, user_api="blas"):
            rounds = self._loop()
        return rounds, time.perf_counter() - start

    def _loop(self) -> tuple[RoundLog, ...]:
        arrivals = sorted(range(len(self.jobs)),
                          key=lambda i: (self.jobs[i].spec.submission_time_s, i))
        next_arrival = 0
        active: list[int] = []
        rounds: list[RoundLog] = []
        now = 0.0
        idle_rounds = 0
        num_done = 0
        while num_done < len(self.jobs) and now < self.max_time_s:
            self._advance([self.jobs[i] for i in active], now)
            now += self.interval_s
            done = [i for i in active if self.jobs[i].completion_time_s is not None]
            if done:
                num_done += len(done)
                for i in done:
                    self.jobs[i].allocation, self.jobs[i].placement = (), ()
                active = [i for i in active if self.jobs[i].completion_time_s is None]
            arrived = False
            while (next_arrival < len(arrivals)
                   and self.jobs[arrivals[next_arrival]].spec.submission_time_s <= now):
                active.append(arrivals[next_arrival])
                next_arrival += 1
                arrived = True
            if arrived:
                active.sort()
            rounds.append(self._round([self.jobs[i] for i in active], now))
            if not active:
                continue
            if not rounds[-1].gpus and next_arrival == len(arrivals):
                idle_rounds += 1
                if idle_rounds >= MAX_IDLE_ROUNDS:
                    logger.warning("%s on %s: %d jobs can never run; stopping at t=%.0f s",
                                   self.policy.name, self.workload.name, len(active), now)
                    break
            else:
                idle_rounds = 0
        return tuple(rounds)

    def _round(self, jobs: list[J], now: float) -> RoundLog:
        """One scheduling round, in the service's order: the jobs' records; the hook
        before the policy (e.g. resizing the cluster); the policy asked on the nodes there
        are then; its decision checked and applied."""
        infos = job_infos([self._report(job) for job in jobs], now, self._speedups,
                          throughput_speedups=self.throughput_speedups,
                          exploration_factor=self.policy.growth_rule(
                              tuple(gpu_types_of(self.nodes)))[0])
        self._before_policy(jobs, infos, now)
        if not jobs:
            return RoundLog(now, 0)
        snapshot = Snapshot(now, infos, tuple(self.nodes),
                            {job.name: job.allocation for job in jobs if job.allocation})
        tic = time.perf_counter()
        decision = self.policy.optimize(list(snapshot.jobs), list(snapshot.nodes),
                                        snapshot.previous_allocations)
        policy_s = time.perf_counter() - tic
        decision = check_decision(decision, snapshot)
        gpus: dict[str, int] = {}
        for job in jobs:
            reason = decision.infeasible.get(job.name)
            if reason is None:
                self._infeasible.pop(job.name, None)
            elif self._infeasible.get(job.name) != reason:  # once per reason, as the service
                self._infeasible[job.name] = reason
                logger.warning("t=%.0f s: policy %s: allocation of %s infeasible: %s", now,
                               self.policy.name, job.name, reason)
                job.events.append((now, f"policy {self.policy.name}: allocation infeasible: "
                                        f"{reason}"))
            new = tuple(decision.allocations.get(job.name, ()))
            self._apply(job, new)
            if new:
                gpus[job.name] = len(new)
        return RoundLog(now, len(jobs), gpus, policy_s)
