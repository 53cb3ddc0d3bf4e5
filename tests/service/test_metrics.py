"""``/metrics`` scraped and parsed with prometheus_client's own parser, and the
per-round history the dashboard charts, on the fake backend."""

from __future__ import annotations

import warnings

import pytest

from pollux.service.loop.telemetry import History
from tests.service.service_builders import make_spec

parser = pytest.importorskip("prometheus_client.parser")

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

SPEC = {"name": "digits", "command": ["python", "train.py"], "working_dir": "/tmp",
        "max_replicas": 2}
HINTS = {"init_batch_size": 32, "max_batch_size": 512, "local_bsz_bounds": [16, 128],
         "batch_size": 64, "local_bsz": 32, "accum_steps": 0, "epoch": 1,
         "grad_stats": {"sqr": 1.0, "var": 20.0},
         "throughput_params": {"alpha_c": 0.01, "beta_c": 0.001, "alpha_n": 0.1,
                               "beta_n": 0.01, "alpha_r": 0.05, "beta_r": 0.005,
                               "gamma": 1.5}}


def post_hints(client: TestClient, service, job_id: str) -> int:
    token = service.store.get_job(job_id).hints_token
    return client.post(f"/api/jobs/{job_id}/hints", json=HINTS,
                       headers={"Authorization": f"Bearer {token}"}).status_code


def scrape(client: TestClient) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted labels: value}, through prometheus_client's parser."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in parser.text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = \
                sample.value
    return samples


def test_metrics_follow_jobs_slots_and_rounds(client, service):
    empty = scrape(client)
    assert empty["pollux_jobs"][(("state", "Pending"),)] == 0
    assert empty["pollux_gpus_free"][()] == 4 and empty["pollux_gpus_allocated"][()] == 0
    first = client.post("/api/jobs", json=SPEC).json()["id"]
    second = client.post("/api/jobs", json={**SPEC, "name": "other"}).json()["id"]
    service.allocator.tick()
    assert post_hints(client, service, first) == 204
    scraped = scrape(client)
    assert scraped["pollux_jobs"][(("state", "Starting"),)] == 2
    assert scraped["pollux_gpus_allocated"][()] == 4 and scraped["pollux_gpus_free"][()] == 0
    assert scraped["pollux_slots"][(("status", "allocated"),)] == 4
    assert scraped["pollux_job_replicas"][(("job", first),)] == 2
    assert scraped["pollux_job_batch_size"][(("job", first),)] == 64
    assert scraped["pollux_job_goodput_samples_per_second"][(("job", first),)] > 0
    assert (("job", second),) not in scraped["pollux_job_goodput_samples_per_second"]
    assert scraped["pollux_job_restarts_total"][(("job", first),)] == 0
    assert scraped["pollux_policy_round_duration_seconds_count"][()] == 1
    latency = scraped["pollux_api_request_duration_seconds_count"]
    assert latency[(("method", "POST"), ("route", "/api/jobs"), ("status", "201"))] == 2
    assert latency[(("method", "POST"), ("route", "/api/jobs/{job_id}/hints"),
                    ("status", "204"))] == 1


def test_each_service_has_its_own_registry(make_service):
    one, two = make_service().metrics, make_service().metrics
    assert one.registry is not two.registry
    one.round_duration.observe(0.5)
    assert b"pollux_policy_round_duration_seconds_count 1.0" in one.exposition()
    assert b"pollux_policy_round_duration_seconds_count 0.0" in two.exposition()


def test_history_records_each_round_and_serves_columns(client, service):
    job = client.post("/api/jobs", json=SPEC).json()["id"]
    service.allocator.tick()
    assert post_hints(client, service, job) == 204
    service.allocator.request_round()
    service.allocator.tick()
    samples = client.get(f"/api/jobs/{job}/history").json()["samples"]
    assert samples["state"][0] == "Pending" and samples["state"][1] in ("Starting", "Running")
    assert samples["replicas"] == [0, 2] and samples["batch_size"] == [None, 64]
    assert samples["goodput"][0] is None and samples["goodput"][1] > 0
    assert 0 < samples["efficiency"][1] <= 1
    cluster = client.get("/api/cluster/history").json()["samples"]
    assert cluster["slots_used"] == [0, 2] and cluster["slots_total"] == [4, 4]
    assert all(r >= 0 for r in cluster["round_s"])
    assert client.get("/api/jobs/nope/history").status_code == 404


def test_history_is_bounded():
    history = History(max_samples=3, max_jobs=2)
    for i in range(5):
        history.record_round(float(i), 0.01, [], [])
    assert [s.time for s in history.cluster()] == [2.0, 3.0, 4.0]


def test_each_round_with_jobs_reports_its_policy_time(make_allocator, store):
    seen: list[float] = []
    allocator = make_allocator()
    allocator.on_round = seen.append
    allocator.tick()                                   # no jobs: no policy call, no report
    assert seen == []
    store.add_job(make_spec("a"), now=0.0)
    allocator.request_round()
    allocator.tick()
    assert len(seen) == 1 and 0 <= seen[0] < 5


def test_a_failing_round_observer_does_not_stop_scheduling(make_allocator, store, caplog):
    def broken(round_s: float) -> None:
        raise RuntimeError("telemetry down")

    allocator = make_allocator()
    allocator.on_round = broken
    job = store.add_job(make_spec("a"), now=0.0)
    allocator.tick()
    assert store.get_job(job.id).allocation          # the round still placed the job
    assert "cannot report the scheduling round" in caplog.text


def test_grafana_example_queries_metrics_the_server_exports(client, service):
    import json
    import re
    from pathlib import Path

    job = client.post("/api/jobs", json=SPEC).json()["id"]
    service.allocator.tick()
    assert post_hints(client, service, job) == 204
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "examples" /
                            "grafana-dashboard.json").read_text())
    exported = set(scrape(client))
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\bpollux_[a-z_]+", target["expr"])}
    assert queried and queried <= exported, queried - exported


def test_job_models_are_rebuilt_only_when_hints_change(service, monkeypatch):
    from pollux.models import hints as hints_module
    from pollux.service.loop import telemetry

    job = service.submit(SPEC)["id"]
    service.allocator.tick()
    service.post_hints(job, HINTS)
    built: list[int] = []
    real = hints_module.SpeedupFunction
    monkeypatch.setattr(hints_module, "SpeedupFunction",
                        lambda *args, **kwargs: built.append(1) or real(*args, **kwargs))
    first = telemetry.job_sample(service.store.get_job(job), 1.0)
    service.store.add_service({job: 5.0}, 1.5)  # the row changes, its hints do not
    assert telemetry.job_sample(service.store.get_job(job), 2.0).speedup == first.speedup
    assert built == [1]
    service.post_hints(job, {**HINTS, "batch_size": 128})
    assert telemetry.job_sample(service.store.get_job(job), 3.0).batch_size == 128
    assert built == [1, 1]
    assert first.speedup is not None and first.speedup > 0
