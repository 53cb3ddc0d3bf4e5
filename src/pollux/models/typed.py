"""A job's goodput on a cluster of several GPU types.

A job keeps one step-time model per GPU type (the same 7-parameter
:class:`~pollux.models.throughput.ThroughputParams`, fitted per type from what it ran
there), and shares one set of gradient statistics: statistical efficiency depends on the
batch size, not on the device.

**Bootstrap for unseen types.** A job that has a model on type ``d`` but none on type
``c`` borrows ``d``'s model with every time scaled by ``1 / ratio``, where ``ratio`` is
how much faster one GPU of ``c`` trains than one GPU of ``d`` (``speed[c] / speed[d]``
from a per-type relative-speed table). Every predicted time shrinks by the same factor,
so the projected goodput at any (nodes, replicas) is ``d``'s goodput there times
``ratio``: Sia's projection (SOSP'23), which takes the ratio of 1-GPU throughputs from
profiling. Among several known types the one the job has run on with the most replicas is
projected (its scaling is the best measured). ``bench/hetero_bootstrap.py`` measures how
wrong this is on the Sia artifact's traces. A type without a model and without a speed
ratio has no model: callers treat it as unknown (Sia offers such a job 1 GPU only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
from numpy.typing import ArrayLike

from pollux.errors import ConfigError
from pollux.models.efficiency import GradientStats
from pollux.models.goodput import GoodputFunction, check_batch_bounds
from pollux.models.speedup import SpeedupFunction, speedup_matrix
from pollux.models.throughput import FloatArray, ThroughputParams

__all__ = ["TypeProfile", "TypeSpeedup", "TypedGoodput", "goodput_matrix", "project_params"]

TIME_PARAMS = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r")
"""The parameters measured in seconds (``gamma`` is a shape, not a time)."""


def project_params(params: ThroughputParams, speed_ratio: float) -> ThroughputParams:
    """``params`` on a GPU type ``speed_ratio`` times as fast: every time divided by it."""
    if not (np.isfinite(speed_ratio) and speed_ratio > 0):
        raise ConfigError("speed_ratio", speed_ratio, "use a finite number > 0")
    return replace(params, **{name: getattr(params, name) / speed_ratio
                              for name in TIME_PARAMS})


@dataclass(frozen=True)
class TypeProfile:
    """What a job knows of itself on one GPU type."""

    throughput_params: ThroughputParams | None = None
    """Step-time model fitted to what the job ran on this type; None before any run."""
    max_profiled_replicas: int = 0
    """Largest replica count the job has run with on this type."""

    def __post_init__(self) -> None:
        if not (isinstance(self.max_profiled_replicas, int)
                and not isinstance(self.max_profiled_replicas, bool)
                and self.max_profiled_replicas >= 0):
            raise ConfigError("max_profiled_replicas", self.max_profiled_replicas,
                              "use a whole number >= 0")
        if self.throughput_params is not None and not isinstance(self.throughput_params,
                                                                 ThroughputParams):
            raise ConfigError("throughput_params", self.throughput_params,
                              "use a ThroughputParams record or None")


class TypedGoodput:
    """A job's goodput per (GPU type, nodes, replicas), fitted or projected per type.

    ``goodput(t, n, k)`` is the best goodput (progress in initial-batch steps per second)
    over batch configurations within the job's bounds; ``speedup(t, n, k)`` divides it by
    ``reference_goodput``, the smallest 1-GPU goodput over the modelled types, so speedups
    compare types on one scale (1.0 = one GPU of the slowest modelled type). Both
    broadcast over ``n`` and ``k`` and are memoized per type (one
    :class:`~pollux.models.speedup.SpeedupFunction` each).
    """

    def __init__(self, profiles: Mapping[str, TypeProfile], grad_stats: GradientStats,
                 init_batch_size: float, max_batch_size: float,
                 local_bsz_bounds: Mapping[str, tuple[float, float]] | tuple[float, float],
                 accumulation: bool = True,
                 type_speeds: Mapping[str, float] | None = None) -> None:
        self.profiles = dict(profiles)
        self.grad_stats = grad_stats
        self.init_batch_size = float(init_batch_size)
        self.max_batch_size = float(max_batch_size)
        self.accumulation = accumulation
        self.type_speeds = dict(type_speeds or {})
        for gpu_type, speed in self.type_speeds.items():
            if not (np.isfinite(speed) and speed > 0):
                raise ConfigError(f"type_speeds[{gpu_type!r}]", speed, "use a number > 0")
        self._bounds = local_bsz_bounds
        self.params: dict[str, ThroughputParams] = {}
        """Type -> the model used: fitted where the job ran, projected elsewhere."""
        self.projected_from: dict[str, str] = {}
        """Type -> the type its model was projected from (fitted types absent)."""
        known: dict[str, ThroughputParams] = {}
        for gpu_type, profile in self.profiles.items():
            if profile.throughput_params is not None:
                known[gpu_type] = profile.throughput_params
        self.params.update(known)
        if known:
            source = max(known, key=lambda t: (self.profiles[t].max_profiled_replicas, t))
            if source in self.type_speeds:
                for gpu_type, speed in self.type_speeds.items():
                    if gpu_type not in self.params:
                        ratio = speed / self.type_speeds[source]
                        self.params[gpu_type] = project_params(known[source], ratio)
                        self.projected_from[gpu_type] = source
        self._speedups: dict[str, SpeedupFunction] = {}
        for gpu_type, params in self.params.items():
            bounds = self.local_bsz_bounds(gpu_type)
            check_batch_bounds(self.init_batch_size, self.max_batch_size, bounds)
            goodput = GoodputFunction(params, grad_stats, self.init_batch_size)
            self._speedups[gpu_type] = SpeedupFunction(goodput, self.max_batch_size, bounds,
                                                       accumulation)
        base = [fn.base_goodput for fn in self._speedups.values()]
        self.reference_goodput = min(base) if base else 0.0

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """Types with a model (fitted or projected)."""
        return tuple(self.params)

    def local_bsz_bounds(self, gpu_type: str) -> tuple[float, float]:
        """The atomic-batch bounds on ``gpu_type`` (GPU memory differs per type)."""
        if isinstance(self._bounds, Mapping):
            found = self._bounds.get(gpu_type)
            if found is None:
                raise ConfigError("local_bsz_bounds", gpu_type,
                                  f"no bounds for this GPU type; known: {sorted(self._bounds)}")
            return found
        return self._bounds

    def has_model(self, gpu_type: str) -> bool:
        return gpu_type in self._speedups

    def goodput(self, gpu_type: str, num_nodes: ArrayLike, num_replicas: ArrayLike
                ) -> FloatArray:
        """Best goodput on ``gpu_type`` (0 for 0 replicas); ConfigError without a model."""
        fn = self._speedups.get(gpu_type)
        if fn is None:
            raise ConfigError("gpu_type", gpu_type,
                              f"no model for this type; modelled: {sorted(self._speedups)}")
        return fn(num_nodes, num_replicas) * fn.base_goodput

    def speedup(self, gpu_type: str, num_nodes: ArrayLike, num_replicas: ArrayLike
                ) -> FloatArray:
        """Goodput on ``gpu_type`` over ``reference_goodput``."""
        return self.goodput(gpu_type, num_nodes, num_replicas) / self.reference_goodput

    def best_batch(self, gpu_type: str, num_nodes: int, num_replicas: int
                   ) -> tuple[float, int, int]:
        """(goodput, atomic batch, accumulation steps) at one allocation on ``gpu_type``."""
        fn = self._speedups.get(gpu_type)
        if fn is None:
            raise ConfigError("gpu_type", gpu_type,
                              f"no model for this type; modelled: {sorted(self._speedups)}")
        good, bsz, steps = fn.goodput_fn.optimize(num_nodes, num_replicas, self.max_batch_size,
                                                  self.local_bsz_bounds(gpu_type),
                                                  self.accumulation)
        return float(good), int(bsz), int(steps)

    def on(self, gpu_type: str) -> TypeSpeedup | None:
        """The speedup on ``gpu_type`` as a function of (nodes, replicas); None without
        a model there."""
        return TypeSpeedup(self, gpu_type) if self.has_model(gpu_type) else None


class TypeSpeedup:
    """A job's speedup on one GPU type, a view of its :class:`TypedGoodput` (``model``):
    ``speedup(num_nodes, num_replicas)`` on ``gpu_type``, on the model's one scale."""

    def __init__(self, model: TypedGoodput, gpu_type: str) -> None:
        self.model = model
        self.gpu_type = gpu_type

    def __call__(self, num_nodes: ArrayLike, num_replicas: ArrayLike) -> FloatArray:
        return self.model.speedup(self.gpu_type, num_nodes, num_replicas)



def goodput_matrix(models: Sequence[TypedGoodput], gpu_type: str, num_nodes: ArrayLike,
                   num_replicas: ArrayLike) -> FloatArray:
    """``models[j].goodput(gpu_type, num_nodes[q], num_replicas[q])`` for every model as one
    (models x placements) matrix: the same numbers, many jobs per numpy pass (each model
    must have a model for ``gpu_type``)."""
    fns = []
    for model in models:
        fn = model._speedups.get(gpu_type)
        if fn is None:
            raise ConfigError("gpu_type", gpu_type,
                              f"no model for this type; modelled: {sorted(model._speedups)}")
        fns.append(fn)
    base = np.array([fn.base_goodput for fn in fns]).reshape(-1, 1)
    return speedup_matrix(fns, num_nodes, num_replicas) * base


def profile_from_dict(data: object, field: str) -> TypeProfile:
    """Parse one JSON type profile; errors name ``field`` and the bad key."""
    if not isinstance(data, dict):
        raise ConfigError(field, data, "give an object with throughput_params and "
                          "max_profiled_replicas")
    allowed = {f.name for f in fields(TypeProfile)}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{field}.{unknown[0]}", data[unknown[0]],
                          f"unknown key; use {sorted(allowed)}")
    raw_params = data.get("throughput_params")
    params = None
    if raw_params is not None:
        if not isinstance(raw_params, dict):
            raise ConfigError(f"{field}.throughput_params", raw_params, "give an object")
        params = ThroughputParams.from_dict(raw_params)
    replicas = data.get("max_profiled_replicas", 0)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ConfigError(f"{field}.max_profiled_replicas", replicas, "use a whole number >= 0")
    return TypeProfile(params, replicas)


def profile_to_dict(profile: TypeProfile) -> dict[str, object]:
    return {"throughput_params": (None if profile.throughput_params is None
                                  else profile.throughput_params.to_dict()),
            "max_profiled_replicas": profile.max_profiled_replicas}
