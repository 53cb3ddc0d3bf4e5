"""The dashboard's page and its one-request overview, without a browser (the browser
tests are in test_dashboard_browser.py)."""

from __future__ import annotations

import re
import warnings

import pytest

from pollux.backends.fake import FakeBackend
from pollux.policies.base import NodeInfo
from pollux.service.http.api import create_app
from tests.service.service_builders import AUTH_HEADERS, make_auth

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

SPEC = {"name": "digits", "command": ["python", "train.py"], "working_dir": "/tmp",
        "max_replicas": 2}


def test_page_and_every_asset_it_loads_come_from_the_server(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assets = [url for url in urls if url.startswith("/static/")]
    assert {"/static/dashboard.js", "/static/charts.js", "/static/dashboard.css"} <= set(assets)
    assert all(url.startswith("/") and not url.startswith("//") for url in urls), urls
    for url in assets:
        assert client.get(url).status_code == 200, url
    for script in ("/static/dashboard.js", "/static/charts.js"):
        assert not re.search(r"https?://(?!www\.w3\.org)", client.get(script).text), script


def test_overview_has_jobs_nodes_and_history(client, service):
    job = client.post("/api/jobs", json=SPEC).json()["id"]
    service.allocator.tick()
    view = client.get("/api/dashboard").json()
    assert [(j["id"], j["replicas"]) for j in view["jobs"]] == [(job, 2)]
    assert {"speedup", "efficiency", "goodput", "restarts", "age_s"} <= set(view["jobs"][0])
    assert sum(n["jobs"].get(job, 0) for n in view["nodes"]) == 2
    assert all(n["gpu_type"] is None for n in view["nodes"])  # an untyped cluster
    assert view["history"]["slots_total"] == [4]
    assert view["health"]["rounds"] == 1


def test_overview_names_gpu_types(make_service):
    backend = FakeBackend([NodeInfo("a100-0", {"gpu": 4.0, "cpu": 8.0}, gpu_type="a100"),
                           NodeInfo("t4-0", {"gpu": 2.0, "cpu": 8.0}, gpu_type="t4")])
    from pollux.service.config import PolicyConfig, ServerConfig
    from pollux.service.server import build_service
    from tests.service.e2e_helpers import EQUAL_SHARE

    service = build_service(ServerConfig(data_dir=make_service().data_dir.parent / "typed",
                                         policy=PolicyConfig(EQUAL_SHARE)),
                            "http://127.0.0.1:1/api/jobs/{job_id}/hints", backend)
    try:
        with TestClient(create_app(service, make_auth()), headers=AUTH_HEADERS) as client:
            nodes = client.get("/api/dashboard").json()["nodes"]
        assert {n["name"]: n["gpu_type"] for n in nodes} == {"a100-0": "a100", "t4-0": "t4"}
    finally:
        service.store.close()


def test_every_static_file_is_package_data():
    """A non-editable install ships only the files pyproject's package-data names."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["pollux.service.http"]
    package = root / "src" / "pollux" / "service" / "http"
    shipped = {path for pattern in patterns for path in package.glob(pattern) if path.is_file()}
    present = {path for path in (package / "static").rglob("*") if path.is_file()}
    assert present and present <= shipped, sorted(map(str, present - shipped))
