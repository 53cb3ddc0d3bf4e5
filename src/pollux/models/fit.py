"""Fitting the step-time model (:class:`ThroughputParams`) to measured step times.

The fit minimizes ``RMSLE(compute_time) + RMSLE(step_time)`` plus light regularization
toward ``gamma = 1`` and toward little retrogression (``beta / alpha``), with scipy's
bounded L-BFGS-B and an analytic gradient. Parameters the data cannot identify get
optimistic priors (see :func:`fit_throughput` for the rules).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.optimize

from pollux.errors import ConfigError
from pollux.models.throughput import FloatArray, ThroughputParams

logger = logging.getLogger(__name__)

# Parameter indices in ThroughputParams order.
ALPHA_C, BETA_C, ALPHA_N, BETA_N, ALPHA_R, BETA_R, GAMMA = range(7)

MIN_ALPHA_S = 1e-8
"""Lower bound of every ``alpha`` (s); also the value of an unidentifiable sync parameter."""
MIN_BETA_S = 0.0
"""Lower bound of every ``beta``."""
GAMMA_BOUNDS = (1.0, 10.0)
GAMMA_REGULARIZATION = 1e-3
"""Weight of ``(gamma - 1)^2`` in the loss."""
RETROGRESSION_REGULARIZATION = 1e-3
"""Weight of ``(beta_r / alpha_r)^2 + (beta_n / alpha_n)^2`` in the loss."""
RMS_SMOOTHING = 1e-4
"""Each RMSLE term is ``sqrt(mean(e^2) + RMS_SMOOTHING^2)``: differentiable where a part
of the data is fitted exactly (noise-free compute times on a line, two batch sizes), where
the plain root has a kink, L-BFGS-B's line search fails and the fit stalls at its start."""
INTER_OVER_INTRA_PRIOR = 1.1
"""Without multi-node data, inter-node sync is assumed at least this much slower."""


@dataclass(frozen=True)
class ThroughputObservations:
    """Measured step times, one entry per observation (all arrays of equal length)."""

    num_nodes: FloatArray
    num_replicas: FloatArray
    local_bsz: FloatArray
    compute_time: FloatArray
    """Seconds of one micro-step's compute (forward and backward)."""
    step_time: FloatArray
    """Seconds of one optimizer step, compute and synchronization included."""

    def __post_init__(self) -> None:
        arrays = {
            name: np.atleast_1d(np.asarray(getattr(self, name), dtype=np.float64))
            for name in ("num_nodes", "num_replicas", "local_bsz", "compute_time", "step_time")
        }
        lengths = {a.shape for a in arrays.values()}
        if len(lengths) != 1 or any(a.ndim != 1 for a in arrays.values()):
            raise ConfigError("observations", {k: v.shape for k, v in arrays.items()},
                              "give 1-d arrays of equal length")
        if arrays["num_nodes"].size == 0:
            raise ConfigError("observations", [], "give at least one observation")
        for name, arr in arrays.items():
            bad = ~np.isfinite(arr) | (arr <= 0)
            if bad.any():
                i = int(np.argmax(bad))
                raise ConfigError(f"observations.{name}[{i}]", float(arr[i]),
                                  "must be a finite number > 0")
        nodes, replicas = arrays["num_nodes"], arrays["num_replicas"]
        bad = nodes > replicas
        if bad.any():
            i = int(np.argmax(bad))
            raise ConfigError(f"observations.num_nodes[{i}]", float(nodes[i]),
                              f"cannot exceed num_replicas ({replicas[i]:g})")
        for name, arr in arrays.items():
            object.__setattr__(self, name, arr)

    def __len__(self) -> int:
        return int(self.num_nodes.size)

    @classmethod
    def from_records(cls, records: Iterable[Any]) -> ThroughputObservations:
        """Build from records: mappings, objects with attributes, or 5-tuples
        ``(num_nodes, num_replicas, local_bsz, compute_time, step_time)``."""
        names = ("num_nodes", "num_replicas", "local_bsz", "compute_time", "step_time")
        rows: list[tuple[float, ...]] = []
        for rec in records:
            if isinstance(rec, Mapping):
                rows.append(tuple(float(rec[n]) for n in names))
            elif hasattr(rec, "step_time"):
                rows.append(tuple(float(getattr(rec, n)) for n in names))
            else:
                rows.append(tuple(float(v) for v in rec))
        if not rows:
            raise ConfigError("observations", [], "give at least one observation")
        cols = np.array(rows, dtype=np.float64).T
        return cls(*cols)


@dataclass(frozen=True)
class ThroughputFit:
    """The outcome of a fit: parameters plus how the optimizer fared."""

    params: ThroughputParams
    loss: float
    converged: bool
    message: str = ""
    fixed: tuple[str, ...] = field(default_factory=tuple)
    """Names of the parameters set by priors instead of the data."""


@dataclass(frozen=True)
class _FitDesign:
    """What the loss needs from the observations, computed once per fit."""

    x: FloatArray
    multi: FloatArray
    """1.0 where the step synchronizes (more than one replica), else 0.0."""
    inter: FloatArray
    intra: FloatArray
    extra: FloatArray
    """``max(K - 2, 0)`` per observation."""
    not_multi: FloatArray
    log_compute: FloatArray
    log_step: FloatArray
    n_obs: int

    @classmethod
    def of(cls, obs: ThroughputObservations) -> _FitDesign:
        multi = obs.num_replicas > 1
        inter = multi & (obs.num_nodes > 1)
        return cls(x=obs.local_bsz, multi=multi.astype(np.float64),
                   inter=inter.astype(np.float64), intra=(multi & ~inter).astype(np.float64),
                   extra=np.maximum(obs.num_replicas - 2.0, 0.0),
                   not_multi=(~multi).astype(np.float64),
                   log_compute=np.log(obs.compute_time), log_step=np.log(obs.step_time),
                   n_obs=int(obs.local_bsz.size))


def _loss_and_grad(
    p: FloatArray, d: _FitDesign
) -> tuple[float, FloatArray]:
    """The fit objective and its gradient with respect to the 7 parameters."""
    x, multi, inter, intra, extra = d.x, d.multi, d.inter, d.intra, d.extra
    g = p[GAMMA]

    t_c = p[ALPHA_C] + p[BETA_C] * x
    # Sync time where the step synchronizes; 1.0 elsewhere keeps the logs finite (those
    # entries are masked out by ``multi`` below).
    t_s = (inter * (p[ALPHA_N] + p[BETA_N] * extra) + intra * (p[ALPHA_R] + p[BETA_R] * extra)
           + d.not_multi)
    log_c = np.log(t_c)
    log_s = np.log(t_s)
    log_o = log_c + multi * (np.logaddexp(g * log_c, g * log_s) / g - log_c)
    w_c = np.exp(g * (log_c - log_o))
    w_s = multi * np.exp(g * (log_s - log_o))

    e_c = log_c - d.log_compute
    e_s = log_o - d.log_step
    # Smoothed at 0 (see RMS_SMOOTHING): an exact fit of one part must keep a gradient.
    rms_c = float(np.sqrt(e_c @ e_c / d.n_obs + RMS_SMOOTHING**2))
    rms_s = float(np.sqrt(e_s @ e_s / d.n_obs + RMS_SMOOTHING**2))
    d_c = e_c / (d.n_obs * rms_c)
    d_s = e_s / (d.n_obs * rms_s)

    grad_tc = (d_c + d_s * w_c) / t_c
    grad_ts = d_s * w_s / t_s
    d_log_o_d_g = (w_c * log_c + w_s * log_s - log_o) / g

    ratio_r = p[BETA_R] / p[ALPHA_R]
    ratio_n = p[BETA_N] / p[ALPHA_N]
    loss = (rms_c + rms_s + GAMMA_REGULARIZATION * (g - 1.0) ** 2
            + RETROGRESSION_REGULARIZATION * (ratio_r**2 + ratio_n**2))

    grad_inter = grad_ts @ inter
    grad_intra = grad_ts @ intra
    grad_ts_extra = grad_ts * extra
    reg = 2 * RETROGRESSION_REGULARIZATION
    grad = np.array([
        grad_tc.sum(),
        grad_tc @ x,
        grad_inter - reg * ratio_n**2 / p[ALPHA_N],
        grad_ts_extra @ inter + reg * ratio_n / p[ALPHA_N],
        grad_intra - reg * ratio_r**2 / p[ALPHA_R],
        grad_ts_extra @ intra + reg * ratio_r / p[ALPHA_R],
        d_s @ d_log_o_d_g + 2 * GAMMA_REGULARIZATION * (g - 1.0),
    ])
    return loss, grad


def _initial_guess(obs: ThroughputObservations) -> FloatArray:
    """A finite starting point from simple per-group averages."""
    p = np.empty(7)
    mean_c = float(np.mean(obs.compute_time))
    if np.unique(obs.local_bsz).size > 1:
        slope, intercept = np.polyfit(obs.local_bsz, obs.compute_time, 1)
    else:
        slope, intercept = mean_c / 2 / float(np.mean(obs.local_bsz)), mean_c / 2
    p[BETA_C] = max(float(slope), 1e-3 * mean_c / float(np.mean(obs.local_bsz)))
    p[ALPHA_C] = max(float(intercept), 0.05 * mean_c)
    gap = np.maximum(obs.step_time - obs.compute_time, 0.05 * obs.step_time)
    multi = obs.num_replicas > 1
    inter = multi & (obs.num_nodes > 1)
    intra = multi & ~inter
    p[ALPHA_R] = float(np.mean(gap[intra])) if intra.any() else MIN_ALPHA_S
    p[ALPHA_N] = float(np.mean(gap[inter])) if inter.any() else p[ALPHA_R]
    p[BETA_R] = 0.01 * p[ALPHA_R]
    p[BETA_N] = 0.01 * p[ALPHA_N]
    p[GAMMA] = 1.0
    return p


def fit_throughput(
    observations: ThroughputObservations | Iterable[Any],
    initial_params: ThroughputParams | None = None,
) -> ThroughputFit:
    """Fit :class:`ThroughputParams` and report how the fit went.

    ``initial_params`` (e.g. the previous fit of the same job) warm-starts the optimizer
    from one point instead of the default two starts, which is about twice as fast.

    Priors for what the data cannot identify (optimistic where possible):

    * a single local batch size seen: ``alpha_c`` fixed at half the mean compute time;
    * no multi-replica data: every sync parameter at its lower bound;
    * no multi-node data: ``alpha_n >= 1.1 alpha_r`` and ``beta_n >= 1.1 beta_r``;
    * at most 2 replicas seen (per kind of placement): retrogression at its lower bound.

    A failed or non-finite optimization never raises: the best finite parameters seen
    (at worst the initial guess) are returned with ``converged=False`` and a warning log.
    """
    # Note: the priors below also apply to a warm start; fixed parameters never move.
    obs = (observations if isinstance(observations, ThroughputObservations)
           else ThroughputObservations.from_records(observations))
    multi = obs.num_replicas > 1
    inter = multi & (obs.num_nodes > 1)
    intra = multi & ~inter

    lower = np.array([MIN_ALPHA_S, MIN_BETA_S, MIN_ALPHA_S, MIN_BETA_S, MIN_ALPHA_S,
                      MIN_BETA_S, GAMMA_BOUNDS[0]])
    upper = np.array([np.inf] * 6 + [GAMMA_BOUNDS[1]])
    fixed: dict[int, float] = {}
    if np.unique(obs.local_bsz).size == 1:
        fixed[ALPHA_C] = float(np.mean(obs.compute_time)) / 2
    if not intra.any():
        fixed[ALPHA_R] = MIN_ALPHA_S
        fixed[BETA_R] = MIN_BETA_S
    elif obs.num_replicas[intra].max() <= 2:
        fixed[BETA_R] = MIN_BETA_S
    if not inter.any():
        fixed[ALPHA_N] = MIN_ALPHA_S
        fixed[BETA_N] = MIN_BETA_S
    elif obs.num_replicas[inter].max() <= 2:
        fixed[BETA_N] = MIN_BETA_S
    if not multi.any():
        fixed[GAMMA] = 1.0

    free = np.array([i not in fixed for i in range(7)])
    guess = np.clip(_initial_guess(obs), lower, upper)
    start = (guess.copy() if initial_params is None
             else np.clip(initial_params.as_array(), lower, upper))
    for i, v in fixed.items():
        start[i] = v
    # Optimize in units of the data-driven guess so L-BFGS-B sees well-scaled variables.
    scale = np.where(guess[:6] > 0, guess[:6], 1.0)
    scale = np.concatenate([np.maximum(scale, 1e-6 * float(np.mean(obs.compute_time))), [1.0]])

    def objective(z: FloatArray) -> tuple[float, FloatArray]:
        p = start.copy()
        p[free] = z * scale[free]
        loss, grad = _loss_and_grad(p, design)
        return loss, grad[free] * scale[free]

    design = _FitDesign.of(obs)
    best_p, best_loss = start.copy(), float(_loss_and_grad(start, design)[0])
    if not free.any():
        return ThroughputFit(ThroughputParams.from_array(_apply_inter_node_prior(start, inter)),
                             best_loss, True, "every parameter set by priors",
                             _fixed_names(fixed))
    finite_result, converged, message = False, False, "initial guess"
    bounds = list(zip(lower[free] / scale[free], upper[free] / scale[free]))
    gamma_starts = (start[GAMMA],) if initial_params is not None or not free[GAMMA] else (1.0, 3.0)
    for gamma0 in gamma_starts:
        z0 = start[free] / scale[free]
        if free[GAMMA]:
            z0[int(np.sum(free[:GAMMA]))] = gamma0
        try:
            with np.errstate(all="ignore"):
                res = scipy.optimize.minimize(objective, z0, jac=True, method="L-BFGS-B",
                                              bounds=bounds, options={"maxiter": 500, "ftol": 1e-7})
        except (ValueError, FloatingPointError, ArithmeticError) as exc:  # pragma: no cover
            message = f"optimizer raised {exc!r}"
            continue
        p = start.copy()
        p[free] = res.x * scale[free]
        loss = float(res.fun)
        if not (np.all(np.isfinite(p)) and np.isfinite(loss)):
            message = f"non-finite result ({res.message})"
            continue
        finite_result = True
        if loss <= best_loss:
            best_p, best_loss = p, loss
            converged, message = bool(res.success), str(res.message)
    if not finite_result:
        logger.warning("throughput fit failed (%s); keeping the best finite parameters",
                       message)
    elif not converged:
        logger.debug("throughput fit stopped early (%s)", message)

    best_p = _apply_inter_node_prior(np.clip(best_p, lower, upper), inter)
    return ThroughputFit(
        params=ThroughputParams.from_array(best_p),
        loss=best_loss,
        converged=converged,
        message=message,
        fixed=_fixed_names(fixed),
    )


def _apply_inter_node_prior(p: FloatArray, inter: np.ndarray) -> FloatArray:
    """Without multi-node data, inter-node sync is at least ``INTER_OVER_INTRA_PRIOR`` times
    the intra-node one."""
    p = p.copy()
    if not inter.any():
        p[ALPHA_N] = max(p[ALPHA_N], INTER_OVER_INTRA_PRIOR * p[ALPHA_R])
        p[BETA_N] = max(p[BETA_N], INTER_OVER_INTRA_PRIOR * p[BETA_R])
    return p


def _fixed_names(fixed: dict[int, float]) -> tuple[str, ...]:
    names = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma")
    return tuple(names[i] for i in sorted(fixed))


def fit_throughput_params(
    observations: ThroughputObservations | Iterable[Any],
    initial_params: ThroughputParams | None = None,
) -> ThroughputParams:
    """Fit the 7 step-time parameters to observations; see :func:`fit_throughput`."""
    return fit_throughput(observations, initial_params).params
