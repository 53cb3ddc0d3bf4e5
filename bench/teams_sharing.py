"""Sharing incentive and isolation between teams: ``pollux`` with teams beside private
clusters (``--partitioned``) and the Kueue-like ``quota-tiresias``.

    python bench/teams_sharing.py --cases generated --seeds 0,1,2 --jobs 20,40,80,160
    python bench/teams_sharing.py --cases paper --paper ../shared/pollux-artifact
    python bench/teams_sharing.py --cases philly --sia ../shared/sia-artifact
    python bench/teams_sharing.py --cases isolation

Teams: vision, nlp, speech with half, 30% and 20% of the jobs (``generated``: drawn by
``pollux workload generate --teams``; ``paper``/``philly``: by a seeded hash of each
job's name) and quotas of whole nodes (16 x 4 GPUs: 32, 16, 16; the typed Philly cluster
aws:6x4,dgx-ext:2x8,rtx:3x8: a part of every type). Every workload runs under
``pollux`` with the teams, under ``pollux/partitioned`` (each team alone on its quota)
and under ``quota-tiresias``. Printed side by side: each team's average JCT shared /
private (target: <= 1.02 in every workload), the cluster's average JCT pooled over every
job of every workload (target: pollux <= 0.75x private and below quota-tiresias), and,
for ``isolation`` (speech submits 4x its jobs), the rounds in which another team held
less than its guarantee while a team borrowed (target: 0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pollux.cluster_spec import parse_cluster_spec
from pollux.policies.registry import make_policy
from pollux.sim.generator import generate_workload
from pollux.sim.metrics import RunRecord
from pollux.sim.runner import RunTask, load_applications, run_tasks
from pollux.sim.semantics import SIA_ARTIFACT
from pollux.sim.simulator import ClusterConfig, RoundLog, Simulator
from pollux.sim.workload import Workload, read_workload, workload_files
from pollux.teams import Teams, parse_teams

SHARES = {"vision": 0.5, "nlp": 0.3, "speech": 0.2}
UNTYPED_TEAMS = parse_teams({"teams": {"vision": {"quota_gpus": 32},
                                       "nlp": {"quota_gpus": 16},
                                       "speech": {"quota_gpus": 16}}})
PHILLY = "aws:6x4,dgx-ext:2x8,rtx:3x8"
TYPED_TEAMS = parse_teams({"teams": {
    "vision": {"quota_gpus": {"aws": 12, "dgx-ext": 8, "rtx": 8}},
    "nlp": {"quota_gpus": {"aws": 8, "rtx": 8}},
    "speech": {"quota_gpus": {"aws": 4, "dgx-ext": 8, "rtx": 8}}}})
POLICIES = (("pollux", False), ("pollux", True), ("quota-tiresias", False))
TEAM_BLIND = "pollux/team-blind"
"""``pollux`` without the teams file: what sharing gains with no guarantee at all (a bound
on the pooled JCT any policy that keeps the guarantees can reach, with this optimizer)."""


def hashed_teams(workload: Workload, seed: int) -> Workload:
    """Teams by a seeded hash of each job's name, in the shares of :data:`SHARES`."""
    names, cuts = list(SHARES), np.cumsum(list(SHARES.values()))
    jobs = []
    for job in workload.jobs:
        digest = hashlib.sha256(f"{seed}:{job.name}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2.0**64
        jobs.append(replace(job, team=names[int(np.searchsorted(cuts, u, side="right"))]))
    return Workload(workload.name, tuple(jobs))


def flooded(workload: Workload, team: str, times: int) -> Workload:
    """``workload`` with every job of ``team`` submitted ``times`` times (copies a second
    apart per copy)."""
    extra = [replace(job, name=f"{job.name}-copy{k}", submission_time_s=job.submission_time_s
                     + k) for k in range(1, times) for job in workload.jobs if job.team == team]
    jobs = sorted(workload.jobs + tuple(extra), key=lambda j: (j.submission_time_s, j.name))
    return Workload(f"{workload.name}-{team}x{times}", tuple(jobs))


def tasks_for(workloads: list[Workload], config: ClusterConfig, teams: Teams,
              traces: str | None, isolation: bool = False, blind: bool = False
              ) -> list[RunTask]:
    """Every workload under :data:`POLICIES` (``isolation``: ``pollux`` and
    ``quota-tiresias`` only); ``blind``: also ``pollux`` without teams (its record is
    relabelled :data:`TEAM_BLIND` by :func:`labelled`)."""
    policies = (("pollux", False), ("quota-tiresias", False)) if isolation else POLICIES
    tasks = [RunTask(policy, workload, config, traces, teams=teams, partitioned=partitioned)
             for workload in workloads for policy, partitioned in policies]
    return tasks + [RunTask("pollux", w, config, traces) for w in workloads if blind]


def labelled(task: RunTask, record: RunRecord) -> RunRecord:
    """The record named :data:`TEAM_BLIND` where its task ran ``pollux`` without teams."""
    return replace(record, policy=TEAM_BLIND) if task.teams is None else record


def side_by_side(records: list[RunRecord], title: str) -> dict[str, Any]:
    """Print each team's JCT ratio shared / private per workload and the pooled figures."""
    by = {(r.workload, r.policy): r for r in records}
    workloads = list(dict.fromkeys(r.workload for r in records))
    print(f"\n## {title}\n")
    print("| workload | team | pollux avg JCT (s) | private (s) | ratio | quota-tiresias (s) "
          "| rounds below guarantee (pollux) |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    out: dict[str, Any] = {"workloads": {}}
    for w in workloads:
        shared, private = by.get((w, "pollux")), by.get((w, "pollux/partitioned"))
        quota = by.get((w, "quota-tiresias"))
        for team, fig in (shared.teams or {}).items() if shared else ():
            priv = private.teams[team] if private and private.teams else None
            ratio = fig.avg_jct_s / priv.avg_jct_s if priv and priv.avg_jct_s else float("nan")
            worst = max(worst, ratio) if np.isfinite(ratio) else worst
            q = quota.teams[team].avg_jct_s if quota and quota.teams else float("nan")
            print(f"| {w} | {team} | {fig.avg_jct_s:,.0f} | "
                  f"{priv.avg_jct_s if priv else float('nan'):,.0f} | {ratio:.3f} | {q:,.0f} | "
                  f"{fig.num_rounds_below_guarantee}/{fig.num_rounds_with_demand} |")
            out["workloads"].setdefault(w, {})[team] = {"shared": fig.avg_jct_s, "ratio": ratio}
    pooled = {}
    for policy in dict.fromkeys(r.policy for r in records):
        jcts = [j.jct_s for r in records if r.policy == policy for j in r.jobs
                if j.jct_s is not None]
        done = sum(r.num_completed for r in records if r.policy == policy)
        total = sum(r.num_jobs for r in records if r.policy == policy)
        pooled[policy] = float(np.mean(jcts)) if jcts else float("nan")
        print(f"\npooled avg JCT {policy}: {pooled[policy]:,.0f} s ({done}/{total} done)")
    if "pollux/partitioned" in pooled and "pollux" in pooled:
        print(f"pollux / private: {pooled['pollux'] / pooled['pollux/partitioned']:.3f} "
              f"(target <= 0.75); worst team ratio {worst:.3f} (target <= 1.02)")
    if "pollux/partitioned" in pooled and TEAM_BLIND in pooled:
        print(f"team-blind pollux / private: "
              f"{pooled[TEAM_BLIND] / pooled['pollux/partitioned']:.3f}")
    out.update(pooled=pooled, worst_team_ratio=worst)
    return out


class _GuaranteeLog(Simulator):
    """A simulation that also keeps, per round, the guarantees ``pollux`` gave each team
    (``PolicyDecision.info["team_guarantee_gpus"]``: ``min(quota, demand)`` bounded by
    what the team's private cluster would hold now)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guarantees: list[dict[str, float]] = []
        self._last: dict[str, float] = {}
        ask = self.policy.optimize_teams

        def recorded(*call: Any) -> Any:
            decision = ask(*call)
            self._last = dict(decision.info.get("team_guarantee_gpus", {}))
            return decision

        self.policy.optimize_teams = recorded  # type: ignore[method-assign]

    def _round(self, jobs: list[Any], now: float) -> RoundLog:
        self._last = {}
        log = super()._round(jobs, now)
        self.guarantees.append(self._last)
        return log


def private_guarantee_rounds(workload: Workload, config: ClusterConfig, teams: Teams
                             ) -> dict[str, tuple[int, int, int]]:
    """Team -> (rounds with demand, rounds it held fewer GPUs than ``pollux`` guaranteed
    it while another team held more than its quota, largest gap): the isolation measure
    with the guarantee of the policy (what the team's private cluster would hold now)
    in place of ``min(quota, demand)``."""
    sim = _GuaranteeLog(workload, load_applications(None, config), make_policy("pollux"),
                        config, None, None, None, "measured", teams)
    result = sim.run()
    team_of = {job.name: job.spec.team for job in result.jobs}
    out: dict[str, list[int]] = {}
    for log, guarantee in zip(result.rounds, sim.guarantees):
        held: dict[str, int] = {}
        for job, gpus in log.gpus.items():
            held[team_of[job]] = held.get(team_of[job], 0) + gpus
        over = {t for t, h in held.items() if h > teams[t].total_quota_gpus}
        for team, demand in log.demand_gpus.items():
            entry = out.setdefault(team, [0, 0, 0])
            if demand <= 0:
                continue
            entry[0] += 1
            gap = guarantee.get(team, 0.0) - held.get(team, 0) if over - {team} else 0.0
            if gap > 1e-6:
                entry[1] += 1
                entry[2] = max(entry[2], int(np.ceil(gap)))
    return {t: (a, b, c) for t, (a, b, c) in out.items()}


def isolation_report(records: list[RunRecord]) -> None:
    print("\n## isolation: speech submits 4x its jobs\n")
    print("| workload | policy | team | rounds below guarantee | largest gap (GPUs) "
          "| GPU time | quota |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        for team, fig in (r.teams or {}).items():
            print(f"| {r.workload} | {r.policy} | {team} | {fig.num_rounds_below_guarantee}/"
                  f"{fig.num_rounds_with_demand} | {fig.max_shortfall_gpus} | "
                  f"{fig.share_of_gpu_time:.1%} | {fig.quota_share:.1%} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="generated,isolation",
                        help="generated, paper, philly, isolation (comma-separated)")
    parser.add_argument("--seeds", default="0", help="generated workloads' seeds")
    parser.add_argument("--jobs", default="20,40,80",
                        help="jobs per generated workload (light to 2x saturated)")
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--paper", default="../shared/pollux-artifact")
    parser.add_argument("--sia", default="../shared/sia-artifact")
    parser.add_argument("--limit", type=int, default=8, help="paper/philly workloads to run")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", default=None, help="write every record here")
    parser.add_argument("--team-blind", action="store_true",
                        help="also run pollux without the teams file (the pooled bound)")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    sizes = [int(n) for n in args.jobs.split(",")]
    untyped = ClusterConfig(num_nodes=16, gpus_per_node=4)
    everything: list[RunRecord] = []
    summary: dict[str, Any] = {}

    def run(tasks: list[RunTask]) -> list[RunRecord]:
        records = [labelled(t, o.record) for t, o in zip(tasks, run_tasks(tasks,
                                                                          args.processes))]
        everything.extend(records)
        return records

    if "generated" in cases:
        workloads = [generate_workload(n, args.hours, seed, teams=SHARES,
                                       name=f"gen-{n}jobs-seed{seed}")
                     for seed in seeds for n in sizes]
        summary["generated"] = side_by_side(run(tasks_for(workloads, untyped, UNTYPED_TEAMS,
                                                          None, blind=args.team_blind)), "generated, 16 x 4 GPUs")
    if "paper" in cases:
        files = workload_files([Path(args.paper) / "workloads"])[: args.limit]
        workloads = [hashed_teams(read_workload(f), 0) for f in files]
        summary["paper"] = side_by_side(run(tasks_for(
            workloads, untyped, UNTYPED_TEAMS, str(Path(args.paper) / "traces"),
            blind=args.team_blind)),
            "the paper's workloads, 16 x 4 GPUs")
    if "philly" in cases:
        files = workload_files([Path(args.sia) / "workloads" / "philly"])[: args.limit]
        typed = ClusterConfig(cluster=parse_cluster_spec(PHILLY), semantics=SIA_ARTIFACT)
        workloads = [hashed_teams(read_workload(f), 0) for f in files]
        summary["philly"] = side_by_side(run(tasks_for(
            workloads, typed, TYPED_TEAMS, str(Path(args.sia) / "traces"),
            blind=args.team_blind)),
            f"Sia's Philly workloads on {PHILLY}")
    if "isolation" in cases:
        base = generate_workload(sizes[min(1, len(sizes) - 1)], args.hours, seeds[0],
                                 teams=SHARES, name="iso")
        records = run(tasks_for([flooded(base, "speech", 4)], untyped, UNTYPED_TEAMS, None,
                                isolation=True))
        isolation_report(records)
        print("\nwith pollux's own guarantee (what the team's private cluster would hold "
              "now) in place of min(quota, demand):\n")
        print("| team | rounds below its guarantee | largest gap (GPUs) |\n|---|---|---|")
        for team, (rounds, below, gap) in private_guarantee_rounds(
                flooded(base, "speech", 4), untyped, UNTYPED_TEAMS).items():
            print(f"| {team} | {below}/{rounds} | {gap} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": [
            r.to_dict() for r in everything]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
