"""Application models: what a training job of one type does on a given placement.

An :class:`Application` answers four questions, each as the reference simulator of the
Pollux artifact does (the data: docs/research/data.md):

* ``step_sync_time(placement, local_bsz)``: seconds of one optimizer step and the part of
  it spent synchronizing gradients;
* ``grad_stats(batch_size, epoch)``: squared gradient norm and gradient variance (at the
  initial batch scale) during an epoch trained at a total batch size;
* ``epoch_progress(epoch)``: the statistical progress at which ``epoch`` epochs are done;
* ``iterations(batch_size, epoch)``: optimizer steps done at the end of epoch index
  ``epoch`` when training at ``batch_size`` (the Optimus oracle's remaining iterations).

Two sources implement it: :class:`TraceApplication` (measurements in the artifact format,
interpolated) here, and the compact parametric models of :mod:`pollux.sim.catalog`.

A job's application on a cluster is one model per GPU type, :class:`TypedApplication`
(a homogeneous cluster's has one entry). The Sia artifact gives, per application, one
placements and one scalability file per GPU type and validation files shared by every
type: a :class:`TraceApplication` of one type (``gpu_type``) has that type's step times
and batch limits (its measured local batch range, deepspeech2 on rtx at most 57, and at a
measured placement the largest atomic batch measured there), and its 1-GPU throughput
gives the speed ratios that project a job's model onto types it has not run on.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

import numpy as np
from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

from pollux.errors import ConfigError, WorkloadError
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.sim.placement import Placement, canonical_placement
from pollux.sim.traces import TraceData, application_dirs, read_trace_dir

MAX_EPOCHS = MappingProxyType({
    "bert": 2, "cifar10": 100, "deepspeech2": 80, "imagenet": 90, "ncf": 10, "yolov3": 50,
})
"""Epochs each application trains for (the reference simulator's settings)."""
MAX_LOCAL_BSZ_OVERRIDE = MappingProxyType({"yolov3": 8})
"""Largest atomic batch where it differs from the largest measured one (GPU memory)."""
TYPE_MAX_LOCAL_BSZ_OVERRIDE = MappingProxyType({("deepspeech2", "rtx"): 57})
"""Per GPU type: largest atomic batch where GPU memory is below the measured range."""
PINNED_CONFIGS = MappingProxyType({"ncf": (1, 32768)})
"""Applications pinned to (replicas, total batch size) under every policy."""
MAX_INTERPOLATION_NODES = 16
"""Node counts beyond this are looked up as this many (the measurements stop there)."""


@dataclass(frozen=True)
class ApplicationSpec:
    """Batch-size bounds and length of one application."""

    name: str
    init_batch_size: int
    """Initial (smallest) total batch size M0; progress is counted in steps at M0."""
    max_batch_size: int
    min_local_bsz: int
    """Smallest per-replica (atomic) batch."""
    max_local_bsz: int
    """Largest per-replica (atomic) batch; bigger local batches use gradient accumulation."""
    max_epochs: int
    pinned_replicas: int | None = None
    """If set, the job always runs with at most this many replicas..."""
    pinned_batch_size: int | None = None
    """...and this total batch size, under every policy."""

    def fixed_batch_config(self, batch_size: float, num_replicas: int) -> tuple[int, int]:
        """(atomic batch, accumulation steps) that run total ``batch_size`` on ``num_replicas``.

        The local batch is split into accumulation micro-steps of at most
        ``max_local_bsz``; a single replica training above the initial batch takes at least
        one accumulation step; the total never exceeds ``max_batch_size``.
        """
        local_bsz = math.ceil(batch_size / num_replicas - 1e-8)
        accum_steps = math.ceil(local_bsz / self.max_local_bsz - 1e-8) - 1
        if num_replicas == 1 and batch_size > self.init_batch_size:
            accum_steps = max(1, accum_steps)
        atomic_bsz = math.ceil(local_bsz / (accum_steps + 1) - 1e-8)
        return self.cap_atomic_bsz(atomic_bsz, num_replicas, accum_steps), accum_steps

    def cap_atomic_bsz(self, atomic_bsz: int, num_replicas: int, accum_steps: int) -> int:
        """Largest atomic batch <= ``atomic_bsz`` that keeps the total <= max_batch_size."""
        count = num_replicas * (accum_steps + 1)
        return int(min(atomic_bsz, int(self.max_batch_size / count)))

    @property
    def max_useful_replicas(self) -> int:
        """Replicas beyond this could not each get ``min_local_bsz`` of the largest batch."""
        if self.pinned_replicas is not None:
            return self.pinned_replicas
        return max(1, self.max_batch_size // self.min_local_bsz)


def make_spec(name: str, batch_sizes: tuple[int, ...], min_local_bsz: int, max_local_bsz: int,
              num_epochs_measured: int) -> ApplicationSpec:
    """The reference simulator's spec from an application's measured ranges."""
    pinned = PINNED_CONFIGS.get(name)
    return ApplicationSpec(
        name=name,
        init_batch_size=int(min(batch_sizes)),
        max_batch_size=int(max(batch_sizes)),
        min_local_bsz=int(min_local_bsz),
        max_local_bsz=int(MAX_LOCAL_BSZ_OVERRIDE.get(name, max_local_bsz)),
        max_epochs=int(MAX_EPOCHS.get(name, num_epochs_measured)),
        pinned_replicas=None if pinned is None else pinned[0],
        pinned_batch_size=None if pinned is None else pinned[1],
    )


class Application(ABC):
    """One application's true behaviour; lookups are memoized per instance."""

    def __init__(self, spec: ApplicationSpec) -> None:
        self.spec = spec
        self._step_cache: dict[tuple[Placement, float], tuple[float, float]] = {}
        self._stats_cache: dict[tuple[float, int], tuple[float, float]] = {}

    @property
    def name(self) -> str:
        return self.spec.name

    def max_local_bsz_at(self, placement: Placement) -> int:
        """Largest atomic batch at a placement (measured sources may know it per
        placement)."""
        return self.spec.max_local_bsz

    def step_time_key(self, placement: Placement) -> Hashable:
        """Equal for placements whose step times are the same at every batch."""
        return canonical_placement(placement)

    def step_sync_time(self, placement: Placement, local_bsz: float) -> tuple[float, float]:
        """(step seconds, sync seconds) of one optimizer step without accumulation."""
        key = (placement, float(local_bsz))
        found = self._step_cache.get(key)
        if found is None:
            canon = canonical_placement(placement)
            found = self._step_cache.get((canon, float(local_bsz)))
            if found is None:
                found = self._measure(canon, float(local_bsz))
                self._step_cache[(canon, float(local_bsz))] = found
            self._step_cache[key] = found
        return found

    def step_sync_times(self, placement: Placement, local_bsz: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`step_sync_time` over an array of local batches (not memoized)."""
        pairs = [self.step_sync_time(placement, float(b)) for b in local_bsz]
        out = np.array(pairs, dtype=np.float64).reshape(len(pairs), 2)
        return out[:, 0], out[:, 1]

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during ``epoch`` when training at total ``batch_size``."""
        key = (float(batch_size), int(epoch))
        found = self._stats_cache.get(key)
        if found is None:
            found = self._grad_stats(float(batch_size), int(epoch))
            self._stats_cache[key] = found
        return found

    def grad_stats_many(self, batch_size: np.ndarray, epoch: int
                        ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`grad_stats` over an array of total batch sizes (not memoized)."""
        pairs = [self._grad_stats(float(b), int(epoch)) for b in batch_size]
        out = np.array(pairs, dtype=np.float64).reshape(len(pairs), 2)
        return out[:, 0], out[:, 1]

    @abstractmethod
    def _measure(self, placement: Placement, local_bsz: float) -> tuple[float, float]:
        """Uncached step/sync time at a canonical placement."""

    @abstractmethod
    def _grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """Uncached gradient statistics."""

    @abstractmethod
    def epoch_progress(self, epoch: int) -> float:
        """Statistical progress at which ``epoch`` epochs are complete (0 for epoch 0)."""

    @abstractmethod
    def iterations(self, batch_size: float, epoch: int) -> float:
        """Cumulative optimizer steps at the end of epoch index ``epoch`` at ``batch_size``."""


def bracket(sizes: tuple[int, ...], batch_size: float) -> tuple[int, int, float]:
    """Indices of the validated sizes around ``batch_size`` and the weight of the upper one.

    Sizes outside the validated range are clamped to its ends.
    """
    hi = bisect_left(sizes, batch_size)
    if hi >= len(sizes):
        return len(sizes) - 1, len(sizes) - 1, 0.0
    if hi == 0 or sizes[hi] == batch_size:
        return hi, hi, 0.0
    lo = hi - 1
    return lo, hi, (batch_size - sizes[lo]) / (sizes[hi] - sizes[lo])


class TraceApplication(Application):
    """An application whose behaviour is interpolated from measurements (artifact format).

    Step/sync time: exact placements interpolate linearly in the local batch; others
    interpolate linearly (Delaunay) over (num_nodes, num_replicas, local_bsz), falling back
    to the nearest measurement outside the measured hull. Gradient statistics and
    iterations interpolate linearly between the validated batch sizes around the batch.
    """

    def __init__(self, trace: TraceData, gpu_type: str | None = None) -> None:
        spec = make_spec(trace.name, trace.batch_sizes, trace.min_local_bsz,
                         trace.max_local_bsz, min(len(v.progress) for v in trace.validation))
        if gpu_type is not None:  # the type's measured range
            spec = replace(spec, min_local_bsz=trace.min_local_bsz, max_local_bsz=int(
                TYPE_MAX_LOCAL_BSZ_OVERRIDE.get((trace.name, gpu_type), trace.max_local_bsz)))
        super().__init__(spec)
        self.trace = trace
        self.gpu_type = gpu_type
        """The GPU type measured (per-type traces); None: an untyped trace."""
        self._linear: LinearNDInterpolator | None = None
        self._nearest: NearestNDInterpolator | None = None
        progress = np.stack([v.progress[: spec.max_epochs] for v in trace.validation])
        self._epoch_progress = np.concatenate([[0.0], progress.min(axis=0)])
        self._placement_max: dict[Placement, int] = {}

    def max_local_bsz_at(self, placement: Placement) -> int:
        """Per-type traces: the largest atomic batch measured at a placement (or, for a
        placement not measured exactly, at any larger scale), within the type's bound."""
        if self.gpu_type is None:
            return super().max_local_bsz_at(placement)
        canon = canonical_placement(placement)
        found = self._placement_max.get(canon)
        if found is None:
            exact = self.trace.placements.get(canon)
            if exact is not None:
                found = int(exact.local_bsz.max())
            else:
                points = self.trace.scale_points
                larger = points[(points[:, 0] >= len(canon)) & (points[:, 1] >= sum(canon))]
                found = int(larger[:, 2].max()) if len(larger) else self.spec.max_local_bsz
            found = min(found, self.spec.max_local_bsz)
            self._placement_max[canon] = found
        return found

    def one_gpu_throughput(self) -> float:
        """Samples per second of one GPU: largest local batch over the slowest step among
        the 1-replica measurements (the speed the projections compare)."""
        ones = [trace for placement, trace in self.trace.placements.items()
                if sum(placement) == 1]
        if not ones:
            where = "placements.csv" if self.gpu_type is None else f"placements-{self.gpu_type}.csv"
            raise WorkloadError(self.name, None, where,
                                "no 1-replica measurements; the speed ratio needs them")
        return (max(float(t.local_bsz.max()) for t in ones)
                / max(float(t.step_time.max()) for t in ones))

    def step_time_key(self, placement: Placement) -> Hashable:
        """A measured placement's own times, else those interpolated at its node count
        (up to MAX_INTERPOLATION_NODES) and replica count."""
        canon = canonical_placement(placement)
        if canon in self.trace.placements:
            return canon
        return min(len(canon), MAX_INTERPOLATION_NODES), sum(canon)

    def _measure(self, placement: Placement, local_bsz: float) -> tuple[float, float]:
        step, sync = self.step_sync_times(placement, np.array([local_bsz], dtype=np.float64))
        return float(step[0]), float(sync[0])

    def step_sync_times(self, placement: Placement, local_bsz: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
        canon = canonical_placement(placement)
        exact = self.trace.placements.get(canon)
        if exact is None:
            if self._linear is None:
                self._linear = LinearNDInterpolator(self.trace.scale_points,
                                                    self.trace.scale_values)
            bsz = np.asarray(local_bsz, dtype=np.float64)
            points = np.column_stack([
                np.full(len(bsz), min(len(canon), MAX_INTERPOLATION_NODES), dtype=np.float64),
                np.full(len(bsz), sum(canon), dtype=np.float64), bsz])
            values = np.array(self._linear(points), dtype=np.float64).reshape(len(bsz), 2)
            outside = ~np.isfinite(values).all(axis=1)
            if outside.any():  # outside the measured hull: the nearest measurement
                if self._nearest is None:
                    self._nearest = NearestNDInterpolator(self.trace.scale_points,
                                                          self.trace.scale_values)
                values[outside] = np.asarray(self._nearest(points[outside])).reshape(-1, 2)
            return values[:, 0], values[:, 1]
        return (np.interp(local_bsz, exact.local_bsz, exact.step_time),
                np.interp(local_bsz, exact.local_bsz, exact.sync_time))

    def _row(self, epoch: int) -> int:
        return min(max(epoch, 0), len(self.trace.validation[0].progress) - 1)

    def _grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        lo, hi, w = bracket(self.trace.batch_sizes, batch_size)
        e = self._row(epoch)
        a, b = self.trace.validation[lo], self.trace.validation[hi]
        if lo == hi:
            return float(a.grad_sqr[e]), float(a.grad_var[e])
        return (float((1 - w) * a.grad_sqr[e] + w * b.grad_sqr[e]),
                float((1 - w) * a.grad_var[e] + w * b.grad_var[e]))

    def grad_stats_many(self, batch_size: np.ndarray, epoch: int
                        ) -> tuple[np.ndarray, np.ndarray]:
        sizes = np.asarray(self.trace.batch_sizes, dtype=np.float64)
        e = self._row(epoch)
        sqr = np.array([v.grad_sqr[e] for v in self.trace.validation], dtype=np.float64)
        var = np.array([v.grad_var[e] for v in self.trace.validation], dtype=np.float64)
        return np.interp(batch_size, sizes, sqr), np.interp(batch_size, sizes, var)

    def epoch_progress(self, epoch: int) -> float:
        return float(self._epoch_progress[min(max(epoch, 0), len(self._epoch_progress) - 1)])

    def iterations(self, batch_size: float, epoch: int) -> float:
        lo, hi, w = bracket(self.trace.batch_sizes, batch_size)
        e = self._row(epoch)
        a, b = self.trace.validation[lo], self.trace.validation[hi]
        return float((1 - w) * a.iteration[e] + w * b.iteration[e])


def load_trace_applications(traces_dir: str | Path) -> dict[str, Application]:
    """Every application of a trace directory, by name."""
    return {name: TraceApplication(read_trace_dir(path))
            for name, path in application_dirs(traces_dir).items()}


@dataclass(frozen=True)
class TypedApplication:
    """One application on every GPU type of a cluster."""

    name: str
    by_type: Mapping[str, Application]

    @classmethod
    def of(cls, app: Application, gpu_type: str = DEFAULT_GPU_TYPE) -> TypedApplication:
        """An application measured on one type (a homogeneous cluster's)."""
        return cls(app.name, MappingProxyType({gpu_type: app}))

    def type_speeds(self) -> dict[str, float]:
        """Type -> 1-GPU throughput (samples/s); ratios of these project models."""
        return {t: app.one_gpu_throughput() for t, app in self.by_type.items()
                if isinstance(app, TraceApplication) and app.gpu_type is not None}

    @property
    def spec(self) -> ApplicationSpec:
        """The reference type's spec (batch sizes and epochs are the same on every type)."""
        return self.reference().spec

    def reference(self) -> Application:
        """The type-independent parts (epochs, gradient statistics) of any type."""
        return next(iter(self.by_type.values()))


def load_typed_applications(traces_dir: str | Path, gpu_types: Sequence[str]
                            ) -> dict[str, TypedApplication]:
    """Every application of a per-type trace directory, on each of ``gpu_types``.

    Raises :class:`~pollux.errors.WorkloadError` naming the missing file when an
    application has no measurements for one of the types.
    """
    root = Path(traces_dir)
    if not root.is_dir():
        raise WorkloadError(str(root), None, "--traces", "not a directory")
    found: dict[str, TypedApplication] = {}
    for child in sorted(root.iterdir()):
        if not child.is_dir():
            continue
        have = {path.name for path in child.glob("placements-*.csv")}
        if not have:
            continue
        missing = [t for t in gpu_types if f"placements-{t}.csv" not in have]
        if missing:
            raise WorkloadError(str(child), None, f"placements-{missing[0]}.csv",
                                "no measurements for this GPU type; types measured: "
                                + ", ".join(sorted(h[len("placements-"):-4] for h in have)))
        found[child.name] = TypedApplication(
            child.name, MappingProxyType({t: TraceApplication(read_trace_dir(child, t), t)
                                          for t in gpu_types}))
    if not found:
        raise WorkloadError(str(root), None, "--traces", "no application directories with "
                            "per-type files (placements-<type>.csv); untyped traces: "
                            f"{', '.join(application_dirs(root)) if _has_untyped(root) else '-'}")
    return found


def _has_untyped(root: Path) -> bool:
    return any((child / "placements.csv").is_file() for child in root.iterdir()
               if child.is_dir())


def typed_on(app: Application | TypedApplication, gpu_types: Sequence[str]
             ) -> TypedApplication:
    """``app`` on the cluster's types: a plain application is the one type's."""
    if isinstance(app, TypedApplication):
        return app
    if len(gpu_types) != 1:
        raise ConfigError("traces", app.name, "a typed cluster needs per-type traces "
                          "(<app>/placements-<type>.csv), e.g. the Sia artifact's "
                          "sia-simulator/traces (docs/research/data.md)")
    return TypedApplication.of(app, gpu_types[0])
