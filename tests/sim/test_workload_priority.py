"""Issue 32, a job's ``priority`` in the simulator's workloads: an optional column (files
without it: every job 0, the file written as before), refused naming the column and the
line when it is not a whole number in [-100, 100], drawn by ``pollux workload generate
--priorities`` from a stream of its own, and carried to the job's ``JobInfo``."""

from __future__ import annotations

from pathlib import Path

import pytest

from pollux.cli.main import main
from pollux.errors import ConfigError, WorkloadError
from pollux.policies.quota_tiresias import QuotaTiresiasPolicy
from pollux.sim.generator import generate_workload, parse_priority_shares, parse_team_shares
from pollux.sim.job import JobSpec
from pollux.sim.simulator import ClusterConfig, Simulator
from pollux.sim.workload import Workload, read_workload, write_workload
from pollux.teams import parse_teams
from tests.sim.fakes import ToyApplication

HEADER = "name,time,application,num_replicas,batch_size"


def test_a_priority_column_parses_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text(f"{HEADER},team,priority\na,0,toy,1,8,x,3\nb,5,toy,1,8,x,\n"
                    "c,9,toy,1,8,y,-100\nd,9,toy,1,8,y,100.0\n")
    jobs = read_workload(path).jobs
    assert [(j.team, j.priority) for j in jobs] == [("x", 3), ("x", 0), ("y", -100),
                                                    ("y", 100)]
    copy = tmp_path / "copy.csv"
    write_workload(Workload("w", jobs), copy)
    assert copy.read_text().splitlines()[0] == f"{HEADER},team,priority"
    assert read_workload(copy).jobs == jobs


def test_without_the_column_every_job_has_priority_0_and_the_file_is_unchanged(
        tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    text = f"{HEADER}\na,0,toy,1,8\nb,5,toy,2,16\n"
    path.write_text(text)
    workload = read_workload(path)
    assert [j.priority for j in workload.jobs] == [0, 0]
    write_workload(workload, path)
    assert path.read_text().replace("\r\n", "\n") == text


@pytest.mark.parametrize("value", ["1.5", "high", "101", "-101", "nan", "inf", "1e9"])
def test_a_bad_priority_is_refused_naming_the_column_and_the_line(tmp_path: Path,
                                                                 value: str) -> None:
    path = tmp_path / "w.csv"
    path.write_text(f"{HEADER},priority\na,0,toy,1,8,0\nb,5,toy,1,8,{value}\n")
    with pytest.raises(WorkloadError) as info:
        read_workload(path)
    assert (info.value.field, info.value.line) == ("priority", 3)
    assert f"{path}:3: field 'priority'" in str(info.value) and "[-100, 100]" in str(info.value)


def test_generated_priorities_leave_the_jobs_and_their_teams_as_they_were() -> None:
    teams = parse_team_shares("x:0.5,y:0.5")
    plain = generate_workload(40, 1.0, seed=3, teams=teams)
    ranked = generate_workload(40, 1.0, seed=3, teams=teams,
                               priorities=parse_priority_shares("0:0.5,2:0.5"))
    assert [(j.name, j.submission_time_s, j.team) for j in ranked.jobs] == [
        (j.name, j.submission_time_s, j.team) for j in plain.jobs]
    assert {j.priority for j in ranked.jobs} == {0, 2}
    assert {j.priority for j in plain.jobs} == {0}
    assert ranked == generate_workload(40, 1.0, seed=3, teams=teams,
                                       priorities={0: 0.5, 2: 0.5})
    for bad in ("x:1", "0:0", "0:1,0:2", "101:1"):
        with pytest.raises(ConfigError, match="PRIORITY:SHARE"):
            parse_priority_shares(bad)


def test_pollux_workload_generate_priorities(tmp_path: Path, capsys) -> None:
    out = tmp_path / "w.csv"
    assert main(["workload", "generate", "--jobs", "20", "--hours", "1", "-o", str(out),
                 "--priorities=-1:0.5,1:0.5"]) == 0
    assert out.read_text().splitlines()[0] == f"{HEADER},priority"
    assert {j.priority for j in read_workload(out).jobs} == {-1, 1}
    plain = tmp_path / "plain.csv"
    assert main(["workload", "generate", "--jobs", "20", "--hours", "1", "-o", str(plain)]) == 0
    assert [line.rsplit(",", 1)[0] for line in out.read_text().splitlines()[1:]] == \
        plain.read_text().splitlines()[1:]
    capsys.readouterr()
    assert main(["workload", "generate", "--jobs", "20", "-o", str(out),
                 "--priorities", "urgent:1"]) == 2
    assert "--priorities" in capsys.readouterr().err


class PriorityRecorder(QuotaTiresiasPolicy):
    """quota-tiresias, recording each job's priority and team in every round."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, tuple[str, int]] = {}

    def optimize_teams(self, jobs, nodes, previous_allocations, teams):
        self.seen.update({job.name: (job.team, job.priority) for job in jobs})
        return super().optimize_teams(jobs, nodes, previous_allocations, teams)


def test_a_jobs_priority_reaches_the_policy() -> None:
    apps = {"toy": ToyApplication(epochs=1, progress_per_epoch=100.0)}
    jobs = (JobSpec("a", 0.0, "toy", 1, 128, team="x", priority=5),
            JobSpec("b", 0.0, "toy", 1, 128, team="x"),
            JobSpec("c", 0.0, "toy", 1, 128, team="y", priority=-2))
    policy = PriorityRecorder()
    Simulator(Workload("w", jobs), apps, policy, ClusterConfig(num_nodes=1, gpus_per_node=4),
              teams=parse_teams({"teams": {"x": {"quota_gpus": 2}, "y": {"quota_gpus": 2}}})
              ).run()
    assert policy.seen == {"a": ("x", 5), "b": ("x", 0), "c": ("y", -2)}
