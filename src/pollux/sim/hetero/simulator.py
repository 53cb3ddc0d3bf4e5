"""The heterogeneous simulator: a thin driver around one policy on a typed cluster.

The round loop (:mod:`pollux.sim.loop`) advances every job each ``interval_s`` and runs a
scheduling round the way the service does. Here each job's record carries its goodput per
GPU type and its growth cap per type, and nodes carry their type; the decision check
(:func:`~pollux.policies.decision.check_decision`) also refuses an allocation that spans
types. A changed placement (replicas per node) or type restarts the job (its
application's restart delay); the same shape on other nodes of the same type does not, as
in the reference. A job that holds GPUs after a round is charged the whole round (the
reference's GPU-hours per job).

A policy whose class sets ``adaptive_jobs = False`` (tiresias, optimus, fifo) gets
fixed-batch jobs at their tuned batch size; each reports, per GPU type, its replica cap
and the Optimus oracle of remaining time. A policy whose class sets
``heterogeneity_aware = False`` gets heterogeneity-unaware
jobs, as Sia's artifact runs Pollux: one throughput model pooled over every type, a plain
``speedup_fn`` with the batch limits of the policy's ``pooled_limits_type``. The
policy's growth rule on the cluster's types
(:meth:`~pollux.policies.base.Policy.growth_rule`, as the service applies it) sets the
caps: a job grows to ``exploration_factor`` times the replicas it has run with on a type
(None, the reference: 2) and starts with ``initial_replicas`` (the reference: 1). Jobs
that project unseen types also report their application's 1-GPU speed per type
(``extras[TYPE_SPEEDS_KEY]``, what Sia profiles on arrival).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pollux.cluster_spec import ClusterSpec, allocation_gpu_type
from pollux.errors import ConfigError
from pollux.models.type_speeds import estimate_type_speeds
from pollux.policies.base import TYPE_SPEEDS_KEY, Allocation, Policy, TunedConfig
from pollux.policies.snapshot import EXPLORATION_FACTOR, JobReport
from pollux.sim.adaptive import FitCache
from pollux.sim.hetero.apps import TypedApplication
from pollux.sim.hetero.job import HeteroJob
from pollux.sim.loop import RoundLog, RoundLoop, job_report
from pollux.sim.metrics import NodeCounts, RunRecord, job_record, run_figures
from pollux.sim.oracle import OracleTables, RemainingTimeOracle, fixed_batch_max_replicas
from pollux.sim.placement import placement_of
from pollux.sim.workload import Workload


@dataclass(frozen=True)
class HeteroConfig:
    """The typed cluster and the scheduling loop."""

    cluster: ClusterSpec
    interval_s: float = 60.0
    max_time_s: float = 90 * 86400.0
    project_unseen_types: bool = True
    """Jobs project their model onto types they have not run on (Sia's bootstrap)."""
    speeds_from: str = "own"
    """Speed ratios the projection uses: ``own``, each application's own 1-GPU ratios (Sia:
    every application profiled on every type); ``others``, the speeds learned across the
    *other* applications (:mod:`pollux.models.type_speeds`, what a service without
    per-application profiling learns from other jobs)."""

    def __post_init__(self) -> None:
        for name in ("interval_s", "max_time_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, getattr(self, name), "use a number of seconds > 0")
        if self.speeds_from not in SPEEDS_FROM:
            raise ConfigError("speeds_from", self.speeds_from,
                              f"choose from: {', '.join(SPEEDS_FROM)}")


SPEEDS_FROM = ("own", "others")


def projection_speeds(applications: Mapping[str, TypedApplication], speeds_from: str
                      ) -> dict[str, dict[str, float]]:
    """Application -> the type speeds its jobs project with (see ``HeteroConfig``)."""
    own = {name: app.type_speeds() for name, app in applications.items()}
    if speeds_from == "own":
        return own
    return {name: estimate_type_speeds([s for other, s in own.items() if other != name])
            for name in own}


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


class HeteroSimulator(RoundLoop[HeteroJob]):
    """Runs one workload under one policy on a typed cluster."""

    def __init__(self, workload: Workload, applications: Mapping[str, TypedApplication],
                 policy: Policy, config: HeteroConfig) -> None:
        super().__init__(config.interval_s, config.max_time_s)
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
        speeds = projection_speeds(applications, config.speeds_from)
        aware = bool(getattr(type(policy), "heterogeneity_aware", True))
        pooled_type = getattr(type(policy), "pooled_limits_type", None)
        self.adaptive_jobs = bool(getattr(type(policy), "adaptive_jobs", True))
        factor, self._initial_replicas = policy.growth_rule(config.cluster.gpu_types)
        self._growth_factor = factor or EXPLORATION_FACTOR
        self.jobs = tuple(
            HeteroJob(spec, applications[spec.application], self.fits,
                      speeds[spec.application] if config.project_unseen_types else None,
                      pooled=not aware, pooled_type=pooled_type,
                      fixed_batch=not self.adaptive_jobs)
            for spec in workload.jobs)
        self._gpus_per_node = {g.gpu_type: g.gpus_per_node for g in config.cluster.groups}
        self._oracles = OracleTables()
        self._held: dict[str, dict[str, int]] = {job.name: {} for job in self.jobs}

    def _fixed_report(self, job: HeteroJob, batch_size: int) -> JobReport:
        """A fixed-batch job as the baselines see it, per GPU type: the cap of replicas
        that each get the type's smallest atomic batch, and the Optimus oracle of
        remaining time (calibration included) on packed placements of the type."""
        caps: dict[str, int] = {}
        oracles: dict[str, RemainingTimeOracle] = {}
        for gpu_type, app in job.app.by_type.items():
            caps[gpu_type] = fixed_batch_max_replicas(app, batch_size)
            oracles[gpu_type] = self._oracles.oracle(app, batch_size,
                                                     self._gpus_per_node[gpu_type], job.epoch,
                                                     job.app.calibration)
        spec = job.app.reference().spec
        tuned_replicas = job.spec.num_replicas
        if spec.pinned_replicas is not None:
            tuned_replicas = min(tuned_replicas, spec.pinned_replicas)
        return self._typed_report(job, max_replicas=max(caps.values()),
                                  tuned=TunedConfig(tuned_replicas, batch_size),
                                  max_replicas_by_type=caps, remaining_time_fn_by_type=oracles)

    def _report(self, job: HeteroJob) -> JobReport:
        """The job as the policy's snapshot module takes it. Fixed-batch: see
        :meth:`_fixed_report`. Heterogeneity-aware: its per-type goodput and growth caps
        (the most of them as the spec's bound). Heterogeneity-unaware: the hints of its
        one pooled profile."""
        if job.fixed_batch_size is not None:
            pinned = job.app.reference().spec.pinned_batch_size
            return self._fixed_report(job, job.fixed_batch_size if pinned is None else pinned)
        tuned = TunedConfig(job.spec.num_replicas, job.spec.batch_size)
        if job.pooled is not None:
            spec = job.pooled.spec
            return self._typed_report(
                job, max_replicas=max(1, spec.max_batch_size // spec.min_local_bsz),
                tuned=tuned, hints=job.pooled.hints())
        caps = {t: job.max_replicas(t, self._growth_factor, self._initial_replicas)
                for t in job.app.by_type}
        model = job.typed_goodput()
        return self._typed_report(job, max_replicas=max(caps.values()), tuned=tuned,
                                  typed_goodput=model, remaining_s=job.remaining_s(model),
                                  max_replicas_by_type=caps)

    def _typed_report(self, job: HeteroJob, **fields: Any) -> JobReport:
        """:func:`~pollux.sim.loop.job_report` with the application's restart delay, the
        restart delay left and the application's name (Sia's restart penalties)."""
        extras: dict[str, Any] = {"application": job.app.name}
        if job.type_speeds is not None:
            extras[TYPE_SPEEDS_KEY] = job.type_speeds
        return job_report(job, job.app.restart_delay_s,
                          restart_left_s=job.restart_left_s if job.placement else 0.0,
                          extras=extras, **fields)

    def _advance(self, active: Sequence[HeteroJob], now_s: float) -> None:
        for job in active:
            job.advance(now_s, self.interval_s)

    def _apply(self, job: HeteroJob, allocation: Allocation) -> None:
        """A changed type or shape restarts the job; the same shape on other nodes of the
        same type does not (the reference). Held GPUs are charged the whole round."""
        gpu_type = allocation_gpu_type(allocation, self._by_name)
        placement = placement_of(allocation)
        if not allocation:
            if job.allocation:
                job.reallocate((), (), None)
            return
        if gpu_type != job.gpu_type or placement != job.placement:
            job.reallocate(allocation, placement, gpu_type)
        else:
            job.allocation = allocation
        job.hold_round(self.interval_s)
        assert gpu_type is not None
        held = self._held[job.name]
        held[gpu_type] = held.get(gpu_type, 0) + 1

    def run(self) -> HeteroResult:
        """Simulate until every job completes (or nothing can run any more)."""
        rounds, wall_s = self.run_rounds()
        return HeteroResult(self.policy.name, self.workload.name, self.config, self.jobs,
                            rounds, wall_s,
                            {name: dict(held) for name, held in self._held.items()})


def summarize_hetero(result: HeteroResult) -> RunRecord:
    """The run's figures in the homogeneous record's shape (fairness figures NaN: they
    need isolated runs on a homogeneous cluster). GPU-hours count whole rounds held."""
    records = [job_record(job, job.held_gpu_s) for job in result.jobs]
    figures = run_figures(records, result.rounds)
    makespan = figures["makespan_s"]
    held_s = sum(job.held_gpu_s for job in result.jobs)
    num_gpus = result.config.cluster.num_gpus
    nan = float("nan")
    return RunRecord(
        policy=result.policy, workload=result.workload, **figures,
        gpu_utilization=(held_s / (num_gpus * makespan)
                         if figures["num_completed"] and makespan > 0 else 0.0),
        wall_s=result.wall_s,
        max_ftf=nan, p99_ftf=nan, unfair_fraction=nan,
        gpu_hours_per_job=held_s / 3600.0 / len(records) if records else 0.0,
        jobs=tuple(records),
        nodes_over_time=NodeCounts((0.0,), (result.config.cluster.num_nodes,),
                                   (result.config.cluster.num_nodes,), ()),
    )
