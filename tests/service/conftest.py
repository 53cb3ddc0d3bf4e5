from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pollux.backends.fake import FakeBackend
from pollux.policies.base import Policy
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.storage.store import JobStore
from tests.service.e2e_helpers import EQUAL_SHARE
from tests.service.service_builders import make_nodes
from tests.service.service_test_policies import EqualSharePolicy


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    job_store = JobStore(tmp_path / "pollux.db")
    yield job_store
    job_store.close()


@pytest.fixture
def fake_backend() -> FakeBackend:
    return FakeBackend(make_nodes())


@pytest.fixture
def make_allocator(store: JobStore, fake_backend: FakeBackend, tmp_path: Path
                   ) -> Callable[..., Allocator]:
    def build(policy: Policy | None = None, **config: Any) -> Allocator:
        settings: dict[str, Any] = {"interval_s": 10.0, "stop_grace_s": 5.0,
                                    "hints_url": "http://127.0.0.1:1/api/jobs/{job_id}/hints"}
        settings.update(config)
        return Allocator(store, fake_backend, policy or EqualSharePolicy(),
                         AllocatorConfig(data_dir=tmp_path, **settings), clock=lambda: 0.0)
    return build


@pytest.fixture
def make_service(tmp_path: Path, fake_backend: FakeBackend) -> Callable[..., Any]:
    """A SchedulerService on the fake backend (no HTTP server, no loop thread)."""
    from pollux.service.config import LoopConfig, PolicyConfig, ServerConfig
    from pollux.service.server import build_service

    services = []

    def build(policy: str = EQUAL_SHARE, gpu_type_speeds: str | None = None,
              teams_file: str | None = None) -> Any:
        config = ServerConfig(data_dir=tmp_path / "data", teams_file=teams_file,
                              policy=PolicyConfig(policy, gpu_type_speeds),
                              loop=LoopConfig(interval_s=10.0))
        service = build_service(config,
                                "http://127.0.0.1:1/api/jobs/{job_id}/hints", fake_backend)
        services.append(service)
        return service

    yield build
    for service in services:
        service.store.close()


@pytest.fixture
def service(make_service: Callable[..., Any]) -> Any:
    """A service on the fake backend with the default test settings."""
    return make_service()


@pytest.fixture
def client(service: Any) -> Any:
    """The service's REST API in process, every request carrying the test token."""
    import warnings

    from pollux.service.http.api import create_app
    from tests.service.service_builders import AUTH_HEADERS, make_auth

    with warnings.catch_warnings():  # starlette 1.0 asks for the httpx2 fork; httpx works
        warnings.simplefilter("ignore", UserWarning)
        from fastapi.testclient import TestClient
    from pollux.service.http.rate_limit import RateLimit, RateLimiter

    generous = RateLimiter(RateLimit(per_s=1000.0, burst=1000))  # fuzz tests post hundreds
    with TestClient(create_app(service, make_auth(), hints_rate=generous),
                    headers=AUTH_HEADERS) as test_client:
        yield test_client
