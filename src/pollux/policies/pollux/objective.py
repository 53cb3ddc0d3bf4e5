"""The Pollux objective, shared by every optimizer: a power mean of fair-share speedups.

For an allocation ``A``, job ``j``'s *speedup* is its best goodput under ``A`` divided by
its best goodput under a fair share of the cluster::

    speedup_j(A) = S_j(nodes_j(A), replicas_j(A)) / S_j(fair share)

where ``S_j`` is the job's reported speedup function (goodput over one replica;
``S_j(n, k) = k``, perfect scaling, for a job that reports none yet). The fair share is
the cluster divided equally among the ``J`` active jobs by dominant resource:
``R_j = 1 / (J * d_j)`` replicas, ``d_j`` being the largest fraction of any cluster
resource one replica takes, placed on as few nodes as can hold it. ``R_j`` is usually
fractional; :class:`FairShareRounding` says how it is evaluated:

- ``INTERPOLATE`` (default): linear interpolation between the whole replica counts around
  ``R_j`` (below one replica, a time-share of one replica: ``R_j * S_j(1, 1)``);
- ``CEIL``: at ``ceil(R_j)`` replicas, as the published artifact does.

Restart penalty: a job whose allocation differs from its previous one has its speedup
multiplied by ``max(age - restarts * delay, 0) / (age + delay)`` (``delay`` = the job's
``restart_delay_s``). Starting a job that had nothing counts as a change, as in the
reference (``penalize_first_start``).

Fitness: the power mean ``M_p = (1/J * sum_j (speedup_j + eps)^p)^(1/p)`` (geometric mean
for ``p = 0``), ``p = -1`` by default. The ``eps`` (1e-3) follows the reference
implementation: a job with no GPUs would otherwise make the mean 0 for every ``p < 0``
and hide all differences between allocations; with it, such a job adds ``eps^p`` to the
sum, so leaving a job without GPUs costs a lot but stays comparable. ``M_p`` increases
strictly with every job's speedup. Replicas placed on preemptible nodes shave a tiny
fraction (``preemptible_penalty``) off ``M_p`` so that those nodes are used last.

With teams (:mod:`pollux.policies.team_shares`) fairness is hierarchical, in this same
objective: a job's fair share is its part of its team's entitlement, its utility counts
``J / (T * J_t)`` (each team weighs the same however many jobs it has: the mean over
teams of each team's mean over its jobs), and every GPU a team holds below its
guarantee while another team holds more than its quota subtracts
:attr:`PolluxObjective.floor_penalty` from the mean, more than any job's utility can gain
from one replica (the optimizers work job by job; their last step,
:mod:`~pollux.policies.pollux.guarantee`, meets the teams' guarantees).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from pollux.capacity import RESOURCE_TOLERANCE
from pollux.policies.pollux.options import (
    MIN_REMAINING_RATIO,
    FairShareRounding,
    PolluxOptions,
)
from pollux.policies.pollux.problem import (
    AllocationProblem,
    FloatArray,
    IntArray,
    candidate_counts,
)
from pollux.policies.team_shares import TeamShares


def power_mean(values: ArrayLike, p: float, axis: int = -1) -> FloatArray:
    """``(mean(values^p))^(1/p)`` along ``axis``; geometric mean for ``p == 0``."""
    return mean_of(np.mean(utility(values, p), axis=axis), p)  # the signs cancel exactly


def utility(values: ArrayLike, p: float) -> FloatArray:
    """A strictly increasing transform whose mean gives the power mean (:func:`mean_of`):
    maximizing the sum of utilities maximizes the power mean, one job at a time."""
    x = np.asarray(values, dtype=np.float64)
    if p == 0:
        return np.asarray(np.log(x))
    return np.asarray(np.sign(p) * x ** p)


def mean_of(mean_utility: ArrayLike, p: float) -> FloatArray:
    """The power mean from the mean of :func:`utility` values."""
    u = np.asarray(mean_utility, dtype=np.float64)
    if p == 0:
        return np.asarray(np.exp(u))
    return np.asarray((np.sign(p) * u) ** (1.0 / p))


def restart_factor(age_s: ArrayLike, num_restarts: ArrayLike, delay_s: ArrayLike) -> FloatArray:
    """``max(age - restarts * delay, 0) / (age + delay)``; 1 when age and delay are 0."""
    age = np.asarray(age_s, dtype=np.float64)
    delay = np.asarray(delay_s, dtype=np.float64)
    restarts = np.asarray(num_restarts, dtype=np.float64)
    denominator = age + delay
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.maximum(age - restarts * delay, 0.0) / denominator
    return np.asarray(np.where(denominator > 0, factor, 1.0))


class PolluxObjective:
    """Speedups and fitness of candidate states for one round (caches speedup queries)."""

    def __init__(self, problem: AllocationProblem, config: PolluxOptions,
                 shares: TeamShares | None = None) -> None:
        self.problem = problem
        self.config = config
        self.shares = shares
        """With teams: each job's team, share and weight (None: no teams)."""
        self._gpus = np.array([job.gpus_per_replica for job in problem.jobs])
        self._tables: list[FloatArray | None] = [None] * problem.num_jobs
        num_jobs = problem.num_jobs
        share = problem.dominant_share  # a job that needs nothing: its maximum
        part = (np.full(num_jobs, 1.0 / max(num_jobs, 1)) if shares is None
                else shares.share)
        self.fair_replicas = np.where(share > 0, part / np.where(
            share > 0, share, 1.0), problem.max_replicas.astype(np.float64))
        eps, p = config.epsilon, config.p
        worst = float(np.max(np.abs(utility([eps, 1e3], p))))
        self.floor_penalty = 0.0 if shares is None else 4.0 * worst * float(
            np.max(shares.weights, initial=1.0))
        """With teams: what one GPU below a team's guarantee costs the mean utility (four
        times the largest change of any job's weighted utility)."""
        self.fair_speedup = np.array([self._fair_speedup(j) for j in range(num_jobs)])
        self.remaining = np.array([np.nan if job.remaining_s is None else float(job.remaining_s)
                                   for job in problem.jobs], dtype=np.float64)
        """(J,) seconds of training left at one replica; NaN where unknown."""
        self.job_scale = self._remaining_scale()
        """(J,) factor on each job's fair-share speedup from its remaining time."""
        self.delays = np.array([job.restart_delay_s for job in problem.jobs])
        factor = restart_factor([job.age_s for job in problem.jobs],
                                [job.num_restarts for job in problem.jobs], self.delays)
        if not config.restart_penalty:
            factor = np.ones(num_jobs)
        elif not config.penalize_first_start:
            factor = np.where(problem.base_state.any(axis=1), factor, 1.0)
        large = problem.base_state.sum(axis=1) > config.min_restart_gain_replicas
        self.max_factor = np.where(large, 1.0 - config.min_restart_gain, 1.0)
        """(J,) the most a change's speedup keeps (the hysteresis)."""
        self.restart_factor = np.minimum(factor, self.max_factor)  # factor <= 1 already
        self.boost_limit = self._boost_limits()
        """(J,) fair-share speedup beyond which a favoured job's gains are unweighted."""

    # -- speedups ------------------------------------------------------------------------

    def raw_speedup(self, j: int, num_nodes: ArrayLike, num_replicas: ArrayLike) -> FloatArray:
        """Job ``j``'s reported speedup over one replica (memoized for this round)."""
        nodes = np.asarray(num_nodes, dtype=np.int64)
        replicas = np.asarray(num_replicas, dtype=np.int64)
        if nodes.size == 0:
            return np.zeros(nodes.shape)
        table = self._tables[j]
        if table is None:
            table = self._prefetch(j)
        if nodes.max() >= table.shape[0] or replicas.max() >= table.shape[1]:
            rows = max(int(nodes.max()) + 1, table.shape[0])
            cols = max(int(replicas.max()) + 1, table.shape[1])
            grown = np.full((rows, cols), np.nan)
            grown[: table.shape[0], : table.shape[1]] = table
            self._tables[j] = table = grown
        values = table[nodes, replicas]
        missing = np.isnan(values)
        if missing.any():
            flat = np.unique(nodes[missing] * table.shape[1] + replicas[missing])
            n, k = np.divmod(flat, table.shape[1])
            table[n, k] = self._query(j, n, k)
            values = table[nodes, replicas]
        return values

    def _prefetch(self, j: int) -> FloatArray:
        """Fill job ``j``'s table, in one query, with the pairs the optimizers look at.

        Every candidate count (:func:`candidate_counts`) on the fewest nodes that hold it
        (free or empty cluster), the current allocation and the fair share.
        """
        problem = self.problem
        counts = candidate_counts(problem, j)[1:]
        cap = max(int(problem.base_state[j].sum()), int(counts.max(initial=1)))
        per_node = np.sort(problem.max_per_node[j])[::-1]
        fewest = np.minimum(np.searchsorted(np.cumsum(per_node), counts) + 1, counts)
        _, lo, hi = self._fair_counts(j)
        replicas = np.concatenate([counts, counts,
                                   [max(int(problem.base_state[j].sum()), 1), lo, hi]])
        nodes = np.concatenate([fewest, self._min_nodes(j, counts),
                                [max(np.count_nonzero(problem.base_state[j]), 1)],
                                self._min_nodes(j, replicas[-2:])])
        keep = (nodes <= replicas) & (nodes >= 1)
        width = max(cap, hi) + 1
        if not keep.any():
            self._tables[j] = table = np.zeros((1, 1))
            return table
        nodes, replicas = np.divmod(np.unique(nodes[keep] * width + replicas[keep]), width)
        table = np.full((int(nodes.max()) + 2, width), np.nan)
        table[0, 0] = 0.0
        table[nodes, replicas] = self._query(j, nodes, replicas)
        self._tables[j] = table
        return table

    def _query(self, j: int, nodes: IntArray, replicas: IntArray) -> FloatArray:
        fn = self.problem.jobs[j].on().speedup_fn
        running = replicas > 0
        out = np.zeros(nodes.shape, dtype=np.float64)
        if not running.any():
            return out
        if fn is None:
            out[running] = replicas[running]
        else:
            values = np.asarray(fn(nodes[running], replicas[running]), dtype=np.float64)
            out[running] = np.where(np.isfinite(values), np.maximum(values, 0.0), 0.0)
        return out

    def _min_nodes(self, j: int, replicas: IntArray) -> IntArray:
        """The fewest nodes that hold each count of ``replicas`` of job ``j``."""
        return -(-replicas // max(int(self.problem.node_size[j]), 1))

    def _fair_counts(self, j: int) -> tuple[float, int, int]:
        """The fair share of replicas and the whole counts around it."""
        share = float(self.fair_replicas[j])
        lo, hi = int(np.floor(share)), int(np.ceil(share))
        if self.config.fair_share is FairShareRounding.CEIL:
            lo = hi = max(hi, 1)
        return share, lo, hi

    def _remaining_scale(self) -> FloatArray:
        alpha = self.config.remaining_weight
        scale = np.ones(self.problem.num_jobs)
        known = np.isfinite(self.remaining) & (self.remaining > 0)
        if alpha == 0 or not known.any():
            return scale
        at_fair = self.remaining[known] / self.fair_speedup[known]
        ratio = at_fair / float(np.median(at_fair))
        step = self.config.remaining_step
        if step > 1:
            ratio = step ** np.round(np.log(ratio) / np.log(step))
        scale[known] = np.clip(ratio, MIN_REMAINING_RATIO, self.config.remaining_max_ratio
                               ) ** alpha
        return scale

    def _boost_limits(self) -> FloatArray:
        """Each favoured job's fair-share speedup at its efficient size (inf: no limit)."""
        limits = np.full(self.problem.num_jobs, np.inf)
        theta, p = self.config.efficient_boost, self.config.p
        if theta <= 0 or p >= 0:
            return limits
        for j in np.flatnonzero(self.job_scale < 1):
            counts = candidate_counts(self.problem, int(j))[1:]
            if counts.size == 0:
                continue
            raw = self.raw_speedup(int(j), self._min_nodes(int(j), counts), counts)
            efficient = np.flatnonzero(raw >= theta * counts)
            k = int(efficient[-1]) if efficient.size else 0
            limits[j] = raw[k] / self.fair_speedup[j]
        return limits

    def _fair_speedup(self, j: int) -> float:
        share, lo, hi = self._fair_counts(j)
        counts = np.array([lo, hi])
        s_lo, s_hi = self.raw_speedup(j, self._min_nodes(j, counts), counts)
        value = s_lo if hi == lo else s_lo * (hi - share) + s_hi * (share - lo)
        return float(value) if value > 0 else 1.0

    def speedup(self, j: int, num_nodes: ArrayLike, num_replicas: ArrayLike,
                changed: ArrayLike = False) -> FloatArray:
        """Job ``j``'s fair-share speedup, restart factor applied where ``changed``."""
        raw = self.raw_speedup(j, num_nodes, num_replicas)
        factor = self.restart_factor[j]
        if self.config.remaining_restart and np.isfinite(self.remaining[j]):
            left_s = self.remaining[j] / np.maximum(raw, 1e-12)  # no GPUs: factor ~1
            if not self.config.age_restart_factor:
                factor = self.max_factor[j]
            factor = np.minimum(factor, left_s / (left_s + self.delays[j]))
        s = raw / self.fair_speedup[j]
        scale, p, eps = float(self.job_scale[j]), self.config.p, self.config.epsilon
        if self.config.unweighted_restarts and scale > 1 and p < 0:
            kept = s * scale + eps
            loss = utility(s + eps, p) - utility(s * factor + eps, p)  # the paper's
            moved = mean_of(utility(kept, p) - loss, p) - eps
            return np.asarray(np.where(changed, moved, kept - eps))
        s = np.where(changed, s * factor, s)
        if self.config.remaining_admission:  # scales speedup + eps; stays > -eps
            return np.asarray((s + eps) * self.job_scale[j] - eps)
        limit = float(self.boost_limit[j])
        if scale < 1 and np.isfinite(limit):  # gains beyond the efficient size: unweighted
            over = np.maximum(s, limit)
            beyond = mean_of(utility(scale * limit + eps, p) + utility(over + eps, p)
                             - utility(limit + eps, p), p) - eps
            return np.asarray(np.where(s > limit, beyond, s * scale))
        guard = self.config.remaining_guard
        if guard > 0 and scale > 1 and p < 0:
            above = np.maximum(s, guard)  # u(x) = u(g) + scale^p (u(s) - u(g)) for s > g
            return np.asarray(np.where(
                s > guard, (guard ** p + scale ** p * (above ** p - guard ** p)) ** (1 / p), s))
        return np.asarray(s * scale)

    def state_speedups(self, states: IntArray) -> FloatArray:
        """(P, J) penalized fair-share speedups of states shaped (P, J, N)."""
        states = np.asarray(states)
        nodes = np.count_nonzero(states, axis=2)
        replicas = states.sum(axis=2)
        changed = np.any(states != self.problem.base_state[None], axis=2)
        out = np.empty(nodes.shape, dtype=np.float64)
        for j in range(self.problem.num_jobs):
            out[:, j] = self.speedup(j, nodes[:, j], replicas[:, j], changed[:, j])
        return out

    # -- fitness -------------------------------------------------------------------------

    def utility(self, speedups: ArrayLike) -> FloatArray:
        """Per-job utility: the sum over jobs is maximized together with the power mean."""
        return utility(np.asarray(speedups) + self.config.epsilon, self.config.p)

    def job_utility(self, j: int, num_nodes: ArrayLike, num_replicas: ArrayLike,
                    changed: ArrayLike = False) -> FloatArray:
        """Job ``j``'s term of the objective at an allocation: the utility of its speedup,
        with teams weighted and less the floor penalty (module docstring)."""
        value = self.utility(self.speedup(j, num_nodes, num_replicas, changed))
        if self.shares is None:
            return value
        return np.asarray(self.shares.weights[j] * value)

    def evaluate(self, states: IntArray) -> FloatArray:
        """(P,) fitness of states shaped (P, J, N); higher is better."""
        return self.score(states)[0]

    def score(self, states: IntArray) -> tuple[FloatArray, FloatArray]:
        """(P,) fitness and (P, J) penalized speedups of states shaped (P, J, N)."""
        states = np.asarray(states)
        if self.problem.num_jobs == 0:
            return np.zeros(states.shape[0]), np.zeros((states.shape[0], 0))
        speedups = self.state_speedups(states)
        return self.fitness(states, speedups), speedups

    def shortfall(self, states: IntArray) -> FloatArray:
        """(P,) GPUs the teams hold below their guarantees in states (P, J, N), each team's
        counted only while another team holds more than its quota (as the closing step
        counts it: :func:`~pollux.policies.pollux.guarantee.shortfalls`)."""
        shares = self.shares
        assert shares is not None
        gpus = states.sum(axis=2) * self._gpus[None, :]
        onehot = shares.team_index[:, None] == np.arange(len(shares.team_names))[None, :]
        held = gpus @ onehot  # (P, T)
        guarantee = np.array([shares.guarantee_gpus[t] for t in shares.team_names])
        quota = np.array([shares.quota_gpus[t] for t in shares.team_names])
        over = held > quota[None, :] + RESOURCE_TOLERANCE
        others_over = over.sum(axis=1, keepdims=True) - over > 0
        return np.where(others_over, np.maximum(guarantee[None, :] - held, 0.0), 0.0).sum(axis=1)

    def fitness(self, states: IntArray, speedups: FloatArray) -> FloatArray:
        """(P,) fitness of states (P, J, N) whose penalized speedups are ``speedups``."""
        if self.shares is None:
            value = power_mean(np.asarray(speedups) + self.config.epsilon, self.config.p)
        else:
            terms = self.shares.weights[None, :] * self.utility(speedups)
            mean = np.mean(terms, axis=1) - self.floor_penalty * self.shortfall(states)
            value = mean_of(mean, self.config.p) if self.config.p <= 0 else mean
        if self.config.preemptible_penalty and self.problem.node_preemptible.any():
            total = states.sum(axis=(1, 2))
            spot = states[:, :, self.problem.node_preemptible].sum(axis=(1, 2))
            value = value * (1.0 - self.config.preemptible_penalty
                             * spot / np.maximum(total, 1))
        return np.asarray(value)
