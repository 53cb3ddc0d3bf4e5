"""Run Pollux jobs on a Ray cluster (``pollux server --backend ray``; extra ``[ray]``).

:class:`RayBackend` reads Ray's nodes as the policy's nodes every round, turns each
allocation into a placement group with one bundle per replica pinned to its node, and
runs every replica as a Ray actor that launches the training command with the agent's
environment. Ray is imported only when the backend is used.
"""

from __future__ import annotations

from typing import Any

from pollux.errors import ConfigError

__all__ = ["RayBackend"]


def __getattr__(name: str) -> Any:
    if name == "RayBackend":
        try:
            from pollux.backends.ray.backend import RayBackend
        except ImportError as exc:
            if (exc.name or "").partition(".")[0] != "ray":
                raise
            raise ConfigError("backend", "ray", "Ray is not installed: "
                              "pip install 'pollux[ray]'") from exc
        return RayBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
