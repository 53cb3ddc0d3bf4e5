"""What the Pollux objective (:mod:`pollux.policies.pollux.objective`) is asked to weigh:
the power mean's ``p`` and ``eps``, the fair-share rounding, the restart penalty, and the
optional remaining-time ingredients (off by default: the paper's objective)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from pollux.errors import ConfigError

MIN_REMAINING_RATIO = 1e-2
"""Remaining times are compared within [1/100, remaining_max_ratio] times the median."""


class FairShareRounding(str, Enum):
    """How a fractional fair share of replicas is evaluated (see module docstring)."""

    INTERPOLATE = "interpolate"
    CEIL = "ceil"


@dataclass(frozen=True)
class ObjectiveConfig:
    """Knobs of the objective; the defaults are the paper's."""

    p: float = -1.0
    """Power-mean exponent: 1 = sum of speedups (efficiency), lower = fairer, 0 = geometric."""
    epsilon: float = 1e-3
    """Added to every speedup before the power mean (keeps jobs without GPUs comparable)."""
    fair_share: FairShareRounding = FairShareRounding.INTERPOLATE
    """How the fractional fair share of replicas is evaluated."""
    restart_penalty: bool = True
    """Multiply the speedup of a job whose allocation changes by the restart factor."""
    penalize_first_start: bool = True
    """Also penalize giving resources to a job that had none (the reference does)."""
    preemptible_penalty: float = 1e-3
    """Relative fitness lost when every replica sits on preemptible nodes."""
    remaining_weight: float = 0.0
    """``alpha``: each job's speedup is scaled by ``(T_j / T_median) ** alpha``, ``T_j``
    its estimated remaining time at its fair share (``JobInfo.remaining_s`` over its
    fair-share speedup), so that with ``p < 0`` jobs close to done weigh more (Smith's
    rule inside the power mean's fairness). 0: the paper's objective; jobs that report no
    remaining time keep a factor of 1."""
    remaining_max_ratio: float = 1 / MIN_REMAINING_RATIO
    """Ratios ``T_j / T_median`` above this are lowered to it: with 1, every job longer
    than the median weighs as the median one (short jobs are favoured, long ones are not
    pushed back further; a guard for the longest jobs' completion times); above 100 (up
    to 1e6), the longest jobs keep their order among themselves (shortest remaining
    first) where the default clips them all to 100."""
    remaining_admission: bool = False
    """Scale ``speedup + eps`` rather than the speedup alone, so that the cost of leaving
    a job without GPUs (``eps^p``) scales too: when the cluster is saturated, the jobs
    with the most work left may wait while shorter ones run (admission control)."""
    remaining_restart: bool = False
    """Scale a changed allocation's speedup by at most ``T / (T + delay)``, ``T`` the job's
    remaining time at that allocation (``remaining_s`` over its raw speedup): a restart
    pays only if what the job gains before it finishes exceeds the delay (a job close to
    done is not restarted to finish a little sooner). Jobs without ``remaining_s``: 1."""
    min_restart_gain_replicas: int = 0
    """``min_restart_gain`` applies only to jobs holding more replicas than this (0: all):
    the restarts it saves are those of large jobs, small ones keep growing freely."""
    age_restart_factor: bool = True
    """Pollux's age-based restart factor; False: jobs that report ``remaining_s`` use only
    the remaining-time factor (``remaining_restart``) and ``min_restart_gain``, so a young
    job with much work left is not held back from growing."""
    min_restart_gain: float = 0.0
    """A changed allocation's speedup is scaled by at most ``1 - min_restart_gain``: no
    restart for less than this relative gain (hysteresis for long-running jobs, whose
    age-based restart factor tends to 1)."""
    remaining_guard: float = 0.0
    """If > 0, a job the remaining-time weight demotes (``T_j > T_median``) keeps the
    paper's utility up to this fraction ``g`` of its fair-share speedup (1: its fair
    share): only what it gets beyond counts less (``u(x) = u(g) + scale^p (u(s) - u(g))``
    for ``s > g``), so the longest jobs are not pushed below it to speed up short ones.
    For ``p < 0`` only."""
    unweighted_restarts: bool = False
    """A job the remaining-time weight demotes (scale > 1) pays for a change what the
    paper's objective charges it (``u(s) - u(s * factor)``, unweighted), not that loss
    scaled down by its weight: the weights must not make moving the longest jobs cheap
    (each change restarts all their GPUs). For ``p < 0`` only."""
    efficient_boost: float = 0.0
    """If > 0, a job the remaining-time weight favours (scale < 1) is favoured only up to
    its efficient size: the most replicas at which its speedup per replica is at least
    this fraction of one replica's (on the fewest nodes); what it gains beyond counts as
    in the paper's objective (unweighted). Short jobs are then not grown to sizes where
    they waste GPU-time the longest jobs need. For ``p < 0`` only."""
    remaining_step: float = 0.0
    """If > 1, the ratio ``T_j / T_median`` is rounded to a power of this number, so that
    a job's weight moves in steps (fewer reallocations) rather than every round."""

    def __post_init__(self) -> None:
        if not np.isfinite(self.p) or abs(self.p) > 100:
            raise ConfigError("p", self.p, "use a finite power-mean exponent in [-100, 100]")
        if not (np.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigError("epsilon", self.epsilon, "use a number > 0 (e.g. 1e-3)")
        if not 0 <= self.preemptible_penalty < 1:
            raise ConfigError("preemptible_penalty", self.preemptible_penalty,
                              "use a fraction in [0, 1)")
        if not (np.isfinite(self.remaining_weight) and 0 <= self.remaining_weight <= 4):
            raise ConfigError("remaining_weight", self.remaining_weight,
                              "use an exponent in [0, 4] (0: ignore remaining time)")
        if not 0 < self.remaining_max_ratio <= 1e6:
            raise ConfigError("remaining_max_ratio", self.remaining_max_ratio,
                              "use a ratio > 0 (1: no job weighs less than the median one)")
        if not 0 <= self.min_restart_gain < 1:
            raise ConfigError("min_restart_gain", self.min_restart_gain,
                              "use a fraction in [0, 1), e.g. 0.1")
        if self.min_restart_gain_replicas < 0:
            raise ConfigError("min_restart_gain_replicas", self.min_restart_gain_replicas,
                              "use a replica count >= 0 (0: every job)")
        if not (np.isfinite(self.remaining_guard) and 0 <= self.remaining_guard <= 10):
            raise ConfigError("remaining_guard", self.remaining_guard,
                              "use 0 (off) or a fraction of the fair share, e.g. 1")
        if not 0 <= self.efficient_boost < 1:
            raise ConfigError("efficient_boost", self.efficient_boost,
                              "use 0 (off) or a fraction in (0, 1), e.g. 0.5")
        if not (np.isfinite(self.remaining_step) and self.remaining_step >= 0):
            raise ConfigError("remaining_step", self.remaining_step,
                              "use 0 (no rounding) or a factor > 1, e.g. 2")
        object.__setattr__(self, "fair_share", FairShareRounding(self.fair_share))
