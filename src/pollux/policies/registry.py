"""Policies by name: the one way to build a policy (the simulator, the service, the CLI).

A name is a registered policy or any :class:`~pollux.policies.base.Policy` class given as
``module:Class``. Every policy is built with an explicit ``seed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pollux.errors import ConfigError
from pollux.plugins import load_plugin_class
from pollux.policies.base import Policy

POLICY_CLASSES: Mapping[str, str] = MappingProxyType({
    "fifo": "pollux.policies.fifo:FifoPolicy",
    "tiresias": "pollux.policies.tiresias:TiresiasPolicy",
    "optimus": "pollux.policies.optimus:OptimusPolicy",
    "pollux": "pollux.policies.pollux:PolluxPolicy",
    "pollux-ga": "pollux.policies.pollux:PolluxGAPolicy",
    "pollux-remaining": "pollux.policies.pollux:PolluxRemainingPolicy",
    "pollux-unaware": "pollux.policies.pollux_unaware:PolluxUnawarePolicy",
    "pollux-hetero": "pollux.policies.hetero_pollux:HeteroPolluxPolicy",
    "sia": "pollux.policies.sia:SiaPolicy",
})
"""Registered policy names -> ``module:Class`` (read-only)."""


def policy_names() -> list[str]:
    return sorted(POLICY_CLASSES)


def make_policy(name: str, *, seed: int = 0, **options: Any) -> Policy:
    """Instantiate policy ``name`` (registered, or ``module:Class``) with ``seed`` and its
    own keyword ``options``; unknown names list the valid choices."""
    if ":" in name and name not in POLICY_CLASSES:
        cls = load_plugin_class("policy", name, {name: name})
        if not (isinstance(cls, type) and issubclass(cls, Policy)):
            raise ConfigError("policy", name, "name a subclass of pollux.policies.Policy")
    else:
        cls = load_plugin_class("policy", name, POLICY_CLASSES)
    policy: Policy = cls(seed=seed, **options)
    return policy
