"""A simulated job: its configuration, its progress through training, and its accounting.

Semantics follow the reference simulator of the Pollux artifact: a job advances in
progress units (optimizer steps at the initial batch size) at ``gain / step seconds`` per
second, epochs end at fixed progress marks, the batch configuration is re-decided after
every stretch of training (so at every epoch boundary) and on every reallocation, and a
changed placement costs a restart delay during which the job holds its GPUs idle.

:class:`TrainingJob` is that core, shared by both simulators; :class:`SimJob` is the
homogeneous cluster's job and :class:`pollux.sim.hetero.job.HeteroJob` the typed one.
They differ only in which application answers (one, or the current GPU type's), what
the job measures about itself, how it picks its batch size and the factor on its
progress rate (interference, or a per-application calibration).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from pollux.models import JobHints, ThroughputParams, scaled_gain
from pollux.policies.autoscaling.objective import BatchObjective
from pollux.sim.adaptive import FitCache, JobProfile
from pollux.sim.applications import Application, ApplicationSpec
from pollux.sim.placement import Placement

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


class TrainingJob(ABC):
    """Mutable state of one job during a simulation, and how it trains (module docstring)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.allocation: tuple[str, ...] = ()
        self.placement: Placement = ()
        self.atomic_bsz = 0
        self.accum_steps = 0
        self.progress = 0.0
        self.epoch = 0
        self.attained_service_s = 0.0
        """GPU-seconds held while training or restoring (within rounds)."""
        self.num_restarts: int | None = None
        """None until first started; each later placement change adds one."""
        self.restart_left_s = 0.0
        self.completion_time_s: float | None = None
        self.events: list[tuple[float, str]] = []
        """(simulated time, message) of what the scheduler reported about the job (e.g. an
        allocation the policy gave it that could not be applied)."""

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

    # -- the variations ------------------------------------------------------------------
    @abstractmethod
    def current_app(self) -> Application:
        """The application that answers for the job's current placement."""

    @abstractmethod
    def _batch_spec(self) -> ApplicationSpec:
        """The batch limits at the current placement."""

    @abstractmethod
    def _target_batch_size(self, spec: ApplicationSpec) -> int | None:
        """The total batch the job must train (pinned or fixed); None: it chooses."""

    @abstractmethod
    def _best_batch(self, spec: ApplicationSpec) -> tuple[int, int] | None:
        """The (atomic batch, accumulation steps) the job chooses; None without a model."""

    @abstractmethod
    def _observe(self, num_nodes: int, num_replicas: int, atomic_bsz: int, step_s: float,
                 sync_s: float, grad_sqr: float, grad_var: float) -> None:
        """What the job measures of a stretch of training (its own model's data)."""

    # -- effects -------------------------------------------------------------------------
    def update_batch(self) -> None:
        """Re-decide atomic batch and accumulation steps for the current placement: the
        target batch if any, else the job's choice, else (no model yet) the smallest batch
        that gives every replica work."""
        spec = self._batch_spec()
        replicas = self.num_replicas
        target = self._target_batch_size(spec)
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

    def _move(self, allocation: tuple[str, ...], placement: Placement,
              restart_delay_s: float) -> None:
        """Move to a new allocation (empty: release all GPUs); a start or a move costs
        ``restart_delay_s`` and counts a restart (not the first start)."""
        self.allocation = allocation
        if not placement:
            self.placement = ()
            self.atomic_bsz = 0
            return
        self.placement = placement
        self.update_batch()
        self.restart_left_s = float(restart_delay_s)
        self.num_restarts = 0 if self.num_restarts is None else self.num_restarts + 1

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
        spec = app.spec
        while seconds > 0 and self.completion_time_s is None:
            batch = replicas * self.atomic_bsz * (self.accum_steps + 1)
            step, sync = app.step_sync_time(self.placement, self.atomic_bsz)
            sqr, var = app.grad_stats(batch, self.epoch)
            self._observe(len(self.placement), replicas, self.atomic_bsz, step, sync, sqr, var)
            gain = float(scaled_gain(sqr, var, batch / spec.init_batch_size))
            goodput = gain / (step + (step - sync) * self.accum_steps) * rate_factor
            next_progress = app.epoch_progress(self.epoch + 1)
            if self.progress + goodput * seconds < next_progress:
                self.progress += goodput * seconds
                elapsed += seconds
                seconds = 0
            else:  # an epoch ends within this stretch (whole seconds, as the reference)
                self.epoch += 1
                delta = min(float(round((next_progress - self.progress) / goodput)), seconds)
                if self.epoch >= spec.max_epochs:
                    self.completion_time_s = now_s + elapsed + delta
                self.progress = next_progress
                elapsed += delta
                seconds -= delta
            self.update_batch()
        self.attained_service_s += elapsed * replicas


class SimJob(TrainingJob):
    """A job on a homogeneous cluster: one application, fixed, adaptive or oracle batches."""

    def __init__(self, spec: JobSpec, app: Application, mode: BatchMode,
                 fits: FitCache | None = None,
                 batch_objective: BatchObjective = BatchObjective.GOODPUT,
                 known_params: ThroughputParams | None = None) -> None:
        super().__init__(spec)
        self.app = app
        self.mode = mode
        pinned_bsz = app.spec.pinned_batch_size
        self.target_batch_size: int | None = None
        if pinned_bsz is not None:
            self.target_batch_size = pinned_bsz
        elif mode is BatchMode.FIXED:
            self.target_batch_size = int(spec.batch_size)
        self.profile = (JobProfile(app.spec, fits, batch_objective, known_params)
                        if mode is BatchMode.ADAPTIVE else None)
        self.knowledge = (JobKnowledge.MEASURED if known_params is None
                          else JobKnowledge.ORACLE)
        """ORACLE: the job knows its true step-time model and picks batch sizes by its
        true goodput once it has run (see :class:`JobKnowledge`)."""

    def current_app(self) -> Application:
        return self.app

    def remaining_progress(self) -> float:
        """Progress left to train (optimizer steps at the initial batch size): the job
        knows its target epochs. The scheduler turns it into the job's remaining time at
        one replica with the speedup model (:mod:`pollux.policies.snapshot`)."""
        return max(self.app.epoch_progress(self.app.spec.max_epochs) - self.progress, 0.0)

    def hints(self) -> JobHints | None:
        """What the job reports to the scheduler, as the agent would (adaptive jobs; fixed
        jobs report nothing): its profile's hints and where its training stands."""
        if self.profile is None:
            return None
        running = bool(self.placement)
        return replace(self.profile.hints(), epoch=self.epoch, progress=self.progress,
                       batch_size=self.batch_size if running else None,
                       local_bsz=self.atomic_bsz if running else None,
                       accum_steps=self.accum_steps if running else None)

    def reallocate(self, allocation: tuple[str, ...], placement: Placement,
                   restart_delay_s: float) -> None:
        """Move to a new allocation (empty: release all GPUs)."""
        self._move(allocation, placement, restart_delay_s)

    def _batch_spec(self) -> ApplicationSpec:
        return self.app.spec

    def _target_batch_size(self, spec: ApplicationSpec) -> int | None:
        return self.target_batch_size

    def _best_batch(self, spec: ApplicationSpec) -> tuple[int, int] | None:
        if self.mode is BatchMode.ADAPTIVE and self.profile is not None:
            if self.knowledge is JobKnowledge.ORACLE and self.profile.params is not None:
                return self._oracle_batch()
            return self.profile.best_batch(len(self.placement), self.num_replicas)
        if self.mode is BatchMode.ORACLE:
            return self._oracle_batch()
        return None

    def _oracle_batch(self) -> tuple[int, int]:
        """Best (atomic, accumulation) by true goodput at the current epoch."""
        spec = self.app.spec
        replicas = self.num_replicas
        lowest = max(spec.init_batch_size, spec.min_local_bsz * replicas)
        highest = max(lowest, spec.max_batch_size)
        best, best_goodput = (0, 0), -1.0
        for total in np.unique(np.geomspace(lowest, highest, NUM_ORACLE_BATCH_CANDIDATES)
                               .round()):
            atomic, accum = spec.fixed_batch_config(float(total), replicas)
            if atomic < 1:
                continue
            goodput = self._goodput(atomic, accum, 0.0)
            if goodput > best_goodput:
                best, best_goodput = (atomic, accum), goodput
        return best

    def _goodput(self, atomic_bsz: int, accum_steps: int, interference: float) -> float:
        """True progress per second at a batch configuration on the current placement."""
        spec = self.app.spec
        batch = self.num_replicas * atomic_bsz * (accum_steps + 1)
        scale = batch / spec.init_batch_size
        step, sync = self.app.step_sync_time(self.placement, atomic_bsz)
        sqr, var = self.app.grad_stats(batch, self.epoch)
        gain = float(scaled_gain(sqr, var, scale))
        return gain / (step + (step - sync) * accum_steps) * (1.0 - interference)

    def _observe(self, num_nodes: int, num_replicas: int, atomic_bsz: int, step_s: float,
                 sync_s: float, grad_sqr: float, grad_var: float) -> None:
        if self.profile is not None:
            self.profile.observe(num_nodes, num_replicas, atomic_bsz, step_s, sync_s,
                                 grad_sqr, grad_var)

    def advance(self, now_s: float, seconds: float, interference: float = 0.0) -> None:
        """Train for ``seconds`` starting at simulated time ``now_s``, slowed by
        ``interference`` (a fraction)."""
        self._train(now_s, seconds, 1.0 - interference)
