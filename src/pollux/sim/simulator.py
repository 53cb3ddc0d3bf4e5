"""The simulator of a homogeneous cluster: a thin driver around one scheduling policy.

The round loop (:mod:`pollux.sim.loop`) advances every job each ``interval_s`` and runs a
scheduling round the way the service does. Here a job's report carries its scheduling
state and the hints it reports; a job whose nodes changed (not just their order)
restarts (``restart_delay_s`` holding its GPUs without progress), and distributed jobs
sharing a node slow down by ``interference``.

Jobs are *fixed* (the tuned batch size, for baselines) or *adaptive* (Pollux jobs that
fit their own model and report hints, as the agent does). The mode comes from the policy's
class attribute ``adaptive_jobs``: baselines set it to False; a policy without it gets
adaptive jobs. ``adaptive_jobs=`` here overrides it.

With an autoscaler (:mod:`pollux.policies.autoscaling`) the cluster is elastic
(:class:`~pollux.sim.cluster.ElasticCluster`): it starts with ``min_nodes`` ready nodes
and, every round before the policy runs, the autoscaler's desired size is applied; a new
node becomes usable ``provision_delay_s`` after its request, and jobs on a released node
lose their allocation (the policy places them again, a restart). Adaptive jobs then also
carry their throughput speedup in ``JobInfo.extras["throughput_speedup_fn"]`` (their
fitted throughput model, statistical efficiency ignored), for the throughput autoscaler.
Without an autoscaler the cluster keeps ``num_nodes`` nodes and nothing else changes.

What adaptive jobs maximize when they pick their batch size comes from the autoscaler's
class attribute ``batch_objective``: goodput (no autoscaler, the Pollux autoscaler) or
throughput, statistical efficiency ignored (the throughput-based baseline, whose jobs then
report gradient statistics of a fully efficient batch, so the policy sees their
throughput speedup). ``batch_objective=`` overrides it.
A job's true progress always follows its true gradient statistics.

``job_knowledge=JobKnowledge.ORACLE`` gives adaptive jobs their true step-time model and
true goodput (see :class:`~pollux.sim.job.JobKnowledge`): how much better modelling could
gain, measured against the default ``MEASURED``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from pollux.errors import ConfigError
from pollux.models import ThroughputParams
from pollux.policies.autoscaling import (
    DEFAULT_NODE_PRICE_PER_HOUR,
    Autoscaler,
    BatchObjective,
)
from pollux.policies.base import GPU, Allocation, JobInfo, NodeInfo, Policy, TunedConfig
from pollux.policies.snapshot import JobReport
from pollux.sim.adaptive import FitCache
from pollux.sim.applications import Application
from pollux.sim.cluster import ClusterSize, ElasticCluster
from pollux.sim.job import BatchMode, JobKnowledge, SimJob
from pollux.sim.loop import MAX_IDLE_ROUNDS, RoundLog, RoundLoop, job_report
from pollux.sim.oracle import OracleTables, fixed_batch_max_replicas, true_throughput_params
from pollux.sim.placement import placement_of
from pollux.sim.workload import Workload

__all__ = ["MAX_IDLE_ROUNDS", "ClusterConfig", "RoundLog", "SimulationResult", "Simulator",
           "run_simulation"]


@dataclass(frozen=True)
class ClusterConfig:
    """The simulated cluster and scheduling loop."""

    num_nodes: int = 16
    """Nodes in the cluster."""
    gpus_per_node: int = 4
    """GPUs on every node."""
    interval_s: float = 60.0
    """Simulated seconds between scheduling rounds."""
    restart_delay_s: float = 30.0
    """Seconds a job holds its GPUs without progress after each placement change."""
    interference: float = 0.0
    """Slowdown of a distributed job sharing a node with another distributed job (0-1)."""
    max_time_s: float = 90 * 86400.0
    """Simulated time after which a run stops even with jobs left."""
    min_nodes: int = 1
    """With an autoscaler: the fewest nodes, and the size the cluster starts with."""
    max_nodes: int | None = None
    """With an autoscaler: the most nodes (None: ``num_nodes``)."""
    node_price_per_hour: float = DEFAULT_NODE_PRICE_PER_HOUR
    """Price of one node for an hour (for the reported cost)."""
    provision_delay_s: float = 120.0
    """With an autoscaler: seconds from requesting a node until jobs can use it (billed)."""

    def __post_init__(self) -> None:
        for name in ("num_nodes", "gpus_per_node", "min_nodes"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ConfigError(name, value, "use a whole number >= 1")
        if not (isinstance(self.scaling_max_nodes, int)
                and self.scaling_max_nodes >= self.min_nodes):
            raise ConfigError("max_nodes", self.max_nodes,
                              f"use a whole number >= min_nodes ({self.min_nodes})")
        if not (self.node_price_per_hour >= 0 and self.node_price_per_hour < float("inf")):
            raise ConfigError("node_price_per_hour", self.node_price_per_hour,
                              "use a finite price >= 0")
        if not (self.provision_delay_s >= 0 and self.provision_delay_s < float("inf")):
            raise ConfigError("provision_delay_s", self.provision_delay_s,
                              "use a finite number of seconds >= 0")
        for name in ("interval_s", "max_time_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, getattr(self, name), "use a number of seconds > 0")
        if not self.restart_delay_s >= 0:
            raise ConfigError("restart_delay_s", self.restart_delay_s, "use seconds >= 0")
        if not 0 <= self.interference < 1:
            raise ConfigError("interference", self.interference, "use a fraction in [0, 1)")

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def scaling_max_nodes(self) -> int:
        """The autoscaler's upper bound: ``max_nodes``, or ``num_nodes`` when unset."""
        return self.num_nodes if self.max_nodes is None else self.max_nodes

    def node_infos(self) -> tuple[NodeInfo, ...]:
        width = len(str(self.num_nodes - 1))
        resources = MappingProxyType({GPU: float(self.gpus_per_node)})
        return tuple(NodeInfo(f"node-{i:0{width}d}", resources) for i in range(self.num_nodes))


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


class Simulator(RoundLoop[SimJob]):
    """Runs one workload under one policy."""

    def __init__(self, workload: Workload, applications: Mapping[str, Application],
                 policy: Policy, config: ClusterConfig | None = None,
                 adaptive_jobs: bool | None = None,
                 autoscaler: Autoscaler | None = None,
                 batch_objective: BatchObjective | None = None,
                 job_knowledge: JobKnowledge | str = JobKnowledge.MEASURED) -> None:
        self.config = config or ClusterConfig()
        super().__init__(self.config.interval_s, self.config.max_time_s)
        self.workload = workload
        self.policy = policy
        self.autoscaler = autoscaler
        self.throughput_speedups = autoscaler is not None
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
        self.fits = FitCache()
        """Throughput fits shared by the run's adaptive jobs (memoized, deterministic)."""
        try:
            self.job_knowledge = JobKnowledge(job_knowledge)
        except ValueError:
            raise ConfigError("job_knowledge", job_knowledge,
                              f"use one of {', '.join(k.value for k in JobKnowledge)}") from None
        known: dict[str, ThroughputParams | None] = {}
        if self.job_knowledge is JobKnowledge.ORACLE and mode is BatchMode.ADAPTIVE:
            known = {name: true_throughput_params(applications[name], self.config.gpus_per_node)
                     for name in sorted({j.application for j in workload.jobs})}
        self.jobs = tuple(SimJob(spec, applications[spec.application], mode, self.fits,
                                 batch_objective, known.get(spec.application))
                          for spec in workload.jobs)
        self.cluster: ElasticCluster | None = None
        if autoscaler is None:
            self.nodes = self.config.node_infos()
        else:
            self.cluster = ElasticCluster(self.config.min_nodes, self.config.scaling_max_nodes,
                                          self.config.gpus_per_node,
                                          self.config.provision_delay_s)
            self.nodes = self.cluster.nodes()
        self._oracles = OracleTables()

    # -- snapshot ------------------------------------------------------------------------
    def _report(self, job: SimJob) -> JobReport:
        """What the driver knows of a job and what the job reports: one GPU per replica,
        preemptible, its tuned (or pinned) configuration, and either its hints with the
        application's useful replicas as the spec bound (adaptive jobs) or the Optimus
        oracle of remaining time with the bound batch size // smallest atomic batch (fixed
        jobs)."""
        spec = job.app.spec
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
            max_replicas = fixed_batch_max_replicas(job.app, batch)
            remaining_fn = self._oracles.oracle(job.app, batch, self.config.gpus_per_node,
                                                job.epoch)
        return job_report(
            job, self.config.restart_delay_s, max_replicas=max_replicas,
            tuned=TunedConfig(num_replicas=tuned_replicas, batch_size=tuned_batch),
            hints=hints, remaining_time_fn=remaining_fn,
            remaining_progress=None if hints is None else job.remaining_progress())

    # -- effects -------------------------------------------------------------------------
    def _interfered(self, running: Sequence[SimJob]) -> set[str]:
        """Distributed jobs on a node shared with another distributed job."""
        if self.config.interference <= 0:
            return set()
        per_node: dict[str, int] = {}
        distributed = [job for job in running if len(job.placement) > 1]
        for job in distributed:
            for node in set(job.allocation):
                per_node[node] = per_node.get(node, 0) + 1
        return {job.name for job in distributed
                if any(per_node[node] > 1 for node in set(job.allocation))}

    def _advance(self, active: Sequence[SimJob], now_s: float) -> None:
        running = [job for job in active if job.placement]
        interfered = self._interfered(running)
        for job in running:
            job.advance(now_s, self.interval_s,
                        self.config.interference if job.name in interfered else 0.0)

    def _apply(self, job: SimJob, allocation: Allocation) -> None:
        """A job whose nodes changed (not just their order) restarts."""
        if allocation != job.allocation and sorted(allocation) != sorted(job.allocation):
            job.reallocate(allocation, placement_of(allocation), self.config.restart_delay_s)

    def _before_policy(self, jobs: Sequence[SimJob], infos: Sequence[JobInfo], now_s: float
                       ) -> None:
        """With an autoscaler, its desired size applied to the cluster."""
        if self.autoscaler is not None and self.cluster is not None:
            self._resize(self.autoscaler, self.cluster, jobs, infos, now_s)

    def run(self) -> SimulationResult:
        """Simulate until every job completes (or nothing can run any more)."""
        rounds, wall_s = self.run_rounds()
        cfg = self.config
        sizes: tuple[ClusterSize, ...] = (
            (ClusterSize(0.0, cfg.num_nodes, cfg.num_nodes, cfg.num_nodes),)
            if self.cluster is None else tuple(self.cluster.history))
        return SimulationResult(
            policy=self.policy.name, workload=self.workload.name, config=cfg,
            jobs=self.jobs, rounds=rounds, adaptive_jobs=self.adaptive_jobs, wall_s=wall_s,
            autoscaler="none" if self.autoscaler is None else self.autoscaler.name,
            cluster_sizes=sizes, batch_objective=self.batch_objective)

    def _resize(self, autoscaler: Autoscaler, cluster: ElasticCluster, jobs: Sequence[SimJob],
                infos: Sequence[JobInfo], now: float) -> None:
        """Ask the autoscaler for the cluster's size and resize; jobs on released nodes
        lose their allocation."""
        cluster.refresh(now)
        decision = autoscaler.decide(infos, cluster.num_billed_nodes)
        load: dict[str, int] = {}
        for job in jobs:
            for node in job.allocation:
                load[node] = load.get(node, 0) + 1
        released = cluster.resize(decision.num_nodes, now, load)
        for job in jobs:
            if released.intersection(job.allocation):
                job.reallocate((), (), self.config.restart_delay_s)
        cluster.record(now, decision.num_nodes)
        self.nodes = cluster.nodes()


def run_simulation(workload: Workload, applications: Mapping[str, Application],
                   policy: Policy, config: ClusterConfig | None = None,
                   adaptive_jobs: bool | None = None,
                   autoscaler: Autoscaler | None = None,
                   batch_objective: BatchObjective | None = None,
                   job_knowledge: JobKnowledge | str = JobKnowledge.MEASURED) -> SimulationResult:
    """Simulate ``workload`` under ``policy``; see :class:`Simulator`."""
    return Simulator(workload, applications, policy, config, adaptive_jobs, autoscaler,
                     batch_objective, job_knowledge).run()

