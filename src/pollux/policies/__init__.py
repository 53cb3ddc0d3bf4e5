"""Scheduling policies: pure functions of a cluster snapshot (no processes, no files)."""

from __future__ import annotations

from pollux.policies.base import (
    Allocation,
    Allocations,
    JobInfo,
    NodeInfo,
    Policy,
    PolicyDecision,
    TunedConfig,
)
from pollux.policies.registry import make_policy, policy_names

__all__ = [
    "Allocation",
    "Allocations",
    "JobInfo",
    "NodeInfo",
    "Policy",
    "PolicyDecision",
    "TunedConfig",
    "make_policy",
    "policy_names",
]
