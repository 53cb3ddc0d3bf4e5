"""Builders of specs and nodes for the service tests."""

from __future__ import annotations

from typing import Any

from pollux.job_spec import JobSpec
from pollux.policies.base import NodeInfo


def make_nodes(num_nodes: int = 2, slots: int = 2) -> list[NodeInfo]:
    return [NodeInfo(f"node-{i}", {"gpu": float(slots), "cpu": float(slots),
                                   "memory": 8e9}) for i in range(num_nodes)]


def make_spec(name: str = "job", **fields: Any) -> JobSpec:
    data: dict[str, Any] = {"name": name, "command": ["python", "train.py"],
                            "working_dir": "/tmp", "max_replicas": 4}
    data.update(fields)
    return JobSpec.from_dict(data)


TEST_TOKEN = "test-token"
"""The API token of the in-process test apps (TestClient's Host is 'testserver')."""
AUTH_HEADERS = {"Authorization": f"Bearer {TEST_TOKEN}"}


def make_auth(token: str = TEST_TOKEN) -> Any:
    """What the API guard accepts in tests: ``token`` and TestClient's host name."""
    from pollux.service.http.auth import ApiAuth

    return ApiAuth(token, frozenset({"testserver"}))
