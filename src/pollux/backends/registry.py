"""Backends by name. Each entry names the module and class; modules load on first use."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pollux.backends.base import Backend
from pollux.plugins import load_plugin_class

BACKEND_CLASSES: Mapping[str, str] = MappingProxyType({
    "local": "pollux.backends.local:LocalBackend",
    "ray": "pollux.backends.ray:RayBackend",
    "slurm": "pollux.backends.slurm:SlurmBackend",
})
"""Registered backend names -> ``module:Class``. Read-only. Every class
takes ``instance_id`` (stable per data directory, to find a dead server's replicas)
plus its own keyword options. The fake backend is built directly by tests."""


def backend_names() -> list[str]:
    return sorted(BACKEND_CLASSES)


def make_backend(name: str, **options: Any) -> Backend:
    """Instantiate a registered backend; unknown names list the valid choices."""
    cls = load_plugin_class("backend", name, BACKEND_CLASSES)
    backend: Backend = cls(**options)
    return backend
