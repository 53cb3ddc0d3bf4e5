"""The Pollux policy family: one :class:`PolluxPolicy` on any cluster, its variants as
options (:class:`PolluxOptions`; :mod:`~pollux.policies.pollux.policy`)."""

from __future__ import annotations

from pollux.policies.pollux.constraints import repair, violations
from pollux.policies.pollux.ga import GAConfig, GeneticOptimizer
from pollux.policies.pollux.marginal import MarginalGainOptimizer
from pollux.policies.pollux.objective import PolluxObjective, power_mean, restart_factor
from pollux.policies.pollux.options import FairShareRounding, PolluxOptions
from pollux.policies.pollux.policy import PolluxPolicy
from pollux.policies.pollux.problem import AllocationProblem, build_problem

__all__ = [
    "AllocationProblem", "FairShareRounding", "GAConfig", "GeneticOptimizer",
    "MarginalGainOptimizer", "PolluxObjective", "PolluxOptions", "PolluxPolicy",
    "build_problem", "power_mean", "repair", "restart_factor", "violations",
]
