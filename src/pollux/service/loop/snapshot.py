"""The service's jobs as the scheduler's reports (:mod:`pollux.policies.snapshot`).

Each active job record becomes a :class:`~pollux.policies.snapshot.JobReport`: its spec's
resources and bounds, its accounting, what it holds, and the hints its agent last posted
(parsed once, when its record was read: :class:`~pollux.service.storage.records.JobDecoder`).
The policy's records are built from these reports by the module the simulator uses too.
"""

from __future__ import annotations

from collections.abc import Sequence

from pollux.policies.base import Allocation, TunedConfig, facts_by_type
from pollux.policies.snapshot import JobReport
from pollux.service.storage.records import JobRecord
from pollux.teams import DEFAULT_TEAM, Teams


def hints_problems(records: Sequence[JobRecord]) -> dict[str, str]:
    """Job id -> why its stored hints are not used (the jobs whose hints do not parse;
    the allocation loop tells each job once per hints version)."""
    return {r.id: r.hints_problem for r in records if r.hints_problem is not None}


def held_allocation(record: JobRecord) -> Allocation:
    """What the job holds or was promised: the pending decision, else what runs."""
    if record.target_allocation is not None:
        return record.target_allocation
    if record.state.has_replicas:
        return record.allocation
    return ()


def job_report(record: JobRecord, reports_hints: bool = False) -> JobReport:
    """What the scheduler knows of ``record`` and what its agent reported;
    ``reports_hints``: the job's agent will report hints (the policy adapts its jobs), so
    before it has, the job is bounded as one that has profiled nothing."""
    spec, hints = record.spec, record.hints
    batch_size = 0 if hints is None else (hints.batch_size or hints.init_batch_size)
    return JobReport(
        name=record.id,
        resources=spec.resources.as_policy_resources(),
        submission_time_s=record.submitted_at,
        min_replicas=spec.min_replicas,
        by_type=facts_by_type(spec.max_replicas),
        preemptible=spec.preemptible,
        attained_service_s=record.attained_service_s,
        num_restarts=record.num_restarts,
        restart_delay_s=spec.restart_delay_s,
        num_held_replicas=len(held_allocation(record)),
        tuned=TunedConfig(num_replicas=spec.max_replicas, batch_size=batch_size),
        hints=hints,
        reports_hints=reports_hints,
        team=record.team or DEFAULT_TEAM,
        priority=spec.priority,
    )


def teams_for_round(teams: Teams | None, reports: Sequence[JobReport]) -> Teams | None:
    """The teams a round is asked about: the teams file's, and a team of no quota for each
    team a job names that the file lacks (:meth:`~pollux.teams.Teams.with_teams_named`):
    the policy schedules those jobs beyond the quotas instead of refusing the round. None
    without a teams file."""
    return None if teams is None else teams.with_teams_named(r.team for r in reports)


def active_records(records: Sequence[JobRecord]) -> list[JobRecord]:
    """The records the policy is asked about: not final, not being cancelled."""
    return [r for r in records if not r.state.is_final and not r.cancel_requested]
