"""The goodput model: throughput x statistical efficiency (numpy/scipy only, no torch)."""

from __future__ import annotations

from pollux.models.efficiency import GradientStats, efficiency, gain, scaled_gain
from pollux.models.fit import (
    ThroughputFit,
    ThroughputObservations,
    fit_throughput,
    fit_throughput_params,
)
from pollux.models.goodput import GoodputFunction
from pollux.models.hints import JobHints
from pollux.models.speedup import SpeedupFunction
from pollux.models.throughput import (
    ThroughputParams,
    compute_time,
    iteration_time,
    optimizer_step_time,
    sync_time,
    throughput,
)

__all__ = [
    "GoodputFunction",
    "GradientStats",
    "JobHints",
    "SpeedupFunction",
    "ThroughputFit",
    "ThroughputObservations",
    "ThroughputParams",
    "compute_time",
    "efficiency",
    "fit_throughput",
    "fit_throughput_params",
    "gain",
    "scaled_gain",
    "iteration_time",
    "optimizer_step_time",
    "sync_time",
    "throughput",
]
