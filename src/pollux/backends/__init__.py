"""Where jobs run: local processes, a fake for tests (and, later, Ray)."""

from __future__ import annotations

from pollux.backends.base import (
    Backend,
    LaunchedReplica,
    LaunchRequest,
    ReplicaState,
    ReplicaStatus,
    rank_order,
)
from pollux.errors import BackendError

__all__ = [
    "Backend",
    "BackendError",
    "LaunchRequest",
    "LaunchedReplica",
    "ReplicaState",
    "ReplicaStatus",
    "rank_order",
]
