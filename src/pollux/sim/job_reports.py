"""What a simulated job reports to the scheduler each round, as a job of the service does.

The simulator describes every active job as a :class:`~pollux.policies.snapshot.JobReport`
(:mod:`pollux.policies.snapshot` turns it into the policy's record), by the semantics'
scheduler model (:mod:`pollux.sim.semantics`): ``hints`` (the Pollux artifact), an
adaptive job's hints or a fixed-batch job's Optimus oracle; ``typed_goodput`` (the Sia
artifact), a job's goodput, caps and oracles per GPU type.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from pollux.policies.base import (
    GPU,
    TYPE_SPEEDS_KEY,
    TunedConfig,
    facts_by_type,
    typed_facts,
)
from pollux.policies.snapshot import JobReport
from pollux.sim.config import ClusterConfig
from pollux.sim.job import BatchMode, SimJob
from pollux.sim.oracle import OracleTables, RemainingTimeOracle, fixed_batch_max_replicas

ONE_GPU = MappingProxyType({GPU: 1.0})
"""Resources per replica of every simulated job."""


def job_report(job: SimJob, restart_delay_s: float, **fields: Any) -> JobReport:
    """A simulated job's report with what every one shares (one GPU per replica,
    preemptible, its submission, service, restarts and replicas held); ``fields`` add the
    rest."""
    return JobReport(name=job.name, resources=ONE_GPU,
                     submission_time_s=job.spec.submission_time_s,
                     attained_service_s=job.attained_service_s,
                     num_restarts=job.num_restarts or 0, restart_delay_s=restart_delay_s,
                     num_held_replicas=len(job.allocation), **fields)


def hints_report(job: SimJob, restart_delay_s: float, oracles: OracleTables,
                 config: ClusterConfig) -> JobReport:
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
        remaining_fn = oracles.oracle(
            app, batch, config.gpus_per_node_of(str(job.gpu_type)), job.epoch)
    return job_report(
        job, restart_delay_s, by_type=facts_by_type(max_replicas, None, remaining_fn),
        tuned=TunedConfig(num_replicas=tuned_replicas, batch_size=tuned_batch),
        hints=hints,
        remaining_progress=None if hints is None else job.remaining_progress())


def typed_report(job: SimJob, restart_delay_s: float, oracles: OracleTables,
                 config: ClusterConfig, growth_factor: float, initial_replicas: int
                 ) -> JobReport:
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
        by_type: dict[str, RemainingTimeOracle] = {}
        for gpu_type, app in job.app.by_type.items():
            caps[gpu_type] = fixed_batch_max_replicas(app, batch)
            by_type[gpu_type] = oracles.oracle(
                app, batch, config.gpus_per_node_of(gpu_type), job.epoch,
                job.rate_factor)
        pinned = job.app.reference().spec.pinned_replicas
        tuned = TunedConfig(job.spec.num_replicas if pinned is None
                            else min(job.spec.num_replicas, pinned), batch)
        fields = {"by_type": facts_by_type(max(caps.values()),
                                           per_type=typed_facts(caps, None, by_type))}
    elif job.pooled is not None:
        spec = job.pooled.spec
        fields = {"by_type": facts_by_type(max(1, spec.max_batch_size // spec.min_local_bsz)),
                  "hints": job.pooled.hints()}
    else:
        caps = {t: job.max_replicas(t, growth_factor, initial_replicas)
                for t in job.app.by_type}
        model = job.typed_goodput()
        fields = {"by_type": facts_by_type(max(caps.values()),
                                           per_type=typed_facts(caps, model)),
                  "remaining_s": job.remaining_s(model)}
    return job_report(job, restart_delay_s, tuned=tuned,
                      restart_left_s=job.restart_left_s if job.placement else 0.0,
                      extras=extras, **fields)
