"""The one Pollux policy on any cluster: the power mean of fair-share speedups on one GPU
type (:mod:`~pollux.policies.pollux.objective`), Sia's program with the project's fixes on
several (:mod:`~pollux.policies.pollux.typed`); variants are options (:mod:`~pollux.
policies.pollux.options`), and ``pollux``, ``pollux-paper`` and ``pollux-ga`` are this
class with a base and an optimizer (:mod:`pollux.policies.registry`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import numpy as np

from pollux.policies.base import (
    GPU,
    Allocations,
    JobInfo,
    NodeInfo,
    OptionDoc,
    Policy,
    PolicyDecision,
)
from pollux.policies.pollux.alone import alone_gpus
from pollux.policies.pollux.ga import GAConfig, GeneticOptimizer
from pollux.policies.pollux.guarantee import MAX_PRICE_ROUNDS, priced_solve
from pollux.policies.pollux.marginal import MarginalGainOptimizer
from pollux.policies.pollux.objective import PolluxObjective
from pollux.policies.pollux.options import (
    BASES,
    KINDS,
    ONE_TYPE,
    SEVERAL_TYPES,
    PolluxOptions,
    field_docs,
)
from pollux.policies.pollux.problem import build_problem
from pollux.policies.pollux.typed import OneTypeProgram, TypedPollux
from pollux.policies.team_shares import team_shares
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.teams import Teams

logger = logging.getLogger(__name__)


class PolluxPolicy(Policy):
    """Pollux on any cluster; ``base`` picks the defaults (``best``: ``pollux``, ``paper``:
    the paper's objective) and ``options`` override them (:class:`PolluxOptions`)."""

    name = "pollux"

    def __init__(self, *, seed: int | None = 0, base: str = "best", **options: Any) -> None:
        self.base = base
        self.one = one = PolluxOptions.resolve(ONE_TYPE, base, options)
        """The options on a cluster of one GPU type."""
        self.several = PolluxOptions.resolve(SEVERAL_TYPES, base, options)
        """The options on a cluster of several GPU types."""
        self.rng = np.random.default_rng(seed)
        self.exploration_factor = self.one.exploration_factor or None
        self.typed = TypedPollux(self.several)
        """The optimizer of snapshots with several GPU types (kept across rounds)."""
        self.least_service_first = (one.optimizer == "ga" if one.least_service_first is None
                                    else one.least_service_first)
        """Order jobs by attained service (the reference GA) instead of submission time."""
        self.optimizer: MarginalGainOptimizer | GeneticOptimizer | OneTypeProgram
        if one.optimizer == "ga":
            self.optimizer = GeneticOptimizer(
                GAConfig(population_size=one.population_size,
                         num_generations=one.num_generations, small_first=one.small_first),
                self.rng, one.interference_avoidance)
        elif one.optimizer == "typed":
            self.optimizer = OneTypeProgram(one)
        else:
            self.optimizer = MarginalGainOptimizer(one.interference_avoidance, one.fill_free,
                                                   shrink_whole_nodes=one.shrink_whole_nodes)

    @classmethod
    def option_docs(cls, base: str = "best", **fixed: Any) -> list[OptionDoc]:
        """Every option with its default on each cluster kind under ``base``."""
        resolved = {kind: PolluxOptions.resolve(kind, base, fixed) for kind in KINDS}
        docs = field_docs()
        return [OptionDoc("base", {"": base},
                          f"defaults: {' or '.join(BASES)} (see docs/research/policies.md)"),
                *(OptionDoc(f.name, {kind: getattr(resolved[kind], f.name) for kind in KINDS},
                            docs.get(f.name, "")) for f in fields(PolluxOptions))]

    def growth_rule(self, gpu_types: Sequence[str]) -> tuple[float | None, int]:
        """On several GPU types, the typed options' growth rule; on one, this policy's."""
        if len(set(gpu_types)) > 1:
            return self.typed.exploration_factor, self.typed.initial_replicas
        return super().growth_rule(gpu_types)

    def optimize(
        self,
        jobs: Sequence[JobInfo],
        nodes: Sequence[NodeInfo],
        previous_allocations: Allocations,
    ) -> PolicyDecision:
        return self._optimize(jobs, nodes, previous_allocations, None)

    def optimize_teams(
        self,
        jobs: Sequence[JobInfo],
        nodes: Sequence[NodeInfo],
        previous_allocations: Allocations,
        teams: Teams,
    ) -> PolicyDecision:
        """Hierarchical fairness (:mod:`pollux.policies.team_shares`): teams first (each
        one's guarantee, then weights), then the paper's fair-share speedups within each
        team, in the one objective; ``priority`` orders who keeps the team's guarantee."""
        return self._optimize(jobs, nodes, previous_allocations, teams)

    def _optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                  previous_allocations: Allocations, teams: Teams | None) -> PolicyDecision:
        if (len({node.gpu_type for node in nodes}) > 1
                or any(job.typed_goodput is not None for job in jobs)):
            if teams is not None:
                return self.typed.optimize_teams(jobs, nodes, previous_allocations, teams)
            return self.typed.optimize(jobs, nodes, previous_allocations)
        if isinstance(self.optimizer, OneTypeProgram):
            return self.optimizer.optimize(jobs, nodes, previous_allocations)
        start = time.perf_counter()
        name = self.one.optimizer
        problem = build_problem(jobs, nodes, previous_allocations, self.least_service_first)
        if problem.num_jobs == 0:
            return PolicyDecision(allocations={}, info={"optimizer": name,
                                                        "objective": 0.0, "optimize_s": 0.0})
        shares = None
        if teams is not None:
            gpu_type = nodes[0].gpu_type if nodes else DEFAULT_GPU_TYPE
            capacity = float(sum(node.resources.get(GPU, 0.0) for node in nodes))
            shares = team_shares(problem.jobs, [int(b) for b in problem.max_replicas],
                                 capacity, teams, gpu_type,
                                 alone_gpus(problem.jobs, nodes, previous_allocations, teams,
                                            gpu_type, self.one, self.least_service_first))
        optimizer = self.optimizer
        if shares is None or teams is None:
            objective = PolluxObjective(problem, self.one)
            state, stats = optimizer.solve(problem, objective)
        else:
            objective, state, stats = priced_solve(
                lambda objective: optimizer.solve(problem, objective),
                lambda priced: PolluxObjective(problem, self.one, priced), shares,
                [teams.team_of(job.team).name for job in problem.jobs],
                np.array([job.gpus_per_replica for job in problem.jobs]),
                0 if isinstance(optimizer, GeneticOptimizer) else MAX_PRICE_ROUNDS,
                None if isinstance(optimizer, GeneticOptimizer)
                else optimizer.current_state(problem))
        values, speedups = objective.score(state[None])
        info = {
            "optimizer": name,
            "objective": float(values[0]),
            "num_jobs": problem.num_jobs,
            "num_allocated": int(np.count_nonzero(state.sum(axis=1))),
            "replicas": int(state.sum()),
            "num_changed": int(np.sum(np.any(state != problem.base_state, axis=1))),
            "min_speedup": float(speedups.min()),
            "optimize_s": time.perf_counter() - start,
            **stats,
        }
        if shares is not None:  # what each team was guaranteed (bench/teams_sharing.py)
            info["team_guarantee_gpus"] = dict(shares.guarantee_gpus)
        logger.debug("%s round: %s", name, info)
        return PolicyDecision(problem.to_allocations(state, previous_allocations), info=info)
