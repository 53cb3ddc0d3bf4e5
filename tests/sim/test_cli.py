from __future__ import annotations

import json
from pathlib import Path

import pytest

from pollux.cli.main import main

RUN_FIELDS = {"policy", "workload", "avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s",
              "num_jobs", "num_completed", "restarts_per_job", "gpu_utilization", "wall_s",
              "round_s", "jobs", "max_ftf", "p99_ftf", "unfair_fraction", "gpu_hours_per_job",
              "lower_bound_avg_jct_s"}


def test_simulate_writes_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    out = tmp_path / "out.json"
    code = main(["simulate", "--policy", "tiresias,optimus", "--jobs", "12", "--hours", "1",
                 "--nodes", "4", "--processes", "1", "--json", str(out),
                 "--plot", str(tmp_path / "plots")])
    assert code == 0
    printed = capsys.readouterr().out
    assert "tiresias" in printed and "optimus" in printed and "avg JCT" in printed
    report = json.loads(out.read_text())
    assert set(report) == {"runs", "summary"}
    assert len(report["runs"]) == 2
    for run in report["runs"]:
        assert RUN_FIELDS <= set(run)
        assert set(run["round_s"]) == {"median", "p99", "max"}
        assert run["num_jobs"] == len(run["jobs"]) == 12
        assert run["lower_bound_avg_jct_s"] > 0
        if run["num_completed"] == run["num_jobs"]:  # else the average is of those done
            assert run["lower_bound_avg_jct_s"] <= run["avg_jct_s"]
        assert {"name", "application", "submission_s", "completion_s", "jct_s",
                "restarts"} <= set(run["jobs"][0])
    assert set(report["summary"]) == {"tiresias", "optimus"}
    assert report["summary"]["tiresias"]["mean_avg_jct_s"] == report["runs"][0]["avg_jct_s"]
    names = {p.name for p in (tmp_path / "plots").iterdir()}
    assert "lower bound" in printed
    assert {"jct_cdf.png", "avg_jct.png", "timeline-tiresias-generated-12jobs-1h-seed0.png",
            "gpus-generated-12jobs-1h-seed0.png"} <= names


def test_simulate_json_to_stdout_is_pure_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--policy", "fifo", "--jobs", "4", "--hours", "0.5",
                 "--nodes", "2", "--processes", "1", "--json", "-"])
    captured = capsys.readouterr()
    assert code == 0 and json.loads(captured.out)["summary"].keys() == {"fifo"}
    assert "workload(s)" in captured.err


def test_unknown_policy_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "tiresas"]) == 2
    err = capsys.readouterr().err
    assert "unknown policy 'tiresas'; choose from:" in err
    assert "fifo, optimus" in err and "tiresias" in err


def test_workload_generate_then_simulate_and_bad_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.csv"
    assert main(["workload", "generate", "--jobs", "6", "--hours", "1", "--seed", "2",
                 "-o", str(path)]) == 0
    assert len(path.read_text().splitlines()) == 7
    assert main(["workload", "check", str(path)]) == 0
    assert main(["simulate", str(path), "--policy", "fifo", "--processes", "1"]) == 0
    bad = tmp_path / "bad.csv"
    bad.write_text("name,time,application,num_replicas,batch_size\na,0,resnet,1,32\n")
    capsys.readouterr()
    assert main(["simulate", str(bad), "--policy", "fifo"]) == 2
    assert f"{bad}:2: field 'application'" in capsys.readouterr().err
