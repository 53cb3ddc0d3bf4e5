"""Private clusters (``pollux simulate --partitioned``): each team alone on nodes of its
quota, the baseline that sharing must beat.

The cluster is cut into one cluster per team: on each GPU type, ``quota / GPUs per node``
whole nodes of that type (a quota must be a whole number of nodes; a team without quota
is refused: a private cluster of no GPUs runs none of its jobs). Each team's jobs run
there under a fresh instance of the same policy, team-blind (one team per cluster); the
runs' jobs and rounds are then put together as one run of the whole cluster, so its
records (per job, per team, the cluster's) compare with a shared run's directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pollux.cluster_spec import ClusterSpec, NodeGroup
from pollux.errors import ConfigError
from pollux.sim.config import ClusterConfig
from pollux.sim.job import JobSpec
from pollux.sim.simulator import RoundLog, SimulationResult
from pollux.sim.workload import Workload
from pollux.teams import Teams

__all__ = ["merge_results", "partition_configs", "partition_workload"]


def partition_configs(config: ClusterConfig, teams: Teams) -> dict[str, ClusterConfig]:
    """Team -> the cluster of its quota (module docstring); quotas are checked to fit."""
    spec = config.spec
    teams.check_cluster(spec)
    out: dict[str, ClusterConfig] = {}
    for team in teams:
        groups = []
        for group in spec.groups:
            quota = team.quota(group.gpu_type)
            if quota % group.gpus_per_node:
                where = "" if config.cluster is None else f" of type {group.gpu_type!r}"
                raise ConfigError(f"teams.{team.name}.quota_gpus", quota,
                                  f"--partitioned gives each team whole nodes: make the "
                                  f"quota{where} a multiple of {group.gpus_per_node} GPUs")
            if quota:
                groups.append(NodeGroup(group.gpu_type, quota // group.gpus_per_node,
                                        group.gpus_per_node))
        if not groups:
            raise ConfigError(f"teams.{team.name}.quota_gpus", 0, "--partitioned needs a "
                              "quota for every team (a private cluster of 0 GPUs runs "
                              "none of its jobs)")
        if config.cluster is None:
            out[team.name] = replace(config, num_nodes=groups[0].num_nodes)
        else:
            out[team.name] = replace(config, cluster=ClusterSpec(tuple(groups)))
    return out


def partition_workload(workload: Workload, teams: Teams) -> dict[str, Workload]:
    """Team -> its jobs (every team of ``teams``; a job's team must be one of them)."""
    jobs: dict[str, list[JobSpec]] = {name: [] for name in teams.names}
    for job in workload.jobs:
        jobs[teams.team_of(job.team, f"team of job {job.name!r}").name].append(job)
    return {name: Workload(f"{workload.name}[{name}]", tuple(items))
            for name, items in jobs.items()}


def merge_results(results: Mapping[str, SimulationResult], workload: Workload,
                  config: ClusterConfig, teams: Teams, policy: str) -> SimulationResult:
    """The teams' private runs as one run of the whole cluster (jobs in workload order,
    rounds side by side: each private run has the same round times from 0)."""
    by_name = {job.name: job for result in results.values() for job in result.jobs}
    jobs = tuple(by_name[job.name] for job in workload.jobs)
    rounds = []
    for i in range(max(len(result.rounds) for result in results.values())):
        present = [result.rounds[i] for result in results.values() if i < len(result.rounds)]
        rounds.append(RoundLog(present[0].time_s, sum(r.num_active for r in present),
                               {job: n for r in present for job, n in r.gpus.items()},
                               sum(r.policy_s for r in present)))
    first = next(iter(results.values()))
    return replace(first, policy=policy, workload=workload.name, config=config, jobs=jobs,
                   rounds=tuple(rounds), wall_s=sum(r.wall_s for r in results.values()),
                   gpu_types={k: v for r in results.values() for k, v in r.gpu_types.items()},
                   teams=teams)

