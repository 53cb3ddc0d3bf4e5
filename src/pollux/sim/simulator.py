"""The simulator: a thin driver around one scheduling policy, on any cluster.

The round loop (:mod:`pollux.sim.loop`) advances every job each ``interval_s`` and runs a
scheduling round the way the service does. A homogeneous cluster is a typed cluster with
one type: nodes carry their GPU type, a job's allocation never spans types (the decision
check refuses it) and a job keeps one model per type (:class:`~pollux.sim.job.SimJob`).
What the reference simulators of the two artifacts do differently (restart delays per
application, GPU-hours charging, what the scheduler sees of a job, batch limits,
calibration) is ``config.semantics`` (:mod:`pollux.sim.semantics`), chosen by the
trace set. Distributed jobs sharing a node slow down by ``interference``.

Jobs are *fixed* (the tuned batch size, for baselines) or *adaptive* (Pollux jobs that
fit their own model, as the agent does). The mode comes from the policy's class attribute
``adaptive_jobs`` (``adaptive_jobs=`` here overrides it); a policy whose class sets
``heterogeneity_aware = False`` gets, on a typed cluster, jobs with one model pooled over
every type with the limits of its ``pooled_limits_type``, as Sia's artifact runs Pollux.
Under the ``typed_goodput`` scheduler model the policy's growth rule on the cluster's
types (:meth:`~pollux.policies.base.Policy.growth_rule`) sets each job's caps per type.

With an autoscaler (:mod:`pollux.policies.autoscaling`) the cluster is elastic
(:class:`~pollux.sim.cluster.ElasticCluster`): it starts with ``min_nodes`` ready nodes
and, every round before the policy runs, the autoscaler's desired size is applied; a new
node becomes usable ``provision_delay_s`` after its request, and jobs on a released node
lose their allocation. Adaptive jobs then also carry their throughput speedup, and what
they maximize when they pick their batch size is the autoscaler's ``batch_objective``
(goodput, or throughput with efficiency ignored); ``batch_objective=`` overrides it.
``job_knowledge=JobKnowledge.ORACLE`` gives adaptive jobs their true step-time model per
type and true goodput (see :class:`~pollux.sim.job.JobKnowledge`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pollux.cluster_spec import allocation_gpu_type
from pollux.errors import ConfigError
from pollux.models import ThroughputParams
from pollux.models.type_speeds import estimate_type_speeds
from pollux.policies.autoscaling import Autoscaler, BatchObjective
from pollux.policies.base import TYPE_SPEEDS_KEY, Allocation, JobInfo, Policy, TunedConfig
from pollux.policies.snapshot import EXPLORATION_FACTOR, JobReport
from pollux.sim.adaptive import FitCache
from pollux.sim.applications import Application
from pollux.sim.cluster import ClusterSize, ElasticCluster
from pollux.sim.config import ClusterConfig
from pollux.sim.job import BatchMode, JobKnowledge, SimJob
from pollux.sim.loop import MAX_IDLE_ROUNDS, RoundLog, RoundLoop, job_report
from pollux.sim.oracle import (
    OracleTables,
    RemainingTimeOracle,
    fixed_batch_max_replicas,
    true_throughput_params,
)
from pollux.sim.placement import placement_of
from pollux.sim.typed_apps import TypedApplication, typed_on
from pollux.sim.workload import Workload

__all__ = ["MAX_IDLE_ROUNDS", "ClusterConfig", "RoundLog", "SimulationResult", "Simulator",
           "run_simulation"]


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


class Simulator(RoundLoop[SimJob]):
    """Runs one workload under one policy."""

    def __init__(self, workload: Workload,
                 applications: Mapping[str, Application] | Mapping[str, TypedApplication],
                 policy: Policy, config: ClusterConfig | None = None,
                 adaptive_jobs: bool | None = None,
                 autoscaler: Autoscaler | None = None,
                 batch_objective: BatchObjective | None = None,
                 job_knowledge: JobKnowledge | str = JobKnowledge.MEASURED) -> None:
        self.config = cfg = config or ClusterConfig()
        super().__init__(cfg.interval_s, cfg.max_time_s)
        self.workload = workload
        self.policy = policy
        self.autoscaler = autoscaler
        self.throughput_speedups = autoscaler is not None
        self.semantics = sem = cfg.semantics
        spec = cfg.spec
        if adaptive_jobs is None:
            adaptive_jobs = bool(getattr(type(policy), "adaptive_jobs", True))
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
        typed_model = sem.scheduler_model == "typed_goodput"
        speeds = (projection_speeds({n: typed_on(a, spec.gpu_types)
                                     for n, a in applications.items()}, cfg.speeds_from)
                  if typed_model and cfg.project_unseen_types else {})
        aware = bool(getattr(type(policy), "heterogeneity_aware", True))
        pooled = None if aware or len(spec.gpu_types) == 1 else (
            getattr(type(policy), "pooled_limits_type", None) or "")
        factor, self._initial_replicas = policy.growth_rule(spec.gpu_types)
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
        self._held: dict[str, dict[str, int]] = {job.name: {} for job in self.jobs}

    def _restart_delay_s(self, job: SimJob) -> float:
        return self.semantics.restart_delay_s(job.spec.application, self.config.restart_delay_s)

    # -- snapshot ------------------------------------------------------------------------
    def _report(self, job: SimJob) -> JobReport:
        """What the driver knows of a job and what the job reports (the semantics'
        scheduler model)."""
        if self.semantics.scheduler_model == "hints":
            return self._hints_report(job)
        return self._typed_report(job)

    def _hints_report(self, job: SimJob) -> JobReport:
        """One GPU per replica, preemptible, its tuned (or pinned) configuration, and
        either its hints with the application's useful replicas as the spec bound
        (adaptive jobs) or the Optimus oracle of remaining time with the bound batch size
        // smallest atomic batch (fixed jobs)."""
        app = job.current_app()
        spec = app.spec
        tuned_replicas = job.spec.num_replicas
        tuned_batch = job.spec.batch_size
        if spec.pinned_replicas is not None:
            tuned_replicas = min(tuned_replicas, spec.pinned_replicas)
        if spec.pinned_batch_size is not None:
            tuned_batch = spec.pinned_batch_size
        hints = job.hints()
        remaining_fn = None
        if hints is not None:
            max_replicas = spec.max_useful_replicas
        else:
            batch = job.target_batch_size or tuned_batch
            max_replicas = fixed_batch_max_replicas(app, batch)
            remaining_fn = self._oracles.oracle(
                app, batch, self.config.gpus_per_node_of(str(job.gpu_type)), job.epoch)
        return job_report(
            job, self._restart_delay_s(job), max_replicas=max_replicas,
            tuned=TunedConfig(num_replicas=tuned_replicas, batch_size=tuned_batch),
            hints=hints, remaining_time_fn=remaining_fn,
            remaining_progress=None if hints is None else job.remaining_progress())

    def _typed_report(self, job: SimJob) -> JobReport:
        """Per GPU type: a fixed-batch job's replica cap (replicas that each get the
        type's smallest atomic batch) and Optimus oracle of remaining time (calibration
        included); an adaptive job's goodput per type and growth caps (the most of them as
        the spec's bound), or a heterogeneity-unaware job's pooled hints. With the
        restart delay left and the application's name (Sia's restart penalties)."""
        extras: dict[str, Any] = {"application": job.app.name}
        if job.type_speeds is not None:
            extras[TYPE_SPEEDS_KEY] = job.type_speeds
        fields: dict[str, Any] = {}
        tuned = TunedConfig(job.spec.num_replicas, job.spec.batch_size)
        if job.mode is BatchMode.FIXED:
            batch = int(job.target_batch_size or job.spec.batch_size)
            caps: dict[str, int] = {}
            oracles: dict[str, RemainingTimeOracle] = {}
            for gpu_type, app in job.app.by_type.items():
                caps[gpu_type] = fixed_batch_max_replicas(app, batch)
                oracles[gpu_type] = self._oracles.oracle(
                    app, batch, self.config.gpus_per_node_of(gpu_type), job.epoch,
                    job.rate_factor)
            pinned = job.app.reference().spec.pinned_replicas
            tuned = TunedConfig(job.spec.num_replicas if pinned is None
                                else min(job.spec.num_replicas, pinned), batch)
            fields = {"max_replicas": max(caps.values()), "max_replicas_by_type": caps,
                      "remaining_time_fn_by_type": oracles}
        elif job.pooled is not None:
            spec = job.pooled.spec
            fields = {"max_replicas": max(1, spec.max_batch_size // spec.min_local_bsz),
                      "hints": job.pooled.hints()}
        else:
            caps = {t: job.max_replicas(t, self._growth_factor, self._initial_replicas)
                    for t in job.app.by_type}
            model = job.typed_goodput()
            fields = {"max_replicas": max(caps.values()), "typed_goodput": model,
                      "remaining_s": job.remaining_s(model), "max_replicas_by_type": caps}
        return job_report(job, self._restart_delay_s(job), tuned=tuned,
                          restart_left_s=job.restart_left_s if job.placement else 0.0,
                          extras=extras, **fields)

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
        held = self._held[job.name]
        held[str(gpu_type)] = held.get(str(gpu_type), 0) + 1

    def _before_policy(self, jobs: Sequence[SimJob], infos: Sequence[JobInfo], now_s: float
                       ) -> None:
        """With an autoscaler, its desired size applied to the cluster."""
        if self.autoscaler is not None and self.cluster is not None:
            self._resize(self.autoscaler, self.cluster, jobs, infos, now_s)

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
            gpu_types={name: dict(held) for name, held in self._held.items()})

    def _resize(self, autoscaler: Autoscaler, cluster: ElasticCluster, jobs: Sequence[SimJob],
                infos: Sequence[JobInfo], now: float) -> None:
        """Ask the autoscaler for the cluster's size and resize; jobs on released nodes
        lose their allocation."""
        cluster.refresh(now)
        decision = autoscaler.decide_by_type(infos, cluster.billed_by_type())
        load = Counter(node for job in jobs for node in job.allocation)
        released = cluster.resize(decision.num_nodes_by_type, now, load)
        for job in jobs:
            if released.intersection(job.allocation):
                job.reallocate((), (), self._restart_delay_s(job))
        cluster.record(now, decision.num_nodes)
        self.nodes = cluster.nodes()
        self._by_name = {node.name: node for node in self.nodes}


def projection_speeds(applications: Mapping[str, TypedApplication], speeds_from: str
                      ) -> dict[str, dict[str, float]]:
    """Application -> the type speeds its jobs project with (see ``ClusterConfig``)."""
    own = {name: app.type_speeds() for name, app in applications.items()}
    if speeds_from == "own":
        return own
    return {name: estimate_type_speeds([s for other, s in own.items() if other != name])
            for name in own}


def run_simulation(workload: Workload,
                   applications: Mapping[str, Application] | Mapping[str, TypedApplication],
                   policy: Policy, config: ClusterConfig | None = None,
                   adaptive_jobs: bool | None = None,
                   autoscaler: Autoscaler | None = None,
                   batch_objective: BatchObjective | None = None,
                   job_knowledge: JobKnowledge | str = JobKnowledge.MEASURED) -> SimulationResult:
    """Simulate ``workload`` under ``policy``; see :class:`Simulator`."""
    return Simulator(workload, applications, policy, config, adaptive_jobs, autoscaler,
                     batch_objective, job_knowledge).run()
