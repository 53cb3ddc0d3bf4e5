"""The options of the one ``pollux`` policy family, and their defaults per cluster kind.

Options marked *(several types)* act on clusters of several GPU types (Sia's program,
:mod:`~pollux.policies.pollux.typed`), ``p`` and ``exploration_factor`` on both, the others
on one type (the paper's power mean). The field defaults are the paper's objective on one
type; a *base* (:data:`BASES`) sets options per kind: ``paper`` Sia's ``p = -0.5`` on
several types, ``best`` (``pollux``) also the best measured variant of each kind under the
rule of the docs' page research/policies.md. Options a spec writes override both."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from types import MappingProxyType
from typing import Any

import numpy as np

from pollux.errors import ConfigError
from pollux.policies.sia import SOLVERS

MIN_REMAINING_RATIO = 1e-2
"""Remaining times are compared within [1/100, remaining_max_ratio] times the median."""
ONE_TYPE, SEVERAL_TYPES = "one type", "several types"
KINDS = (ONE_TYPE, SEVERAL_TYPES)
"""Cluster kinds whose defaults may differ."""
OPTIMIZERS = ("marginal", "ga", "typed")
MOVE_DISCOUNTS = ("age", "remaining", "both")

BEST_SEVERAL_TYPES: Mapping[str, Any] = MappingProxyType({
    "move_discount": "both", "remaining_exponent": 0.5, "weighted_moves": True,
    "max_weight_ratio": 2.0, "exploration_factor": 4.0, "initial_replicas": 4})
"""``pollux`` on several GPU types: the variant that passes the rule of the docs' page
research/policies.md on the 8 Philly workloads (``bench/pollux_best.py`` checks it and
writes the figures there)."""
BASES: Mapping[str, Mapping[str, Mapping[str, Any]]] = MappingProxyType({
    "paper": {ONE_TYPE: {}, SEVERAL_TYPES: {"p": -0.5}},
    "best": {ONE_TYPE: {}, SEVERAL_TYPES: {"p": -0.5, **BEST_SEVERAL_TYPES}},
})
"""Base -> cluster kind -> the options it sets over the field defaults. On one type no
measured variant passes the rule (docs: research/policies.md), so ``best`` is the
paper's objective there."""


class FairShareRounding(str, Enum):
    """How a fractional fair share of replicas is evaluated (see the objective)."""

    INTERPOLATE = "interpolate"
    CEIL = "ceil"


@dataclass(frozen=True)
class PolluxOptions:
    """Every option of ``pollux``, resolved for one cluster kind (:meth:`resolve`)."""

    p: float = -1.0
    """Power-mean exponent: 1 = sum of speedups (efficiency), lower = fairer, 0 =
    geometric; on several types the exponent of Sia's cost (-0.5 there, must be < 0)."""
    exploration_factor: float = 0.0
    """A job may grow to this times the replicas it has run with (on a type); 0: the
    paper's rule, twice. The drivers apply it (``Policy.growth_rule``)."""
    optimizer: str = "marginal"
    """marginal (fast), ga (the paper's genetic algorithm) or typed (Sia's program on one
    type, rows from each job's speedup function)."""
    epsilon: float = 1e-3
    """Added to every speedup before the power mean (keeps jobs without GPUs comparable)."""
    fair_share: FairShareRounding = FairShareRounding.INTERPOLATE
    """How the fractional fair share of replicas is evaluated: interpolate or ceil."""
    restart_penalty: bool = True
    """Multiply the speedup of a job whose allocation changes by the restart factor."""
    penalize_first_start: bool = True
    """Also penalize giving resources to a job that had none (the reference does)."""
    preemptible_penalty: float = 1e-3
    """Relative fitness lost when every replica sits on preemptible nodes."""
    interference_avoidance: bool = True
    """At most one distributed job per node."""
    fill_free: bool = True
    """marginal: hand GPUs left free to the jobs that gain most from them."""
    shrink_whole_nodes: bool = False
    """marginal: a distributed job that shrinks keeps only the nodes it fills."""
    population_size: int = 100
    """ga: individuals kept from generation to generation (and round to round)."""
    num_generations: int = 100
    """ga: generations per round."""
    least_service_first: bool | None = None
    """Order jobs by attained service instead of submission; none: true for ga (the
    reference), false otherwise."""
    small_first: bool = False
    """ga: order jobs by size first."""
    remaining_weight: float = 0.0
    """Each job's speedup scaled by ``(T_j / T_median) ** remaining_weight``, ``T_j`` its
    remaining time at its fair share (Smith's rule inside the power mean); 0: the paper."""
    remaining_max_ratio: float = 1 / MIN_REMAINING_RATIO
    """Ratios ``T_j / T_median`` above this are lowered to it (1: no job weighs less than
    the median one; up to 1e6)."""
    remaining_admission: bool = False
    """Scale ``speedup + eps`` rather than the speedup (waiting costs scale too)."""
    remaining_restart: bool = False
    """A changed allocation's speedup is worth at most ``T / (T + delay)``, ``T`` the
    job's remaining time there (no restart to finish a little sooner)."""
    min_restart_gain_replicas: int = 0
    """min_restart_gain applies only to jobs holding more replicas than this (0: all)."""
    age_restart_factor: bool = True
    """The paper's age-based restart factor; false: jobs with remaining times use only
    the remaining-time factor and min_restart_gain."""
    min_restart_gain: float = 0.0
    """A change keeps at most ``1 - min_restart_gain`` of its speedup (hysteresis)."""
    remaining_guard: float = 0.0
    """A job the weights demote keeps the paper's utility up to this fraction of its
    fair-share speedup (p < 0 only)."""
    unweighted_restarts: bool = False
    """A demoted job pays the paper's (unweighted) loss for a change (p < 0 only)."""
    efficient_boost: float = 0.0
    """A favoured job is favoured only up to the most replicas at which its speedup per
    replica is at least this fraction of one replica's (p < 0 only)."""
    remaining_step: float = 0.0
    """If > 1, ``T_j / T_median`` is rounded to a power of this (weights move in steps)."""
    lambda_n: float = 1.1
    """(several types) Cost of leaving a job without GPUs in Sia's program."""
    remaining_exponent: float = 0.0
    """(several types) Each job's term weighted by ``(median remaining / its remaining)
    ** remaining_exponent`` within min_weight..max_weight_ratio (Smith's rule)."""
    max_weight_ratio: float = 4.0
    """(several types) Largest weight from remaining_exponent."""
    min_weight: float | None = None
    """(several types) Smallest weight; none: 1 / max_weight_ratio."""
    weighted_moves: bool = False
    """(several types) A job of weight ``w < 1`` has its restart delay counted ``/ w``."""
    move_discount: str = "age"
    """(several types) What a move costs: age (Sia's factor), remaining (the restart delay
    charged against the work left: ``g / (1 + S g / W)``) or both."""
    fast_growth_share: float = 0.0
    """(several types) exploration_factor only for jobs whose restart delay is at least
    this share of their remaining time; others grow 2x."""
    gpu_price: float = 0.0
    """(several types) Cost per GPU of a configuration in the objective."""
    tail_share: float = 0.0
    """(several types) This share of jobs with the latest predicted completion weigh at
    least tail_weight."""
    tail_weight: float = 1.0
    """(several types) See tail_share."""
    restart_scale: float = 1.0
    """(several types) Both move factors count the restart delay this many times."""
    initial_replicas: int = 1
    """(several types) A job that has not run may start with this many GPUs on its
    fastest type (perfect scaling from its 1-GPU speeds)."""
    solver: str = "fast"
    """(several types) fast (Lagrangian prices) or milp (exact, HiGHS)."""

    @classmethod
    def resolve(cls, kind: str, base: str, options: Mapping[str, Any]) -> PolluxOptions:
        """The options of ``base`` on ``kind`` with ``options`` on top (checked)."""
        if base not in BASES:
            raise ConfigError("base", base, f"use one of {', '.join(BASES)}")
        return cls(**{**BASES[base][kind], **options})

    def __post_init__(self) -> None:
        def check(name: str, ok: object, fix: str) -> None:
            if not ok:
                raise ConfigError(name, getattr(self, name), fix)

        types = {"float": (int, float), "int": (int,), "bool": (bool,), "str": (str,)}
        for f in fields(self):  # the value's type first: a spec may give any
            wanted, value = str(f.type).removesuffix(" | None"), getattr(self, f.name)
            optional = value is None and wanted != str(f.type)
            typed = wanted in types and isinstance(value, types[wanted]) and (
                (wanted == "bool") == isinstance(value, bool))
            check(f.name, wanted not in types or optional or typed, f"use a value of type {f.type}")

        inf = np.inf  # every bound below also refuses NaN (comparisons with it are false)
        check("p", abs(self.p) <= 100, "use a finite power-mean exponent in [-100, 100]")
        check("exploration_factor", self.exploration_factor == 0
              or 1 <= self.exploration_factor < inf,
              "use 0 (the paper's growth rule) or a factor >= 1, e.g. 4")
        check("optimizer", self.optimizer in OPTIMIZERS, f"use one of {', '.join(OPTIMIZERS)}")
        check("epsilon", 0 < self.epsilon < inf, "use a number > 0 (e.g. 1e-3)")
        check("fair_share", self.fair_share in {r.value for r in FairShareRounding},
              "use 'interpolate' or 'ceil'")
        object.__setattr__(self, "fair_share", FairShareRounding(self.fair_share))
        check("preemptible_penalty", 0 <= self.preemptible_penalty < 1, "use a fraction in [0, 1)")
        check("remaining_weight", 0 <= self.remaining_weight <= 4,
              "use an exponent in [0, 4] (0: ignore remaining time)")
        check("remaining_max_ratio", 0 < self.remaining_max_ratio <= 1e6,
              "use a ratio > 0 (1: no job weighs less than the median one)")
        check("min_restart_gain", 0 <= self.min_restart_gain < 1, "use a fraction in [0, 1)")
        check("min_restart_gain_replicas", self.min_restart_gain_replicas >= 0,
              "use a replica count >= 0 (0: every job)")
        check("remaining_guard", 0 <= self.remaining_guard <= 10,
              "use 0 (off) or a fraction of the fair share, e.g. 1")
        check("efficient_boost", 0 <= self.efficient_boost < 1,
              "use 0 (off) or a fraction in (0, 1), e.g. 0.5")
        check("remaining_step", 0 <= self.remaining_step < inf,
              "use 0 (no rounding) or a factor > 1, e.g. 2")
        check("lambda_n", self.lambda_n > 0, "use a cost > 0 for an unallocated job")
        check("max_weight_ratio", self.max_weight_ratio > 0, "use a ratio > 0, e.g. 2")
        low = 1.0 / self.max_weight_ratio if self.min_weight is None else self.min_weight
        check("min_weight", 0 < low <= self.max_weight_ratio,
              "use a weight in (0, max_weight_ratio]")
        check("move_discount", self.move_discount in MOVE_DISCOUNTS,
              f"use one of {', '.join(MOVE_DISCOUNTS)}")
        check("fast_growth_share", 0 <= self.fast_growth_share < inf, "use a share >= 0")
        check("gpu_price", 0 <= self.gpu_price < inf, "use a cost >= 0 per GPU")
        check("tail_share", 0 <= self.tail_share < 1, "use a share in [0, 1)")
        check("tail_weight", 0 < self.tail_weight < inf, "use a weight > 0")
        check("restart_scale", 0 < self.restart_scale < inf, "use a factor > 0")
        check("initial_replicas", self.initial_replicas >= 1, "use a whole number >= 1")
        check("solver", self.solver in SOLVERS, f"use one of {', '.join(SOLVERS)}")


def field_docs() -> dict[str, str]:
    """Each option's docstring (the text under its field above), one line each."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(PolluxOptions))).body[0]
    body = tree.body if isinstance(tree, ast.ClassDef) else []
    return {node.target.id: " ".join(str(after.value.value).split())
            for node, after in zip(body, body[1:])
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)}
