"""The step-time (system throughput) model of a data-parallel training job.

A job runs ``K`` replicas on ``N`` nodes, each replica processing an atomic (local) batch
of ``b`` samples per micro-step, with ``s`` gradient-accumulation micro-steps before each
optimizer step (so the total batch is ``M = K * b * (s + 1)``).

Every function broadcasts over numpy arrays and accepts scalars.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pollux.errors import ConfigError

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class ThroughputParams:
    """The 7 parameters of the step-time model (all times in seconds).

    Compute time of one micro-step:  ``T_c = alpha_c + beta_c * b``.
    Synchronization time of one optimizer step (``K`` replicas, ``N`` nodes):
    ``T_s = 0`` if ``K == 1``;
    ``T_s = alpha_r + beta_r * max(K - 2, 0)`` if ``N == 1`` (intra-node, e.g. NVLink/PCIe);
    ``T_s = alpha_n + beta_n * max(K - 2, 0)`` if ``N > 1`` (inter-node network).
    Optimizer step, overlapping compute and sync: ``T_o = (T_c^gamma + T_s^gamma)^(1/gamma)``.
    One iteration with ``s`` accumulation steps: ``T_iter = s * T_c + T_o``.
    Throughput: ``K * b * (s + 1) / T_iter`` samples per second.
    """

    alpha_c: float
    """Constant compute time per micro-step (s): ``T_c = alpha_c + beta_c * b``."""
    beta_c: float
    """Compute time per sample of the local batch (s/sample)."""
    alpha_n: float
    """Constant inter-node sync time (s): ``T_s = alpha_n + beta_n * max(K-2, 0)`` if N > 1."""
    beta_n: float
    """Inter-node retrogression: extra sync time per replica beyond 2 (s/replica)."""
    alpha_r: float
    """Constant intra-node sync time (s): ``T_s = alpha_r + beta_r * max(K-2, 0)`` if N == 1."""
    beta_r: float
    """Intra-node retrogression: extra sync time per replica beyond 2 (s/replica)."""
    gamma: float
    """Overlap exponent in [1, 10]: 1 = no overlap of compute and sync, large = full overlap."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not np.isfinite(value) or value < 0:
                raise ConfigError(f"ThroughputParams.{f.name}", value, "use a finite value >= 0")
        if not 1.0 <= self.gamma <= 10.0:
            raise ConfigError("ThroughputParams.gamma", self.gamma, "gamma must lie in [1, 10]")

    def as_array(self) -> FloatArray:
        """The parameters in declaration order as a float array."""
        return np.array(astuple(self), dtype=np.float64)

    @classmethod
    def from_array(cls, values: ArrayLike) -> ThroughputParams:
        """Inverse of :meth:`as_array`."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        if arr.shape != (7,):
            raise ConfigError("ThroughputParams", arr.shape, "pass exactly 7 values")
        return cls(*(float(v) for v in arr))

    def to_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> ThroughputParams:
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise ConfigError("ThroughputParams", sorted(data), f"missing keys {missing}")
        return cls(*(float(data[n]) for n in names))


@dataclass(frozen=True)
class ThroughputArrays:
    """The 7 parameters of many jobs, one array each (same shapes), for the functions
    below to evaluate every job at once by broadcasting (see :meth:`stack`)."""

    alpha_c: FloatArray
    beta_c: FloatArray
    alpha_n: FloatArray
    beta_n: FloatArray
    alpha_r: FloatArray
    beta_r: FloatArray
    gamma: FloatArray

    @classmethod
    def stack(cls, params: Sequence[ThroughputParams], trailing_dims: int = 0
              ) -> ThroughputArrays:
        """One entry per job along the first axis, then ``trailing_dims`` axes of 1."""
        values = np.array([(p.alpha_c, p.beta_c, p.alpha_n, p.beta_n, p.alpha_r, p.beta_r,
                            p.gamma) for p in params], dtype=np.float64).reshape(
            (len(params), 7) + (1,) * trailing_dims)
        return cls(*(values[:, i] for i in range(7)))


Params = ThroughputParams | ThroughputArrays
"""One job's parameters, or many jobs' stacked."""


def compute_time(params: Params, local_bsz: ArrayLike) -> FloatArray:
    """Seconds of one micro-step's forward/backward pass at atomic batch ``local_bsz``."""
    return params.alpha_c + params.beta_c * np.asarray(local_bsz, dtype=np.float64)


def sync_time(
    params: Params, num_nodes: ArrayLike, num_replicas: ArrayLike
) -> FloatArray:
    """Seconds of gradient synchronization per optimizer step (0 for a single replica)."""
    nodes = np.asarray(num_nodes, dtype=np.float64)
    replicas = np.asarray(num_replicas, dtype=np.float64)
    extra = np.maximum(replicas - 2.0, 0.0)
    intra = params.alpha_r + params.beta_r * extra
    inter = params.alpha_n + params.beta_n * extra
    t = np.where(nodes > 1, inter, intra)
    return np.where(replicas > 1, t, 0.0)


def optimizer_step_time(
    params: Params, num_nodes: ArrayLike, num_replicas: ArrayLike, local_bsz: ArrayLike
) -> FloatArray:
    """Seconds of one optimizer step: ``(T_c^gamma + T_s^gamma)^(1/gamma)``."""
    t_c = compute_time(params, local_bsz)
    t_s = sync_time(params, num_nodes, num_replicas)
    g = params.gamma
    # Computed in log space so that large gamma cannot overflow.
    with np.errstate(divide="ignore"):
        log_c = g * np.log(t_c)
        log_s = g * np.log(t_s)
    return np.exp(np.logaddexp(log_c, log_s) / g)


def iteration_time(
    params: Params,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> FloatArray:
    """Seconds of one iteration: ``s`` accumulation micro-steps plus one optimizer step."""
    t_c = compute_time(params, local_bsz)
    t_o = optimizer_step_time(params, num_nodes, num_replicas, local_bsz)
    return np.asarray(accum_steps, dtype=np.float64) * t_c + t_o


def throughput(
    params: Params,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> FloatArray:
    """Samples per second: ``K * b * (s + 1) / T_iter``."""
    replicas = np.asarray(num_replicas, dtype=np.float64)
    bsz = np.asarray(local_bsz, dtype=np.float64)
    steps = np.asarray(accum_steps, dtype=np.float64)
    t_iter = iteration_time(params, num_nodes, num_replicas, local_bsz, accum_steps)
    return replicas * bsz * (steps + 1.0) / t_iter
