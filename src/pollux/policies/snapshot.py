"""The policy's question, built the same way by the simulator and the service.

Each driver describes every active job as a :class:`JobReport`: its scheduling state
(what the driver knows: resources, bounds, service received, restarts, replicas held)
and the :class:`~pollux.models.hints.JobHints` the job reported about itself (the agent
posts them to the service; a simulated adaptive job reports them the same way). This
module alone turns reports into the policy's :class:`~pollux.policies.base.JobInfo`:

* the speedup function comes from the hints (None before the job has a profile: the
  policies and the autoscalers then take the job to scale perfectly); a job that picks
  its batch sizes for throughput reports gradient statistics for which every batch is
  fully efficient, so its speedup is its throughput speedup;
* the exploration bound: a job with hints (or one that will report them, before its
  first report: it has profiled nothing) gets at most :data:`EXPLORATION_FACTOR` times
  (or the policy's own :attr:`~pollux.policies.base.Policy.exploration_factor`)
  the most replicas it has profiled (at least one, at most
  :data:`MAX_EXPLORATION_REPLICAS`, never less than it holds), no more than could each
  get its smallest atomic batch of the largest total batch, and never more than its
  spec allows;
* a job that knows how much training it has left (``remaining_progress``) gets its
  remaining time at one replica, ``remaining_s``, from its speedup model;
* with ``throughput_speedups``, the job's throughput speedup (efficiency ignored) goes
  into ``extras[THROUGHPUT_SPEEDUP_KEY]`` for the throughput autoscaler;
* on a typed cluster (the driver names its GPU types, more than one), a job whose report
  carries no typed model gets one from its hints' per-type profiles
  (:meth:`~pollux.models.hints.JobHints.typed_goodput`; a type it has not run on has no
  model) and a growth cap per type: the exploration bound above, from the replicas
  profiled on that type (1 on a type it has not run on); its ``max_replicas`` is the
  largest of these.

Hints that cannot be evaluated (a model that refuses them) are logged and the job is
treated as reporting none; in the service a model that later fails or answers non-finite
values is guarded the same way (:class:`GuardedSpeedup`): one bad job never fails a
round.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from operator import attrgetter

import numpy as np
from numpy.typing import ArrayLike

from pollux.models.hints import JobHints
from pollux.models.type_speeds import estimate_type_speeds, one_gpu_speed
from pollux.models.typed import TypedGoodput
from pollux.policies.autoscaling.utility import (
    THROUGHPUT_SPEEDUP_KEY,
    throughput_speedup_function,
)
from pollux.policies.base import (
    TYPE_SPEEDS_KEY,
    Allocation,
    JobFacts,
    JobInfo,
    NodeInfo,
    SpeedupFn,
    facts_by_type,
    typed_facts,
)
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.teams import Teams

logger = logging.getLogger(__name__)

_FACTS = tuple(f.name for f in fields(JobFacts))
"""The fields a job's report hands on to its policy record as they are (some changed)."""
_facts_of = attrgetter(*_FACTS)

EXPLORATION_FACTOR = 2
"""A job with hints may get at most this times the most replicas it has profiled."""
MAX_EXPLORATION_REPLICAS = 64
"""...and never more than this many replicas through exploration."""


@dataclass(frozen=True)
class JobReport(JobFacts):
    """One active job as a driver knows it: its scheduling state (the facts it shares with
    the policy's record) and its latest hints."""

    num_held_replicas: int = 0
    """Replicas the job holds or was promised now."""
    hints: JobHints | None = None
    """What the job reported about itself; None before its first report."""
    reports_hints: bool = False
    """The job adapts and reports hints (an agent's job, every job of the service): before
    its first report it is bounded as a job that has profiled nothing (at most one
    replica, or the policy's initial replicas; AdaptDL's ``max(2 * profiled, 1)``), as a
    simulated adaptive job is in its first round. False: a job without hints is bounded
    by its ``max_replicas`` (the simulator's fixed-batch jobs)."""
    remaining_progress: float | None = None
    """Training left in optimizer steps at the initial batch size, when the job knows its
    target (simulated jobs do); with a speedup model it becomes ``JobInfo.remaining_s``
    (``remaining_s`` here: the remaining seconds at one replica when the driver knows them
    directly, typed models)."""


@dataclass(frozen=True)
class Snapshot:
    """One scheduling question: active jobs, nodes and what each job holds now."""

    time_s: float
    jobs: tuple[JobInfo, ...]
    nodes: tuple[NodeInfo, ...]
    previous_allocations: Mapping[str, Allocation] = field(default_factory=dict)
    teams: Teams | None = None
    """The teams the jobs belong to (:mod:`pollux.teams`); None: no teams file (every
    job in one team, fair share between jobs)."""


class GuardedSpeedup:
    """A job's speedup function that cannot fail a scheduling round: when it raises or
    answers anything but finite values >= 0 (hints whose model overflows, say), the job is
    scheduled from then on as a job without a model (perfect scaling), and ``problem``
    says why (the service logs it as the job's event)."""

    def __init__(self, job_name: str, function: SpeedupFn, probe_replicas: int) -> None:
        self.job_name = job_name
        self.function = function
        self.problem: str | None = None
        self(1, max(1, probe_replicas))  # find a broken model before any policy asks

    def __call__(self, num_nodes: ArrayLike, num_replicas: ArrayLike) -> np.ndarray:
        if self.problem is None:
            try:
                with np.errstate(all="ignore"):
                    value = np.asarray(self.function(num_nodes, num_replicas),
                                       dtype=np.float64)
                shape = np.broadcast_shapes(np.shape(num_nodes), np.shape(num_replicas))
                if value.shape == shape and bool(np.all(np.isfinite(value) & (value >= 0))):
                    return value
                self.problem = "its speedup model gives values that are not finite"
            except Exception as exc:  # any failure of one job's model stays with the job
                self.problem = f"its speedup model fails ({type(exc).__name__}: {exc})"
            logger.warning("job %s: %s; scheduled as a job without a model", self.job_name,
                           self.problem)
        _, replicas = np.broadcast_arrays(np.asarray(num_nodes), np.asarray(num_replicas))
        return replicas.astype(np.float64)


SpeedupKey = tuple[object, ...]
"""The fields of a job's hints that its speedup functions depend on."""


def speedup_key(hints: JobHints) -> SpeedupKey:
    return (hints.throughput_params, hints.grad_stats, hints.init_batch_size,
            hints.max_batch_size, hints.local_bsz_bounds, hints.accumulation)


class SpeedupCache:
    """Speedup functions per job, rebuilt only when the hints they depend on change (a
    speedup function memoizes its table, so keeping it across rounds is cheap).

    With ``guarded`` (the service, where hints come from outside) each function is a
    :class:`GuardedSpeedup`; :meth:`problems` says which jobs' models failed."""

    def __init__(self, guarded: bool = False) -> None:
        self.guarded = guarded
        self._entries: dict[str, tuple[SpeedupKey, SpeedupFn | None, SpeedupFn | None]] = {}
        self._typed: dict[str, tuple[object, TypedGoodput | None]] = {}
        self._refused: dict[str, str] = {}

    def speedups(self, name: str, hints: JobHints
                 ) -> tuple[SpeedupFn | None, SpeedupFn | None]:
        """``(speedup, throughput speedup)`` of the job's hints; None without a profile.
        Raises what the models raise on hints they refuse."""
        key = speedup_key(hints)
        cached = self._entries.get(name)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        goodput = hints.goodput_function()
        throughput: SpeedupFn | None = None
        speedup: SpeedupFn | None = None
        if goodput is not None:
            speedup = hints.speedup_function()
            throughput = throughput_speedup_function(goodput, hints.max_batch_size,
                                                     hints.local_bsz_bounds,
                                                     hints.accumulation)
            if self.guarded and speedup is not None:
                probe = max(1, hints.max_profiled_replicas)
                speedup = GuardedSpeedup(name, speedup, probe)
                throughput = GuardedSpeedup(name, throughput, probe)
        self._entries[name] = (key, speedup, throughput)
        return speedup, throughput

    def typed(self, name: str, hints: JobHints,
              type_speeds: Mapping[str, float] | None = None) -> TypedGoodput | None:
        """The job's goodput per GPU type from its hints' per-type profiles (None without
        a profile), projected onto the other types of ``type_speeds``; rebuilt only when
        they change. Raises what the models raise."""
        key = (speedup_key(hints), tuple(sorted(hints.profiles_by_type().items())),
               tuple(sorted((type_speeds or {}).items())))
        cached = self._typed.get(name)
        if cached is not None and cached[0] == key:
            return cached[1]
        model = hints.typed_goodput(type_speeds)
        self._typed[name] = (key, model)
        return model

    def refused(self, name: str, reason: str) -> None:
        """Record that the job's hints could not be turned into a model."""
        self._refused[name] = reason

    def problems(self) -> dict[str, str]:
        """Job name -> why its model is not used (for the jobs it failed for)."""
        failed = {name: speedup.problem for name, (_, speedup, _) in self._entries.items()
                  if isinstance(speedup, GuardedSpeedup) and speedup.problem is not None}
        return {**self._refused, **failed}

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the entries of jobs not in ``keep`` (ended jobs)."""
        kept = set(keep)
        for entries in (self._entries, self._typed, self._refused):
            for name in set(entries) - kept:
                del entries[name]


def exploration_bound(report: JobReport, max_profiled_replicas: int | None = None,
                      num_held_replicas: int | None = None,
                      factor: float = EXPLORATION_FACTOR, least: int = 1) -> int:
    """The most replicas the policy may give the job (module docstring); by default from
    the replicas its hints profiled and the replicas it holds; ``factor``: times the
    replicas profiled (the policy's :attr:`~pollux.policies.base.Policy.
    exploration_factor`); ``least``: the bound's floor (the policy's initial replicas
    for a job that has not run anywhere)."""
    bound = report.max_replicas
    hints = report.hints
    if hints is not None:
        profiled = (hints.max_profiled_replicas if max_profiled_replicas is None
                    else max_profiled_replicas)
        held = report.num_held_replicas if num_held_replicas is None else num_held_replicas
        explored = min(MAX_EXPLORATION_REPLICAS,
                       max(int(np.ceil(factor * profiled)), 1, least))
        useful = max(1, hints.max_batch_size // max(hints.local_bsz_bounds[0], 1))
        bound = min(bound, max(explored, held), useful)
    elif report.reports_hints:  # nothing profiled yet: what profiling nothing allows
        bound = min(bound, max(1, least, report.num_held_replicas if num_held_replicas is None
                               else num_held_replicas))
    return max(bound, report.min_replicas)


def typed_caps(report: JobReport, hints: JobHints, gpu_types: Sequence[str],
               factor: float = EXPLORATION_FACTOR, initial_replicas: int = 1
               ) -> dict[str, int]:
    """The job's growth cap on each of ``gpu_types``, from what ``hints`` (the report's)
    say it profiled there (``factor``: see :func:`exploration_bound`); before it has run
    anywhere, ``initial_replicas`` on every type."""
    profiles = hints.profiles_by_type()
    ran = any(profile.max_profiled_replicas > 0 for profile in profiles.values())
    return {gpu_type: exploration_bound(
        report, profiles[gpu_type].max_profiled_replicas if gpu_type in profiles else 0, 0,
        factor, 1 if ran else initial_replicas) for gpu_type in gpu_types}


def learned_type_speeds(reports: Sequence[JobReport], gpu_types: Sequence[str],
                        declared: Mapping[str, float] | None = None) -> dict[str, float]:
    """Relative speed per GPU type of the cluster (``gpu_types``) from the 1-GPU speeds
    the jobs' hints imply on each such type they ran on (:mod:`pollux.models.type_speeds`;
    profiles of other types, which a job may invent by the dozen, are ignored), with
    ``declared`` ones kept as given. Hints whose models cannot be evaluated are left out
    (they stay with their job)."""
    cluster = set(gpu_types)
    per_job = []
    for hints in (report.hints for report in reports if report.hints is not None):
        local_bsz = min(hints.local_bsz_bounds[1], hints.max_batch_size)
        try:
            with np.errstate(all="ignore"):
                per_job.append({t: one_gpu_speed(p.throughput_params, local_bsz)
                                for t, p in hints.profiles_by_type().items()
                                if t in cluster and p.throughput_params is not None})
        except Exception:  # one job's model never fails the others
            continue
    return estimate_type_speeds(per_job, declared)


def job_info(report: JobReport, now_s: float, cache: SpeedupCache,
             throughput_speedups: bool = False, gpu_types: Sequence[str] = (),
             exploration_factor: float | None = None,
             type_speeds: Mapping[str, float] | None = None,
             initial_replicas: int = 1) -> JobInfo:
    """The policy's record of one job (module docstring); ``gpu_types``: the cluster's
    GPU types (a typed model is built from the hints when there are several);
    ``exploration_factor``: the policy's growth factor (None: :data:`EXPLORATION_FACTOR`);
    ``type_speeds``: relative GPU type speeds that project the typed model onto types the
    job has not run on (and, for a job without a model, ``extras[TYPE_SPEEDS_KEY]``);
    ``initial_replicas``: the policy's cap on every type for a job that has not run
    anywhere (:meth:`~pollux.policies.base.Policy.growth_rule`)."""
    factor = EXPLORATION_FACTOR if exploration_factor is None else exploration_factor
    speedup = throughput = max_replicas = None
    own = {t: f for t, f in report.by_type.items() if t != DEFAULT_GPU_TYPE}
    typed_goodput, caps = report.typed_goodput, {t: f.max_replicas for t, f in own.items()}
    if report.hints is not None:
        try:
            speedup, throughput = cache.speedups(report.name, report.hints)
            if len(gpu_types) > 1 and typed_goodput is None:
                typed_goodput = cache.typed(report.name, report.hints, type_speeds)
                caps = typed_caps(report, report.hints, gpu_types, factor, initial_replicas)
                max_replicas = max(exploration_bound(report, factor=factor), *caps.values())
        except Exception as exc:  # a model that refuses the hints stays with its job
            logger.warning("job %s: ignoring hints that cannot be evaluated: %s",
                           report.name, exc)
            cache.refused(report.name, f"its hints' model cannot be built "
                                       f"({type(exc).__name__}: {exc})")
            report = replace(report, hints=None)
            speedup = throughput = typed_goodput = max_replicas = None
            caps = {t: f.max_replicas for t, f in own.items()}
    extras = report.extras
    if len(gpu_types) > 1 and typed_goodput is None:  # no model yet (the service's)
        if not caps and initial_replicas > 1:  # no hints either: caps as before any run
            caps = {t: min(initial_replicas, report.max_replicas) for t in gpu_types}
            max_replicas = max(caps.values())
        if type_speeds and TYPE_SPEEDS_KEY not in extras:
            extras = {**extras, TYPE_SPEEDS_KEY: dict(type_speeds)}
    remaining_s = report.remaining_s
    base = getattr(speedup, "base_goodput", None)  # the goodput at one replica
    if base and report.remaining_progress is not None and report.hints is not None:
        remaining_s = report.remaining_progress * report.hints.init_batch_size / float(base)
    if throughput_speedups and throughput is not None:
        extras = {**extras, THROUGHPUT_SPEEDUP_KEY: throughput}
    facts = dict(zip(_FACTS, _facts_of(report)))
    bound = exploration_bound(report, factor=factor) if max_replicas is None else max_replicas
    oracles = {t: f.remaining_time_fn for t, f in own.items() if f.remaining_time_fn}
    facts.update(by_type=facts_by_type(bound, speedup, report.on().remaining_time_fn,
                                       typed_facts(caps, typed_goodput, oracles)),
                 remaining_s=remaining_s, extras=extras)
    return JobInfo(**facts, age_s=max(0.0, now_s - report.submission_time_s))


def without_models(jobs: Sequence[JobInfo]) -> tuple[JobInfo, ...]:
    """``jobs`` as jobs without a model (perfect scaling): what a driver retries a round
    with when the policy failed on the jobs' models."""
    return tuple(replace(job, remaining_s=None,
                         by_type={t: replace(f, speedup_fn=None) for t, f in job.by_type.items()},
                         extras={k: v for k, v in job.extras.items()
                                 if k != THROUGHPUT_SPEEDUP_KEY})
                 for job in jobs)

