"""Run records: the figures of one (policy, workload) run, and summaries over runs.

The JSON written by ``pollux simulate --json`` is ``{"runs": [RunRecord...], "summary":
{policy: {...}}}`` with the field names of :class:`RunRecord` and :class:`JobRecord`;
other tools read them, so keep them stable.

Cost: every run also reports the node-hours it paid for (nodes ready or provisioning,
from time 0 until the last completion, or the end of the run when jobs are left), their
cost at the node price, and the cluster's size over time (constant without autoscaler).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from pollux.sim.applications import Application, TypedApplication
from pollux.sim.cluster import node_seconds
from pollux.sim.fairness import IsolatedRuns, finish_time_fairness
from pollux.sim.job import SimJob
from pollux.sim.simulator import SimulationResult
from pollux.sim.team_metrics import TeamRecord, team_records
from pollux.teams import DEFAULT_TEAM

UNFAIR_TOLERANCE = 1e-6
"""rho must exceed 1 by more than this to count as unfair (float noise)."""


@dataclass(frozen=True)
class JobRecord:
    """One job's outcome."""

    name: str
    application: str
    submission_s: float
    completion_s: float | None
    """None when the job did not finish within the run."""
    jct_s: float | None
    """Job completion time: completion - submission."""
    restarts: int
    """Placement changes after the first start."""
    gpu_hours: float
    """GPU-hours held (restart delays included)."""
    ftf: float | None
    """Finish-time fairness rho (see :mod:`pollux.sim.fairness`); None if unfinished."""


@dataclass(frozen=True)
class RoundStats:
    """Wall seconds the policy spent per scheduling round."""

    median: float
    p99: float
    max: float


@dataclass(frozen=True)
class NodeCounts:
    """The cluster's size over time, as change points."""

    times_s: tuple[float, ...] = ()
    num_nodes: tuple[int, ...] = ()
    """Ready nodes from ``times_s[i]`` until the next change point."""
    num_billed_nodes: tuple[int, ...] = ()
    """Ready plus provisioning nodes (what is paid for)."""
    desired_num_nodes: tuple[int, ...] = ()
    """What the autoscaler asked for."""


@dataclass(frozen=True)
class RunRecord:
    """The figures of one (policy, workload) run."""

    policy: str
    workload: str
    """Workload file stem."""
    avg_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    makespan_s: float
    """Last completion - first submission."""
    num_jobs: int
    num_completed: int
    restarts_per_job: float
    gpu_utilization: float
    """GPU-seconds held / (cluster GPUs x makespan); with an autoscaler, GPU-seconds held
    / GPU-seconds paid for."""
    wall_s: float
    """Wall seconds of the whole simulation."""
    round_s: RoundStats
    max_ftf: float
    p99_ftf: float
    unfair_fraction: float
    """Share of completed jobs with finish-time fairness rho > 1."""
    gpu_hours_per_job: float
    jobs: tuple[JobRecord, ...]
    autoscaler: str = "none"
    """Registered autoscaler name; "none": a fixed cluster."""
    node_hours: float = 0.0
    """Node-hours paid for: nodes ready or provisioning from time 0 until the last
    completion (the end of the run when jobs are left)."""
    cost: float = 0.0
    """``node_hours`` x the node price per hour."""
    nodes_over_time: NodeCounts = NodeCounts()
    lower_bound_avg_jct_s: float | None = None
    """A lower bound on the average JCT any policy could reach on this workload and
    cluster (:mod:`pollux.sim.lower_bound`); None when not computed."""
    teams: Mapping[str, TeamRecord] | None = None
    """Team -> its figures (:mod:`pollux.sim.team_metrics`) when the run had a teams file
    or its workload a ``team`` column; None (and absent from the JSON) otherwise."""

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready data; undefined figures (NaN, e.g. no job finished) become None."""
        data = _finite(asdict(self))
        if isinstance(data, dict) and data.get("teams") is None:
            data.pop("teams", None)
        return data if isinstance(data, dict) else {}


def _finite(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    arr = np.asarray(values, dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else float("nan")


def job_record(job: SimJob, gpu_s: float, ftf: float | None = None) -> JobRecord:
    """One job's outcome, with the GPU-seconds it is charged."""
    done = job.completion_time_s
    return JobRecord(
        name=job.name,
        application=job.spec.application,
        submission_s=job.spec.submission_time_s,
        completion_s=done,
        jct_s=None if done is None else done - job.spec.submission_time_s,
        restarts=job.num_restarts or 0,
        gpu_hours=gpu_s / 3600.0,
        ftf=ftf,
    )


def summarize_run(result: SimulationResult,
                  applications: Mapping[str, Application] | Mapping[str, TypedApplication],
                  isolated: IsolatedRuns | None = None) -> RunRecord:
    """Turn a raw simulation result into a :class:`RunRecord`. GPU-hours per job are the
    seconds held while training or restoring, or (the semantics' ``charge_whole_rounds``)
    every round held in full."""
    cfg = result.config
    if isolated is None:
        isolated = IsolatedRuns(applications, cfg)
    times = np.array([r.time_s for r in result.rounds], dtype=np.float64)
    active = np.array([r.num_active for r in result.rounds], dtype=np.float64)
    rho = finish_time_fairness(result.jobs, times, active, cfg.num_gpus, isolated,
                               cfg.interval_s)
    whole = cfg.semantics.charge_whole_rounds
    charged = [job.held_gpu_s if whole else job.attained_service_s for job in result.jobs]
    records = [job_record(job, gpu_s, rho.get(job.name))
               for job, gpu_s in zip(result.jobs, charged)]
    jcts = [r.jct_s for r in records if r.jct_s is not None]
    completions = [r.completion_s for r in records if r.completion_s is not None]
    first = min(r.submission_s for r in records) if records else 0.0
    makespan = (max(completions) - first) if completions else float("nan")
    policy_s = [r.policy_s for r in result.rounds if r.num_active]
    gpu_s = sum(charged)
    ftf = list(rho.values())
    num_jobs = len(records)
    all_done = bool(records) and len(completions) == len(records)
    end_s = max(completions) if all_done else (times[-1] if times.size else 0.0)
    sizes = result.cluster_sizes
    billed_s = node_seconds(sizes, float(end_s))
    cost = sum(node_seconds(sizes, float(end_s), t) / 3600.0 * price
               for t, price in cfg.node_prices().items())
    if result.autoscaler == "none":
        utilization = (gpu_s / (cfg.num_gpus * makespan)
                       if completions and makespan > 0 else 0.0)
    else:
        gpu_seconds = sum(node_seconds(sizes, float(end_s), g.gpu_type) * g.gpus_per_node
                          for g in cfg.spec.groups)
        utilization = gpu_s / gpu_seconds if gpu_seconds > 0 else 0.0
    by_team = None
    if result.teams is not None or any(job.spec.team != DEFAULT_TEAM for job in result.jobs):
        by_team = team_records(result, {r.name: r.jct_s for r in records},
                               {job.name: s for job, s in zip(result.jobs, charged)},
                               cfg.num_gpus)
    return RunRecord(
        policy=result.policy,
        workload=result.workload,
        avg_jct_s=float(np.mean(jcts)) if jcts else float("nan"),
        p50_jct_s=_percentile(jcts, 50),
        p99_jct_s=_percentile(jcts, 99),
        makespan_s=float(makespan),
        num_jobs=num_jobs,
        num_completed=len(jcts),
        restarts_per_job=float(np.mean([r.restarts for r in records])) if records else 0.0,
        gpu_utilization=utilization,
        wall_s=result.wall_s,
        round_s=RoundStats(median=_percentile(policy_s, 50), p99=_percentile(policy_s, 99),
                           max=float(max(policy_s)) if policy_s else float("nan")),
        max_ftf=float(max(ftf)) if ftf else float("nan"),
        p99_ftf=_percentile(ftf, 99),
        unfair_fraction=float(np.mean(np.asarray(ftf) > 1.0 + UNFAIR_TOLERANCE)) if ftf else float("nan"),
        gpu_hours_per_job=gpu_s / 3600.0 / num_jobs if num_jobs else 0.0,
        jobs=tuple(records),
        autoscaler=result.autoscaler,
        node_hours=billed_s / 3600.0,
        cost=cost,
        nodes_over_time=NodeCounts(
            times_s=tuple(s.time_s for s in sizes),
            num_nodes=tuple(s.num_nodes for s in sizes),
            num_billed_nodes=tuple(s.num_billed_nodes for s in sizes),
            desired_num_nodes=tuple(s.desired_num_nodes for s in sizes)),
        teams=by_team,
    )


def summarize_policies(runs: Sequence[RunRecord]) -> dict[str, dict[str, float]]:
    """Policy -> means over its runs (``mean_avg_jct_s`` and companions)."""
    by_policy: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_policy.setdefault(run.policy, []).append(run)
    summary: dict[str, dict[str, float]] = {}
    for policy, items in by_policy.items():
        summary[policy] = {
            **{f"mean_{name}": float(np.mean([getattr(r, name) for r in items])) for name in (
                "avg_jct_s", "p99_jct_s", "makespan_s", "restarts_per_job", "gpu_utilization")},
            "max_ftf": float(np.max([r.max_ftf for r in items])),
            **{f"mean_{name}": float(np.mean([getattr(r, name) for r in items])) for name in (
                "unfair_fraction", "gpu_hours_per_job", "node_hours", "cost")},
            "mean_lower_bound_avg_jct_s": (
                float(np.mean([r.lower_bound_avg_jct_s for r in items]))
                if all(r.lower_bound_avg_jct_s is not None for r in items) else float("nan")),
            "num_workloads": len(items),
        }
    return summary


def report(runs: Sequence[RunRecord]) -> dict[str, object]:
    """The ``--json`` document: ``{"runs": [...], "summary": {...}}`` (NaN -> None)."""
    return {"runs": [run.to_dict() for run in runs],
            "summary": _finite(summarize_policies(runs))}
