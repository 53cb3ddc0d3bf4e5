"""Per-team figures of a run: each team's jobs, JCTs and GPU time, and whether every team
got its guarantee round by round.

A team's *guarantee* in a round is ``min(quota, demand)`` GPUs, ``demand`` being what its
active jobs could use that round (:attr:`~pollux.sim.simulator.RoundLog.demand_gpus`):
its quota while it has the demand for it. A round in which a team holds fewer GPUs than
its guarantee while another team holds more than its own quota (the others took what
was the team's) counts in ``num_rounds_below_guarantee``; ``max_shortfall_gpus`` is the
largest gap. A run without a teams file has one team per ``team`` of its workload (all
in ``default`` without the column), with no quota.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pollux.sim.simulator import RoundLog, SimulationResult
from pollux.teams import Teams

__all__ = ["TeamRecord", "guarantee_shortfalls", "team_records"]


@dataclass(frozen=True)
class TeamRecord:
    """One team's figures in a run."""

    num_jobs: int
    avg_jct_s: float
    """Mean JCT of the team's completed jobs (NaN: none completed)."""
    p99_jct_s: float
    gpu_hours: float
    """GPU-hours the team's jobs are charged (as the run's per-job figures)."""
    share_of_gpu_time: float
    """The team's part of all GPU-hours charged in the run."""
    quota_share: float
    """The team's quota as a part of the cluster's GPUs (0 without a teams file)."""
    num_completed: int = 0
    num_rounds_with_demand: int = 0
    """Rounds in which the team had active jobs."""
    num_rounds_below_guarantee: int = 0
    """Rounds in which it held fewer GPUs than ``min(quota, demand)`` (module docstring)."""
    max_shortfall_gpus: int = 0
    """The largest such gap, in GPUs."""


def guarantee_shortfalls(rounds: Sequence[RoundLog], team_of: Mapping[str, str],
                         teams: Teams | None) -> dict[str, tuple[int, int, int]]:
    """Team -> (rounds with demand, rounds below the guarantee, largest shortfall)."""
    out: dict[str, list[int]] = {}
    for log in rounds:
        held: Counter[str] = Counter()
        for job, gpus in log.gpus.items():
            held[team_of.get(job, "")] += gpus
        def quota(team: str) -> int:
            return teams[team].total_quota_gpus if teams is not None and team in teams else 0

        over = {team for team in held if held[team] > quota(team)}
        for team, demand in log.demand_gpus.items():
            entry = out.setdefault(team, [0, 0, 0])
            if demand <= 0:
                continue
            entry[0] += 1
            gap = min(quota(team), demand) - held[team] if over - {team} else 0
            if gap > 0:
                entry[1] += 1
                entry[2] = max(entry[2], gap)
    return {team: (a, b, c) for team, (a, b, c) in out.items()}


def team_records(result: SimulationResult, jcts: Mapping[str, float | None],
                 charged_gpu_s: Mapping[str, float], num_gpus: int) -> dict[str, TeamRecord]:
    """Team -> its figures; ``jcts`` and ``charged_gpu_s`` per job name (as the run's
    records say), ``num_gpus`` the cluster's GPUs."""
    team_of = {job.name: job.spec.team for job in result.jobs}
    total_s = sum(charged_gpu_s.values())
    rounds = guarantee_shortfalls(result.rounds, team_of, result.teams)
    records: dict[str, TeamRecord] = {}
    for team in (result.teams or Teams(())).with_teams_named(sorted(set(team_of.values()))):
        members = [name for name, t in team_of.items() if t == team.name]
        done = [float(j) for name in members if (j := jcts.get(name)) is not None]
        gpu_s = sum(charged_gpu_s.get(name, 0.0) for name in members)
        with_demand, below, gap = rounds.get(team.name, (0, 0, 0))
        records[team.name] = TeamRecord(
            num_jobs=len(members),
            avg_jct_s=float(np.mean(done)) if done else float("nan"),
            p99_jct_s=float(np.percentile(done, 99)) if done else float("nan"),
            gpu_hours=gpu_s / 3600.0,
            share_of_gpu_time=gpu_s / total_s if total_s > 0 else 0.0,
            quota_share=team.total_quota_gpus / num_gpus if num_gpus else 0.0,
            num_completed=len(done), num_rounds_with_demand=with_demand,
            num_rounds_below_guarantee=below, max_shortfall_gpus=gap)
    return records
