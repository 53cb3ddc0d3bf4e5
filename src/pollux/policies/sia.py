"""Sia (SOSP'23): heterogeneity-aware goodput-optimized scheduling, as published.

Each round, for every job and every *configuration* (a GPU type and a GPU count: 1, 2, 4
... on one node, then whole nodes), Sia takes the job's goodput there
(:attr:`JobInfo.typed_goodput`: fitted where the job ran, projected by 1-GPU speed ratios
elsewhere) and solves one integer program:

* goodput matrix ``G[i, c]``, each job's row divided by its smallest valid entry (so 1 is
  the job's worst useful configuration); invalid entries (beyond the job's growth cap, or
  more than 1 GPU for a job with no model anywhere) are ``1e-4``;
* restart factor: every entry except last round's configuration is multiplied by
  ``max(age - restarts x S, 0) / (age + S)`` (1 while ``age < S``), ``S`` the job's
  restart penalty (Sia's table by application; a job without one, as the service's,
  its own ``restart_delay_s``);
* ``A = round(G ** p, 2)`` with ``p = -0.5`` (capped at 3000);
* minimize ``sum X[i, c] A[i, c] + lambda_n x (jobs - sum X)``, ``lambda_n = 1.1``, over
  binary ``X`` with at most one configuration per job, the GPUs of each type within its
  capacity, and jobs still restoring a checkpoint kept at their configuration.

Solved with :func:`scipy.optimize.milp` (HiGHS; ``solver="milp"``, entries that can never
be optimal pruned). ``solver="fast"`` (the project's typed ``pollux``) solves the same
program by its linear relaxation or per-type prices (:mod:`pollux.policies.assignment`).
Placement, per type: bigger jobs first, whole free nodes first, then free GPUs from any
node (so a small job may span nodes); a job whose configuration did not change keeps its
nodes when they are free.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from pollux.cluster_spec import gpu_types_of
from pollux.errors import ConfigError
from pollux.models.typed import TypedGoodput, goodput_matrix
from pollux.policies.assignment import solve_exact, solve_fast
from pollux.policies.base import (
    Allocation,
    Allocations,
    JobInfo,
    NodeInfo,
    Policy,
    PolicyDecision,
)

INVALID_GOODPUT = 1e-4
"""Goodput entry of a configuration a job may not take (raised to p it is huge)."""
MAX_COST = 3000.0
"""Entries of the cost matrix are capped here."""
RESTART_PENALTY_S = MappingProxyType({
    "deepspeech2": 25.0, "imagenet": 250.0, "cifar10": 30.0, "bert": 120.0, "yolov3": 45.0,
})
"""Sia's restart penalties by application (measured on its cluster); others 30 s."""
DEFAULT_RESTART_PENALTY_S = 30.0
SOLVERS = ("milp", "fast")
"""Solvers of the program (:mod:`pollux.policies.assignment`): ``milp`` exact (HiGHS),
``fast`` Lagrangian prices with repair and greedy moves."""


@dataclass(frozen=True)
class Config:
    """One allocation shape: ``num_gpus`` GPUs of ``gpu_type`` on ``num_nodes`` nodes."""

    gpu_type: str
    num_nodes: int
    num_gpus: int


def type_configs(gpu_type: str, nodes: Sequence[NodeInfo], every_count: bool = False
                 ) -> list[Config]:
    """1, 2, 4, ... GPUs on one node (powers of two below a node; ``every_count``: every
    count below a node), then 1..N whole nodes."""
    per_node = max(node.num_gpus for node in nodes)
    below = (range(1, per_node) if every_count
             else [2 ** i for i in range(per_node.bit_length()) if 2 ** i < per_node])
    return ([Config(gpu_type, 1, count) for count in below]
            + [Config(gpu_type, k, k * per_node) for k in range(1, len(nodes) + 1)])


def restart_factor(job: JobInfo, penalty_s: float) -> float:
    """Share of the job's age not lost to restarts, counting the one a change would add."""
    if job.age_s < penalty_s:
        return 1.0
    return max(job.age_s - job.num_restarts * penalty_s, 0.0) / (job.age_s + penalty_s)


class SiaPolicy(Policy):
    """Sia's MILP over (job, configuration) pairs; see the module docstring."""

    name = "sia"
    adaptive_jobs = True
    every_count = False
    """Configurations of every GPU count below a node (Sia: powers of two)."""
    cost_decimals: int | None = 2
    """Costs rounded to this many decimals (Sia: 2); None: exact."""

    def __init__(self, p: float = -0.5, lambda_n: float = 1.1,
                 restart_penalty_s: Mapping[str, float] | None = None,
                 mip_rel_gap: float = 1e-4, time_limit_s: float = 10.0,
                 seed: int | None = None, solver: str = "milp") -> None:
        if not (np.isfinite(p) and p < 0):
            raise ConfigError("p", p, "Sia's objective needs a fairness power p < 0")
        if not lambda_n > 0:
            raise ConfigError("lambda_n", lambda_n, "use a cost > 0 for an unallocated job")
        self.p = float(p)
        self.lambda_n = float(lambda_n)
        self.restart_penalty_s = dict(RESTART_PENALTY_S if restart_penalty_s is None
                                      else restart_penalty_s)
        if solver not in SOLVERS:
            raise ConfigError("solver", solver, f"choose from: {', '.join(SOLVERS)}")
        self.solver = solver
        self.mip_rel_gap = mip_rel_gap
        self.time_limit_s = time_limit_s

    # -- the goodput matrix --------------------------------------------------------------
    def _penalty_s(self, job: JobInfo) -> float:
        """Sia's table by application (others 30 s, as published); a job that names no
        application (the service's) is charged its own restart delay."""
        app = job.extras.get("application")
        if app is None:
            return float(job.restart_delay_s)
        return self.restart_penalty_s.get(str(app), DEFAULT_RESTART_PENALTY_S)

    def goodput_matrix(self, jobs: Sequence[JobInfo], configs: Sequence[Config]) -> np.ndarray:
        """Each job's normalized goodput at each configuration (invalid: 1e-4), one GPU
        type at a time (:func:`pollux.models.typed.goodput_matrix`)."""
        matrix = np.full((len(jobs), len(configs)), INVALID_GOODPUT)
        # Sia shares the largest growth cap over the job's types (those of an elastic
        # cluster's nodes now included or not)
        caps = np.array([max(max(job.own_caps().values(), default=job.max_replicas), 1)
                         for job in jobs])
        num_gpus = np.array([c.num_gpus for c in configs])
        num_nodes = np.array([c.num_nodes for c in configs])
        no_model = np.zeros((len(jobs), len(configs)), dtype=bool)  # 1 GPU of such a type
        for gpu_type in dict.fromkeys(c.gpu_type for c in configs):
            indices = np.array([i for i, c in enumerate(configs) if c.gpu_type == gpu_type])
            modelled: dict[int, list[tuple[int, TypedGoodput]]] = {}  # valid prefix -> jobs
            for j, job in enumerate(jobs):
                model = job.typed_goodput
                if model is None or not model.has_model(gpu_type):
                    no_model[j, indices[0]] = True
                    continue
                valid = int(np.count_nonzero(num_gpus[indices] <= caps[j]))
                if valid:
                    modelled.setdefault(valid, []).append((j, model))
            for valid, pairs in modelled.items():
                cols = indices[:valid]
                matrix[np.ix_(np.array([j for j, _ in pairs]), cols)] = goodput_matrix(
                    [model for _, model in pairs], gpu_type, num_nodes[cols], num_gpus[cols])
        useful = matrix > INVALID_GOODPUT
        lowest = np.where(useful, matrix, np.inf).min(axis=1, keepdims=True)
        matrix = np.where(useful, matrix / lowest, matrix)
        matrix[no_model] = 1.0
        return np.maximum(matrix, INVALID_GOODPUT)

    def _discount_moves(self, job: JobInfo, configs: Sequence[Config], row: np.ndarray,
                        prev_index: int) -> np.ndarray:
        """``row`` with every configuration but last round's (``prev_index``) multiplied
        by the restart factor."""
        out = row * restart_factor(job, self._penalty_s(job))
        out[prev_index] = row[prev_index]
        return out

    def _job_weights(self, jobs: Sequence[JobInfo]) -> np.ndarray:
        """Weight of each job's term in the objective (Sia: all equal)."""
        return np.ones(len(jobs))

    def _cost(self, row: np.ndarray) -> np.ndarray:
        """``row ** p`` (rounded to ``cost_decimals``), capped at MAX_COST."""
        with np.errstate(divide="ignore"):  # a restart factor of 0: cost capped
            cost = np.power(row, self.p)
        if self.cost_decimals is not None:
            cost = np.round(cost, self.cost_decimals)
        return np.minimum(cost, MAX_COST)

    # -- the round -----------------------------------------------------------------------
    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        groups = gpu_types_of([n for n in nodes if n.num_gpus > 0])
        configs = [c for gpu_type, group in groups.items()
                   for c in type_configs(gpu_type, group, self.every_count)]
        if not jobs or not configs:
            return PolicyDecision({job.name: () for job in jobs})
        type_of = {node.name: node.gpu_type for node in nodes}
        index = {(c.gpu_type, c.num_gpus): i for i, c in enumerate(configs)}
        cost = np.empty((len(jobs), len(configs)))
        previous_config: list[int | None] = []
        for i, (job, row) in enumerate(zip(jobs, self.goodput_matrix(jobs, configs))):
            prev = tuple(previous_allocations.get(job.name, ()))
            prev_index = index.get((type_of[prev[0]], len(prev))) if prev else None
            previous_config.append(prev_index)
            if prev_index is not None:
                row = self._discount_moves(job, configs, row, prev_index)
            cost[i] = self._cost(row)
        chosen = self._solve(jobs, configs, cost, previous_config, groups)
        allocations = self._place(jobs, configs, chosen, groups, previous_allocations)
        return PolicyDecision(allocations, info={"num_configs": len(configs)})

    def _solve(self, jobs: Sequence[JobInfo], configs: Sequence[Config], cost: np.ndarray,
               previous_config: Sequence[int | None],
               groups: Mapping[str, Sequence[NodeInfo]]) -> list[int | None]:
        """Minimize ``sum weight x (cost - lambda_n)`` over the chosen entries (at most one
        per job, per-type capacity, restoring jobs kept) with ``self.solver``."""
        values = (cost - self.lambda_n) * self._job_weights(jobs)[:, None]
        type_index = {gpu_type: t for t, gpu_type in enumerate(groups)}
        kind = np.array([type_index[c.gpu_type] for c in configs])
        size = np.array([c.num_gpus for c in configs], dtype=np.float64)
        capacity = np.array([sum(n.num_gpus for n in group) for group in groups.values()],
                            dtype=np.float64)
        forced = np.array([-1 if prev is None or job.restart_left_s <= 0 else prev
                           for job, prev in zip(jobs, previous_config)])
        if self.solver == "milp":
            chosen = solve_exact(values, kind, size, capacity, forced,
                                 mip_rel_gap=self.mip_rel_gap, time_limit_s=self.time_limit_s)
        else:
            chosen = solve_fast(values, kind, size, capacity, forced)
        return [int(c) if c >= 0 else None for c in chosen]

    def _place(self, jobs: Sequence[JobInfo], configs: Sequence[Config],
               chosen: Sequence[int | None], groups: Mapping[str, Sequence[NodeInfo]],
               previous_allocations: Allocations) -> dict[str, Allocation]:
        allocations: dict[str, Allocation] = {job.name: () for job in jobs}
        for gpu_type, group in groups.items():
            free = {node.name: node.num_gpus for node in group}
            order = [node.name for node in group]
            per_node = max(node.num_gpus for node in group)
            wanted = [(configs[c].num_gpus, i) for i, c in enumerate(chosen)
                      if c is not None and configs[c].gpu_type == gpu_type]
            pending = []
            for num_gpus, i in wanted:  # unchanged configuration: keep the same nodes
                prev = tuple(previous_allocations.get(jobs[i].name, ()))
                counts = Counter(prev)
                if len(prev) == num_gpus and all(free.get(n, 0) >= k for n, k in counts.items()):
                    free.update({n: free[n] - k for n, k in counts.items()})
                    allocations[jobs[i].name] = prev
                else:
                    pending.append((num_gpus, i))
            for i, alloc in self._fill(pending, free, order, per_node).items():
                allocations[jobs[i].name] = alloc
        return allocations

    def _fill(self, pending: Sequence[tuple[int, int]], free: dict[str, int],
              order: Sequence[str], per_node: int) -> dict[int, Allocation]:
        """Sia's placement of (GPUs, job index) pairs on one type's free GPUs: bigger jobs
        first, whole free nodes first, then free GPUs from any node, scanning the nodes
        round-robin from where the last job ended."""
        placed: dict[int, Allocation] = {}
        pointer = 0
        for num_gpus, i in sorted(pending, key=lambda item: -item[0]):
            taken: list[str] = []
            left = num_gpus
            for step in range(len(order)):  # whole free nodes first
                if left < per_node:
                    break
                name = order[(pointer + step) % len(order)]
                if free[name] == per_node:
                    taken += [name] * per_node
                    free[name] = 0
                    left -= per_node
                    pointer = (pointer + step + 1) % len(order)
            for step in range(len(order)):  # then free GPUs anywhere
                if left == 0:
                    break
                name = order[(pointer + step) % len(order)]
                take = min(left, free[name])
                if take:
                    taken += [name] * take
                    free[name] -= take
                    left -= take
                    pointer = (pointer + step) % len(order)
            placed[i] = tuple(taken) if left == 0 else ()
        return placed
