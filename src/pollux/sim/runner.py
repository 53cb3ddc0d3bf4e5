"""Running many (policy, workload) simulations, in parallel processes when asked.

Each task is self-contained (its workload, cluster, application source and seed), so a
worker process rebuilds the applications (once per source) and the policy itself; only
the records come back. Inputs are validated in the parent before any worker starts.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from threadpoolctl import threadpool_limits

from pollux.errors import ConfigError, PolluxError
from pollux.policies.autoscaling import (
    Autoscaler,
    AutoscalerConfig,
    NodeTemplate,
    TypedAutoscaler,
    TypedThroughputAutoscaler,
    check_autoscaler_name,
    make_autoscaler,
)
from pollux.policies.base import GPU
from pollux.policies.registry import POLICY_CLASSES, make_policy
from pollux.sim.applications import (
    Application,
    TypedApplication,
    load_trace_applications,
    load_typed_applications,
)
from pollux.sim.cluster import ClusterSize
from pollux.sim.job import SimJob
from pollux.sim.metrics import RunRecord, summarize_run
from pollux.sim.partition import merge_results, partition_configs, partition_workload
from pollux.sim.simulator import ClusterConfig, RoundLog, SimulationResult, Simulator
from pollux.sim.workload import Workload
from pollux.teams import Teams

logger = logging.getLogger(__name__)

PARTITIONED_SUFFIX = "/partitioned"
"""Appended to the policy's name in the records of private-cluster runs."""

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")


@dataclass(frozen=True)
class RunTask:
    """One simulation to run."""

    policy: str
    workload: Workload
    config: ClusterConfig
    traces_dir: str | None = None
    """Trace directory in the artifact format; None: the built-in catalog."""
    seed: int = 0
    """Passed to the policy (``seed=``) when its constructor takes one."""
    timeline: bool = False
    """Also return the allocation timeline (for plots)."""
    autoscaler: str = "none"
    """Registered autoscaler deciding the cluster's size; "none": ``num_nodes`` fixed."""
    autoscaler_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword options of the autoscaler (``window_rounds`` and ``grow_window_rounds`` go
    to its config)."""
    job_knowledge: str = "measured"
    """What adaptive jobs know of themselves: "measured" (fitted) or "oracle" (true model)."""
    teams: Teams | None = None
    """The teams the jobs belong to (``--teams``); None: no teams file."""
    partitioned: bool = False
    """Each team alone on nodes of its quota (:mod:`pollux.sim.partition`); needs teams."""

    @property
    def label(self) -> str:
        """The policy as the records name it (``pollux/partitioned`` for private
        clusters)."""
        return f"{self.policy}{PARTITIONED_SUFFIX}" if self.partitioned else self.policy


@dataclass(frozen=True)
class JobTimeline:
    """GPUs a job held over time, as change points."""

    name: str
    application: str
    submission_s: float
    completion_s: float | None
    times_s: tuple[float, ...]
    gpus: tuple[int, ...]
    """GPUs held from ``times_s[i]`` until the next change point."""


@dataclass(frozen=True)
class Timeline:
    """Cluster-wide and per-job allocation over a run."""

    num_gpus: int
    times_s: tuple[float, ...]
    gpus_allocated: tuple[int, ...]
    jobs: tuple[JobTimeline, ...]
    num_nodes: tuple[int, ...] = ()
    """Ready nodes at each of ``times_s``."""
    num_billed_nodes: tuple[int, ...] = ()
    """Ready plus provisioning nodes at each of ``times_s``."""
    autoscaler: str = "none"


@dataclass(frozen=True)
class RunOutcome:
    task_index: int
    record: RunRecord
    timeline: Timeline | None = None


def load_applications(traces_dir: str | Path | None, config: ClusterConfig | None = None
                      ) -> dict[str, Application] | dict[str, TypedApplication]:
    """Applications from a trace directory, or the built-in catalog when None; on a typed
    cluster (``config.cluster``) from per-type traces, on each of its types."""
    if config is not None and config.cluster is not None and config.cluster.is_typed:
        if traces_dir is None:
            raise ConfigError("traces", None, "a typed cluster needs per-type traces, e.g. "
                              "--traces ARTIFACT/traces with the Sia artifact's "
                              "sia-simulator folder (docs/research/data.md)")
        return load_typed_applications(traces_dir, config.cluster.gpu_types)
    if traces_dir is None:
        from pollux.sim.catalog import load_builtin_applications

        return load_builtin_applications()
    return load_trace_applications(traces_dir)


def timeline_of(result: SimulationResult) -> Timeline:
    """Change points of every job's GPU count, and the cluster total per round."""
    return timeline_from(result.rounds, result.jobs, result.config.num_gpus,
                         result.cluster_sizes, result.autoscaler)


def timeline_from(rounds: Sequence[RoundLog], jobs: Sequence[SimJob], num_gpus: int,
                  sizes: Sequence[ClusterSize] = (), autoscaler: str = "none") -> Timeline:
    """:func:`timeline_of` from a run's round log and jobs."""
    points: dict[str, tuple[list[float], list[int]]] = {job.name: ([], []) for job in jobs}
    last: dict[str, int] = {}
    for rnd in rounds:
        for name in set(last) | set(rnd.gpus):
            gpus = rnd.gpus.get(name, 0)
            if last.get(name, 0) != gpus or name not in last:
                points[name][0].append(rnd.time_s)
                points[name][1].append(gpus)
            last[name] = gpus
        for name in [n for n, g in last.items() if g == 0]:
            del last[name]
    job_lines = tuple(JobTimeline(job.name, job.spec.application, job.spec.submission_time_s,
                                  job.completion_time_s, tuple(points[job.name][0]),
                                  tuple(points[job.name][1])) for job in jobs)
    times = tuple(r.time_s for r in rounds)
    starts = [size.time_s for size in sizes]
    at = [sizes[i] if (i := bisect_right(starts, t) - 1) >= 0 else None for t in times]
    return Timeline(
        num_gpus=num_gpus,
        times_s=times,
        gpus_allocated=tuple(sum(r.gpus.values()) for r in rounds),
        jobs=job_lines,
        num_nodes=tuple(0 if s is None else s.num_nodes for s in at),
        num_billed_nodes=tuple(0 if s is None else s.num_billed_nodes for s in at),
        autoscaler=autoscaler,
    )


def build_autoscaler(task: RunTask) -> Autoscaler | None:
    """The task's autoscaler over template nodes of its cluster; None for "none". On a
    typed cluster ``pollux`` and ``throughput`` are the typed ones (one template and bound
    per type)."""
    if check_autoscaler_name(task.autoscaler) == "none":
        return None
    cfg = task.config
    options = dict(task.autoscaler_options)
    windows = {name: int(options.pop(name)) for name in ("window_rounds", "grow_window_rounds")
               if name in options}
    prices = cfg.node_prices()
    templates = {g.gpu_type: NodeTemplate({GPU: float(g.gpus_per_node)}, prices[g.gpu_type])
                 for g in cfg.spec.groups}
    first = cfg.spec.gpu_types[0]
    config = AutoscalerConfig(template=templates[first], min_nodes=cfg.min_nodes,
                              max_nodes=cfg.scaling_max_nodes, **windows)
    if cfg.cluster is None:
        return make_autoscaler(task.autoscaler, config, **options)
    typed = TypedThroughputAutoscaler if task.autoscaler == "throughput" else TypedAutoscaler
    return typed(config, templates, {g.gpu_type: g.num_nodes for g in cfg.spec.groups},
                 **options)


def execute(task: RunTask, index: int = 0,
            applications: Mapping[str, Application] | Mapping[str, TypedApplication] | None
            = None) -> RunOutcome:
    """Run one task in this process, BLAS held to one thread throughout (a pool of
    BLAS threads set up again after the simulation's own limit only spins: 5.5-5.7
    CPU-s in one run's summary, measured on 2 busy cores)."""
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            apps = (applications if applications is not None
                    else load_applications(task.traces_dir, task.config))
            result = (_run_partitioned(task, apps) if task.partitioned else Simulator(
                task.workload, apps, make_policy(task.policy, seed=task.seed), task.config,
                autoscaler=build_autoscaler(task), job_knowledge=task.job_knowledge,
                teams=task.teams).run())
            record = summarize_run(result, apps)
    except PolluxError as exc:  # re-raised plainly so it survives pickling
        raise PolluxError(f"{task.policy} on {task.workload.name}: {exc}") from None
    return RunOutcome(index, record, timeline_of(result) if task.timeline else None)


def _run_partitioned(task: RunTask, apps: Mapping[str, Application]
                     | Mapping[str, TypedApplication]) -> SimulationResult:
    """Each team's jobs alone on the nodes of its quota, under a fresh policy each."""
    if task.teams is None:
        raise ConfigError("partitioned", True, "private clusters need --teams FILE")
    if task.autoscaler != "none":
        raise ConfigError("partitioned", True, "private clusters are fixed: leave out "
                          "--autoscaler")
    configs = partition_configs(task.config, task.teams)
    results = {team: Simulator(workload, apps, make_policy(task.policy, seed=task.seed),
                               configs[team], job_knowledge=task.job_knowledge).run()
               for team, workload in partition_workload(task.workload, task.teams).items()
               if workload.jobs}
    return merge_results(results, task.workload, task.config, task.teams, task.label)


_loaded_in_worker: dict[Hashable, Any] = {}
"""In a pool worker only (emptied as it starts): what it has loaded, by load key, so
that each worker loads each key once however many tasks it runs."""


def _start_worker() -> None:
    _loaded_in_worker.clear()


def _execute_in_worker(execute: Callable[[T, int, A | None], R], load: Callable[[T], A],
                       load_key: Callable[[T], Hashable], task: T, index: int) -> R:
    key = load_key(task)
    if key not in _loaded_in_worker:
        _loaded_in_worker[key] = load(task)
    return execute(task, index, _loaded_in_worker[key])


def run_each(tasks: Sequence[T], execute: Callable[[T, int, A | None], R],
             load: Callable[[T], A], load_key: Callable[[T], Hashable], processes: int = 1,
             on_done: Callable[[R], None] | None = None) -> list[R]:
    """``execute(task, index, applications)`` for every task, results in task order,
    each distinct ``load_key`` loaded once by ``load`` in this process, or (``processes``
    > 1) once in each of that many worker processes (then ``execute``, ``load`` and
    ``load_key`` must be picklable). ``on_done`` sees each result as it comes."""
    results: list[R | None] = [None] * len(tasks)
    if processes <= 1 or len(tasks) <= 1:
        cache: dict[Hashable, A] = {}
        for i, task in enumerate(tasks):
            key = load_key(task)
            if key not in cache:
                cache[key] = load(task)
            result = execute(task, i, cache[key])
            results[i] = result
            if on_done is not None:
                on_done(result)
    else:
        with ProcessPoolExecutor(max_workers=min(processes, len(tasks)),
                                 initializer=_start_worker) as pool:
            futures = {pool.submit(_execute_in_worker, execute, load, load_key, task, i): i
                       for i, task in enumerate(tasks)}
            for future in as_completed(futures):
                result = future.result()
                results[futures[future]] = result
                if on_done is not None:
                    on_done(result)
    return [r for r in results if r is not None]


def _load_task(task: RunTask) -> Mapping[str, Application] | Mapping[str, TypedApplication]:
    return load_applications(task.traces_dir, task.config)


def _task_load_key(task: RunTask) -> Hashable:
    return task.traces_dir, task.config.spec.gpu_types


def run_tasks(tasks: Sequence[RunTask], processes: int = 1,
              on_done: Callable[[RunOutcome], None] | None = None) -> list[RunOutcome]:
    """Run every task (in ``processes`` worker processes when > 1), results in task order."""
    for task in tasks:
        if task.policy not in POLICY_CLASSES:
            make_policy(task.policy, seed=task.seed)  # raises with the valid choices
        build_autoscaler(task)  # its name and options checked here, not in a worker
        if task.teams is not None:
            task.teams.check_cluster(task.config.spec)
            partition_workload(task.workload, task.teams)  # every job's team is known
        if task.partitioned:
            if task.teams is None:
                raise ConfigError("partitioned", True, "private clusters need --teams FILE")
            partition_configs(task.config, task.teams)
    return run_each(tasks, execute, _load_task, _task_load_key, processes, on_done)
