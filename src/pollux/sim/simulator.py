"""The simulator: a thin driver around one scheduling policy, on any cluster.

Every ``interval_s`` of simulated time the jobs that hold GPUs train, completed jobs
release theirs, arrived jobs join the active ones (in workload order) and the round the
service runs too (:mod:`pollux.policies.round`) is asked with their reports; its reply is
carried out. A run stops when every job has completed, at ``max_time_s``, or after
:data:`MAX_IDLE_ROUNDS` rounds in which nothing runs and nothing is left to arrive. A
homogeneous cluster is a typed cluster with one type. What the reference simulators of
the two artifacts do differently (restart delays, GPU-hours charging, what the scheduler
sees of a job, batch limits, calibration) is ``config.semantics``
(:mod:`pollux.sim.semantics`). Distributed jobs sharing a node slow down by
``interference``.

Jobs are *fixed* (the tuned batch size) or *adaptive* (they fit their own model, as the
agent does), by the policy's trait :attr:`~pollux.policies.base.Policy.adaptive_jobs`
(``adaptive_jobs=`` overrides it); a policy that is not
:attr:`~pollux.policies.base.Policy.heterogeneity_aware` gets, on a typed cluster, one
model per job pooled over every type. With an autoscaler the cluster is elastic
(:class:`~pollux.sim.cluster.ElasticCluster`): it starts with ``min_nodes`` ready nodes,
a new node is usable ``provision_delay_s`` after its request, jobs on a released node
lose their allocation, and adaptive jobs pick their batch size by the autoscaler's
``batch_objective`` (``batch_objective=`` overrides it). ``job_knowledge`` is
:class:`~pollux.sim.job.JobKnowledge`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from threadpoolctl import threadpool_limits

from pollux.cluster_spec import allocation_gpu_type
from pollux.errors import ConfigError
from pollux.models import ThroughputParams
from pollux.models.type_speeds import estimate_type_speeds
from pollux.policies.autoscaling import Autoscaler, BatchObjective
from pollux.policies.base import Allocation, NodeInfo, Policy
from pollux.policies.round import RoundRequest, SchedulingRound
from pollux.policies.snapshot import EXPLORATION_FACTOR, JobReport
from pollux.sim.adaptive import FitCache
from pollux.sim.applications import Application, TypedApplication, typed_on
from pollux.sim.cluster import ClusterSize, ElasticCluster
from pollux.sim.config import ClusterConfig
from pollux.sim.job import BatchMode, JobKnowledge, SimJob
from pollux.sim.job_reports import job_report
from pollux.sim.oracle import OracleTables, true_throughput_params
from pollux.sim.placement import placement_of
from pollux.sim.semantics import SchedulerModel
from pollux.sim.workload import Workload
from pollux.teams import Teams

__all__ = ["MAX_IDLE_ROUNDS", "ClusterConfig", "RoundLog", "SimulationResult", "Simulator"]

logger = logging.getLogger(__name__)

MAX_IDLE_ROUNDS = 100
"""Rounds in which nothing runs and nothing is left to arrive before the run is abandoned."""


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
    demand_gpus: Mapping[str, int] = field(default_factory=dict)
    """With teams: team -> GPUs its active jobs could use this round (each job's bound
    times its GPUs per replica); teams without active jobs omitted."""


@dataclass(frozen=True)
class SimulationResult:
    """Raw outcome of a run; :mod:`pollux.sim.metrics` turns it into figures."""

    policy: str
    workload: str
    config: ClusterConfig
    jobs: tuple[SimJob, ...]
    rounds: tuple[RoundLog, ...]
    adaptive_jobs: bool
    wall_s: float
    autoscaler: str = "none"
    """Registered name of the autoscaler ("none": the fixed cluster of ``num_nodes``)."""
    cluster_sizes: tuple[ClusterSize, ...] = ()
    """The cluster's size from time 0, as change points."""
    batch_objective: BatchObjective = BatchObjective.GOODPUT
    """What the adaptive jobs' batch sizes maximized."""
    gpu_types: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Job -> GPU type -> rounds held on it."""
    teams: Teams | None = None
    """The teams file the run scheduled by; None: none."""


class Simulator:
    """Runs one workload's jobs under one policy, round after round (module docstring)."""

    def __init__(self, workload: Workload,
                 applications: Mapping[str, Application] | Mapping[str, TypedApplication],
                 policy: Policy, config: ClusterConfig | None = None,
                 adaptive_jobs: bool | None = None,
                 autoscaler: Autoscaler | None = None,
                 batch_objective: BatchObjective | None = None,
                 job_knowledge: JobKnowledge | str = JobKnowledge.MEASURED,
                 teams: Teams | None = None) -> None:
        self.config = cfg = config or ClusterConfig()
        self.teams = teams
        if teams is not None:
            teams.check_cluster(cfg.spec)
            for job_spec in workload.jobs:
                teams.team_of(job_spec.team, f"team of job {job_spec.name!r}")
        self.interval_s, self.max_time_s = cfg.interval_s, cfg.max_time_s
        self.workload = workload
        self.policy = policy
        self.autoscaler = autoscaler
        self.round = SchedulingRound(policy, autoscaler)
        """The scheduling round this driver gathers reports for and carries out."""
        self.semantics = sem = cfg.semantics
        spec = cfg.spec
        if adaptive_jobs is None:
            adaptive_jobs = type(policy).adaptive_jobs
        self.adaptive_jobs = adaptive_jobs
        mode = BatchMode.ADAPTIVE if adaptive_jobs else BatchMode.FIXED
        if batch_objective is None:
            batch_objective = (BatchObjective.GOODPUT if autoscaler is None
                               else type(autoscaler).batch_objective)
        if not isinstance(batch_objective, BatchObjective):
            raise ConfigError("batch_objective", batch_objective,
                              f"use one of {', '.join(o.name for o in BatchObjective)}")
        self.batch_objective = batch_objective
        missing = sorted({j.application for j in workload.jobs} - set(applications))
        if missing:
            raise ConfigError("application", missing[0],
                              f"no model for it; known: {', '.join(sorted(applications))}")
        try:
            self.job_knowledge = JobKnowledge(job_knowledge)
        except ValueError:
            raise ConfigError("job_knowledge", job_knowledge,
                              f"use one of {', '.join(k.value for k in JobKnowledge)}") from None
        used = sorted({j.application for j in workload.jobs})
        apps = {name: typed_on(applications[name], spec.gpu_types) for name in used}
        self.fits = FitCache()
        """Throughput fits shared by the run's adaptive jobs (memoized, deterministic)."""
        known: dict[str, dict[str, ThroughputParams]] = {}
        if self.job_knowledge is JobKnowledge.ORACLE and mode is BatchMode.ADAPTIVE:
            known = {name: {t: true_throughput_params(a, cfg.gpus_per_node_of(t))
                            for t, a in apps[name].by_type.items()} for name in used}
        typed_model = sem.scheduler_model is SchedulerModel.TYPED_GOODPUT
        speeds = (projection_speeds({n: typed_on(a, spec.gpu_types)
                                     for n, a in applications.items()}, cfg.speeds_from)
                  if typed_model and cfg.project_unseen_types else {})
        pooled = None if type(policy).heterogeneity_aware or len(spec.gpu_types) == 1 else (
            type(policy).pooled_limits_type or "")
        factor, self._initial_replicas = self.round.growth_rule(spec.gpu_types)
        self._growth_factor = factor or EXPLORATION_FACTOR
        self.jobs = tuple(
            SimJob(js, apps[js.application], mode, self.fits, batch_objective,
                   known.get(js.application), type_speeds=speeds.get(js.application),
                   pooled_type=pooled, rate_factor=sem.calibration(js.application),
                   placement_limits=sem.placement_batch_limits)
            for js in workload.jobs)
        self.cluster: ElasticCluster | None = None
        if autoscaler is None:
            self.nodes = cfg.node_infos()
        else:  # one type: up to max_nodes; typed: up to each group's nodes
            groups = [(g.gpu_type, cfg.scaling_max_nodes if cfg.cluster is None
                       else g.num_nodes, g.gpus_per_node) for g in spec.groups]
            prices = cfg.node_prices()
            cheapest = min(spec.gpu_types, key=lambda t: (prices[t], t))
            self.cluster = ElasticCluster({cheapest: cfg.min_nodes}, groups,
                                          cfg.provision_delay_s)
            self.nodes = self.cluster.nodes()
        self._by_name = {node.name: node for node in self.nodes}
        self._oracles = OracleTables()
        self._held: dict[str, Counter[str]] = {job.name: Counter() for job in self.jobs}

    def _restart_delay_s(self, job: SimJob) -> float:
        return self.semantics.restart_delay_s(job.spec.application, self.config.restart_delay_s)

    # -- snapshot ------------------------------------------------------------------------
    def _report(self, job: SimJob) -> JobReport:
        """The job's report (by the semantics' scheduler model)."""
        report = job_report(job, self._restart_delay_s(job), self._oracles, self.config,
                            self.semantics.scheduler_model, self._growth_factor,
                            self._initial_replicas)
        if job.spec.priority:
            report = replace(report, priority=job.spec.priority)
        return report if self.teams is None else replace(report, team=job.spec.team)

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

    def _round(self, jobs: list[SimJob], now: float) -> RoundLog:
        """One round (:mod:`pollux.policies.round`): resize, events and allocations."""
        cluster = self.cluster
        if cluster is not None:
            cluster.refresh(now)
        request = RoundRequest(now, tuple(self._report(job) for job in jobs), tuple(self.nodes),
                               {job.name: job.allocation for job in jobs if job.allocation},
                               None if cluster is None else cluster.billed_by_type(),
                               self.teams)
        reply = self.round.schedule(request, None if cluster is None else (
            lambda wanted: self._resize(cluster, jobs, wanted, now)))
        if reply.scaling is not None and cluster is not None:
            cluster.record(now, reply.scaling.num_nodes)
        if not jobs:
            return RoundLog(now, 0)
        by_name = {job.name: job for job in jobs}
        for event in reply.events:
            if event.level == "warning":
                logger.warning("t=%.0f s: job %s: %s", now, event.job, event.message)
            by_name[event.job].events.append((now, event.message))
        gpus: dict[str, int] = {}
        for job in jobs:
            new = tuple(reply.decision.allocations.get(job.name, ()))
            self._apply(job, new)
            if new:
                gpus[job.name] = len(new)
        demand: Counter[str] = Counter()
        if self.teams is not None and reply.snapshot is not None:
            for info in reply.snapshot.jobs:
                bound = (info.tuned.num_replicas if info.tuned is not None
                         and not self.adaptive_jobs else info.max_replicas)
                demand[info.team] += int(bound * info.gpus_per_replica)
        return RoundLog(now, len(jobs), gpus, reply.policy_s, dict(demand))

    # -- effects -------------------------------------------------------------------------
    def _interfered(self, running: Sequence[SimJob]) -> set[str]:
        """Distributed jobs on a node shared with another distributed job."""
        if self.config.interference <= 0:
            return set()
        distributed = [job for job in running if len(job.placement) > 1]
        per_node = Counter(node for job in distributed for node in set(job.allocation))
        return {job.name for job in distributed
                if any(per_node[node] > 1 for node in set(job.allocation))}

    def _advance(self, active: Sequence[SimJob], now_s: float) -> None:
        running = [job for job in active if job.placement]
        interfered = self._interfered(running)
        for job in running:
            job.advance(now_s, self.interval_s,
                        self.config.interference if job.name in interfered else 0.0)

    def _apply(self, job: SimJob, allocation: Allocation) -> None:
        """A move restarts the job (the semantics say what a move is); held GPUs are
        counted per round (whole-round GPU-hours) and per type."""
        if not allocation:
            if job.allocation:
                job.reallocate((), (), self._restart_delay_s(job))
            return
        if allocation == job.allocation:  # kept: same type and placement
            gpu_type, placement = job.gpu_type, job.placement
        else:
            gpu_type = allocation_gpu_type(allocation, self._by_name)
            placement = placement_of(allocation)
        if self.semantics.restart_on_node_change:
            moved = sorted(allocation) != sorted(job.allocation)
        else:
            moved = gpu_type != job.gpu_type or placement != job.placement
            if not moved:
                job.allocation = allocation
        if moved:
            job.reallocate(allocation, placement, self._restart_delay_s(job), gpu_type)
        job.held_gpu_s += self.interval_s * job.num_replicas  # whole rounds held
        self._held[job.name][str(gpu_type)] += 1

    def run(self) -> SimulationResult:
        """Simulate until every job completes (or nothing can run any more)."""
        rounds, wall_s = self.run_rounds()
        cfg = self.config
        n = cfg.spec.num_nodes
        sizes: tuple[ClusterSize, ...] = (
            (ClusterSize(0.0, n, n, n, {g.gpu_type: g.num_nodes for g in cfg.spec.groups}),)
            if self.cluster is None else tuple(self.cluster.history))
        return SimulationResult(
            policy=self.policy.name, workload=self.workload.name, config=cfg,
            jobs=self.jobs, rounds=rounds, adaptive_jobs=self.adaptive_jobs, wall_s=wall_s,
            autoscaler="none" if self.autoscaler is None else self.autoscaler.name,
            cluster_sizes=sizes, batch_objective=self.batch_objective,
            gpu_types={name: dict(held) for name, held in self._held.items()},
            teams=self.teams)

    def _resize(self, cluster: ElasticCluster, jobs: Sequence[SimJob],
                num_nodes_by_type: Mapping[str, int], now: float) -> tuple[NodeInfo, ...]:
        """Resize the cluster to the nodes wanted; jobs on released nodes lose their
        allocation. The nodes ready now."""
        load = Counter(node for job in jobs for node in job.allocation)
        released = cluster.resize(num_nodes_by_type, now, load)
        for job in jobs:
            if released.intersection(job.allocation):
                job.reallocate((), (), self._restart_delay_s(job))
        self.nodes = cluster.nodes()
        self._by_name = {node.name: node for node in self.nodes}
        return self.nodes


def projection_speeds(applications: Mapping[str, TypedApplication], speeds_from: str
                      ) -> dict[str, dict[str, float]]:
    """Application -> the type speeds its jobs project with (see ``ClusterConfig``)."""
    own = {name: app.type_speeds() for name, app in applications.items()}
    if speeds_from == "own":
        return own
    return {name: estimate_type_speeds([s for other, s in own.items() if other != name])
            for name in own}

