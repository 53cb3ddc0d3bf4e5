"""How the CLI prints when piped: whole lines per job event, no truncated tables."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from pollux.cli import jobs as jobs_cli
from pollux.cli.output import EventFeed, make_console


class FakeClient:
    """Jobs whose events grow between calls, like a live server."""

    def __init__(self) -> None:
        self.events: dict[str, list[dict[str, Any]]] = {"a-1": [], "b-2": []}

    def log(self, job_id: str, when: float, kind: str, message: str) -> None:
        self.events[job_id].append({"time": when, "kind": kind, "message": message})

    def jobs(self) -> list[dict[str, Any]]:
        return [{"id": job_id} for job_id in self.events]

    def job(self, ref: str) -> dict[str, Any]:
        return {"id": ref, "events": list(self.events[ref])}


def test_event_feed_prints_each_event_once_in_time_order() -> None:
    client = FakeClient()
    feed = EventFeed()
    client.log("b-2", 2.0, "Pending", "submitted")
    client.log("a-1", 1.0, "Pending", "submitted")
    first = feed.new_events(client)
    assert [line.split(" ", 1)[1] for line in first] == ["a-1 Pending: submitted",
                                                          "b-2 Pending: submitted"]
    assert feed.new_events(client) == []
    client.log("a-1", 3.0, "Rescaling", "rescale 2 -> 1 replicas: because")
    (line,) = feed.new_events(client)
    assert line.endswith("a-1 Rescaling: rescale 2 -> 1 replicas: because")


def test_tables_are_not_truncated_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    row = {"id": "a-very-long-job-name-for-a-narrow-terminal-12", "state": "Succeeded",
           "replicas": 0, "nodes": 0, "batch_size": 468, "goodput": 123.4, "restarts": 1,
           "age_s": 4000.0, "started_at": 10.0, "finished_at": 200.0}
    make_console().print(jobs_cli.jobs_table([row]))  # capsys: not a terminal
    out = capsys.readouterr().out
    assert row["id"] in out and "Succeeded" in out and "…" not in out
    assert "goodput (samples/s)" in out and "3m10s" in out  # run time apart from age
    narrow = Console(width=80, force_terminal=False, record=True, file=io.StringIO())
    narrow.print(jobs_cli.jobs_table([row]))
    assert "…" in narrow.export_text()  # what a fixed 80 columns used to do


def test_top_when_piped_prints_tables_then_event_lines(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    client = FakeClient()
    client.log("a-1", 1.0, "Running", "all 1 replicas running")
    client.nodes = lambda: []  # type: ignore[attr-defined]
    client.address = type("A", (), {"url": "http://x"})()  # type: ignore[attr-defined]
    ticks = iter([lambda: client.log("a-1", 5.0, "Cancelling", "cancelling: asked")])
    monkeypatch.setattr(jobs_cli.time, "sleep", lambda s: next(ticks, lambda: None)())

    class Args:
        iterations = 2
        refresh = 0.0

    monkeypatch.setattr(client, "jobs", lambda: [
        {"id": "a-1", "state": "Running", "replicas": 1, "nodes": 1, "age_s": 1.0,
         "restarts": 0}])
    assert jobs_cli._top_lines(client, Args()) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out.splitlines()
    assert out[-1].endswith("a-1 Cancelling: cancelling: asked")
    assert not any("all 1 replicas running" in line for line in out)  # past: in describe
