"""A job that posts hints in a loop is slowed at the door, alone, and costs the store nothing."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.service.http.api import create_app
from pollux.service.http.rate_limit import RateLimit, RateLimiter
from tests.service.service_builders import AUTH_HEADERS, make_auth

with warnings.catch_warnings():  # starlette 1.0 asks for the httpx2 fork; httpx works
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

SPEC = {"name": "j", "command": ["true"], "working_dir": "/tmp"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def hints(batch_size: int) -> dict[str, object]:
    return {"init_batch_size": 32, "max_batch_size": 4096, "local_bsz_bounds": [16, 256],
            "batch_size": batch_size}


def test_a_flooding_job_is_answered_429_and_others_are_not(make_service) -> None:
    service = make_service()
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(per_s=1.0, burst=5), clock)
    with TestClient(create_app(service, make_auth(), hints_rate=limiter),
                    headers=AUTH_HEADERS) as client:
        noisy = client.post("/api/jobs", json=SPEC).json()["id"]
        quiet = client.post("/api/jobs", json=SPEC).json()["id"]
        as_noisy = {"Authorization": f"Bearer {service.store.get_job(noisy).hints_token}"}
        as_quiet = {"Authorization": f"Bearer {service.store.get_job(quiet).hints_token}"}
        events_before = len(service.store.events(noisy))
        codes = [client.post(f"/api/jobs/{noisy}/hints", json=hints(64 * (1 + i % 2)),
                             headers=as_noisy).status_code for i in range(200)]
        assert codes[:5] == [204] * 5 and set(codes[5:]) == {429}
        refused = client.post(f"/api/jobs/{noisy}/hints", json=hints(64), headers=as_noisy)
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["field"] == "hints" and "too often" in refused.json()["detail"]
        # the store saw five posts: at most five batch-size events, not two hundred
        assert len(service.store.events(noisy)) - events_before <= 5
        assert service.store.get_job(noisy).hints.batch_size == 64  # the 5th post's
        # another job is not slowed by its neighbour
        assert client.post(f"/api/jobs/{quiet}/hints", json=hints(32),
                           headers=as_quiet).status_code == 204
        clock.now += 1.0  # one token back
        assert client.post(f"/api/jobs/{noisy}/hints", json=hints(128),
                           headers=as_noisy).status_code == 204
        assert service.store.get_job(noisy).hints.batch_size == 128
        # a post for a job one may not post for costs no token and learns nothing
        assert client.post(f"/api/jobs/{quiet}/hints", json=hints(32),
                           headers=as_noisy).status_code == 403


@settings(max_examples=60, deadline=None)
@given(per_s=st.floats(0.1, 10.0), burst=st.integers(1, 20),
       gaps=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=60))
def test_no_window_admits_more_than_burst_plus_rate(per_s: float, burst: int,
                                                     gaps: list[float]) -> None:
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(per_s=per_s, burst=burst), clock)
    admitted = []
    for gap in gaps:
        clock.now += gap
        wait = limiter.take("job")
        if wait == 0.0:
            admitted.append(clock.now)
        else:
            assert wait > 0
    for i, start in enumerate(admitted):
        within = [t for t in admitted[i:] if t - start <= 5.0]
        assert len(within) <= burst + per_s * 5.0 + 1e-9


def test_buckets_stay_bounded_and_bad_limits_are_refused() -> None:
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(per_s=1.0, burst=2), clock, max_keys=3)
    for key in range(50):
        assert limiter.take(key) == 0.0
        clock.now += 0.01
    assert len(limiter._buckets) <= 3
    with pytest.raises(ConfigError, match="per_s"):
        RateLimit(per_s=0.0)
    with pytest.raises(ConfigError, match="burst"):
        RateLimit(burst=0)
