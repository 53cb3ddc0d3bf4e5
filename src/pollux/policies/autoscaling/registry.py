"""Autoscalers by name. Each entry names the module and class; modules load on first use."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pollux.plugins import load_plugin_class
from pollux.policies.autoscaling.autoscaler import Autoscaler, AutoscalerConfig

AUTOSCALER_CLASSES: Mapping[str, str] = MappingProxyType({
    "none": "pollux.policies.autoscaling.autoscaler:FixedSizeAutoscaler",
    "pollux": "pollux.policies.autoscaling.autoscaler:PolluxAutoscaler",
    "throughput": "pollux.policies.autoscaling.autoscaler:ThroughputAutoscaler",
})
"""Registered autoscaler names -> ``module:Class``. Read-only."""


def autoscaler_names() -> list[str]:
    return sorted(AUTOSCALER_CLASSES)


def check_autoscaler_name(name: str) -> str:
    """``name`` when registered; otherwise UnknownPluginError listing the choices."""
    load_plugin_class("autoscaler", name, AUTOSCALER_CLASSES)
    return name


def make_autoscaler(name: str, config: AutoscalerConfig, **options: Any) -> Autoscaler:
    """Instantiate a registered autoscaler; unknown names list the valid choices."""
    cls = load_plugin_class("autoscaler", name, AUTOSCALER_CLASSES)
    autoscaler: Autoscaler = cls(config, **options)
    return autoscaler
