"""Running many (policy, workload) simulations on a typed cluster, in processes if asked.

Each task names its cluster spec and trace directory, so a worker rebuilds the
applications and the policy itself; only the run records come back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pollux.cluster_spec import parse_cluster_spec
from pollux.errors import PolluxError
from pollux.policies.registry import POLICY_CLASSES, make_policy
from pollux.sim.hetero.apps import TypedApplication, load_typed_applications
from pollux.sim.hetero.simulator import HeteroConfig, HeteroSimulator, summarize_hetero
from pollux.sim.runner import RunOutcome, build_policy, run_each, timeline_from
from pollux.sim.workload import Workload


@dataclass(frozen=True)
class HeteroTask:
    """One simulation on a typed cluster."""

    policy: str
    workload: Workload
    cluster: str
    """Cluster spec, e.g. ``aws:6x4,dgx-ext:2x8,rtx:3x8``."""
    traces_dir: str
    """Per-type traces (``<app>/placements-<type>.csv``, the Sia artifact's layout)."""
    interval_s: float = 60.0
    seed: int = 0
    timeline: bool = False
    """Keep the run's per-job GPU timeline (for plots)."""


def load_for(cluster: str, traces_dir: str | Path) -> dict[str, TypedApplication]:
    """The applications of ``traces_dir`` on every type of the cluster spec."""
    return load_typed_applications(traces_dir, parse_cluster_spec(cluster).gpu_types)


def execute_hetero(task: HeteroTask, index: int = 0,
                   applications: Mapping[str, TypedApplication] | None = None) -> RunOutcome:
    """Run one task in this process."""
    try:
        apps = applications if applications is not None else load_for(task.cluster,
                                                                      task.traces_dir)
        config = HeteroConfig(parse_cluster_spec(task.cluster), interval_s=task.interval_s)
        policy = build_policy(task.policy, task.seed)
        result = HeteroSimulator(task.workload, apps, policy, config).run()
    except PolluxError as exc:  # re-raised plainly so it survives pickling
        raise PolluxError(f"{task.policy} on {task.workload.name}: {exc}") from None
    timeline = (timeline_from(result.rounds, result.jobs, config.cluster.num_gpus)
                if task.timeline else None)
    return RunOutcome(index, summarize_hetero(result), timeline)


def run_hetero_outcomes(tasks: Sequence[HeteroTask], processes: int = 1,
                        on_done: Callable[[RunOutcome], None] | None = None
                        ) -> list[RunOutcome]:
    """Run every task (in ``processes`` worker processes when > 1), in task order."""
    for task in tasks:
        if task.policy not in POLICY_CLASSES:
            make_policy(task.policy)  # raises with the valid choices
        parse_cluster_spec(task.cluster)
    return run_each(tasks, execute_hetero,
                    lambda task: load_for(task.cluster, task.traces_dir),
                    lambda task: (task.cluster, task.traces_dir), processes, on_done)

