"""The job commands and ``pollux demo`` against a live server running the small
stand-in job (tests/backends/fake_job.py), and the submit flags/YAML merge."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from pollux.cli.main import build_parser, main
from pollux.errors import JobSpecError
from tests.service.e2e_helpers import EQUAL_SHARE, REPO, ServerProcess, wait_until

FAKE_JOB = str(Path(__file__).resolve().parents[1] / "backends" / "fake_job.py")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server(tmp_path: Path):
    process = ServerProcess(tmp_path / "data")
    yield process
    process.cleanup()


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_job_commands_against_a_live_server(server, capsys, tmp_path):
    server.start()
    where = ("--data-dir", str(server.data_dir))
    code, out = run_cli(capsys, "submit", *where, "--name", "short", "--max-replicas", "2",
                        "--", sys.executable, FAKE_JOB, "--steps", "30", "--step-s", "0.02")
    assert code == 0 and out.strip() == "submitted short-1"
    job_file = tmp_path / "long.yaml"
    job_file.write_text(f"name: long\ncommand: [{sys.executable}, {FAKE_JOB}, --steps, '5000']"
                        "\nmax_replicas: 2\nworking_dir: .\n")
    code, out = run_cli(capsys, "submit", *where, str(job_file), "--json")
    assert json.loads(out)["id"] == "long-2"
    code, out = run_cli(capsys, "logs", *where, "short-1", "-f", "--replica", "1",
                        "--poll-interval", "0.2")
    assert code == 0 and "rank 1 done" in out
    code, out = run_cli(capsys, "logs", *where, "short-1", "--replica", "1", "--tail", "1")
    assert code == 0 and out == "rank 1 done\n"  # lines, not bytes
    code, out = run_cli(capsys, "logs", *where, "short-1", "--replica", "1", "--tail", "50")
    assert code == 0 and out.startswith("=== pollux") and out.endswith("rank 1 done\n")
    wait_until(lambda: run_cli(capsys, "describe", *where, "long", "--json")[1].count(
        '"state": "Running"'), 30, "the long job to run")
    code, out = run_cli(capsys, "cancel", *where, "long-2")
    assert code == 0 and "long-2: Cancelling" in out
    wait_until(lambda: '"Cancelled"' in run_cli(capsys, "ls", *where, "--json")[1], 30,
               "the cancellation")
    rows = {r["id"]: r for r in json.loads(run_cli(capsys, "ls", *where, "--json")[1])}
    assert rows["short-1"]["state"] == "Succeeded" and rows["long-2"]["state"] == "Cancelled"
    code, out = run_cli(capsys, "describe", *where, "short-1")
    assert code == 0 and "all 2 replicas exited 0" in out
    assert "failures:    0 of 3 tolerated" in out
    code, out = run_cli(capsys, "describe", *where, "long-2")
    assert code == 0 and "Cancelling" in out and "Rescaling" not in out
    for row in rows.values():  # age: since submission; run time: first launch to the end
        assert row["age_s"] >= row["run_time_s"] > 0
    code, out = run_cli(capsys, "top", *where, "--iterations", "1")
    assert code == 0 and "node-1" in out and "long-2" in out
    code, out = run_cli(capsys, "ls", *where, "--active")
    assert code == 0 and "short-1" not in out
    # finished jobs past the newest N are left out on request (the server pages them)
    newest = json.loads(run_cli(capsys, "ls", *where, "--finished", "1", "--json")[1])
    assert [r["id"] for r in newest] == ["long-2"]
    with pytest.raises(SystemExit) as refused:
        main(["ls", *where, "--finished", "-1"])
    assert refused.value.code == 2
    assert "--finished -1: choose 0 to 10000" in capsys.readouterr().err
    assert main(["describe", *where, "nope"]) == 1  # a runtime failure
    assert "server said 404" in capsys.readouterr().err
    assert main(["submit", *where, "--max-replicas", "0", "--", "python", "x.py"]) == 2
    assert "max_replicas" in capsys.readouterr().err
    assert main(["submit", *where, "--", "no-such-program-xyz"]) == 2
    assert "command" in capsys.readouterr().err
    assert main(["submit", *where]) == 2  # no arguments: the usage, not a field's name
    err = capsys.readouterr().err
    assert err.startswith("usage: pollux submit") and "give a job YAML file" in err
    assert main(["logs", *where, "short-1", "--tail", "-1"]) == 2
    server.stop()


def test_demo_runs_end_to_end_with_a_stand_in_script(monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), str(REPO)]))
    code = main(["demo", "--script", FAKE_JOB, "--jobs", "2", "--stagger", "0.05",
                 "--policy", EQUAL_SHARE, "--interval", "1", "--timeout", "60"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "summary" in out and "digits-b-2" in out and "Succeeded" in out
    # piped (capsys is not a terminal): one line per job event as it happens
    assert " digits-a-1 Starting: launch 1: " in out and " digits-b-2 Succeeded: " in out
    assert "ended by SIGTERM" not in out


def test_demo_on_typed_virtual_nodes_launches_within_one_type(monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), str(REPO)]))
    code = main(["demo", "--script", FAKE_JOB, "--jobs", "2", "--stagger", "0.05",
                 "--virtual-nodes", "a:1x2,b:1x1", "--policy", "pollux", "--interval", "1",
                 "--timeout", "60"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "server on typed virtual nodes a:1x2,b:1x1" in out
    launches = [line for line in out.splitlines() if " Starting: launch " in line]
    assert launches and all(("on a-0 " in line and line.endswith("(GPU type a)"))
                            or ("on b-0 " in line and line.endswith("(GPU type b)"))
                            for line in launches), launches
    assert out.count("Succeeded") >= 2


def submit_args(*argv: str):
    return build_parser().parse_args(["submit", *argv])


def test_submit_flags_and_yaml_merge(tmp_path, monkeypatch):
    from pollux.cli.jobs import spec_from_args

    monkeypatch.chdir(tmp_path)
    spec = spec_from_args(submit_args("--max-replicas", "4", "--env", "SEED=3", "--gpu", "1",
                                      "--", "python", "scripts/train.py", "--lr", "0.1"))
    assert spec["name"] == "train" and spec["command"][-2:] == ["--lr", "0.1"]
    assert spec["working_dir"] == str(tmp_path) and spec["env"] == {"SEED": "3"}
    (tmp_path / "jobs").mkdir()
    yaml_file = tmp_path / "jobs" / "job.yaml"
    yaml_file.write_text("name: fromfile\ncommand: python t.py\nworking_dir: ..\n"
                         "max_replicas: 2\nresources: {cpu: 2}\n")
    spec = spec_from_args(submit_args(str(yaml_file), "--max-replicas", "3", "--memory", "1G"))
    assert spec["name"] == "fromfile" and spec["max_replicas"] == 3
    assert spec["working_dir"] == str(tmp_path)
    assert spec["resources"] == {"gpu": 1.0, "cpu": 2.0, "memory": 1e9}
    with pytest.raises(JobSpecError, match="env"):
        spec_from_args(submit_args("--env", "NOEQUALS", "--", "python", "t.py"))
    with pytest.raises(JobSpecError, match="command"):
        spec_from_args(submit_args("--name", "x"))
    huge = tmp_path / "huge.yaml"  # 400 digits: was OverflowError's traceback
    huge.write_text(f"name: huge\ncommand: python t.py\nworking_dir: .\nmax_replicas: "
                    f"{'9' * 400}\n")
    with pytest.raises(JobSpecError, match="max_replicas"):
        spec_from_args(submit_args(str(huge)))
    assert main(["submit", "--data-dir", str(tmp_path / "none"), str(huge)]) == 2
