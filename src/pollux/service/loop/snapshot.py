"""The service's jobs as the scheduler's reports (:mod:`pollux.policies.snapshot`).

Each active job record becomes a :class:`~pollux.policies.snapshot.JobReport`: its spec's
resources and bounds, its accounting, what it holds, and the hints its agent last posted
(parsed once per post). The policy's records are built from these reports by the module
the simulator uses too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pollux.models.hints import JobHints
from pollux.policies.base import Allocation, NodeInfo, TunedConfig
from pollux.policies.snapshot import JobReport
from pollux.service.storage.records import JobRecord

logger = logging.getLogger(__name__)


class HintsCache:
    """Parsed hints per job, parsed again only when new hints arrive."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float | None, JobHints | None]] = {}
        self._unusable: dict[str, str] = {}

    def get(self, record: JobRecord) -> JobHints | None:
        cached = self._entries.get(record.id)
        if cached is not None and cached[0] == record.hints_updated_at:
            return cached[1]
        hints = parse_hints(record.id, record.hints)
        if hints is None and record.hints is not None:
            self._unusable[record.id] = "its hints cannot be read"
        else:
            self._unusable.pop(record.id, None)
        self._entries[record.id] = (record.hints_updated_at, hints)
        return hints

    def problems(self) -> dict[str, str]:
        """Job id -> why its hints are not used (for the jobs whose hints do not parse)."""
        return dict(self._unusable)

    def forget(self, keep: Iterable[str]) -> None:
        kept = set(keep)
        for job_id in set(self._entries) - kept:
            del self._entries[job_id]
            self._unusable.pop(job_id, None)


def parse_hints(job_id: str, raw: Mapping[str, Any] | None) -> JobHints | None:
    """The job's hints, or None when it has posted none (or hints that no longer parse:
    they were validated when posted, so this is logged and the job treated as new)."""
    if raw is None:
        return None
    try:
        return JobHints.from_dict(dict(raw))
    except Exception as exc:  # validated when posted (not before #13); never fail a round
        logger.warning("job %s: ignoring hints: %s", job_id, exc)
        return None


def held_allocation(record: JobRecord) -> Allocation:
    """What the job holds or was promised: the pending decision, else what runs."""
    if record.target_allocation is not None:
        return record.target_allocation
    if record.state.has_replicas:
        return record.allocation
    return ()


def job_report(record: JobRecord, hints: JobHints | None) -> JobReport:
    """What the scheduler knows of ``record`` and what its agent reported."""
    spec = record.spec
    batch_size = 0 if hints is None else (hints.batch_size or hints.init_batch_size)
    return JobReport(
        name=record.id,
        resources=spec.resources.as_policy_resources(),
        submission_time_s=record.submitted_at,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        preemptible=spec.preemptible,
        attained_service_s=record.attained_service_s,
        num_restarts=record.num_restarts,
        restart_delay_s=spec.restart_delay_s,
        num_held_replicas=len(held_allocation(record)),
        tuned=TunedConfig(num_replicas=spec.max_replicas, batch_size=batch_size),
        hints=hints,
    )


def active_records(records: Sequence[JobRecord]) -> list[JobRecord]:
    """The records the policy is asked about: not final, not being cancelled."""
    return [r for r in records if not r.state.is_final and not r.cancel_requested]


def job_reports(records: Sequence[JobRecord], cache: HintsCache) -> list[JobReport]:
    """Reports of ``records`` (in their order); ``cache`` forgets the others."""
    reports = [job_report(record, cache.get(record)) for record in records]
    cache.forget(r.id for r in records)
    return reports


def previous_allocations(records: Sequence[JobRecord], nodes: Sequence[NodeInfo]
                         ) -> dict[str, Allocation]:
    """Job id -> what it holds or was promised on ``nodes``; a job holding nothing, or
    holding a node that is gone (the cluster shrank), is left out, as in the simulator."""
    names = {node.name for node in nodes}
    held = {r.id: held_allocation(r) for r in records}
    return {job_id: alloc for job_id, alloc in held.items()
            if alloc and all(node in names for node in alloc)}
