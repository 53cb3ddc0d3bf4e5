"""Issue 32, the service's per-team views: ``/api/teams`` (quota, in use, lent, borrowed,
pending GPUs), the per-team gauges of ``/metrics``, a teams file's names enforced at
submission, and each team's Slurm account reaching its jobs' launches."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pollux.backends.base import LaunchRequest
from pollux.backends.slurm.script import batch_options
from pollux.service.http.api import create_app
from pollux.service.http.team_usage import team_usage
from pollux.service.storage.states import JobState
from pollux.teams import parse_teams
from tests.service.service_builders import AUTH_HEADERS, make_auth, make_spec
from tests.service.service_test_policies import EqualSharePolicy

with warnings.catch_warnings():  # starlette 1.0 asks for the httpx2 fork; httpx works
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

TEAMS = """teams:
  vision: {quota_gpus: 1, weight: 1, slurm_account: vision-lab}
  nlp:    {quota_gpus: 3, weight: 2}
"""


def spec(name: str, max_replicas: int, min_replicas: int = 1) -> dict[str, Any]:
    return {"name": name, "command": ["true"], "working_dir": "/tmp",
            "min_replicas": min_replicas, "max_replicas": max_replicas}


@pytest.fixture
def teams_service(make_service: Any, tmp_path: Path) -> Any:
    path = tmp_path / "teams.yaml"
    path.write_text(TEAMS)
    return make_service(teams_file=str(path))


@pytest.fixture
def admin(teams_service: Any) -> Any:
    with TestClient(create_app(teams_service, make_auth()), headers=AUTH_HEADERS) as client:
        yield client


def test_team_usage_counts_quota_in_use_lent_borrowed_and_pending(teams_service, admin,
                                                                  fake_backend):
    token = admin.post("/api/users", json={"name": "ann", "teams": ["vision"]}).json()["token"]
    ann = TestClient(admin.app, headers={"Authorization": f"Bearer {token}"})
    assert ann.post("/api/jobs", json=spec("wide", 3)).status_code == 201  # into vision
    teams_service.allocator.tick()  # the fake cluster: 2 nodes x 2 GPUs, one job: 3 GPUs
    assert admin.post("/api/jobs", json=spec("queued", 4, 4), params={"team": "nlp"}
                      ).status_code == 201
    rows = {row["team"]: row for row in ann.get("/api/teams").json()["teams"]}
    held = len(fake_backend.launches[-1].allocation)
    assert held >= 2
    assert rows["vision"] == {
        "team": "vision", "quota_gpus": 1, "weight": 1.0, "in_use_gpus": float(held),
        "lent_gpus": 0.0, "borrowed_gpus": float(held - 1), "pending_gpus": 0.0,
        "num_jobs": 1, "slurm_account": "vision-lab", "by_gpu_type": {}}
    assert rows["nlp"]["in_use_gpus"] == 0.0 and rows["nlp"]["pending_gpus"] == 4.0
    assert rows["nlp"]["lent_gpus"] == float(held - 1)  # nlp's idle quota, vision borrows
    metrics = ann.get("/metrics").text
    assert f'pollux_team_gpus_borrowed{{team="vision"}} {float(held - 1)}' in metrics
    assert 'pollux_team_quota_gpus{team="nlp"} 3.0' in metrics
    assert 'pollux_team_gpus_pending{team="nlp"} 4.0' in metrics


class TeamRecorder(EqualSharePolicy):
    """Equal shares, recording the teams each round is asked about."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds: list[tuple[dict[str, str], tuple[str, ...]]] = []

    def optimize_teams(self, jobs, nodes, previous_allocations, teams):
        self.rounds.append(({job.name: job.team for job in jobs}, teams.names))
        return self.optimize(jobs, nodes, previous_allocations)


def test_each_jobs_team_reaches_the_policy(teams_service, admin):
    """The policy gets each job's team and the teams file; a job of no team of the file
    (the server's own, without a team) is in a team of no quota, not a failed round."""
    recorder = TeamRecorder()
    teams_service.allocator.policy = recorder
    token = admin.post("/api/users", json={"name": "ann", "teams": ["nlp"]}).json()["token"]
    TestClient(admin.app, headers={"Authorization": f"Bearer {token}"}).post(
        "/api/jobs", json=spec("n", 1))
    admin.post("/api/jobs", json=spec("own", 1))
    teams_service.allocator.tick()
    assert recorder.rounds[-1] == ({"n-1": "nlp", "own-2": "default"},
                                   ("vision", "nlp", "default"))
    assert all(j.state.value == "Starting" for j in teams_service.store.list_jobs())


def test_lent_and_borrowed_gpus_add_up(store):
    teams = parse_teams({"teams": {"a": {"quota_gpus": 4}, "b": {"quota_gpus": 2},
                                   "c": {"quota_gpus": 2}}})
    records = [store.add_job(make_spec(f"j{i}", max_replicas=1), 0.0, team="a")
               for i in range(2)]
    usage = {u.team: u for u in team_usage(records, teams)}
    assert sum(u.lent_gpus for u in usage.values()) == sum(
        u.borrowed_gpus for u in usage.values()) == 0.0
    assert usage["a"].pending_gpus == 2.0 and usage["a"].num_jobs == 2


def test_typed_quotas_lend_and_borrow_per_gpu_type(store):
    """A team over its T4 quota borrows T4s even with A100 quota to spare."""
    teams = parse_teams({"teams": {"a": {"quota_gpus": {"t4": 2, "a100": 2}},
                                   "b": {"quota_gpus": {"t4": 2}}}})
    record = store.add_job(make_spec("wide", max_replicas=4), 0.0, team="a")
    running = replace(record, state=JobState.RUNNING, allocation=("n1",) * 3, gpu_type="t4")
    usage = {u.team: u for u in team_usage([running], teams)}
    assert (usage["a"].in_use_gpus, usage["a"].borrowed_gpus, usage["a"].lent_gpus) == (
        3.0, 1.0, 0.0)
    assert usage["b"].lent_gpus == 1.0 and usage["a"].quota_gpus == 4
    assert usage["a"].by_gpu_type == {
        "t4": {"quota_gpus": 2.0, "in_use_gpus": 3.0, "lent_gpus": 0.0, "borrowed_gpus": 1.0},
        "a100": {"quota_gpus": 2.0, "in_use_gpus": 0.0, "lent_gpus": 0.0,
                 "borrowed_gpus": 0.0}}


def test_a_teams_file_names_the_teams_a_job_may_go_into(teams_service, admin):
    refused = admin.post("/api/jobs", json=spec("x", 1), params={"team": "speech"})
    assert refused.status_code == 403 and refused.json()["field"] == "team"
    bad_user = admin.post("/api/users", json={"name": "bo", "teams": ["speech"]})
    assert bad_user.status_code == 422 and bad_user.json()["field"] == "team"
    assert "vision, nlp" in bad_user.json()["detail"]


def test_a_teams_slurm_account_reaches_its_launches(teams_service, admin, fake_backend):
    token = admin.post("/api/users", json={"name": "ann", "teams": ["vision", "nlp"]}
                       ).json()["token"]
    ann = TestClient(admin.app, headers={"Authorization": f"Bearer {token}"})
    assert ann.post("/api/jobs", json=spec("v", 1)).json()["team"] == "vision"
    assert ann.post("/api/jobs", json=spec("n", 1), params={"team": "nlp"}
                    ).json()["team"] == "nlp"
    teams_service.allocator.tick()
    accounts = {request.job_id: request.account for request in fake_backend.launches}
    assert accounts == {"v-1": "vision-lab", "n-2": None}
    request = fake_backend.launches[0]
    assert "--account=vision-lab" in batch_options(request, "x", None, "default-acct")
    other = LaunchRequest(**{**request.__dict__, "account": None})
    assert "--account=default-acct" in batch_options(other, "x", None, "default-acct")
