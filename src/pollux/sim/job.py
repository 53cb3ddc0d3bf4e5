"""A simulated job: its configuration, its progress through training, and its accounting.

Semantics follow the reference simulators of the artifacts: a job advances in progress
units (optimizer steps at the initial batch size) at ``gain / step seconds`` per second,
epochs end at fixed progress marks (whole seconds), the batch configuration is re-decided
after every stretch of training (so at every epoch boundary) and on every reallocation,
and a changed placement costs a restart delay during which the job holds its GPUs idle.

A job runs on one GPU type at a time (a homogeneous cluster has one type) and keeps one
throughput profile per type, fitted from what it ran there; an adaptive job picks its
batch by the current type's model and its latest gradient statistics (a
heterogeneity-unaware job: one profile pooled over every type). Its true progress rate is
multiplied by ``rate_factor`` (a calibration, see :mod:`pollux.sim.semantics`) and slowed
by interference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from pollux.errors import PolluxError
from pollux.models import GoodputFunction, GradientStats, JobHints, ThroughputParams, scaled_gain
from pollux.models.typed import TypedGoodput, TypeProfile
from pollux.policies.autoscaling.objective import BatchObjective
from pollux.policies.snapshot import EXPLORATION_FACTOR, MAX_EXPLORATION_REPLICAS
from pollux.sim.adaptive import EFFICIENCY_IGNORED, FitCache, JobProfile
from pollux.sim.applications import Application, ApplicationSpec, TypedApplication
from pollux.sim.placement import Placement
from pollux.teams import DEFAULT_TEAM

NUM_ORACLE_BATCH_CANDIDATES = 32
"""Total batch sizes an oracle job tries (geometric between the initial and the maximum)."""


class BatchMode(Enum):
    """How a job chooses its batch size."""

    FIXED = "fixed"
    """The tuned (or pinned) total batch size, whatever the allocation (baselines)."""
    ADAPTIVE = "adaptive"
    """Goodput-optimal from the job's own fitted model and gradient statistics (Pollux), or
    throughput-optimal from its fitted model (the THROUGHPUT batch objective)."""
    ORACLE = "oracle"
    """Goodput-optimal from the application's true behaviour (isolated reference runs)."""


class JobKnowledge(Enum):
    """What an adaptive job knows about itself (for experiments on the value of modelling)."""

    MEASURED = "measured"
    """Only what it measured: the step-time model is fitted to the configurations it ran
    (the agent's way; the default)."""
    ORACLE = "oracle"
    """Its true step-time model (from its first measurement on) and its true goodput when
    it picks a batch size: an upper bound on what better modelling could give."""


class JobState(Enum):
    WAITING = "waiting"
    """Submitted, holds no GPUs."""
    RESTARTING = "restarting"
    """Holds GPUs, paying the restart delay."""
    RUNNING = "running"
    COMPLETED = "completed"


@dataclass(frozen=True)
class JobSpec:
    """One row of a workload."""

    name: str
    submission_time_s: float
    application: str
    num_replicas: int
    """Tuned GPU count (baselines)."""
    batch_size: int
    """Tuned total batch size (baselines)."""
    team: str = DEFAULT_TEAM
    """The team that submitted the job (the workload's optional ``team`` column)."""
    priority: int = 0
    """Its order within its team (the workload's optional ``priority`` column)."""


class SimJob:
    """Mutable state of one job during a simulation, and how it trains (module docstring).

    ``app`` is the application on every GPU type of the cluster (a plain
    :class:`~pollux.sim.applications.Application` is one of the default type).
    ``known_params`` (type -> true step-time model) makes an adaptive job know its model
    (:attr:`JobKnowledge.ORACLE`); ``type_speeds`` (type -> 1-GPU throughput) lets its
    typed model project onto types it has not run on; ``pooled_type`` (heterogeneity-
    unaware jobs) pools every type's measurements in one profile with that type's limits
    (``""``: the first type's); ``placement_limits``: the largest atomic batch at a
    placement is the largest measured there."""

    def __init__(self, spec: JobSpec, app: Application | TypedApplication, mode: BatchMode,
                 fits: FitCache | None = None,
                 batch_objective: BatchObjective = BatchObjective.GOODPUT,
                 known_params: ThroughputParams | Mapping[str, ThroughputParams] | None = None,
                 *, type_speeds: dict[str, float] | None = None,
                 pooled_type: str | None = None, rate_factor: float = 1.0,
                 placement_limits: bool = False) -> None:
        self.spec = spec
        self.app = app if isinstance(app, TypedApplication) else TypedApplication.of(app)
        self.mode = mode
        self.rate_factor = rate_factor
        self.placement_limits = placement_limits
        self.type_speeds = type_speeds
        self.batch_objective = batch_objective
        ref = self.app.reference().spec
        self.target_batch_size: int | None = ref.pinned_batch_size
        """The total batch the job trains: pinned, or tuned (fixed mode); None: it chooses."""
        if self.target_batch_size is None and mode is BatchMode.FIXED:
            self.target_batch_size = int(spec.batch_size)
        if isinstance(known_params, ThroughputParams):
            known_params = dict.fromkeys(self.app.by_type, known_params)
        self.knowledge = JobKnowledge.ORACLE if known_params else JobKnowledge.MEASURED
        """ORACLE: the job knows its true step-time model and picks batch sizes by its
        true goodput once it has run (see :class:`JobKnowledge`)."""
        fits = FitCache() if fits is None else fits
        self.profiles = {t: JobProfile(a.spec, fits, batch_objective,
                                       (known_params or {}).get(t))
                         for t, a in self.app.by_type.items()}
        self.pooled: JobProfile | None = None
        """Heterogeneity-unaware jobs: one profile of every type's measurements (the first
        time measured per configuration wins)."""
        if pooled_type is not None:
            limits = self.app.by_type[pooled_type] if pooled_type else self.app.reference()
            self.pooled = JobProfile(limits.spec, fits)
        self.grad_stats: GradientStats | None = None
        """The latest true gradient statistics (of the last stretch trained)."""
        self.gpu_type: str | None = (next(iter(self.app.by_type)) if len(self.app.by_type) == 1
                                     else None)
        """Type of the current (or last) allocation."""
        self.allocation: tuple[str, ...] = ()
        self.placement: Placement = ()
        self.atomic_bsz = self.accum_steps = self.epoch = 0
        self.progress = 0.0
        self.attained_service_s = 0.0
        """GPU-seconds held while training or restoring (within rounds)."""
        self.held_gpu_s = 0.0
        """GPU-seconds of whole rounds held (Sia's GPU-hours)."""
        self.num_restarts: int | None = None
        """None until first started; each later placement change adds one."""
        self.restart_left_s = 0.0
        self.completion_time_s: float | None = None
        self.events: list[tuple[float, str]] = []
        """(simulated time, message) of what the scheduler reported about the job (e.g. an
        allocation the policy gave it that could not be applied)."""
        self._model: tuple[tuple[object, ...], TypedGoodput | None] | None = None
        self._batch: tuple[tuple[object, ...], tuple[int, int]] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def num_replicas(self) -> int:
        return sum(self.placement)

    @property
    def batch_size(self) -> int:
        return self.num_replicas * self.atomic_bsz * (self.accum_steps + 1)

    @property
    def state(self) -> JobState:
        if self.completion_time_s is not None:
            return JobState.COMPLETED
        if not self.placement:
            return JobState.WAITING
        return JobState.RESTARTING if self.restart_left_s > 0 else JobState.RUNNING

    def current_app(self) -> Application:
        """The application of the job's current (or last) GPU type."""
        if self.gpu_type is None:
            raise PolluxError(f"job {self.name!r} has never been placed on a GPU type")
        return self.app.by_type[self.gpu_type]

    @property
    def profile(self) -> JobProfile | None:
        """Where the job's measurements go: the pooled profile, the current type's (adaptive
        jobs), or nowhere (fixed-batch jobs)."""
        if self.mode is not BatchMode.ADAPTIVE:
            return None
        return self.pooled if self.pooled is not None else self.profiles[str(self.gpu_type)]

    @profile.setter
    def profile(self, profile: JobProfile) -> None:
        if self.pooled is not None:
            self.pooled = profile
        else:
            self.profiles[str(self.gpu_type)] = profile

    # -- what the scheduler sees ---------------------------------------------------------
    def remaining_progress(self) -> float:
        """Progress left to train (optimizer steps at the initial batch size): the job
        knows its target epochs. The scheduler turns it into the job's remaining time at
        one replica with the speedup model (:mod:`pollux.policies.snapshot`)."""
        ref = self.app.reference()
        return max(ref.epoch_progress(ref.spec.max_epochs) - self.progress, 0.0)

    def hints(self) -> JobHints | None:
        """What the job reports to the scheduler, as the agent would (adaptive jobs; fixed
        jobs report nothing): its profile's hints and where its training stands."""
        profile = self.profile
        if profile is None:
            return None
        running = bool(self.placement)
        return replace(profile.hints(), epoch=self.epoch, progress=self.progress,
                       batch_size=self.batch_size if running else None,
                       local_bsz=self.atomic_bsz if running else None,
                       accum_steps=self.accum_steps if running else None)

    def max_replicas(self, gpu_type: str, growth_factor: float = EXPLORATION_FACTOR,
                     initial_replicas: int = 1) -> int:
        """Growth cap on a type: ``growth_factor`` (the reference: 2) times the most
        replicas run there, rounded up (at least 1; ``initial_replicas`` before the job
        has run anywhere), at most 64 and the most replicas the largest batch can feed."""
        spec = self.app.by_type[gpu_type].spec
        if spec.pinned_replicas is not None:
            return spec.pinned_replicas
        seen = self.profiles[gpu_type].max_profiled_replicas
        ran = any(p.max_profiled_replicas for p in self.profiles.values())
        explored = max(math.ceil(growth_factor * seen), 1 if ran else initial_replicas)
        return int(min(explored, MAX_EXPLORATION_REPLICAS,
                       spec.max_batch_size // spec.min_local_bsz))

    def typed_goodput(self) -> TypedGoodput | None:
        """The job's goodput per (type, nodes, replicas) from its own per-type fits,
        projected onto the other types by 1-GPU speed ratios; None before any model.
        Rebuilt only when a fit or the gradient statistics changed."""
        params = tuple(self.profiles[t].params for t in self.profiles)
        key = (params, self.grad_stats,
               tuple(p.max_profiled_replicas for p in self.profiles.values()))
        if self._model is not None and self._model[0] == key:
            return self._model[1]
        model = None
        if any(p is not None for p in params) and self.grad_stats is not None:
            ref = self.app.reference().spec
            profiles = {t: TypeProfile(p.params, p.max_profiled_replicas)
                        for t, p in self.profiles.items() if p.params is not None}
            bounds = {t: (float(a.spec.min_local_bsz), float(a.spec.max_local_bsz))
                      for t, a in self.app.by_type.items()}
            stats = (self.grad_stats if self.batch_objective is BatchObjective.GOODPUT
                     else EFFICIENCY_IGNORED)  # throughput jobs report their throughput
            model = TypedGoodput(profiles, stats, ref.init_batch_size, ref.max_batch_size,
                                 bounds, True, self.type_speeds)
        self._model = (key, model)
        return model

    def remaining_s(self, model: TypedGoodput | None) -> float | None:
        """Seconds of training left on one GPU of the slowest modelled type, by the job's
        own model and current gradient statistics; None without a model. Progress counts
        steps at the initial batch and goodput samples per second, so the progress left
        is scaled by the initial batch size (as :mod:`pollux.policies.snapshot` does)."""
        if model is None or model.reference_goodput <= 0:
            return None
        return self.remaining_progress() * model.init_batch_size / model.reference_goodput

    # -- effects -------------------------------------------------------------------------
    def reallocate(self, allocation: tuple[str, ...], placement: Placement,
                   restart_delay_s: float, gpu_type: str | None = None) -> None:
        """Move to a new allocation (on ``gpu_type``; None: the current one), or release
        every GPU (empty); a start or a move costs ``restart_delay_s`` and counts a
        restart (not the first start)."""
        self.allocation = allocation
        if not placement:
            self.placement = ()
            self.atomic_bsz = 0
            return
        if gpu_type is not None:
            self.gpu_type = gpu_type
        self.placement = placement
        self.update_batch()
        self.restart_left_s = float(restart_delay_s)
        self.num_restarts = 0 if self.num_restarts is None else self.num_restarts + 1

    def advance(self, now_s: float, seconds: float, interference: float = 0.0) -> None:
        """Train for ``seconds`` from ``now_s``, slowed by ``interference`` (a fraction)."""
        self._train(now_s, seconds, self.rate_factor * (1.0 - interference))

    # -- the batch -----------------------------------------------------------------------
    def _batch_spec(self) -> ApplicationSpec:
        """The current type's limits (with ``placement_limits``, the largest atomic batch
        the placement's)."""
        app = self.current_app()
        if not self.placement_limits:
            return app.spec
        return replace(app.spec, max_local_bsz=app.max_local_bsz_at(self.placement))

    def _best_batch(self, spec: ApplicationSpec) -> tuple[int, int] | None:
        """The (atomic batch, accumulation steps) the job chooses; None without a model:
        true goodput (oracle knowledge or mode), else the objective (goodput, or throughput
        with efficiency ignored) of its profile's model at its latest gradient statistics."""
        profile = self.profile
        if self.mode is BatchMode.ORACLE or (self.knowledge is JobKnowledge.ORACLE
                                             and profile is not None
                                             and profile.params is not None):
            return self._oracle_batch(spec)
        stats = self.grad_stats or profile.grad_stats if profile is not None else None
        if profile is None or profile.params is None or stats is None:
            return None
        if profile.objective is not BatchObjective.GOODPUT:
            stats = EFFICIENCY_IGNORED
        key = (profile.params, stats, spec, len(self.placement), self.num_replicas)
        if self._batch is None or self._batch[0] != key:  # mostly unchanged within an epoch
            goodput = GoodputFunction(profile.params, stats, spec.init_batch_size)
            _, bsz, steps = goodput.optimize(len(self.placement), self.num_replicas,
                                             spec.max_batch_size,
                                             (spec.min_local_bsz, spec.max_local_bsz),
                                             accumulation=True)
            self._batch = (key, (int(bsz), int(steps)))
        return self._batch[1]

    def _oracle_batch(self, spec: ApplicationSpec | None = None) -> tuple[int, int]:
        """Best (atomic, accumulation) by true goodput at the current epoch."""
        spec = self._batch_spec() if spec is None else spec
        replicas = self.num_replicas
        lowest = max(spec.init_batch_size, spec.min_local_bsz * replicas)
        highest = max(lowest, spec.max_batch_size)
        best, best_goodput = (0, 0), -1.0
        for total in np.unique(np.geomspace(lowest, highest, NUM_ORACLE_BATCH_CANDIDATES)
                               .round()):
            atomic, accum = spec.fixed_batch_config(float(total), replicas)
            if atomic < 1:
                continue
            goodput = self._goodput(atomic, accum)
            if goodput > best_goodput:
                best, best_goodput = (atomic, accum), goodput
        return best

    def _goodput(self, atomic_bsz: int, accum_steps: int) -> float:
        """True progress per second at a batch configuration on the current placement."""
        app = self.current_app()
        batch = self.num_replicas * atomic_bsz * (accum_steps + 1)
        step, sync = app.step_sync_time(self.placement, atomic_bsz)
        sqr, var = app.grad_stats(batch, self.epoch)
        gain = float(scaled_gain(sqr, var, batch / app.spec.init_batch_size))
        return gain / (step + (step - sync) * accum_steps)

    def update_batch(self) -> None:
        """Re-decide atomic batch and accumulation steps for the current placement: the
        target batch if any, else the job's choice, else (no model yet) the smallest batch
        that gives every replica work."""
        spec = self._batch_spec()
        replicas = self.num_replicas
        target = self.target_batch_size
        if target is not None:
            self.atomic_bsz, self.accum_steps = spec.fixed_batch_config(target, replicas)
            return
        best = self._best_batch(spec)
        if best is None:
            self.atomic_bsz, self.accum_steps = spec.fixed_batch_config(
                max(spec.init_batch_size, spec.min_local_bsz * replicas), replicas)
        else:
            self.atomic_bsz = spec.cap_atomic_bsz(best[0], replicas, best[1])
            self.accum_steps = best[1]

    def _train(self, now_s: float, seconds: float, rate_factor: float) -> None:
        """Train for ``seconds`` from simulated time ``now_s``, the progress rate times
        ``rate_factor``: restart delay first, then stretches to each epoch end (whole
        seconds, as the reference), the batch re-decided after each."""
        if not self.placement or self.completion_time_s is not None:
            return
        replicas = self.num_replicas
        delay = min(self.restart_left_s, seconds)
        elapsed = delay
        self.restart_left_s -= delay
        seconds -= delay
        app = self.current_app()
        profile = self.profile
        nodes, init_batch = len(self.placement), app.spec.init_batch_size
        fixed = self.target_batch_size is not None  # its batch only changes with a move
        while seconds > 0 and self.completion_time_s is None:
            atomic, accum = self.atomic_bsz, self.accum_steps
            batch = replicas * atomic * (accum + 1)
            step, sync = app.step_sync_time(self.placement, atomic)
            sqr, var = app.grad_stats(batch, self.epoch)
            if profile is not None:  # adaptive jobs: what they measure and decide by
                clamped = (max(sqr, 0.0), max(var, 0.0))
                stats = self.grad_stats
                if stats is None or (stats.sqr, stats.var) != clamped:
                    self.grad_stats = GradientStats(*clamped)
                profile.observe(nodes, replicas, atomic, step, sync, sqr, var)
            gain = float(scaled_gain(sqr, var, batch / init_batch))
            goodput = gain / (step + (step - sync) * accum) * rate_factor
            next_progress = app.epoch_progress(self.epoch + 1)
            if self.progress + goodput * seconds < next_progress:
                self.progress += goodput * seconds
                elapsed += seconds
                seconds = 0
            else:  # an epoch ends within this stretch (whole seconds, as the reference)
                self.epoch += 1
                delta = min(float(round((next_progress - self.progress) / goodput)), seconds)
                if self.epoch >= app.spec.max_epochs:
                    self.completion_time_s = now_s + elapsed + delta
                self.progress = next_progress
                elapsed += delta
                seconds -= delta
            if not fixed:
                self.update_batch()
        self.attained_service_s += elapsed * replicas
