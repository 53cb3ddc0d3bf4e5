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


def test_gpu_types_get_a_column_only_on_typed_clusters(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    row = {"id": "j-1", "state": "Running", "replicas": 2, "nodes": 1, "age_s": 5.0,
           "restarts": 0, "gpu_type": "rtx", "started_at": 1.0}
    untyped = {**row, "id": "k-2", "gpu_type": None}
    console = make_console()
    console.print(jobs_cli.jobs_table([row, untyped]))
    console.print(jobs_cli.nodes_table([
        {"name": "rtx-0", "gpu_type": "rtx", "resources": {"gpu": 4}, "jobs": {"j-1": 2}},
        {"name": "aws-0", "gpu_type": "aws", "resources": {"gpu": 2}, "jobs": {}}]))
    out = capsys.readouterr().out
    assert out.count("gpu type") == 2
    job_line = next(line for line in out.splitlines() if "j-1" in line and "Running" in line)
    assert "rtx" in job_line
    node_line = next(line for line in out.splitlines() if "aws-0" in line)
    assert "aws" in node_line.replace("aws-0", "")
    console.print(jobs_cli.jobs_table([untyped]))
    console.print(jobs_cli.nodes_table([{"name": "node-0", "gpu_type": None,
                                         "resources": {"gpu": 2}, "jobs": {}}]))
    assert "gpu type" not in capsys.readouterr().out


def test_describe_names_the_gpu_type_of_the_allocation(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    job = {"id": "j-1", "state": "Running", "replicas": 2, "nodes": 1, "age_s": 5.0,
           "restarts": 0, "failures": 0, "rescales": 0, "launches": 1, "gpu_type": "rtx",
           "allocation": ["rtx-0", "rtx-0"], "events": [],
           "spec": {"command": ["python", "t.py"], "working_dir": "/w", "min_replicas": 1,
                    "max_replicas": 4, "preemptible": True, "max_failures": 3}}

    class Client:
        def __enter__(self) -> Client:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def job(self, ref: str) -> dict[str, Any]:
            return job

    monkeypatch.setattr(jobs_cli, "connect", lambda args: Client())

    class Args:
        job = "j-1"
        json = False

    assert jobs_cli.describe(Args()) == 0  # type: ignore[arg-type]
    assert "allocation:  rtx-0, rtx-0 (GPU type rtx)" in capsys.readouterr().out
