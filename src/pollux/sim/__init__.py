"""Trace-driven cluster simulator: a thin driver around the scheduling policies.

Applications come from a trace directory in the Pollux artifact format
(:func:`load_trace_applications`) or from the built-in catalog
(:func:`load_builtin_applications`); workloads from CSV files (:func:`read_workload`) or
the generator (:func:`generate_workload`). Both simulators, the homogeneous
(:mod:`.simulator`) and the typed (:mod:`.hetero.simulator`), are hooks on one round loop
(:mod:`.loop`) over jobs that share one training core (:class:`~.job.TrainingJob`).
"""

from __future__ import annotations

from pollux.sim.applications import (
    Application,
    ApplicationSpec,
    TraceApplication,
    load_trace_applications,
)
from pollux.sim.job import BatchMode, JobKnowledge, JobSpec, JobState, SimJob
from pollux.sim.simulator import ClusterConfig, SimulationResult, Simulator, run_simulation
from pollux.sim.workload import Workload, read_workload, workload_files, write_workload

__all__ = [
    "Application",
    "ApplicationSpec",
    "BatchMode",
    "ClusterConfig",
    "JobSpec",
    "JobKnowledge",
    "JobState",
    "SimJob",
    "SimulationResult",
    "Simulator",
    "TraceApplication",
    "Workload",
    "load_trace_applications",
    "read_workload",
    "run_simulation",
    "workload_files",
    "write_workload",
]
