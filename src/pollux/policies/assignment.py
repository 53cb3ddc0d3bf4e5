"""Choose at most one configuration per job under per-type GPU capacities.

The program (Sia's, SOSP'23, and the project's typed Pollux): jobs ``i``, configurations
``j`` (each ``size[j]`` GPUs of type ``kind[j]``), values ``a[i, j]`` to minimize
(``inf``: not allowed)::

    minimize    sum_ij a[i, j] x[i, j]
    subject to  sum_j x[i, j] <= 1                                  (each job)
                sum_{i, j: kind[j] = t} size[j] x[i, j] <= capacity[t]   (each type)
                x[i, forced[i]] = 1 where forced[i] >= 0            (restoring jobs)
                x binary

If the forced jobs alone exceed a type's capacity, no job is forced (Sia's rule). An
entry ``a[i, j] > 0`` never helps (leaving the job out costs 0 and frees GPUs), so both
solvers drop such entries unless forced.

* :func:`solve_exact`: the integer program with :func:`scipy.optimize.milp` (HiGHS).
* :func:`solve_fast`: Lagrangian prices on the few coupling rows. For prices ``mu[t]`` per
  GPU of each type every job picks, independently and vectorized, its best entry of
  ``a[i, j] + mu[kind[j]] size[j]`` (or none if no entry is negative). Prices rise, one
  type at a time, to the lowest price at which that type's demand fits (bisection), and
  cycle until every type fits (an ascending auction: raising one type's price only adds
  demand on others); a repair drops the cheapest jobs per GPU if the cycles stop early;
  then greedy moves (the single change of one job that most lowers the objective within
  the free GPUs) fill what the prices left idle. The linear relaxation of this program
  has an optimum with at most ``num_types`` fractional jobs, so the prices leave little
  on the table; ``tests/policies/test_assignment.py`` bounds the gap to the exact optimum.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import csr_matrix

from pollux.capacity import RESOURCE_TOLERANCE
from pollux.errors import ConfigError

__all__ = ["objective_value", "solve_exact", "solve_fast"]

IntArray = NDArray[np.int64]

NONE = -1
"""Chosen index of a job left without a configuration."""
LP_MAX_ENTRIES = 6000
"""Above this many useful (job, configuration) entries :func:`solve_fast` prices instead
of solving the relaxation, whose solve time grows quickly with its size
(``bench/policy_round.py --typed`` measures both)."""
_BISECTION_STEPS = 25
_MAX_CYCLES = 8
_STDOUT_SWAP = threading.Lock()
"""Held while file descriptor 1 points at /dev/null: two threads solving at once would
otherwise save each other's /dev/null and leave stdout silenced for good."""


def _check(values: ArrayLike, kind: ArrayLike, size: ArrayLike, capacity: ArrayLike,
           forced: ArrayLike | None) -> tuple[np.ndarray, IntArray, np.ndarray, np.ndarray,
                                              IntArray]:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 2:
        raise ConfigError("values", a.shape, "give a (jobs x configurations) matrix")
    num_jobs, num_configs = a.shape
    k = np.asarray(kind, dtype=np.int64)
    s = np.asarray(size, dtype=np.float64)
    cap = np.asarray(capacity, dtype=np.float64)
    if k.shape != (num_configs,) or s.shape != (num_configs,):
        raise ConfigError("kind/size", (k.shape, s.shape),
                          f"give one type index and one size per configuration ({num_configs})")
    if num_configs and (k.min() < 0 or k.max() >= len(cap)):
        raise ConfigError("kind", k, f"type indices must lie in 0..{len(cap) - 1}")
    if (s <= 0).any() or (cap < 0).any():
        raise ConfigError("size/capacity", (s, cap), "sizes must be > 0, capacities >= 0")
    if np.isnan(a).any() or (a == -np.inf).any():
        raise ConfigError("values", "nan/-inf", "use finite values, or +inf for not allowed")
    f = np.asarray(np.full(num_jobs, NONE) if forced is None else forced, dtype=np.int64)
    if f.shape != (num_jobs,) or (f < NONE).any() or (f >= num_configs).any():
        raise ConfigError("forced", f, "give one configuration index or -1 per job")
    rows = np.flatnonzero(f >= 0)
    if np.isinf(a[rows, f[rows]]).any():
        raise ConfigError("forced", f, "a job cannot be forced onto a forbidden entry")
    used = np.bincount(k[f[rows]], weights=s[f[rows]], minlength=len(cap))
    if (used > cap + RESOURCE_TOLERANCE).any():  # Sia's rule: forcing that cannot fit is dropped
        f = np.full(num_jobs, NONE, dtype=np.int64)
    return a, k, s, cap, f


def objective_value(values: ArrayLike, chosen: Sequence[int] | IntArray) -> float:
    """``sum a[i, chosen[i]]`` over jobs with a configuration."""
    a = np.asarray(values, dtype=np.float64)
    c = np.asarray(chosen, dtype=np.int64)
    rows = np.flatnonzero(c >= 0)
    return float(a[rows, c[rows]].sum())


def solve_exact(values: ArrayLike, kind: ArrayLike, size: ArrayLike, capacity: ArrayLike,
                forced: ArrayLike | None = None, mip_rel_gap: float = 1e-4,
                time_limit_s: float = 10.0) -> IntArray:
    """The chosen configuration per job (-1: none), by HiGHS's branch and bound."""
    a, k, s, cap, f = _check(values, kind, size, capacity, forced)
    keep = np.isfinite(a) & (a <= 0)
    rows_forced = np.flatnonzero(f >= 0)
    keep[rows_forced, f[rows_forced]] = True
    job, config = np.nonzero(keep)
    chosen = np.full(len(a), NONE, dtype=np.int64)
    if job.size == 0:
        return chosen
    matrix, upper = _rows(job, config, len(a), k, s, cap)
    forced_x = (f[job] == config).astype(np.float64)  # lower bound 1 on the forced entries
    with _highs_printf_silenced():
        result = milp(a[job, config], integrality=np.ones(job.size),
                      bounds=Bounds(forced_x, np.ones(job.size)),
                      constraints=LinearConstraint(matrix, -np.inf, upper),
                      options={"mip_rel_gap": mip_rel_gap, "time_limit": time_limit_s})
    if result.x is not None:
        taken = np.round(result.x) > 0.5
        chosen[job[taken]] = config[taken]
    return chosen


def _rows(job: IntArray, config: IntArray, num_jobs: int, kind: IntArray, size: np.ndarray,
          cap: np.ndarray) -> tuple[csr_matrix, np.ndarray]:
    """The program's rows over the variables ``(job[v], config[v])``: one per job (at most
    one configuration), one per type (GPUs within its capacity); and their upper bounds."""
    var = np.arange(job.size)
    matrix = csr_matrix(
        (np.concatenate([np.ones(job.size), size[config]]),
         (np.concatenate([job, num_jobs + kind[config]]), np.concatenate([var, var]))),
        shape=(num_jobs + len(cap), job.size))
    return matrix, np.concatenate([np.ones(num_jobs), cap])


@contextmanager
def _highs_printf_silenced() -> Iterator[None]:
    """HiGHS's branch and bound ``printf``s a debug line
    (``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();``) to the
    process's stdout whatever its output options: point file descriptor 1 at /dev/null
    while it runs (C's buffer flushed before it is restored). Other threads' writes to
    stdout during a solve are lost too; the library logs to stderr. Solves in several
    threads take turns (``_STDOUT_SWAP``), so stdout always comes back."""
    with _STDOUT_SWAP:
        try:
            libc = ctypes.CDLL(None)
            saved = os.dup(1)
        except OSError:  # no C library or no descriptor 1: nothing to silence
            yield
            return
        sys.stdout.flush()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 1)
            yield
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            os.close(null)


def solve_fast(values: ArrayLike, kind: ArrayLike, size: ArrayLike, capacity: ArrayLike,
               forced: ArrayLike | None = None, max_lp_entries: int = LP_MAX_ENTRIES
               ) -> IntArray:
    """The chosen configuration per job (-1: none): the linear relaxation (HiGHS) when it
    has at most ``max_lp_entries`` useful entries, else ascending prices; then a repair
    and greedy single and pair moves."""
    a, k, s, cap, f = _check(values, kind, size, capacity, forced)
    chosen = f.copy()  # forced jobs keep their entries, the others start with none
    fixed = np.flatnonzero(f >= 0)
    free_cap = cap - np.bincount(k[f[fixed]], weights=s[f[fixed]], minlength=len(cap))
    jobs = np.flatnonzero(f < 0)
    sub = a[jobs]
    useful = np.isfinite(sub) & (sub < 0) & (s <= free_cap[k] + RESOURCE_TOLERANCE)[None, :]
    cols = np.flatnonzero(useful.any(axis=0))
    if jobs.size == 0 or cols.size == 0:
        return chosen
    sub = np.where(useful[:, cols], sub[:, cols], np.inf)
    program = (sub, k[cols], s[cols], free_cap)
    start = _relaxed if np.count_nonzero(np.isfinite(sub)) <= max_lp_entries else _price
    pick = _improve(*program, _repair(*program, start(*program)))
    for _ in range(2 * len(jobs)):  # pair moves, each followed by single moves
        moved = _pair_move(*program, pick)
        if moved is None:
            break
        pick = _improve(*program, moved)
    taken = pick >= 0
    chosen[jobs[taken]] = cols[pick[taken]]
    return chosen


def _relaxed(a: np.ndarray, kind: IntArray, size: np.ndarray, cap: np.ndarray) -> IntArray:
    """The jobs the linear relaxation gives whole to one entry (at most ``len(cap)`` jobs
    are split in a basic optimum; they start unassigned)."""
    job, config = np.nonzero(np.isfinite(a))
    matrix, upper = _rows(job, config, len(a), kind, size, cap)
    result = linprog(a[job, config], A_ub=matrix, b_ub=upper, bounds=(0, 1), method="highs")
    pick = np.full(len(a), NONE, dtype=np.int64)
    if result.x is not None:
        whole = result.x > 1 - 1e-7
        pick[job[whole]] = config[whole]
    return pick


def _demand(pick: IntArray, kind: IntArray, size: np.ndarray, num_types: int) -> np.ndarray:
    on = pick >= 0
    return np.bincount(kind[pick[on]], weights=size[pick[on]], minlength=num_types)


def _price(a: np.ndarray, kind: IntArray, size: np.ndarray, cap: np.ndarray) -> IntArray:
    """Ascending per-type prices until every type's demand fits (or cycles run out)."""
    num_types = len(cap)
    mu = np.zeros(num_types)
    for _ in range(_MAX_CYCLES):
        raised = False
        for t in range(num_types):
            on_t = kind == t
            if not on_t.any():
                continue
            others = np.where(on_t, np.inf, a + (mu[kind] * size)[None, :]).min(axis=1)
            outside = np.minimum(others, 0.0)  # each job's best elsewhere, or none
            a_t, size_t = a[:, on_t], size[on_t]

            def demand_t(price: float, a_t: np.ndarray = a_t, size_t: np.ndarray = size_t,
                         outside: np.ndarray = outside) -> float:
                total = a_t + price * size_t[None, :]
                best = np.argmin(total, axis=1)
                wins = total[np.arange(len(total)), best] < outside
                return float(size_t[best[wins]].sum())

            if demand_t(mu[t]) <= cap[t] + RESOURCE_TOLERANCE:
                continue
            low, high = mu[t], float(np.max(-a_t[np.isfinite(a_t)])) + 1.0
            for _ in range(_BISECTION_STEPS):  # demand_t(high) fits, demand_t(low) does not
                mid = 0.5 * (low + high)
                low, high = (low, mid) if demand_t(mid) <= cap[t] + RESOURCE_TOLERANCE else (mid, high)
            mu[t] = high
            raised = True
        if not raised:
            break
    total = a + (mu[kind] * size)[None, :]  # each job's best priced entry, if negative
    best = np.argmin(total, axis=1)
    return np.where(total[np.arange(len(a)), best] < 0, best, NONE)


def _repair(a: np.ndarray, kind: IntArray, size: np.ndarray, cap: np.ndarray,
            pick: IntArray) -> IntArray:
    """Drop, on each type over capacity, the jobs that lose least per GPU freed."""
    pick = pick.copy()
    demand = _demand(pick, kind, size, len(cap))
    for t in np.flatnonzero(demand > cap + RESOURCE_TOLERANCE):
        on = np.flatnonzero((pick >= 0) & (kind[np.maximum(pick, 0)] == t))
        loss_per_gpu = -a[on, pick[on]] / size[pick[on]]
        for i in on[np.argsort(loss_per_gpu, kind="stable")]:
            if demand[t] <= cap[t] + RESOURCE_TOLERANCE:
                break
            demand[t] -= size[pick[i]]
            pick[i] = NONE
    return pick


def _improve(a: np.ndarray, kind: IntArray, size: np.ndarray, cap: np.ndarray,
             pick: IntArray) -> IntArray:
    """Apply the best single-job change within the free GPUs until none helps."""
    pick = pick.copy()
    rows = np.arange(len(pick))
    free = cap - _demand(pick, kind, size, len(cap))
    for _ in range(4 * len(pick) + 10):
        on = pick >= 0
        current = np.where(on, a[rows, np.maximum(pick, 0)], 0.0)
        # GPUs the job may use on each configuration's type: the free ones plus its own
        own = np.where(on[:, None] & (kind[np.maximum(pick, 0)][:, None] == kind[None, :]),
                       size[np.maximum(pick, 0)][:, None], 0.0)
        fits = size[None, :] <= free[kind][None, :] + own + RESOURCE_TOLERANCE
        gain = np.where(fits, current[:, None] - a, -np.inf)
        best = int(np.argmax(gain))
        i, j = divmod(best, a.shape[1])
        if not gain[i, j] > 1e-12:
            break
        if pick[i] >= 0:
            free[kind[pick[i]]] += size[pick[i]]
        free[kind[j]] -= size[j]
        pick[i] = j
    return pick


def _pair_move(a: np.ndarray, kind: IntArray, size: np.ndarray, cap: np.ndarray,
               pick: IntArray) -> IntArray | None:
    """The best move of one job onto GPUs that another job of that type frees by
    shrinking or leaving (the move single changes cannot make); None if none helps."""
    rows = np.arange(len(pick))
    on = pick >= 0
    safe = np.maximum(pick, 0)
    current = np.where(on, a[rows, safe], 0.0)
    cur_type = np.where(on, kind[safe], -1)
    cur_size = np.where(on, size[safe], 0.0)
    free = cap - _demand(pick, kind, size, len(cap))
    best_gain, best = 1e-12, None
    for t in range(len(cap)):
        holders = np.flatnonzero(cur_type == t)
        cols_t = np.flatnonzero(kind == t)
        if holders.size == 0 or cols_t.size == 0:
            continue
        # release options of each holder: shrink to a smaller entry of t, or leave
        freed = cur_size[holders][:, None] - size[cols_t][None, :]
        loss = a[np.ix_(holders, cols_t)] - current[holders][:, None]
        loss = np.where((freed > 0) & np.isfinite(loss), loss, np.inf)
        freed = np.concatenate([freed, cur_size[holders][:, None]], axis=1)
        loss = np.concatenate([loss, -current[holders][:, None]], axis=1)
        to = np.concatenate([cols_t, [NONE]])
        # moves onto t that need GPUs beyond the free ones (and the mover's own)
        own = np.where(cur_type == t, cur_size, 0.0)
        need = size[cols_t][None, :] - free[t] - own[:, None]
        gain_move = current[:, None] - a[:, cols_t]
        wanted = (need > RESOURCE_TOLERANCE) & np.isfinite(gain_move) & (gain_move > best_gain)
        for d in np.unique(need[wanted]):
            release = np.where(freed >= d - RESOURCE_TOLERANCE, loss, np.inf)
            per_holder = release.min(axis=1)
            order = np.argsort(per_holder, kind="stable")[:2]
            movers, targets = np.nonzero(wanted & (np.abs(need - d) < RESOURCE_TOLERANCE))
            for rank, h in enumerate(order):
                if not np.isfinite(per_holder[h]):
                    break
                other = holders[h]
                ok = movers != other
                if not ok.any():
                    continue
                gains = gain_move[movers[ok], targets[ok]] - per_holder[h]
                top = int(np.argmax(gains))
                if gains[top] > best_gain:
                    best_gain = float(gains[top])
                    best = (int(movers[ok][top]), int(cols_t[targets[ok][top]]), int(other),
                            int(to[np.argmin(release[h])]))
                if rank == 0 and ok.all():
                    break
    if best is None:
        return None
    mover, target, other, other_to = best
    moved = pick.copy()
    moved[[other, mover]] = other_to, target
    return moved

