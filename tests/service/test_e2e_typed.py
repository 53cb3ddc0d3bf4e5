"""End to end on a typed local cluster (issue #16): a real ``pollux server --virtual-nodes
a:2x1,b:1x1`` (the ``pollux`` policy, 1 s rounds) trains the agent's example, a job that
may take 3 replicas. A type-blind placement would put them on a-0, a-1 and b-0; every
launch stays within one type, each replica is told its type, the agent reports its
profile under that name, and the CLI shows it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pollux.cli.main import main
from tests.service.browser import headless_chromium, skip_reason
from tests.service.e2e_helpers import (
    EXAMPLE,
    FINAL_STATES,
    ServerProcess,
    example_spec,
    launch_log,
    launches,
    wait_until,
)
from tests.service.test_dashboard_browser import cell, click_row, page_url

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not EXAMPLE.exists(), reason="needs examples/train_digits.py"),
]

VIRTUAL_NODES = "a:2x1,b:1x1"


@pytest.fixture
def server(tmp_path: Path):
    process = ServerProcess(tmp_path / "data", policy="pollux", virtual_nodes=VIRTUAL_NODES)
    yield process
    process.cleanup()


def test_a_real_job_on_typed_virtual_nodes_stays_within_one_type(server, capsys):
    data = server.data_dir
    client = server.start()
    types = {node["name"]: node["gpu_type"] for node in client.nodes()}
    assert types == {"a-0": "a", "a-1": "a", "b-0": "b"}
    job = client.submit(example_spec("typed", 3, epochs=4))["id"]
    final = wait_until(lambda: (lambda j: j if j["state"] in FINAL_STATES else None)(
        client.job(job)), 200, "the job to end")
    assert final["state"] == "Succeeded", final["events"]
    runs = launches(data, job)
    assert runs
    for generation, nodes in runs.items():
        launched_on = {types[node] for node in nodes}
        assert len(launched_on) == 1, (generation, nodes)
        (gpu_type,) = launched_on
        assert f"(GPU type {gpu_type})" in next(
            e["message"] for e in final["events"] if e["message"].startswith(
                f"launch {generation}:"))
        assert launch_log(data, job, generation)  # the replica ran and logged
    last_type = types[runs[max(runs)][0]]
    assert final["gpu_type"] == last_type
    # the agent knew its type: its hints carry one profile per type it ran on
    hints = final["hints"]
    assert hints is not None and hints["gpu_type"] == last_type
    assert set(hints["type_profiles"]) == {types[n] for nodes in runs.values() for n in nodes}
    # the CLI shows the type: a column in ls and top, a field in --json
    where = ("--data-dir", str(data))
    assert main(["ls", *where]) == 0
    table = capsys.readouterr().out
    assert "gpu type" in table
    assert last_type in next(line for line in table.splitlines() if job in line).split(job)[1]
    assert main(["ls", *where, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["gpu_type"] == last_type
    assert main(["top", *where, "--json", "--iterations", "1"]) == 0
    view = json.loads(capsys.readouterr().out.splitlines()[0])
    assert [n["gpu_type"] for n in view["nodes"]] == ["a", "a", "b"]
    if skip_reason() is None:  # the dashboard names the job's type too
        with headless_chromium() as driver:
            driver.get(page_url(client, "/", refresh_s="0.5"))
            wait_until(lambda: cell(driver, job, "nodes") == f"0 · {last_type}", 30,
                       "the dashboard's jobs table")
            click_row(driver, job)
            wait_until(lambda: f"GPU type {last_type}" in driver.find_element(
                "id", "job-reason").text, 30, "the job's detail line")
