"""Issue 32, a job's ``priority`` in the service: part of the job spec (a whole number in
[-100, 100], default 0; ``pollux submit --priority N``), checked at the boundary, stored
with the spec, and carried to the job's ``JobInfo`` in every round."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from pollux.cli.main import build_parser, main
from pollux.errors import JobSpecError
from pollux.service.http.api import create_app
from tests.service.service_builders import AUTH_HEADERS, make_auth
from tests.service.service_test_policies import EqualSharePolicy

with warnings.catch_warnings():  # starlette 1.0 asks for the httpx2 fork; httpx works
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

TEAMS = "teams:\n  a: {quota_gpus: 2}\n  b: {quota_gpus: 2}\n"


def spec(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": ["true"], "working_dir": "/tmp", **fields}


class PriorityRecorder(EqualSharePolicy):
    """Equal shares, recording each job's team and priority in every round."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, tuple[str, int]] = {}

    def optimize_teams(self, jobs, nodes, previous_allocations, teams):
        self.seen.update({job.name: (job.team, job.priority) for job in jobs})
        return self.optimize(jobs, nodes, previous_allocations)


@pytest.fixture
def service(make_service: Any, tmp_path: Path) -> Any:
    path = tmp_path / "teams.yaml"
    path.write_text(TEAMS)
    return make_service(teams_file=str(path))


def test_a_submitted_priority_reaches_the_policy(service):
    recorder = PriorityRecorder()
    service.allocator.policy = recorder
    with TestClient(create_app(service, make_auth()), headers=AUTH_HEADERS) as client:
        high = client.post("/api/jobs", json=spec("high", priority=7), params={"team": "a"})
        plain = client.post("/api/jobs", json=spec("plain"), params={"team": "a"})
        low = client.post("/api/jobs", json=spec("low", priority=-3.0), params={"team": "b"})
        assert [r.status_code for r in (high, plain, low)] == [201, 201, 201]
        service.allocator.tick()
        assert recorder.seen == {high.json()["id"]: ("a", 7), plain.json()["id"]: ("a", 0),
                                 low.json()["id"]: ("b", -3)}
        assert client.get(f"/api/jobs/{high.json()['id']}").json()["spec"]["priority"] == 7


@pytest.mark.parametrize("value", [101, -101, 1.5, "1", True, 10**400])
def test_a_bad_priority_is_refused_naming_the_field(service, value):
    with TestClient(create_app(service, make_auth()), headers=AUTH_HEADERS) as client:
        response = client.post("/api/jobs", json=spec("x", priority=value))
    assert response.status_code == 422 and response.json()["field"] == "priority", \
        response.text


def test_pollux_submit_priority(tmp_path, capsys, monkeypatch):
    from pollux.cli.jobs import spec_from_args

    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["submit", "--priority", "5", "--", "python", "t.py"])
    assert spec_from_args(args)["priority"] == 5
    args = build_parser().parse_args(["submit", "--", "python", "t.py"])
    assert spec_from_args(args)["priority"] == 0
    with pytest.raises(JobSpecError, match="priority"):
        spec_from_args(build_parser().parse_args(["submit", "--priority", "101", "--", "x"]))
    assert main(["submit", "--data-dir", str(tmp_path / "none"), "--priority", "-101",
                 "--", "python", "t.py"]) == 2
    assert "priority=-101: must be between -100 and 100" in capsys.readouterr().err


def test_pollux_describe_shows_a_priority(service, capsys, monkeypatch):
    """``pollux describe`` names a job's priority beside its replica bounds (none for 0)."""
    import contextlib

    from pollux.cli import jobs

    ids = [service.submit(spec(name, **fields), team="a")["id"]
           for name, fields in (("ranked", {"priority": -4}), ("plain", {}))]

    class InProcess:
        def job(self, ref: str) -> dict[str, Any]:
            return service.describe(ref)

    monkeypatch.setattr(jobs, "connect", lambda args: contextlib.nullcontext(InProcess()))
    lines = {}
    for job_id in ids:
        assert main(["describe", job_id]) == 0
        lines[job_id] = next(line for line in capsys.readouterr().out.splitlines()
                             if line.startswith("replicas:"))
    assert lines == {ids[0]: "replicas:    1..1 (preemptible: True, priority -4)",
                     ids[1]: "replicas:    1..1 (preemptible: True)"}
