"""Plugins by name: each registry maps names to ``"module:Class"``, loaded on first use.

Lazy loading keeps heavy optional dependencies (Ray, torch) out of every import that
does not use them. Unknown names fail with the valid choices.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from pollux.errors import ConfigError, UnknownPluginError


def load_plugin_class(kind: str, name: str, registry: Mapping[str, str]) -> type:
    """The class registered as ``name``; UnknownPluginError listing the choices otherwise."""
    target = registry.get(name)
    if target is None:
        raise UnknownPluginError(kind, name, registry)
    module_name, _, class_name = target.partition(":")
    try:
        cls: type = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(kind, name, f"cannot load {target!r} ({exc})") from exc
    return cls
