"""Statistical efficiency from the gradient noise scale.

Training with total batch ``M`` instead of the initial batch ``M0`` (scale ``S = M / M0``)
makes each optimizer step worth ``r`` steps at ``M0``, where the *gain* is
``r = (var + sqr) / (var / S + sqr)``; ``sqr`` is the squared norm of the true gradient
and ``var`` the variance of the gradient estimate at batch ``M0``. The efficiency
``r / S = (phi + M0) / (phi + M)`` with ``phi = M0 * var / sqr``, the gradient noise scale,
is the progress per sample relative to training at ``M0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from pollux.errors import ConfigError
from pollux.models.throughput import FloatArray

_TINY = 1e-30


@dataclass(frozen=True)
class GradientStats:
    """Gradient statistics measured at the initial batch size."""

    sqr: float
    """Squared norm of the true (noise-free) gradient, ``|E[g]|^2``."""
    var: float
    """Variance (trace of covariance) of the gradient estimated at the initial batch."""

    def __post_init__(self) -> None:
        for name in ("sqr", "var"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ConfigError(f"GradientStats.{name}", value, "use a finite value >= 0")

    def noise_scale(self, init_batch_size: float) -> float:
        """The gradient noise scale ``phi = M0 * var / sqr`` (infinite when sqr == 0)."""
        if self.sqr <= 0:
            return float("inf") if self.var > 0 else 0.0
        return float(init_batch_size) * self.var / self.sqr


def gain(grad_stats: GradientStats, init_batch_size: float, batch_size: ArrayLike) -> FloatArray:
    """Optimizer steps at the initial batch that one step at ``batch_size`` is worth."""
    scale = np.asarray(batch_size, dtype=np.float64) / float(init_batch_size)
    return np.asarray(scaled_gain(grad_stats.sqr, grad_stats.var, scale))


def scaled_gain(sqr: float, var: float, scale: ArrayLike) -> FloatArray | float:
    """The gain ``(var + sqr) / (var / scale + sqr)`` at batch scale ``scale = M / M0``
    from raw statistics (perfect scaling, ``scale``, when both are 0). A plain number in,
    a plain float out (the simulator's inner loop); arrays broadcast."""
    if isinstance(scale, (int, float)):
        if var + sqr <= 0:
            return float(scale)
        return (var + sqr) / max(var / scale + sqr, _TINY)
    if var + sqr <= 0:  # no information: assume perfect scaling
        return np.asarray(scale, dtype=np.float64) * 1.0
    return np.asarray((var + sqr) / np.maximum(var / np.asarray(scale) + sqr, _TINY))


def efficiency(
    grad_stats: GradientStats, init_batch_size: float, batch_size: ArrayLike
) -> FloatArray:
    """Statistical efficiency ``gain / scale = (phi + M0) / (phi + M)`` in (0, 1] for M >= M0."""
    scale = np.asarray(batch_size, dtype=np.float64) / float(init_batch_size)
    return gain(grad_stats, init_batch_size, batch_size) / scale


def stacked_efficiency(sqr: FloatArray, var: FloatArray, init_batch_size: FloatArray,
                       batch_size: FloatArray) -> FloatArray:
    """:func:`efficiency` of many jobs at once: their statistics and initial batches as
    arrays broadcast against ``batch_size`` (the same arithmetic, so the same numbers)."""
    scale = batch_size / init_batch_size
    with np.errstate(divide="ignore", invalid="ignore"):
        gains = np.where(var + sqr <= 0, scale * 1.0,
                         (var + sqr) / np.maximum(var / scale + sqr, _TINY))
    return np.asarray(gains / scale)
