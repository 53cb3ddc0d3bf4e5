"""Pollux on clusters of several GPU types: Sia's program with the project's fixes.

Sia's formulation (one configuration, a GPU type and count, per job, chosen by one integer
program over row-normalized goodputs raised to ``p``), with: each job's own restart delay
in the restart factor (Sia's table undercounts cifar10 and yolov3); unrounded costs
(Sia's rounding makes speedups 40 and 50 equal); every GPU count from 1 to a node, then
whole nodes; and a job smaller than a node placed on one node (best fit), so its
synchronization stays where its goodput assumed. The options marked *(several types)* in
:class:`~pollux.policies.pollux.options.PolluxOptions` add remaining-work awareness,
faster growth and bigger starts (study: ``bench/hetero_policy.md``).
:class:`OneTypeProgram` runs the program on one type from the jobs' speedup functions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from pollux.policies.base import (
    TYPE_SPEEDS_KEY,
    Allocation,
    Allocations,
    JobInfo,
    NodeInfo,
    PolicyDecision,
)
from pollux.policies.pollux.guarantee import MAX_PRICE_ROUNDS
from pollux.policies.pollux.options import PolluxOptions
from pollux.policies.sia import INVALID_GOODPUT, Config, SiaPolicy, restart_factor
from pollux.policies.snapshot import EXPLORATION_FACTOR
from pollux.teams import Teams

TYPED_PRICE_STEP = 2.0
"""How much a short team's weight grows per solve of Sia's program (half the fast
optimizer's :data:`~pollux.policies.pollux.guarantee.PRICE_STEP`): the program moves whole
configurations, so a steep price overshoots, moving other teams' jobs round after round,
each move a restart (``docs/operate/teams.md`` has the measurement)."""


class TypedPollux(SiaPolicy):
    """Sia's program with the project's fixes; see the module docstring."""

    name = "pollux"
    every_count = True
    cost_decimals = None

    def __init__(self, options: PolluxOptions) -> None:
        super().__init__(p=options.p, lambda_n=options.lambda_n, solver=options.solver)
        self.options = options
        self.exploration_factor = options.exploration_factor or None
        self.initial_replicas = options.initial_replicas
        self.min_weight = (1.0 / options.max_weight_ratio if options.min_weight is None
                           else options.min_weight)
        self._tail: frozenset[str] = frozenset()  # this round's (tail_share)
        self._team_weights: dict[str, float] = {}  # this round's, with teams
        self._move_weights: dict[str, float] = {}  # this round's below 1 (weighted_moves)

    def _job_weights(self, jobs: Sequence[JobInfo]) -> np.ndarray:
        """Shorter remaining work weighs more: ``(median / remaining_s) ** exponent``,
        clipped to ``[min_weight, max_weight_ratio]`` (``min_weight`` defaults to
        ``1 / max_weight_ratio``); 1 where unknown."""
        remaining = np.array([np.nan if job.remaining_s is None else job.remaining_s
                              for job in jobs])
        known = np.isfinite(remaining) & (remaining > 0)
        weights = np.ones(len(jobs))
        if self.options.remaining_exponent and known.any():
            ratio = np.median(remaining[known]) / remaining[known]
            weights[known] = np.clip(ratio ** self.options.remaining_exponent,
                                     self.min_weight, self.options.max_weight_ratio)
        if self._tail:
            tail = np.array([job.name in self._tail for job in jobs], dtype=bool)
            weights[tail] = np.maximum(weights[tail], self.options.tail_weight)
        if self._team_weights:
            weights = weights * np.array([self._team_weights.get(job.name, 1.0) for job in jobs])
        return weights

    def optimize_teams(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                       previous_allocations: Allocations, teams: Teams) -> PolicyDecision:
        """Sia's program with each job weighted ``J / (T * J_t)`` (every team weighs the
        same), solved again with a short team's weight raised :data:`TYPED_PRICE_STEP` times
        (up to :data:`MAX_PRICE_ROUNDS`) while it holds less than ``min(quota, demand)``
        GPUs over all types and another team more than its quota. Its guarantee is
        priced, not enforced: the program picks one configuration per job."""
        names = [teams.team_of(job.team, f"JobInfo({job.name!r}).team").name for job in jobs]
        count = Counter(names)
        demand: Counter[str] = Counter()
        for job, name in zip(jobs, names):
            demand[name] += int(job.max_replicas * job.gpus_per_replica)
        guarantee = {t: min(teams[t].total_quota_gpus, demand[t]) for t in count}
        prices = dict.fromkeys(count, 1.0)
        decision = PolicyDecision({})
        try:
            for attempt in range(MAX_PRICE_ROUNDS + 1):
                self._team_weights = {job.name: len(jobs) * prices[n] / (len(count) * count[n])
                                      for job, n in zip(jobs, names)}
                decision = self.optimize(jobs, nodes, previous_allocations)
                held: Counter[str] = Counter()
                for job, name in zip(jobs, names):
                    held[name] += int(len(decision.allocations.get(job.name, ()))
                                      * job.gpus_per_replica)
                over = {t for t in count if held[t] > teams[t].total_quota_gpus}
                short = [t for t in count if held[t] < guarantee[t] and over - {t}]
                if not short or attempt == MAX_PRICE_ROUNDS:
                    break
                for t in short:
                    prices[t] *= TYPED_PRICE_STEP
        finally:
            self._team_weights = {}
        return decision

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        """Sia's round; with ``weighted_moves`` a job weighing ``w < 1`` has its restart
        delay counted as ``S / w``, so its move costs what a weight-1 job's would."""
        if self.options.fast_growth_share and (self.exploration_factor or 0) > EXPLORATION_FACTOR:
            jobs = self._slow_growth_for_long_jobs(jobs, nodes, previous_allocations)
        if self.options.tail_share:
            self._tail = self._tail_jobs(jobs, nodes, previous_allocations)
        if self.options.weighted_moves:
            self._move_weights = {job.name: float(w)
                                  for job, w in zip(jobs, self._job_weights(jobs)) if w < 1.0}
        try:
            return super().optimize(jobs, nodes, previous_allocations)
        finally:
            self._move_weights = {}
            self._tail = frozenset()

    def _tail_jobs(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                   previous_allocations: Allocations) -> frozenset[str]:
        """Names of the ``tail_share`` of jobs predicted to complete latest after their
        submission (age + remaining time at the current allocation)."""
        type_of = {node.name: node.gpu_type for node in nodes}
        predicted = {job.name: job.age_s + left_s for job in jobs if (left_s := self._left_s(
            job, tuple(previous_allocations.get(job.name, ())), type_of)) is not None}
        if not predicted:
            return frozenset()
        cut = float(np.quantile(list(predicted.values()), 1.0 - self.options.tail_share))
        return frozenset(name for name, jct_s in predicted.items() if jct_s >= cut)

    @staticmethod
    def _left_s(job: JobInfo, prev: Allocation, type_of: Mapping[str, str | None]
                ) -> float | None:
        """The job's remaining seconds at its current allocation ``prev`` by its model;
        None without an allocation, a model there or a remaining-work estimate."""
        model = job.typed_goodput
        if not prev or model is None or not job.remaining_s:
            return None
        gpu_type = type_of.get(prev[0])
        if gpu_type is None or not model.has_model(gpu_type):
            return None
        rate = float(model.goodput(gpu_type, len(set(prev)), len(prev)))
        return job.remaining_s * model.reference_goodput / max(rate, 1e-12)

    def _slow_growth_for_long_jobs(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                                   previous_allocations: Allocations) -> list[JobInfo]:
        """``jobs`` with the reference's 2x growth cap for every job whose restart delay
        is below ``fast_growth_share`` of its remaining time at its current allocation
        (or that has none, or no model there): a restart saved is worth little to it,
        and the model's extrapolation beyond 2x costs GPU-hours."""
        type_of = {node.name: node.gpu_type for node in nodes}
        out = []
        for job in jobs:
            model = job.typed_goodput
            left_s = self._left_s(job, tuple(previous_allocations.get(job.name, ())), type_of)
            fast = (left_s is not None
                    and job.restart_delay_s >= self.options.fast_growth_share * left_s)
            own = {t: f for t, f in job.by_type.items() if job.own(t) is not None}
            if not fast and model is not None and own:
                job = replace(job, by_type={**job.by_type, **{t: replace(f, max_replicas=min(
                    f.max_replicas, max(EXPLORATION_FACTOR * (
                        model.profiles[t].max_profiled_replicas if t in model.profiles else 0),
                        1))) for t, f in own.items()}})
            out.append(job)
        return out

    def goodput_matrix(self, jobs: Sequence[JobInfo], configs: Sequence[Config]) -> np.ndarray:
        """Sia's matrix; with ``initial_replicas`` above 1, a job without a model that
        reports its 1-GPU speed per type scales perfectly from it, up to its cap."""
        matrix = super().goodput_matrix(jobs, configs)
        if self.initial_replicas <= 1:
            return matrix
        num_gpus = np.array([c.num_gpus for c in configs], dtype=np.float64)
        for j, job in enumerate(jobs):
            speeds = job.extras.get(TYPE_SPEEDS_KEY)
            if job.typed_goodput is not None or not speeds:
                continue
            slowest = min(speeds.values())
            cap = max(max(job.own_caps().values(), default=job.max_replicas), 1)
            row = np.array([speeds.get(c.gpu_type, 0.0) / slowest for c in configs]) * num_gpus
            matrix[j] = np.where((num_gpus <= cap) & (row > 0), row, INVALID_GOODPUT)
        return matrix

    def _solve(self, jobs: Sequence[JobInfo], configs: Sequence[Config], cost: np.ndarray,
               previous_config: Sequence[int | None],
               groups: Mapping[str, Sequence[NodeInfo]]) -> list[int | None]:
        """Sia's program, each configuration charged ``gpu_price`` per GPU."""
        if self.options.gpu_price:
            size = np.array([c.num_gpus for c in configs], dtype=np.float64)
            weights = self._job_weights(jobs)[:, None]
            cost = cost + self.options.gpu_price * size[None, :] / weights
        return super()._solve(jobs, configs, cost, previous_config, groups)

    def _penalty_s(self, job: JobInfo) -> float:
        return (self.options.restart_scale * float(job.restart_delay_s)
                / self._move_weights.get(job.name, 1.0))

    def _discount_moves(self, job: JobInfo, configs: Sequence[Config], row: np.ndarray,
                        prev_index: int) -> np.ndarray:
        """Moving costs the job its restart delay ``S``: with ``W`` work left (progress
        units) a move to a configuration of goodput ``g`` finishes after ``W / g + S``,
        an effective goodput of ``g / (1 + S g / W)``; ``age`` is Sia's factor alone."""
        factor = np.ones(len(row))
        if self.options.move_discount in ("age", "both"):
            factor *= restart_factor(job, self._penalty_s(job))
        model = job.typed_goodput
        prev = configs[prev_index]
        if (self.options.move_discount in ("remaining", "both") and model is not None
                and job.remaining_s and model.has_model(prev.gpu_type)
                and row[prev_index] > INVALID_GOODPUT):
            work = job.remaining_s * model.reference_goodput
            scale = float(model.goodput(prev.gpu_type, prev.num_nodes, prev.num_gpus)
                          ) / row[prev_index]
            factor /= 1.0 + self._penalty_s(job) * row * scale / max(work, 1e-9)
        out = row * factor
        out[prev_index] = row[prev_index]
        return out

    def _fill(self, pending: Sequence[tuple[int, int]], free: dict[str, int],
              order: Sequence[str], per_node: int) -> dict[int, Allocation]:
        """Bigger jobs first; whole free nodes for whole-node parts; a part smaller than
        a node on the fullest node where it fits, else spread over the fullest nodes."""
        placed: dict[int, Allocation] = {}
        for num_gpus, i in sorted(pending, key=lambda item: -item[0]):
            wholes = [n for n in order if free[n] == per_node][: num_gpus // per_node]
            free.update(dict.fromkeys(wholes, 0))
            taken = [n for n in wholes for _ in range(per_node)]
            left = num_gpus - per_node * len(wholes)
            best = min((n for n in order if free[n] >= left > 0), key=free.__getitem__,
                       default=None)  # the fullest node that holds the rest (ties: order)
            if best is not None:
                taken += [best] * left
                free[best] -= left
                left = 0
            for name in sorted(order, key=lambda n: -free[n]):
                if left == 0:
                    break
                take = min(left, free[name])
                taken += [name] * take
                free[name] -= take
                left -= take
            placed[i] = tuple(taken) if left == 0 else ()
            if left:  # could not place: give the GPUs back
                for name in taken:
                    free[name] += 1
        return placed


class OneTypeProgram(TypedPollux):
    """:class:`TypedPollux`'s program on a cluster of one type, each job's row its
    default ``speedup_fn`` (speedup over one replica is exactly the normalized goodput
    row): the same program measured against the power mean on the paper's clusters."""

    def goodput_row(self, job: JobInfo, configs: Sequence[Config]) -> np.ndarray:
        """Speedup over one replica at each configuration (beyond the cap: 1e-4; a job
        without a model may take one GPU only)."""
        row = np.full(len(configs), INVALID_GOODPUT)
        gpus = np.array([c.num_gpus for c in configs])
        nodes = np.array([c.num_nodes for c in configs])
        valid = gpus <= max(job.max_replicas, 1)
        speedup_fn = job.on().speedup_fn
        if speedup_fn is None:
            row[np.argmin(gpus)] = 1.0
            return row
        if valid.any():
            values = np.asarray(speedup_fn(nodes[valid], gpus[valid]), dtype=np.float64)
            row[valid] = np.where(np.isfinite(values), values, 0.0)
        useful = row > INVALID_GOODPUT
        if useful.any():
            row[useful] /= row[useful].min()
        return np.maximum(row, INVALID_GOODPUT)

    def goodput_matrix(self, jobs: Sequence[JobInfo], configs: Sequence[Config]) -> np.ndarray:
        """:meth:`goodput_row` of every job."""
        rows = [self.goodput_row(job, configs) for job in jobs]
        return np.array(rows, dtype=np.float64).reshape(len(jobs), len(configs))
