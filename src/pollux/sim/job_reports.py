"""What a simulated job reports to the scheduler each round, as a job of the service does.

The simulator describes every active job as a :class:`~pollux.policies.snapshot.JobReport`
(:mod:`pollux.policies.snapshot` turns it into the policy's record), per GPU type of its
application (a homogeneous cluster's one type: the report's one entry), by the semantics'
scheduler model (:class:`~pollux.sim.semantics.SchedulerModel`): a fixed-batch job, under
either, its replica cap and Optimus oracle of remaining time on each type; an adaptive
job its hints (``HINTS``, the Pollux artifact) or its goodput, caps and remaining time per
GPU type (``TYPED_GOODPUT``, the Sia artifact).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from pollux.policies.base import (
    GPU,
    TYPE_SPEEDS_KEY,
    TunedConfig,
    TypeFacts,
    facts_by_type,
    typed_facts,
)
from pollux.policies.snapshot import EXPLORATION_FACTOR, JobReport
from pollux.sim.config import ClusterConfig
from pollux.sim.job import BatchMode, SimJob
from pollux.sim.oracle import OracleTables, fixed_batch_max_replicas
from pollux.sim.semantics import SchedulerModel

ONE_GPU = MappingProxyType({GPU: 1.0})
"""Resources per replica of every simulated job."""


def job_report(job: SimJob, restart_delay_s: float, oracles: OracleTables,
               config: ClusterConfig, model: SchedulerModel = SchedulerModel.HINTS,
               growth_factor: float = EXPLORATION_FACTOR, initial_replicas: int = 1
               ) -> JobReport:
    """A simulated job's report: one GPU per replica, preemptible, its submission,
    service, restarts and replicas held, its tuned (or pinned) configuration, and what
    ``model`` shows of it (the module docstring; ``growth_factor`` and
    ``initial_replicas``: the policy's growth rule for the per-type caps). Under
    ``TYPED_GOODPUT`` also the restart delay left and the application's name (Sia's
    restart penalties) and its 1-GPU speeds per type."""
    fields: dict[str, Any] = {}
    typed = model is SchedulerModel.TYPED_GOODPUT
    if typed:
        extras: dict[str, Any] = {"application": job.app.name}
        if job.type_speeds is not None:
            extras[TYPE_SPEEDS_KEY] = job.type_speeds
        fields.update(extras=extras,
                      restart_left_s=job.restart_left_s if job.placement else 0.0)
    hints = None if typed else job.hints()
    if job.mode is BatchMode.FIXED if typed else hints is None:
        fields.update(by_type=fixed_batch_facts(job, oracles, config), tuned=pinned_tuned(job))
    elif not typed:
        fields.update(by_type=facts_by_type(job.current_app().spec.max_useful_replicas),
                      tuned=pinned_tuned(job), hints=hints,
                      remaining_progress=job.remaining_progress())
    elif job.pooled is not None:
        spec = job.pooled.spec
        fields.update(by_type=facts_by_type(max(1, spec.max_batch_size // spec.min_local_bsz)),
                      hints=job.pooled.hints())
    else:
        caps = {t: job.max_replicas(t, growth_factor, initial_replicas)
                for t in job.app.by_type}
        goodput = job.typed_goodput()
        fields.update(by_type=facts_by_type(max(caps.values()),
                                            per_type=typed_facts(caps, goodput)),
                      remaining_s=job.remaining_s(goodput))
    fields.setdefault("tuned", TunedConfig(job.spec.num_replicas, job.spec.batch_size))
    return JobReport(name=job.name, resources=ONE_GPU,
                     submission_time_s=job.spec.submission_time_s,
                     attained_service_s=job.attained_service_s,
                     num_restarts=job.num_restarts or 0, restart_delay_s=restart_delay_s,
                     num_held_replicas=len(job.allocation), **fields)


def pinned_tuned(job: SimJob) -> TunedConfig:
    """The job's tuned configuration within what its application pins (on every type)."""
    spec = job.app.reference().spec
    replicas, batch = job.spec.num_replicas, job.spec.batch_size
    if spec.pinned_replicas is not None:
        replicas = min(replicas, spec.pinned_replicas)
    return TunedConfig(replicas, batch if spec.pinned_batch_size is None
                       else spec.pinned_batch_size)


def fixed_batch_facts(job: SimJob, oracles: OracleTables, config: ClusterConfig
                      ) -> dict[str, TypeFacts]:
    """A fixed-batch job on each type of its application: the replicas that each get the
    type's smallest atomic batch, and the Optimus oracle of its remaining time
    (calibration included); the most of those caps on any type."""
    batch = int(job.target_batch_size or job.spec.batch_size)
    caps = {t: fixed_batch_max_replicas(app, batch) for t, app in job.app.by_type.items()}
    remaining = {t: oracles.oracle(app, batch, config.gpus_per_node_of(t), job.epoch,
                                   job.rate_factor) for t, app in job.app.by_type.items()}
    return facts_by_type(max(caps.values()), per_type=typed_facts(caps, None, remaining))
