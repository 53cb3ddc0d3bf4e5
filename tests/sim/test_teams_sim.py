"""Teams in the simulator: the workload's team column, per-team run records, the
guarantee round by round, private clusters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pollux.errors import ConfigError, WorkloadError
from pollux.policies.registry import make_policy
from pollux.sim.generator import generate_workload, parse_team_shares
from pollux.sim.job import JobSpec
from pollux.sim.metrics import report, summarize_run
from pollux.sim.partition import merge_results, partition_configs, partition_workload
from pollux.sim.simulator import ClusterConfig, Simulator
from pollux.sim.workload import Workload, read_workload, write_workload
from pollux.teams import parse_teams
from tests.sim.fakes import ToyApplication

APPS = {"toy": ToyApplication(epochs=2, progress_per_epoch=400.0)}
CONFIG = ClusterConfig(num_nodes=2, gpus_per_node=4)
TEAMS = parse_teams({"teams": {"a": {"quota_gpus": 4}, "b": {"quota_gpus": 4}}})


def _workload(flood: int = 1) -> Workload:
    jobs = [JobSpec("a-0", 0.0, "toy", 1, 128, team="a"),
            JobSpec("a-1", 300.0, "toy", 1, 128, team="a")]
    jobs += [JobSpec(f"b-{i}", 0.0, "toy", 1, 128, team="b") for i in range(2 * flood)]
    return Workload("toy", tuple(jobs))


def test_the_team_column_round_trips_and_is_optional(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    write_workload(_workload(), path)
    assert path.read_text().splitlines()[0].endswith(",team")
    assert [job.team for job in read_workload(path).jobs] == ["a", "a", "b", "b"]
    plain = Workload("p", (JobSpec("x", 0.0, "toy", 1, 128),))
    write_workload(plain, path)
    assert "team" not in path.read_text() and read_workload(path).jobs[0].team == "default"
    path.write_text("name,time,application,num_replicas,batch_size,team\nx,0,toy,1,1,bad team\n")
    with pytest.raises(WorkloadError, match="field 'team'"):
        read_workload(path)


def test_generated_teams_leave_the_jobs_as_they_were() -> None:
    plain = generate_workload(30, 1.0, seed=3)
    teamed = generate_workload(30, 1.0, seed=3, teams=parse_team_shares("x:0.5,y:0.5"))
    assert [j.name for j in teamed.jobs] == [j.name for j in plain.jobs]
    assert {j.team for j in teamed.jobs} == {"x", "y"}
    with pytest.raises(ConfigError, match="TEAM:SHARE"):
        parse_team_shares("x:0,y:1")


def test_a_run_with_teams_reports_each_team_and_its_guarantee() -> None:
    """Team b floods the cluster with 4x its jobs: with teams, team a gets a larger part
    of the GPU time than team-blind Pollux gives it, and is short of min(quota, demand)
    in at most one round, by less than its quota (the policy's guarantee is bounded by
    what a's jobs would hold alone on its quota, which the record does not know)."""
    blind = summarize_run(Simulator(_workload(flood=4), APPS,
                                    make_policy("pollux", seed=0), CONFIG).run(), APPS)
    result = Simulator(_workload(flood=4), APPS, make_policy("pollux", seed=0), CONFIG,
                       teams=TEAMS).run()
    record = summarize_run(result, APPS)
    assert record.teams is not None and set(record.teams) == {"a", "b"}
    a = record.teams["a"]
    assert a.num_jobs == 2 and a.num_completed == 2 and a.quota_share == 0.5
    assert blind.teams is not None
    assert a.share_of_gpu_time > blind.teams["a"].share_of_gpu_time
    assert a.num_rounds_with_demand > 0 and a.num_rounds_below_guarantee <= 1
    assert a.max_shortfall_gpus < 4
    shares = [team.share_of_gpu_time for team in record.teams.values()]
    assert sum(shares) == pytest.approx(1.0)
    assert "teams" in report([record])["runs"][0]  # type: ignore[index]


def test_without_teams_the_record_has_no_teams() -> None:
    plain = Workload("toy", tuple(JobSpec(f"j{i}", 0.0, "toy", 1, 128) for i in range(2)))
    record = summarize_run(Simulator(plain, APPS, make_policy("pollux", seed=0), CONFIG).run(),
                           APPS)
    assert record.teams is None
    assert "teams" not in json.loads(json.dumps(report([record])))["runs"][0]


def test_private_clusters_run_each_team_on_its_quota() -> None:
    configs = partition_configs(CONFIG, TEAMS)
    assert {t: c.num_gpus for t, c in configs.items()} == {"a": 4, "b": 4}
    workloads = partition_workload(_workload(), TEAMS)
    results = {t: Simulator(w, APPS, make_policy("pollux", seed=0), configs[t]).run()
               for t, w in workloads.items()}
    for result in results.values():
        assert max(sum(r.gpus.values()) for r in result.rounds) <= 4
    merged = summarize_run(merge_results(results, _workload(), CONFIG, TEAMS, "p/partitioned"),
                           APPS)
    assert merged.num_completed == 4 and merged.teams is not None
    uneven = parse_teams({"teams": {"a": {"quota_gpus": 3}, "b": {"quota_gpus": 4}}})
    with pytest.raises(ConfigError, match="whole nodes"):
        partition_configs(CONFIG, uneven)


def test_a_job_of_a_team_not_in_the_file_is_refused() -> None:
    teams = parse_teams({"teams": {"a": {"quota_gpus": 4}}})
    with pytest.raises(ConfigError, match="choose from: a"):
        Simulator(_workload(), APPS, make_policy("pollux", seed=0), CONFIG, teams=teams).run()
