"""A simulated job on a cluster of several GPU types.

A :class:`pollux.sim.job.TrainingJob`, as the homogeneous one (progress in initial-batch
steps at ``gain / step seconds`` per second, epochs at fixed progress marks, whole-second
epoch ends, a restart delay on every placement change), with what the Sia reference adds: the job runs on one
GPU type at a time, keeps one throughput profile per type (fitted from what it ran
there), chooses its batch from the current type's own model (before one exists:
``max(initial batch, min local batch x replicas)``), and its true progress rate is
divided by the application's calibration slowdown. A fixed-batch job (the baselines')
trains at its tuned total batch size on whatever type and allocation it gets.
"""

from __future__ import annotations

import math
from dataclasses import replace

from pollux.errors import PolluxError
from pollux.models import GoodputFunction, GradientStats
from pollux.models.typed import TypedGoodput, TypeProfile
from pollux.policies.snapshot import EXPLORATION_FACTOR, MAX_EXPLORATION_REPLICAS
from pollux.sim.adaptive import FitCache, JobProfile
from pollux.sim.applications import ApplicationSpec
from pollux.sim.hetero.apps import TypedApplication, TypedTraceApplication
from pollux.sim.job import JobSpec, TrainingJob
from pollux.sim.placement import Placement


class HeteroJob(TrainingJob):
    """Mutable state of one job during a heterogeneous simulation."""

    def __init__(self, spec: JobSpec, app: TypedApplication, fits: FitCache,
                 type_speeds: dict[str, float] | None = None, pooled: bool = False,
                 pooled_type: str | None = None, fixed_batch: bool = False) -> None:
        super().__init__(spec)
        self.app = app
        self.fixed_batch_size = int(spec.batch_size) if fixed_batch else None
        """Fixed-batch jobs (baselines): the tuned total batch size, whatever the
        allocation (an application's pinned batch size still wins); None: adaptive."""
        self.type_speeds = type_speeds
        """Type -> 1-GPU throughput, for projecting models to unseen types (None: none)."""
        self.profiles = {t: JobProfile(a.spec, fits) for t, a in app.by_type.items()}
        self.pooled: JobProfile | None = None
        """Heterogeneity-unaware jobs: one profile of every type's measurements (the first
        time measured per configuration wins), with ``pooled_type``'s batch limits."""
        if pooled:
            limits = app.by_type[pooled_type] if pooled_type else app.reference()
            self.pooled = JobProfile(limits.spec, fits)
        self.grad_stats: GradientStats | None = None
        self.gpu_type: str | None = None
        """Type of the current (or last) allocation."""
        self.held_gpu_s = 0.0
        """GPU-seconds of whole rounds held (the reference's GPU-hours)."""
        self._model: tuple[tuple[object, ...], TypedGoodput | None] | None = None

    def current_app(self) -> TypedTraceApplication:
        """The current GPU type's application."""
        if self.gpu_type is None:
            raise PolluxError(f"job {self.name!r} has never been placed on a GPU type")
        return self.app.by_type[self.gpu_type]

    # -- what the policy sees ------------------------------------------------------------
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
            model = TypedGoodput(profiles, self.grad_stats, ref.init_batch_size,
                                 ref.max_batch_size, bounds, True, self.type_speeds)
        self._model = (key, model)
        return model

    def remaining_s(self, model: TypedGoodput | None) -> float | None:
        """Seconds of training left on one GPU of the slowest modelled type, by the job's
        own model and current gradient statistics; None without a model. Progress counts
        steps at the initial batch and goodput samples per second, so the progress left
        is scaled by the initial batch size (as :mod:`pollux.policies.snapshot` does)."""
        if model is None or model.reference_goodput <= 0:
            return None
        spec = self.app.reference()
        left = spec.epoch_progress(spec.spec.max_epochs) - self.progress
        return max(left, 0.0) * model.init_batch_size / model.reference_goodput

    # -- effects -------------------------------------------------------------------------
    def reallocate(self, allocation: tuple[str, ...], placement: Placement,
                   gpu_type: str | None) -> None:
        """Move to a new allocation on ``gpu_type`` (empty: release every GPU); a start or a
        move costs the application's restart delay."""
        if placement:
            self.gpu_type = gpu_type
        self._move(allocation, placement, self.app.restart_delay_s)

    def _batch_spec(self) -> ApplicationSpec:
        """The current type's limits, the largest atomic batch the placement's."""
        app = self.current_app()
        return replace(app.spec, max_local_bsz=app.max_local_bsz_at(self.placement))

    def _target_batch_size(self, spec: ApplicationSpec) -> int | None:
        """The pinned batch, else the fixed one (baselines); None for adaptive jobs."""
        if spec.pinned_batch_size is not None:
            return spec.pinned_batch_size
        return self.fixed_batch_size

    def _best_batch(self, spec: ApplicationSpec) -> tuple[int, int] | None:
        """Goodput-optimal by the current type's (or the pooled) model and the latest
        true gradient statistics, within the placement's largest atomic batch."""
        gpu_type = self.current_app().gpu_type
        profile = self.profiles[gpu_type] if self.pooled is None else self.pooled
        if profile.params is None or self.grad_stats is None:
            return None
        goodput = GoodputFunction(profile.params, self.grad_stats, spec.init_batch_size)
        _, bsz, steps = goodput.optimize(len(self.placement), self.num_replicas,
                                         spec.max_batch_size,
                                         (spec.min_local_bsz, spec.max_local_bsz),
                                         accumulation=True)
        return int(bsz), int(steps)

    def hold_round(self, interval_s: float) -> None:
        """Count one scheduling round of the GPUs now held (GPU-hours per job)."""
        self.held_gpu_s += interval_s * self.num_replicas

    def _observe(self, num_nodes: int, num_replicas: int, atomic_bsz: int, step_s: float,
                 sync_s: float, grad_sqr: float, grad_var: float) -> None:
        """The true gradient statistics (the scheduler sees them), and, for adaptive
        jobs, the measurement in the current type's (or the pooled) profile."""
        self.grad_stats = GradientStats(max(grad_sqr, 0.0), max(grad_var, 0.0))
        if self.fixed_batch_size is None:
            gpu_type = self.current_app().gpu_type
            profile = self.profiles[gpu_type] if self.pooled is None else self.pooled
            profile.observe(num_nodes, num_replicas, atomic_bsz, step_s, sync_s, grad_sqr,
                            grad_var)

    def advance(self, now_s: float, seconds: float) -> None:
        """Train for ``seconds`` from simulated time ``now_s`` at the calibrated rate."""
        self._train(now_s, seconds, self.app.calibration)
