"""The heterogeneous simulator: a thin driver around one policy on a typed cluster.

Every ``interval_s`` it advances every job, builds the policy's snapshot through
:mod:`pollux.policies.snapshot` (each job's record carries its goodput per GPU type and
its growth cap per type; nodes carry their type), asks the policy, checks the decision
(:func:`~pollux.policies.decision.check_decision`: capacity, active jobs, one GPU type
per job; what cannot be applied becomes a job event and the job gets nothing) and
applies it: a changed placement (replicas per node) or type restarts the job (its
application's restart delay); the same shape on other nodes of the same type does not, as
in the reference. A job that holds GPUs after a round is charged the whole round (the
reference's GPU-hours per job).

A policy whose class sets ``adaptive_jobs = False`` (tiresias, optimus, fifo) gets
fixed-batch jobs at their tuned batch size; each reports, per GPU type, its replica cap
and the Optimus oracle of remaining time. A policy whose class sets
``heterogeneity_aware = False`` gets heterogeneity-unaware
jobs, as Sia's artifact runs Pollux: one throughput model pooled over every type, a plain
``speedup_fn`` with the batch limits of the policy's ``pooled_limits_type``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from threadpoolctl import threadpool_limits

from pollux.cluster_spec import ClusterSpec, allocation_gpu_type
from pollux.errors import ConfigError
from pollux.policies.base import GPU, Policy, TunedConfig
from pollux.policies.decision import check_decision
from pollux.policies.snapshot import JobReport, Snapshot, SpeedupCache, job_infos
from pollux.sim.adaptive import FitCache
from pollux.sim.hetero.apps import TypedApplication
from pollux.sim.hetero.job import HeteroJob
from pollux.sim.metrics import JobRecord, NodeCounts, RoundStats, RunRecord
from pollux.sim.oracle import RemainingTimeOracle, StepTimeTable, remaining_iterations
from pollux.sim.placement import placement_of
from pollux.sim.simulator import MAX_IDLE_ROUNDS, RoundLog
from pollux.sim.workload import Workload

logger = logging.getLogger(__name__)

ONE_GPU = MappingProxyType({GPU: 1.0})


@dataclass(frozen=True)
class HeteroConfig:
    """The typed cluster and the scheduling loop."""

    cluster: ClusterSpec
    interval_s: float = 60.0
    max_time_s: float = 90 * 86400.0
    project_unseen_types: bool = True
    """Jobs project their model onto types they have not run on (Sia's bootstrap)."""

    def __post_init__(self) -> None:
        for name in ("interval_s", "max_time_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, getattr(self, name), "use a number of seconds > 0")


@dataclass(frozen=True)
class HeteroResult:
    """Raw outcome of one heterogeneous run."""

    policy: str
    workload: str
    config: HeteroConfig
    jobs: tuple[HeteroJob, ...]
    rounds: tuple[RoundLog, ...]
    wall_s: float
    gpu_types: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Job -> GPU type -> rounds held on it."""


class HeteroSimulator:
    """Runs one workload under one policy on a typed cluster."""

    def __init__(self, workload: Workload, applications: Mapping[str, TypedApplication],
                 policy: Policy, config: HeteroConfig) -> None:
        missing = sorted({j.application for j in workload.jobs} - set(applications))
        if missing:
            raise ConfigError("application", missing[0],
                              f"no traces for it; known: {', '.join(sorted(applications))}")
        self.workload = workload
        self.policy = policy
        self.config = config
        self.nodes = config.cluster.node_infos()
        self._by_name = {node.name: node for node in self.nodes}
        self.fits = FitCache()
        speeds = {name: app.type_speeds() for name, app in applications.items()}
        aware = bool(getattr(type(policy), "heterogeneity_aware", True))
        pooled_type = getattr(type(policy), "pooled_limits_type", None)
        self.adaptive_jobs = bool(getattr(type(policy), "adaptive_jobs", True))
        self.jobs = tuple(
            HeteroJob(spec, applications[spec.application], self.fits,
                      speeds[spec.application] if config.project_unseen_types else None,
                      pooled=not aware, pooled_type=pooled_type,
                      fixed_batch=not self.adaptive_jobs)
            for spec in workload.jobs)
        self._gpus_per_node = {g.gpu_type: g.gpus_per_node for g in config.cluster.groups}
        self._step_tables: dict[tuple[str, str, int], StepTimeTable] = {}
        self._held: dict[str, dict[str, int]] = {job.name: {} for job in self.jobs}
        self._speedups = SpeedupCache()

    def _fixed_report(self, job: HeteroJob, batch_size: int) -> JobReport:
        """A fixed-batch job as the baselines see it, per GPU type: the cap of replicas
        that each get the type's smallest atomic batch, and the Optimus oracle of
        remaining time (calibration included) on packed placements of the type."""
        caps: dict[str, int] = {}
        oracles: dict[str, RemainingTimeOracle] = {}
        for gpu_type, app in job.app.by_type.items():
            spec = app.spec
            caps[gpu_type] = max(1, min(batch_size // spec.min_local_bsz,
                                        spec.max_useful_replicas))
            key = (app.name, gpu_type, batch_size)
            table = self._step_tables.get(key)
            if table is None:
                table = StepTimeTable(app, batch_size, self._gpus_per_node[gpu_type])
                self._step_tables[key] = table
            oracles[gpu_type] = RemainingTimeOracle(
                table, remaining_iterations(app, batch_size, job.epoch) / job.app.calibration)
        spec = job.app.reference().spec
        tuned_replicas = job.spec.num_replicas
        if spec.pinned_replicas is not None:
            tuned_replicas = min(tuned_replicas, spec.pinned_replicas)
        return JobReport(
            name=job.name, resources=ONE_GPU, submission_time_s=job.spec.submission_time_s,
            max_replicas=max(caps.values()), attained_service_s=job.attained_service_s,
            num_restarts=job.num_restarts or 0, restart_delay_s=job.app.restart_delay_s,
            num_held_replicas=len(job.allocation),
            tuned=TunedConfig(tuned_replicas, batch_size),
            max_replicas_by_type=caps, remaining_time_fn_by_type=oracles,
            restart_left_s=job.restart_left_s if job.placement else 0.0,
            extras={"application": job.app.name})

    def _report(self, job: HeteroJob) -> JobReport:
        """The job as the policy's snapshot module takes it. Fixed-batch: see
        :meth:`_fixed_report`. Heterogeneity-aware: its per-type goodput and growth caps
        (the most of them as the spec's bound). Heterogeneity-unaware: the hints of its
        one pooled profile."""
        if job.fixed_batch_size is not None:
            pinned = job.app.reference().spec.pinned_batch_size
            return self._fixed_report(job, job.fixed_batch_size if pinned is None else pinned)
        if job.pooled is not None:
            spec = job.pooled.spec
            return JobReport(
                name=job.name, resources=ONE_GPU, submission_time_s=job.spec.submission_time_s,
                max_replicas=max(1, spec.max_batch_size // spec.min_local_bsz),
                attained_service_s=job.attained_service_s,
                num_restarts=job.num_restarts or 0, restart_delay_s=job.app.restart_delay_s,
                num_held_replicas=len(job.allocation),
                tuned=TunedConfig(job.spec.num_replicas, job.spec.batch_size),
                hints=job.pooled.hints(),
                restart_left_s=job.restart_left_s if job.placement else 0.0,
                extras={"application": job.app.name})
        caps = {t: job.max_replicas(t) for t in job.app.by_type}
        model = job.typed_goodput()
        return JobReport(
            name=job.name,
            resources=ONE_GPU,
            submission_time_s=job.spec.submission_time_s,
            min_replicas=0,
            max_replicas=max(caps.values()),
            preemptible=True,
            attained_service_s=job.attained_service_s,
            num_restarts=job.num_restarts or 0,
            restart_delay_s=job.app.restart_delay_s,
            num_held_replicas=len(job.allocation),
            tuned=TunedConfig(job.spec.num_replicas, job.spec.batch_size),
            typed_goodput=model,
            remaining_s=job.remaining_s(model),
            max_replicas_by_type=caps,
            restart_left_s=job.restart_left_s if job.placement else 0.0,
            extras={"application": job.app.name},
        )

    def run(self) -> HeteroResult:
        """Simulate until every job completes (BLAS held to one thread meanwhile)."""
        with threadpool_limits(limits=1, user_api="blas"):
            return self._run()

    def _run(self) -> HeteroResult:
        start = time.perf_counter()
        cfg = self.config
        arrivals = sorted(range(len(self.jobs)),
                          key=lambda i: (self.jobs[i].spec.submission_time_s, i))
        next_arrival = 0
        active: list[int] = []
        rounds: list[RoundLog] = []
        now = 0.0
        idle_rounds = 0
        num_done = 0
        while num_done < len(self.jobs) and now < cfg.max_time_s:
            for i in active:
                self.jobs[i].advance(now, cfg.interval_s)
            now += cfg.interval_s
            done = [i for i in active if self.jobs[i].completion_time_s is not None]
            if done:
                num_done += len(done)
                for i in done:
                    self.jobs[i].allocation, self.jobs[i].placement = (), ()
                active = [i for i in active if self.jobs[i].completion_time_s is None]
            while (next_arrival < len(arrivals)
                   and self.jobs[arrivals[next_arrival]].spec.submission_time_s <= now):
                active.append(arrivals[next_arrival])
                next_arrival += 1
            active.sort()
            if not active:
                rounds.append(RoundLog(now, 0))
                continue
            rounds.append(self._schedule([self.jobs[i] for i in active], now))
            if not rounds[-1].gpus and next_arrival == len(arrivals):
                idle_rounds += 1
                if idle_rounds >= MAX_IDLE_ROUNDS:
                    logger.warning("%s on %s: %d jobs can never run; stopping at t=%.0f s",
                                   self.policy.name, self.workload.name, len(active), now)
                    break
            else:
                idle_rounds = 0
        return HeteroResult(self.policy.name, self.workload.name, cfg, self.jobs,
                            tuple(rounds), time.perf_counter() - start,
                            {name: dict(held) for name, held in self._held.items()})

    def _schedule(self, jobs: list[HeteroJob], now: float) -> RoundLog:
        snapshot = Snapshot(now, job_infos([self._report(job) for job in jobs], now,
                                           self._speedups), self.nodes,
                            {job.name: job.allocation for job in jobs if job.allocation})
        tic = time.perf_counter()
        decision = self.policy.optimize(list(snapshot.jobs), list(snapshot.nodes),
                                        snapshot.previous_allocations)
        policy_s = time.perf_counter() - tic
        decision = check_decision(decision, snapshot)
        gpus: dict[str, int] = {}
        for job in jobs:
            reason = decision.infeasible.get(job.name)
            if reason is not None and (not job.events or not job.events[-1][1].endswith(
                    reason)):  # once per reason, as the other drivers
                logger.warning("t=%.0f s: policy %s: allocation of %s infeasible: %s", now,
                               self.policy.name, job.name, reason)
                job.events.append((now, f"policy {self.policy.name}: allocation "
                                        f"infeasible: {reason}"))
            new = tuple(decision.allocations.get(job.name, ()))
            gpu_type = allocation_gpu_type(new, self._by_name)
            placement = placement_of(new)
            if not new:
                if job.allocation:
                    job.reallocate((), (), None)
            elif gpu_type != job.gpu_type or placement != job.placement:
                job.reallocate(new, placement, gpu_type)
            else:  # same type and shape on other nodes: the reference does not restart
                job.allocation = new
            if new:
                gpus[job.name] = len(new)
                job.hold_round(self.config.interval_s)
                assert gpu_type is not None
                held = self._held[job.name]
                held[gpu_type] = held.get(gpu_type, 0) + 1
        return RoundLog(now, len(jobs), gpus, policy_s)


def summarize_hetero(result: HeteroResult) -> RunRecord:
    """The run's figures in the homogeneous record's shape (fairness figures NaN: they
    need isolated runs on a homogeneous cluster). GPU-hours count whole rounds held."""
    records = []
    for job in result.jobs:
        done = job.completion_time_s
        records.append(JobRecord(
            name=job.name, application=job.spec.application,
            submission_s=job.spec.submission_time_s, completion_s=done,
            jct_s=None if done is None else done - job.spec.submission_time_s,
            restarts=job.num_restarts or 0, gpu_hours=job.held_gpu_s / 3600.0, ftf=None))
    jcts = np.array([r.jct_s for r in records if r.jct_s is not None], dtype=np.float64)
    completions = [r.completion_s for r in records if r.completion_s is not None]
    first = min((r.submission_s for r in records), default=0.0)
    makespan = (max(completions) - first) if completions else float("nan")
    held_s = sum(job.held_gpu_s for job in result.jobs)
    num_gpus = result.config.cluster.num_gpus
    policy_s = np.array([r.policy_s for r in result.rounds if r.num_active])
    nan = float("nan")

    def pct(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) if values.size else nan

    return RunRecord(
        policy=result.policy, workload=result.workload,
        avg_jct_s=float(jcts.mean()) if jcts.size else nan,
        p50_jct_s=pct(jcts, 50), p99_jct_s=pct(jcts, 99), makespan_s=float(makespan),
        num_jobs=len(records), num_completed=int(jcts.size),
        restarts_per_job=float(np.mean([r.restarts for r in records])) if records else 0.0,
        gpu_utilization=(held_s / (num_gpus * makespan)
                         if completions and makespan > 0 else 0.0),
        wall_s=result.wall_s,
        round_s=RoundStats(median=pct(policy_s, 50), p99=pct(policy_s, 99),
                           max=float(policy_s.max()) if policy_s.size else nan),
        max_ftf=nan, p99_ftf=nan, unfair_fraction=nan,
        gpu_hours_per_job=held_s / 3600.0 / len(records) if records else 0.0,
        jobs=tuple(records),
        nodes_over_time=NodeCounts((0.0,), (result.config.cluster.num_nodes,),
                                   (result.config.cluster.num_nodes,), ()),
    )
