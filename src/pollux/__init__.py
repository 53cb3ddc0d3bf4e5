"""Pollux: goodput-optimized, co-adaptive deep-learning cluster scheduling.

Layers: ``pollux.models`` (goodput math, numpy/scipy only),
``pollux.policies`` (scheduling policies over snapshots), ``pollux.sim`` (trace-driven
simulator), ``pollux.service`` and ``pollux.backends`` (the runtime), ``pollux.torch``
(the in-job agent), ``pollux.cli`` (the command line).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
