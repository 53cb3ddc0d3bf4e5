"""Issue 32's commands: ``pollux user add|ls|rm|token``, ``pollux teams`` and
``pollux ls --mine/--team``, against the in-process API (the connection replaced)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import pollux.cli.jobs as jobs_cli
import pollux.cli.users as users_cli
from pollux.cli.main import main
from pollux.client import PolluxClient, ServerAddress
from pollux.client.transport import Response
from pollux.service.http.api import create_app
from tests.service.service_builders import TEST_TOKEN, make_auth

with warnings.catch_warnings():  # starlette 1.0 asks for the httpx2 fork; httpx works
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

class AppTransport:
    """The client's requests sent to the in-process application."""

    def __init__(self, app_client: TestClient) -> None:
        self._app = app_client

    def request(self, method: str, path: str, *, json_body: Any = None,
                params: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> Response:
        answer = self._app.request(method, path, json=json_body, params=params,
                                   headers=headers)
        return Response(answer.status_code, answer.content)

    def close(self) -> None:
        self._app.close()


SPEC = {"name": "job", "command": ["true"], "working_dir": "/tmp", "max_replicas": 1}


@pytest.fixture
def as_token(make_service: Any, tmp_path: Path, monkeypatch) -> Any:
    """``as_token(token)``: the CLI's next commands talk to one in-process server with
    ``token`` (the server's by default)."""
    teams = tmp_path / "teams.yaml"
    teams.write_text("teams: {vision: {quota_gpus: 2}, nlp: {quota_gpus: 2}}\n")
    app = create_app(make_service(teams_file=str(teams)), make_auth())

    def use(token: str = TEST_TOKEN) -> None:
        def connect(args: Any) -> PolluxClient:
            client = PolluxClient(ServerAddress("http://testserver", token),
                                  transport=AppTransport(TestClient(app)))
            client._proven = True
            return client
        monkeypatch.setattr(jobs_cli, "connect", connect)
        monkeypatch.setattr(users_cli, "connect", connect)
    use()
    return use


def run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return str(capsys.readouterr().out)


def test_user_commands_and_per_team_listings(as_token, capsys):
    added = json.loads(run(capsys, "user", "add", "ann", "--team", "vision", "--team", "nlp",
                           "--json"))
    assert set(added) == {"name", "token"} and added["name"] == "ann"
    text = run(capsys, "user", "add", "bo", "--team", "nlp", "--team-admin")
    assert "shown once" in text and "pollux-user-" in text and "team admin" in text
    listed = json.loads(run(capsys, "user", "ls", "--json"))
    assert [(u["name"], u["teams"], u["team_admin"]) for u in listed] == [
        ("ann", ["vision", "nlp"], False), ("bo", ["nlp"], True)]
    assert "pollux-user-" not in json.dumps(listed)
    as_token(added["token"])
    run(capsys, "submit", "--name", "v", "--", "true")
    run(capsys, "submit", "--name", "n", "--team", "nlp", "--", "true")
    as_token()
    run(capsys, "submit", "--name", "s", "--team", "vision", "--", "true")
    as_token(added["token"])
    mine = json.loads(run(capsys, "ls", "--mine", "--json"))
    assert sorted((r["name"], r["team"]) for r in mine) == [("n", "nlp"), ("v", "vision")]
    vision = json.loads(run(capsys, "ls", "--team", "vision", "--json"))
    assert sorted((r["name"], r["owner"]) for r in vision) == [("s", None), ("v", "ann")]
    table = run(capsys, "ls")
    assert "owner" in table and "ann" in table
    teams = json.loads(run(capsys, "teams", "--json"))
    assert {t["team"]: (t["quota_gpus"], t["pending_gpus"], t["num_jobs"]) for t in teams} == {
        "vision": (2, 2.0, 2), "nlp": (2, 1.0, 1)}
    assert "borrowed" in run(capsys, "teams")
    assert main(["user", "ls"]) == 1  # a user may not list users
    assert "server's own account" in capsys.readouterr().err
    as_token()
    rotated = json.loads(run(capsys, "user", "token", "ann", "--json"))
    assert rotated["name"] == "ann" and rotated["token"] != added["token"]
    assert "removed user bo" in run(capsys, "user", "rm", "bo")
    assert main(["user", "rm", "bo"]) == 1
    assert "no user named 'bo'" in capsys.readouterr().err
