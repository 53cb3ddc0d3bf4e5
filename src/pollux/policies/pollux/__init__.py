"""The Pollux policy: goodput-driven allocation maximizing a power mean of speedups.

``PolluxPolicy`` (registered as ``pollux``) uses the default marginal-gain optimizer;
``PolluxGAPolicy`` (``pollux-ga``) the paper's genetic algorithm. Both share the objective
in :mod:`pollux.policies.pollux.objective` and the constraints in
:mod:`pollux.policies.pollux.constraints`.
"""

from __future__ import annotations

from pollux.policies.pollux.constraints import repair, violations
from pollux.policies.pollux.ga import GAConfig, GeneticOptimizer
from pollux.policies.pollux.marginal import MarginalGainOptimizer
from pollux.policies.pollux.objective import PolluxObjective, power_mean, restart_factor
from pollux.policies.pollux.objective_config import FairShareRounding, ObjectiveConfig
from pollux.policies.pollux.policy import PolluxGAPolicy, PolluxPolicy, PolluxRemainingPolicy
from pollux.policies.pollux.problem import AllocationProblem, build_problem

__all__ = [
    "AllocationProblem",
    "FairShareRounding",
    "GAConfig",
    "GeneticOptimizer",
    "MarginalGainOptimizer",
    "ObjectiveConfig",
    "PolluxGAPolicy",
    "PolluxObjective",
    "PolluxPolicy",
    "PolluxRemainingPolicy",
    "build_problem",
    "power_mean",
    "repair",
    "restart_factor",
    "violations",
]
