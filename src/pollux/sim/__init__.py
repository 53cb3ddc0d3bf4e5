"""Trace-driven cluster simulator: a thin driver around the scheduling policies.

Applications come from a trace directory in the Pollux artifact format
(:func:`load_trace_applications`) or from the built-in catalog
(:func:`load_builtin_applications`); workloads from CSV files (:func:`read_workload`) or
the generator (:func:`generate_workload`); per-type traces (the Sia artifact's) from
:func:`~.applications.load_typed_applications`. One simulator (:mod:`.simulator`) runs
every cluster, a homogeneous one being a typed cluster with one type; what the two
artifacts' reference simulators do differently is :mod:`.semantics`.
"""

from __future__ import annotations

from pollux.sim.applications import (
    Application,
    ApplicationSpec,
    TraceApplication,
    load_trace_applications,
)
from pollux.sim.job import BatchMode, JobKnowledge, JobSpec, JobState, SimJob
from pollux.sim.semantics import POLLUX_ARTIFACT, SIA_ARTIFACT, ReferenceSemantics
from pollux.sim.simulator import ClusterConfig, SimulationResult, Simulator
from pollux.sim.workload import Workload, read_workload, workload_files, write_workload

__all__ = [
    "Application",
    "ApplicationSpec",
    "BatchMode",
    "ClusterConfig",
    "JobSpec",
    "JobKnowledge",
    "JobState",
    "POLLUX_ARTIFACT",
    "ReferenceSemantics",
    "SIA_ARTIFACT",
    "SimJob",
    "SimulationResult",
    "Simulator",
    "TraceApplication",
    "Workload",
    "load_trace_applications",
    "read_workload",
    "workload_files",
    "write_workload",
]
