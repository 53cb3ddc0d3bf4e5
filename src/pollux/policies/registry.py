"""Policies by name. Each entry names the module and class; modules load on first use."""

from __future__ import annotations

from typing import Any

from pollux.plugins import load_plugin_class
from pollux.policies.base import Policy

POLICY_CLASSES: dict[str, str] = {
    "fifo": "pollux.policies.fifo:FifoPolicy",
    "tiresias": "pollux.policies.tiresias:TiresiasPolicy",
    "optimus": "pollux.policies.optimus:OptimusPolicy",
    "pollux": "pollux.policies.pollux:PolluxPolicy",
    "pollux-ga": "pollux.policies.pollux:PolluxGAPolicy",
    "pollux-remaining": "pollux.policies.pollux:PolluxRemainingPolicy",
    "pollux-unaware": "pollux.policies.pollux_unaware:PolluxUnawarePolicy",
    "pollux-hetero": "pollux.policies.hetero_pollux:HeteroPolluxPolicy",
    "sia": "pollux.policies.sia:SiaPolicy",
}
"""Registered policy names -> ``module:Class``. Read-only by convention."""


def policy_names() -> list[str]:
    return sorted(POLICY_CLASSES)


def make_policy(name: str, **options: Any) -> Policy:
    """Instantiate a registered policy; unknown names list the valid choices."""
    cls = load_plugin_class("policy", name, POLICY_CLASSES)
    policy: Policy = cls(**options)
    return policy
