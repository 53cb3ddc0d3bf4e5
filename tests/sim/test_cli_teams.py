"""Issue 32, ``pollux simulate --teams FILE`` and ``--partitioned`` from the command
line, on a six-job workload (seconds): the run record's per-team figures, the per-team
table, and bad teams files refused naming the field (exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pollux.cli.main import main
from tests.sim.test_hetero import SIA, needs_sia

TEAM_FIELDS = {"num_jobs", "avg_jct_s", "p99_jct_s", "gpu_hours", "share_of_gpu_time",
               "quota_share"}
TEAMS = "teams:\n  a: {quota_gpus: 4, weight: 1}\n  b: {quota_gpus: 4, weight: 2}\n"


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    """Six one-GPU jobs, three per team, 30 s apart."""
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size,team\n" + "".join(
        f"ncf-{i},{30 * i},ncf,1,32768,{'a' if i < 3 else 'b'}\n" for i in range(6)))
    return path


def simulate(workload: Path, teams_text: str, *extra: str) -> int:
    teams = workload.parent / "teams.yaml"
    teams.write_text(teams_text)
    return main(["simulate", str(workload), "--policy", "quota-tiresias", "--teams",
                 str(teams), "--processes", "1", *extra])


def test_simulate_teams_partitioned_records_and_prints_each_team(
        workload: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = workload.parent / "out.json"
    assert simulate(workload, TEAMS, "--nodes", "2", "--partitioned",
                    "--json", str(out)) == 0
    printed = capsys.readouterr().out
    runs = {run["policy"]: run for run in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"quota-tiresias", "quota-tiresias/partitioned"}
    for run in runs.values():
        assert set(run["teams"]) == {"a", "b"}
        for team in run["teams"].values():
            assert TEAM_FIELDS <= set(team)
            assert team["num_jobs"] == 3 and team["quota_share"] == 0.5
            assert 0 < team["avg_jct_s"] <= team["p99_jct_s"] and team["gpu_hours"] > 0
        assert sum(t["share_of_gpu_time"] for t in run["teams"].values()) == pytest.approx(1)
        assert sum(t["num_jobs"] for t in run["teams"].values()) == run["num_jobs"] == 6
    assert "per team" in printed
    rows = [line.split() for line in printed.splitlines() if " w " in line]
    named = {(cells[3], cells[5]) for cells in rows if len(cells) > 5}
    assert named == {(policy, team) for policy in runs for team in ("a", "b")}, printed


@pytest.mark.parametrize(("teams", "field", "fix"), [
    ("a: {quota_gpus: 6}\n  b: {quota_gpus: 4}", "teams.*.quota_gpus=10",
     "the cluster has 8"),
    ("a: {quota_gpus: {a100: 2}}\n  b: {quota_gpus: 2}", "teams.a.quota_gpus=",
     "the cluster has no GPU types"),
    ("a: {quota_gpus: 2, weight: -1}\n  b: {quota_gpus: 2}", "teams.a.weight=-1",
     "a weight is a finite number > 0"),
    ("a: {quota_gpus: 2, weight: .nan}\n  b: {quota_gpus: 2}", "teams.a.weight=",
     "a weight is a finite number > 0"),
    ("a: {quota_gpus: 2}", "team of job 'ncf-3'='b'", "not a team of the teams file"),
], ids=["quota above the cluster", "a type on an untyped cluster", "negative weight",
        "nan weight", "a workload team missing"])
def test_a_bad_teams_file_is_refused_naming_the_field(
        workload: Path, capsys: pytest.CaptureFixture[str], teams: str, field: str,
        fix: str) -> None:
    assert simulate(workload, f"teams:\n  {teams}\n", "--nodes", "2") == 2
    err = capsys.readouterr().err
    assert f"invalid {field}" in err and fix in err and "Traceback" not in err, err


@needs_sia
def test_a_gpu_type_the_cluster_lacks_is_refused(
        workload: Path, capsys: pytest.CaptureFixture[str]) -> None:
    teams = "teams:\n  a: {quota_gpus: {h100: 2}}\n  b: {quota_gpus: {aws: 2}}\n"
    assert simulate(workload, teams, "--cluster", "aws:6x4,dgx-ext:2x8,rtx:3x8",
                    "--traces", str(SIA / "traces")) == 2
    err = capsys.readouterr().err
    assert "invalid teams.a.quota_gpus.h100=2: the cluster has no GPU type 'h100'" in err
    assert "Traceback" not in err


def test_partitioned_needs_a_teams_file(workload: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(workload), "--policy", "tiresias", "--partitioned",
                 "--nodes", "2", "--processes", "1"]) == 2
    assert "private clusters need --teams FILE" in capsys.readouterr().err
