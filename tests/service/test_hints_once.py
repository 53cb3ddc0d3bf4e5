"""A job's hints and spec are parsed once at each boundary (a request, a row read from
the store) and held parsed in its records; hints the store holds that no longer parse
(an older server's, a damaged row) make the job one without hints, said once in the log
and once in the job's events, naming the field; one model per hints version serves the
allocation loop, the job views and the telemetry."""

from __future__ import annotations

import json
import logging
import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.job_spec import JobSpec
from pollux.models import hints as hints_module
from pollux.models.hints import JobHints
from pollux.service.http.api import create_app
from pollux.service.http.views import job_detail
from pollux.service.storage.store import JobStore
from tests.service.service_builders import AUTH_HEADERS, make_auth
from tests.service.store_faults import write_stored_hints

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

SPEC = {"name": "digits", "command": ["python", "train.py"], "working_dir": "/tmp",
        "max_replicas": 2}
PARAMS = {"alpha_c": 0.01, "beta_c": 0.001, "alpha_n": 0.1, "beta_n": 0.01,
          "alpha_r": 0.05, "beta_r": 0.005, "gamma": 1.5}
HINTS = {"init_batch_size": 32, "max_batch_size": 512, "local_bsz_bounds": [16, 128],
         "batch_size": 64, "local_bsz": 32, "accum_steps": 1, "epoch": 1,
         "grad_stats": {"sqr": 1.0, "var": 20.0}, "throughput_params": PARAMS}

HOSTILE = [  # (hints, the field the refusal names)
    ({**HINTS, "batch_size": math.nan}, "batch_size"),
    ({**HINTS, "progress": math.inf}, "progress"),
    ({**HINTS, "grad_stats": {"sqr": -1.0, "var": 20.0}}, "grad_stats.sqr"),
    ({**HINTS, "throughput_params": {**PARAMS, "gamma": math.nan}}, "throughput_params.gamma"),
    ({**HINTS, "max_batch_size": 2**64}, "max_batch_size"),
    ({**HINTS, "local_bsz_bounds": [16, 2**70]}, "local_bsz_bounds[1]"),
    ({**HINTS, "epoch": -1}, "epoch"),
    ({**HINTS, "init_batch_size": "32"}, "init_batch_size"),
    ({**HINTS, "accumulation": 1}, "accumulation"),
    ({**HINTS, "local_bsz_bounds": 16}, "local_bsz_bounds"),
    ({**HINTS, "gpu_type": ""}, "gpu_type"),
    ({**HINTS, "surprise": 1}, "surprise"),
    ({k: v for k, v in HINTS.items() if k != "max_batch_size"}, "max_batch_size"),
    ([1, 2, 3], "hints"),
    ("not an object", "hints"),
]
CORRUPT_JSON = ['{"init_batch_size": 32, ', "\x00\x01", "NaN]", ""]


def submitted(service, spec=SPEC) -> str:
    job_id = service.submit(spec)["id"]
    service.allocator.tick(1.0)  # launched: its views and samples use its model
    return job_id


def hints_warnings(caplog, job_id: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and job_id in r.getMessage()
            and "hints" in r.getMessage()]


def everything_reads(service, client, now: float) -> None:
    """What reads a job's hints: rounds, the list, describe, telemetry, the dashboard."""
    service.allocator.request_round()
    service.allocator.tick(now)
    assert client.get("/api/jobs").status_code == 200
    for job in service.store.list_jobs():
        assert client.get(f"/api/jobs/{job.id}").status_code == 200
    assert client.get("/api/dashboard").status_code in (200, 404)
    service.history.record_round(now, 0.0, service.store.list_jobs(), service.backend.nodes())


@pytest.fixture
def api(service):
    with TestClient(create_app(service, make_auth()), headers=AUTH_HEADERS) as test_client:
        yield test_client


@pytest.mark.parametrize("raw", CORRUPT_JSON)
def test_a_row_whose_hints_are_not_json_is_a_job_without_hints(service, api, caplog, raw):
    """Before: the whole record counted as damaged (the job vanished from every list,
    describe answered 500); now only its hints are lost."""
    job_id = submitted(service)
    write_stored_hints(service.store, job_id, raw, 2.0)
    record = service.store.get_job(job_id)
    assert record.hints is None and record.hints_problem is not None
    assert "hints" in record.hints_problem
    assert [r.id for r in service.store.list_jobs()] == [job_id]
    with caplog.at_level(logging.WARNING):
        everything_reads(service, api, 3.0)
    assert api.get(f"/api/jobs/{job_id}").json()["hints"] is None
    assert len(hints_warnings(caplog, job_id)) == 1, caplog.text


@pytest.mark.parametrize(("raw", "field"), HOSTILE)
def test_stored_hints_that_no_longer_parse_name_the_field_once(service, api, caplog, raw,
                                                              field):
    job_id = submitted(service)
    write_stored_hints(service.store, job_id, raw, 2.0)
    record = service.store.get_job(job_id)
    assert record.hints is None
    assert field in (record.hints_problem or ""), record.hints_problem
    with caplog.at_level(logging.WARNING):
        for now in (3.0, 30.0, 60.0):  # three rounds, lists, describes, samples
            everything_reads(service, api, now)
    logged = hints_warnings(caplog, job_id)
    assert len(logged) == 1 and field in logged[0], logged
    events = [e.message for e in service.store.events(job_id) if "hints not used" in e.message]
    assert len(events) == 1 and field in events[0], events
    assert "without a model" in events[0]
    summary = api.get(f"/api/jobs/{job_id}").json()
    assert summary["hints"] is None and summary["batch_size"] is None
    assert summary["goodput"] is None


def test_new_bad_hints_are_told_again_and_good_ones_are_used(service, api, caplog):
    job_id = submitted(service)
    with caplog.at_level(logging.WARNING):
        write_stored_hints(service.store, job_id, {**HINTS, "epoch": -1}, 2.0)
        everything_reads(service, api, 3.0)
        write_stored_hints(service.store, job_id, {**HINTS, "epoch": -2}, 4.0)
        everything_reads(service, api, 5.0)
    assert len(hints_warnings(caplog, job_id)) == 2
    service.post_hints(job_id, HINTS)
    record = service.store.get_job(job_id)
    assert record.hints == JobHints.from_dict(HINTS) and record.hints_problem is None
    assert api.get(f"/api/jobs/{job_id}").json()["batch_size"] == 64


@pytest.mark.parametrize(("raw", "field"), HOSTILE)
def test_posted_hostile_hints_are_refused_naming_the_field(service, api, raw, field):
    job_id = submitted(service)
    token = service.store.get_job(job_id).hints_token
    body = json.dumps(raw, allow_nan=True)
    response = api.post(f"/api/jobs/{job_id}/hints", content=body,
                        headers={"Authorization": f"Bearer {token}",
                                 "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert field.split(".")[0].split("[")[0] in response.json()["field"]
    assert service.store.get_job(job_id).hints is None


def test_records_hold_hints_and_specs_parsed_once(service, api, monkeypatch):
    """Parsed at the API, once each; reads of the stored row (it changes every round: its
    attained service grows) parse neither again, and a server that did not receive them
    (a restart) parses each once, at its first read."""
    parsed: list[str] = []
    real_hints, real_spec = JobHints.from_dict.__func__, JobSpec.from_dict.__func__
    monkeypatch.setattr(JobHints, "from_dict", classmethod(
        lambda cls, data: parsed.append("hints") or real_hints(cls, data)))
    monkeypatch.setattr(JobSpec, "from_dict", classmethod(
        lambda cls, data: parsed.append("spec") or real_spec(cls, data)))
    job_id = submitted(service)
    service.post_hints(job_id, HINTS)
    for now in (10.0, 20.0, 30.0, 40.0):
        everything_reads(service, api, now)
    assert sorted(parsed) == ["hints", "spec"], parsed
    record = service.store.get_job(job_id)
    assert isinstance(record.hints, JobHints) and isinstance(record.spec, JobSpec)
    assert record.attained_service_s > 0  # the row did change between the reads
    restarted = JobStore(service.store.path)
    for _ in range(3):
        again = restarted.get_job(job_id)
        restarted.add_service({job_id: 1.0}, 50.0)
    assert sorted(parsed) == ["hints", "hints", "spec", "spec"], parsed
    assert again.hints == record.hints and again.spec == record.spec
    restarted.close()


def test_one_model_per_hints_version_serves_loop_views_and_telemetry(service, api,
                                                                    monkeypatch):
    built: list[int] = []
    real = hints_module.GoodputFunction

    class Counted(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(hints_module, "GoodputFunction", Counted)
    job_id = submitted(service)
    service.post_hints(job_id, HINTS)
    for now in (10.0, 20.0, 30.0):
        everything_reads(service, api, now)
    assert api.get("/api/jobs").json()[0]["goodput"] > 0
    assert service.history.job(job_id)[-1].speedup is not None
    assert len(built) == 1
    service.post_hints(job_id, {**HINTS, "batch_size": 128, "local_bsz": 64})
    everything_reads(service, api, 40.0)
    assert api.get("/api/jobs").json()[0]["batch_size"] == 128
    assert len(built) == 2


def test_describe_shows_the_hints_as_posted(service, api):
    job_id = submitted(service)
    posted = JobHints.from_dict(HINTS).to_dict()
    service.post_hints(job_id, HINTS)
    shown = api.get(f"/api/jobs/{job_id}").json()["hints"]
    assert json.dumps(shown) == json.dumps(posted)
    record = service.store.get_job(job_id)
    assert job_detail(record, 0.0, [], [])["hints"] == posted


valid_hints = st.fixed_dictionaries(
    {"init_batch_size": st.integers(1, 64), "max_batch_size": st.integers(64, 2**30),
     "local_bsz_bounds": st.tuples(st.integers(1, 8), st.integers(64, 2**30)).map(list)},
    optional={"accumulation": st.booleans(),
              "throughput_params": st.fixed_dictionaries(
                  {name: st.floats(0.0, 1e6) for name in PARAMS}),
              "grad_stats": st.fixed_dictionaries({"sqr": st.floats(0, 1e30),
                                                   "var": st.floats(0, 1e30)}),
              "max_profiled_replicas": st.integers(0, 2**30),
              "batch_size": st.integers(1, 2**30), "accum_steps": st.integers(0, 2**30),
              "progress": st.floats(0, 1e18) | st.integers(0, 10**18),
              "gpu_type": st.text(min_size=1, max_size=8).filter(str.strip)})


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=valid_hints)
def test_hints_read_back_from_the_store_equal_the_posted(store, raw):
    """What the store writes (serialized once) reads back as the same hints."""
    try:
        posted = JobHints.from_dict(raw)
    except ConfigError:
        return  # e.g. gamma below 1: refused at the API, never stored
    job = store.add_job(JobSpec.from_dict(SPEC), 0.0)
    store.set_hints(job.id, posted, 1.0)
    read = store.get_job(job.id).hints
    assert read == posted and read.to_dict() == posted.to_dict()


def test_a_model_without_a_finite_goodput_shows_none_everywhere(service, api):
    """Valid hints whose step-time model is all zeros predict infinite goodput: the job
    list, its samples (the dashboard's charts) and /metrics show none, never inf (JSON
    has no inf: the history answered 500)."""
    job_id = submitted(service)
    service.post_hints(job_id, {**HINTS, "throughput_params": {**dict.fromkeys(PARAMS, 0.0),
                                                               "gamma": 1.0}})
    everything_reads(service, api, 10.0)
    assert api.get("/api/jobs").json()[0]["goodput"] is None
    history = api.get(f"/api/jobs/{job_id}/history")
    assert history.status_code == 200, history.text
    assert set(history.json()["samples"]["goodput"]) == {None}
    assert api.get("/api/dashboard").status_code == 200
