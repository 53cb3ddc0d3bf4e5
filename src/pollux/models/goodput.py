"""Goodput = throughput x statistical efficiency, and its maximization over batch sizes."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pollux.errors import ConfigError
from pollux.models.efficiency import GradientStats, efficiency, stacked_efficiency
from pollux.models.throughput import FloatArray, ThroughputArrays, ThroughputParams, throughput

NUM_BATCH_CANDIDATES = 64
"""Total batch sizes tried between the initial and the maximum batch size (geometric)."""


def check_batch_bounds(
    init_batch_size: float, max_batch_size: float, local_bsz_bounds: tuple[float, float]
) -> tuple[int, int]:
    """Validate batch-size bounds, returning the integer (lo, hi) local bounds."""
    lo, hi = local_bsz_bounds
    if not (np.isfinite(lo) and lo >= 1):
        raise ConfigError("local_bsz_bounds[0]", lo, "the smallest atomic batch must be >= 1")
    if not (np.isfinite(hi) and hi >= lo):
        raise ConfigError("local_bsz_bounds[1]", hi,
                          f"the largest atomic batch must be >= the smallest ({lo})")
    if not max_batch_size >= init_batch_size:
        raise ConfigError("max_batch_size", max_batch_size,
                          f"must be >= the initial batch size ({init_batch_size})")
    return int(np.ceil(lo)), int(np.floor(hi))


def check_placement(num_nodes: ArrayLike, num_replicas: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Broadcast and validate (nodes, replicas) queries: 1 <= nodes <= replicas."""
    nodes, replicas = np.broadcast_arrays(np.asarray(num_nodes, dtype=np.float64),
                                          np.asarray(num_replicas, dtype=np.float64))
    if nodes.size and (bad := (nodes < 1) | ~np.isfinite(nodes)).any():
        raise ConfigError("num_nodes", float(nodes[bad].flat[0]), "must be >= 1")
    if nodes.size and (bad := nodes > replicas).any():
        raise ConfigError("num_nodes", float(nodes[bad].flat[0]),
                          f"cannot exceed num_replicas ({float(replicas[bad].flat[0]):g})")
    return nodes, replicas


class GoodputFunction:
    """Goodput of one job as a function of its resources and batch configuration."""

    def __init__(
        self,
        throughput_params: ThroughputParams,
        grad_stats: GradientStats,
        init_batch_size: float,
    ) -> None:
        if not (np.isfinite(init_batch_size) and init_batch_size > 0):
            raise ConfigError("init_batch_size", init_batch_size, "must be a number > 0")
        self.throughput_params = throughput_params
        self.grad_stats = grad_stats
        self.init_batch_size = float(init_batch_size)

    def throughput(
        self, num_nodes: ArrayLike, num_replicas: ArrayLike, local_bsz: ArrayLike,
        accum_steps: ArrayLike = 0,
    ) -> FloatArray:
        """Samples per second (see :func:`pollux.models.throughput.throughput`)."""
        return throughput(self.throughput_params, num_nodes, num_replicas, local_bsz, accum_steps)

    def efficiency(self, batch_size: ArrayLike) -> FloatArray:
        """Statistical efficiency of total batch ``batch_size``."""
        return efficiency(self.grad_stats, self.init_batch_size, batch_size)

    def evaluate(
        self, num_nodes: ArrayLike, num_replicas: ArrayLike, local_bsz: ArrayLike,
        accum_steps: ArrayLike = 0,
    ) -> FloatArray:
        """Goodput = throughput x efficiency at the given configuration."""
        batch = (np.asarray(num_replicas, dtype=np.float64) * np.asarray(local_bsz)
                 * (np.asarray(accum_steps) + 1.0))
        return (self.throughput(num_nodes, num_replicas, local_bsz, accum_steps)
                * self.efficiency(batch))

    def optimize(
        self,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        max_batch_size: float | None = None,
        local_bsz_bounds: tuple[float, float] | None = None,
        accumulation: bool = False,
    ) -> tuple[FloatArray, NDArray[np.int64], NDArray[np.int64]]:
        """Best (goodput, atomic batch, accumulation steps) for each (nodes, replicas).

        Constraints: initial batch <= total batch <= ``max_batch_size``; atomic batch within
        ``local_bsz_bounds``; with one replica and a total batch above the initial one, at
        least one accumulation step (gradient statistics need two micro-batches).
        Results have the broadcast shape of the inputs; infeasible queries get zeros.
        """
        m0 = self.init_batch_size
        m_max = m0 if max_batch_size is None else float(max_batch_size)
        bounds = (m0, m0) if local_bsz_bounds is None else local_bsz_bounds
        lo, hi = check_batch_bounds(m0, m_max, bounds)
        nodes, replicas = check_placement(num_nodes, num_replicas)
        goodput, local_bsz, accum = _best_batches(
            [self], np.array([m_max]), np.array([[lo, hi]]), np.array([accumulation]),
            nodes.ravel(), replicas.ravel())
        return (goodput.reshape(nodes.shape), local_bsz.reshape(nodes.shape),
                accum.reshape(nodes.shape))


def best_goodputs(fns: Sequence[GoodputFunction], max_batch_sizes: ArrayLike,
                  local_bsz_bounds: Sequence[tuple[float, float]],
                  accumulation: ArrayLike, num_nodes: ArrayLike, num_replicas: ArrayLike
                  ) -> FloatArray:
    """:meth:`GoodputFunction.optimize`'s goodput for many jobs at once: entry ``[j, q]``
    is job ``j``'s best goodput at placement ``q`` (``num_nodes[q]``, ``num_replicas[q]``),
    job ``j`` with its own batch limits and accumulation flag; the same numbers as one
    call per job, in one numpy pass."""
    m_max = np.asarray(max_batch_sizes, dtype=np.float64)
    bounds = np.array([check_batch_bounds(fn.init_batch_size, m, b)
                       for fn, m, b in zip(fns, m_max, local_bsz_bounds, strict=True)],
                      dtype=np.float64).reshape(len(fns), 2)
    nodes, replicas = check_placement(num_nodes, num_replicas)
    goodput, _, _ = _best_batches(fns, m_max, bounds, np.asarray(accumulation, dtype=bool),
                                  nodes.ravel(), replicas.ravel())
    return goodput


@lru_cache(maxsize=4096)
def _candidate_batches(low: float, high: float) -> FloatArray:
    """A job's total batches to try, as alone (scalar geomspace), and both ends; read-only
    (kept for every round that asks again)."""
    grid = np.concatenate([np.geomspace(low, high, NUM_BATCH_CANDIDATES)
                           if high > low else np.full(NUM_BATCH_CANDIDATES, low), [low, high]])
    grid.flags.writeable = False
    return grid


def _best_batches(fns: Sequence[GoodputFunction], m_max: FloatArray, bounds: FloatArray,
                  accumulation: NDArray[np.bool_], nodes: FloatArray, replicas: FloatArray
                  ) -> tuple[FloatArray, NDArray[np.int64], NDArray[np.int64]]:
    """Best (goodput, atomic batch, accumulation steps), each (jobs x placements), over
    total batches geometric from each job's initial batch to its ``m_max``."""
    num_jobs = len(fns)
    candidates = [_candidate_batches(fn.init_batch_size, high)
                  for fn, high in zip(fns, m_max.tolist())]
    totals = (candidates[0] if num_jobs == 1 else np.stack(candidates)).reshape(num_jobs, 1, -1)
    m0: float | FloatArray = (fns[0].init_batch_size if num_jobs == 1 else
                              np.array([fn.init_batch_size for fn in fns]).reshape(-1, 1, 1))
    lo: float | FloatArray
    hi: float | FloatArray
    top: float | FloatArray
    accumulate: bool | NDArray[np.bool_]
    k = replicas.reshape(1, -1, 1)
    n = nodes.reshape(1, -1, 1)
    if num_jobs == 1:  # plain numbers: one job costs what it did before batching
        lo, hi = bounds[0].tolist()
        top, accumulate = float(m_max[0]), bool(accumulation[0])
    else:
        lo, hi = bounds[:, 0].reshape(-1, 1, 1), bounds[:, 1].reshape(-1, 1, 1)
        top, accumulate = m_max.reshape(-1, 1, 1), accumulation.reshape(-1, 1, 1)
    if num_jobs == 1 and not accumulate:
        steps = np.zeros_like(totals * k)
    else:
        steps = np.maximum(np.ceil(totals / (k * hi)) - 1.0, 0.0)
        steps = np.where((k == 1) & (totals > m0), np.maximum(steps, 1.0), steps)
        if num_jobs > 1:
            steps = np.where(accumulate, steps, 0.0)
    per_step = totals / (k * (steps + 1.0))
    # Rounding down and up both, so both ends of the batch range stay reachable.
    bsz = np.concatenate([np.floor(per_step), np.ceil(per_step)], axis=2)
    steps = np.concatenate([steps, steps], axis=2)
    bsz = np.clip(bsz, lo, hi)
    batch = k * bsz * (steps + 1.0)
    feasible = (batch >= m0 * (1 - 1e-9)) & (batch <= top * (1 + 1e-9))
    with np.errstate(divide="ignore", invalid="ignore"):
        if num_jobs == 1:
            good = fns[0].throughput(n, k, bsz, steps) * fns[0].efficiency(batch)
        else:
            params = ThroughputArrays.stack([fn.throughput_params for fn in fns], 2)
            sqr = np.array([fn.grad_stats.sqr for fn in fns]).reshape(-1, 1, 1)
            var = np.array([fn.grad_stats.var for fn in fns]).reshape(-1, 1, 1)
            good = (throughput(params, n, k, bsz, steps)
                    * stacked_efficiency(sqr, var, np.asarray(m0), batch))
    good = np.where(feasible & np.isfinite(good), good, -np.inf)
    flat = good.reshape(-1, good.shape[2])
    rows = np.arange(flat.shape[0])
    best = np.argmax(flat, axis=1)
    best_good = flat[rows, best].reshape(good.shape[:2])
    ok = np.isfinite(best_good)
    goodput = np.where(ok, best_good, 0.0)
    local_bsz = np.where(ok, bsz.reshape(flat.shape)[rows, best].reshape(ok.shape), 0
                         ).astype(np.int64)
    accum = np.where(ok, steps.reshape(flat.shape)[rows, best].reshape(ok.shape), 0
                     ).astype(np.int64)
    return goodput, local_bsz, accum
