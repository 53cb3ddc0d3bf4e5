"""The policy's view of the service: JobInfo/NodeInfo records built from the store.

Pure functions of the job records, the backend's nodes, the clock and the latest hints,
so the same snapshot always asks the policy the same question.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from pollux.models.hints import JobHints
from pollux.policies.base import Allocation, JobInfo, NodeInfo, SpeedupFn, TunedConfig
from pollux.service.store import JobRecord

logger = logging.getLogger(__name__)

EXPLORATION_FACTOR = 2
"""A job with hints may get at most this times the most replicas it has profiled."""


def linear_speedup(num_nodes: ArrayLike, num_replicas: ArrayLike) -> np.ndarray:
    """Speedup of a job without a profile yet: optimistic perfect scaling."""
    _, replicas = np.broadcast_arrays(np.asarray(num_nodes), np.asarray(num_replicas))
    return replicas.astype(np.float64)


@dataclass(frozen=True)
class Snapshot:
    """One scheduling question: active jobs, nodes and what each job holds now."""

    time_s: float
    jobs: tuple[JobInfo, ...]
    nodes: tuple[NodeInfo, ...]
    previous_allocations: Mapping[str, Allocation]


class GuardedSpeedup:
    """A job's speedup function that cannot fail a scheduling round: when it raises or
    answers anything but finite values >= 0 (hints whose model overflows, say), the job is
    scheduled from then on as a job without a model (perfect scaling), and ``problem``
    says why (the allocation loop logs it as the job's event)."""

    def __init__(self, job_id: str, function: SpeedupFn, probe_replicas: int) -> None:
        self.job_id = job_id
        self.function = function
        self.problem: str | None = None
        self(1, max(1, probe_replicas))  # find a broken model before any policy asks

    def __call__(self, num_nodes: ArrayLike, num_replicas: ArrayLike) -> np.ndarray:
        if self.problem is None:
            try:
                with np.errstate(all="ignore"):
                    value = np.asarray(self.function(num_nodes, num_replicas),
                                       dtype=np.float64)
                shape = np.broadcast_shapes(np.shape(num_nodes), np.shape(num_replicas))
                if value.shape == shape and bool(np.all(np.isfinite(value) & (value >= 0))):
                    return value
                self.problem = "its speedup model gives values that are not finite"
            except Exception as exc:  # any failure of one job's model stays with the job
                self.problem = f"its speedup model fails ({type(exc).__name__}: {exc})"
            logger.warning("job %s: %s; scheduled as a job without a model", self.job_id,
                           self.problem)
        return linear_speedup(num_nodes, num_replicas)


class HintsCache:
    """Parsed hints and speedup functions per job, rebuilt only when new hints arrive
    (a SpeedupFunction memoizes its table, so keeping it across rounds is cheap)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float | None, JobHints | None, SpeedupFn | None]] = {}
        self._unusable: dict[str, str] = {}

    def get(self, record: JobRecord) -> tuple[JobHints | None, SpeedupFn | None]:
        cached = self._entries.get(record.id)
        if cached is not None and cached[0] == record.hints_updated_at:
            return cached[1], cached[2]
        hints, speedup = parse_hints(record.id, record.hints)
        if hints is None and record.hints is not None:
            self._unusable[record.id] = "its hints cannot be read"
        else:
            self._unusable.pop(record.id, None)
        if speedup is not None and speedup is not linear_speedup:
            speedup = GuardedSpeedup(record.id, speedup, record.spec.max_replicas)
        self._entries[record.id] = (record.hints_updated_at, hints, speedup)
        return hints, speedup

    def problems(self) -> dict[str, str]:
        """Job id -> why its hints' model is not used (for the jobs it failed for)."""
        found = dict(self._unusable)
        for job_id, (_, _, speedup) in self._entries.items():
            if isinstance(speedup, GuardedSpeedup) and speedup.problem is not None:
                found[job_id] = speedup.problem
        return found

    def forget(self, keep: Sequence[str]) -> None:
        for job_id in set(self._entries) - set(keep):
            del self._entries[job_id]
            self._unusable.pop(job_id, None)


def parse_hints(job_id: str, raw: Mapping[str, Any] | None
                ) -> tuple[JobHints | None, SpeedupFn | None]:
    """Hints and the speedup function they imply (linear before any profile exists)."""
    if raw is None:
        return None, None
    try:
        hints = JobHints.from_dict(dict(raw))
        speedup = hints.speedup_function()
    except Exception as exc:  # validated when posted (not before #13); a model may refuse
        logger.warning("job %s: ignoring hints: %s", job_id, exc)
        return None, None
    return hints, (linear_speedup if speedup is None else speedup)


def held_allocation(record: JobRecord) -> Allocation:
    """What the job holds or was promised: the pending decision, else what runs."""
    if record.target_allocation is not None:
        return record.target_allocation
    if record.state.has_replicas:
        return record.allocation
    return ()


def max_replicas_for(record: JobRecord, hints: JobHints | None) -> int:
    """The spec's bound, tightened once hints exist to twice the replicas profiled so far
    (but never below what the job holds: an agent's profile may lag its allocation)."""
    bound = record.spec.max_replicas
    if hints is not None:
        explored = max(EXPLORATION_FACTOR * hints.max_profiled_replicas,
                       len(held_allocation(record)), 1)
        bound = min(bound, explored)
    return max(bound, record.spec.min_replicas)


def job_info(record: JobRecord, now: float, hints: JobHints | None,
             speedup: SpeedupFn | None) -> JobInfo:
    spec = record.spec
    batch_size = 0
    if hints is not None:
        batch_size = hints.batch_size or hints.init_batch_size
    return JobInfo(
        name=record.id,
        resources=spec.resources.as_policy_resources(),
        min_replicas=spec.min_replicas,
        max_replicas=max_replicas_for(record, hints),
        preemptible=spec.preemptible,
        submission_time_s=record.submitted_at,
        age_s=max(0.0, now - record.submitted_at),
        attained_service_s=record.attained_service_s,
        num_restarts=record.num_restarts,
        restart_delay_s=spec.restart_delay_s,
        speedup_fn=speedup,
        tuned=TunedConfig(num_replicas=spec.max_replicas, batch_size=batch_size),
        extras={"hints": hints, "state": record.state.value},
    )


def build_snapshot(records: Sequence[JobRecord], nodes: Sequence[NodeInfo], now: float,
                   cache: HintsCache) -> Snapshot:
    """The snapshot of the active jobs among ``records`` (in submission order)."""
    active = [r for r in records if not r.state.is_final and not r.cancel_requested]
    jobs = []
    for record in active:
        hints, speedup = cache.get(record)
        jobs.append(job_info(record, now, hints, speedup))
    cache.forget([r.id for r in active])
    return Snapshot(
        time_s=now, jobs=tuple(jobs), nodes=tuple(nodes),
        previous_allocations={r.id: held_allocation(r) for r in active
                              if held_allocation(r)})
