"""The one scheduling-policy interface, shared by the simulator and the service.

A policy is asked, every scheduling round, to map a *snapshot* of the cluster (the active
jobs and the nodes, as frozen records) plus the previous allocations to new allocations.
It knows nothing of processes, files or simulated time beyond what the records say.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from pollux.models.typed import TypedGoodput
from pollux.resources import CPU, GPU, MEMORY, NodeInfo
from pollux.teams import DEFAULT_TEAM, Teams

__all__ = [
    "CPU", "GPU", "MEMORY", "Allocation", "Allocations", "JobFacts", "JobInfo", "NodeInfo",
    "OptionDoc", "Policy", "PolicyDecision", "RemainingTimeFn", "SpeedupFn", "TunedConfig",
]

Allocation = tuple[str, ...]
"""A job's allocation: the node name of each replica (a node repeats once per replica)."""

Allocations = Mapping[str, Allocation]
"""Job name -> allocation. Jobs absent (or with an empty tuple) get no resources."""

SpeedupFn = Callable[[ArrayLike, ArrayLike], np.ndarray]
"""``speedup(num_nodes, num_replicas)``, broadcasting over arrays (0 replicas -> 0)."""

RemainingTimeFn = Callable[[ArrayLike, ArrayLike], np.ndarray]
"""``remaining_s(num_nodes, num_replicas)``: seconds left to finish with that allocation."""


@dataclass(frozen=True)
class TunedConfig:
    """The configuration a user would pick by hand ("TunedJobs"), for baseline policies."""

    num_replicas: int
    """GPUs (replicas) the user asked for."""
    batch_size: int
    """Total batch size the user tuned."""


@dataclass(frozen=True)
class JobFacts:
    """What a job's record for the policy (:class:`JobInfo`) and its driver's report
    (:class:`~pollux.policies.snapshot.JobReport`) both say about it."""

    name: str
    resources: Mapping[str, float]
    """Resources per replica, e.g. ``{"gpu": 1, "cpu": 4, "memory": 16e9}``."""
    min_replicas: int = 0
    """Below this many replicas the job cannot run and gets nothing."""
    max_replicas: int = 64
    """Upper bound on replicas: in a report the spec's, in the policy's record also the
    exploration bound of Pollux jobs."""
    preemptible: bool = True
    """False: once running, the job keeps its allocation."""
    submission_time_s: float = 0.0
    attained_service_s: float = 0.0
    """GPU-seconds of service received so far."""
    num_restarts: int = 0
    restart_delay_s: float = 30.0
    """Seconds a (re)start costs this job."""
    tuned: TunedConfig | None = None
    """Hand-tuned configuration (for baselines that need one)."""
    remaining_time_fn: RemainingTimeFn | None = None
    """Oracle of remaining seconds at an allocation (Optimus+Oracle); None when unknown."""
    remaining_time_fn_by_type: Mapping[str, RemainingTimeFn] = field(default_factory=dict)
    """On a typed cluster: the oracle per GPU type (a type absent: ``remaining_time_fn``)."""
    remaining_s: float | None = None
    """Estimated seconds of training left at one replica (the unit of ``speedup_fn``: at
    an allocation with speedup ``S`` about ``remaining_s / S`` seconds); None: unknown."""
    typed_goodput: TypedGoodput | None = None
    """On a typed cluster: the job's goodput per (GPU type, nodes, replicas), fitted where
    it ran and projected elsewhere; None when untyped or before any model."""
    max_replicas_by_type: Mapping[str, int] = field(default_factory=dict)
    """On a typed cluster: the growth cap per GPU type (a type absent: ``max_replicas``)."""
    restart_left_s: float = 0.0
    """Seconds of restart delay the job has still to pay (> 0: it is restoring)."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Free-form facts a specific policy may read (never required; e.g. the application's
    name, for Sia)."""
    team: str = DEFAULT_TEAM
    """The job's team (:mod:`pollux.teams`); a job that names none is in ``default``."""
    priority: int = 0
    """Within its team, the order in which jobs keep the team's guaranteed GPUs: higher
    first, so the lowest priority shrinks first (:mod:`pollux.policies.team_shares`)."""


@dataclass(frozen=True)
class JobInfo(JobFacts):
    """One active job as a policy sees it."""

    age_s: float = 0.0
    """Seconds since submission."""
    speedup_fn: SpeedupFn | None = None
    """Goodput speedup over one replica; None when the job reports none."""

    @property
    def gpus_per_replica(self) -> float:
        return float(self.resources.get(GPU, 0.0))


@dataclass(frozen=True)
class PolicyDecision:
    """What a policy returns for one round."""

    allocations: dict[str, Allocation]
    """Job name -> node of each replica. Every active job appears (possibly with ())."""
    infeasible: Mapping[str, str] = field(default_factory=dict)
    """Job name -> why its allocation cannot be applied (the job gets nothing this
    round); drivers record these as job events instead of dropping or raising them."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """Diagnostics (objective value, optimizer statistics); never required."""


TYPE_SPEEDS_KEY = "type_speeds"
"""``JobInfo.extras`` key: the job's 1-GPU speed per GPU type (any unit; only ratios
count), known before it has a model: the simulator's from the traces (Sia profiles each
job on arrival), the service's the types' speeds (declared or learned from other jobs)."""


@dataclass(frozen=True)
class OptionDoc:
    """One option of a policy, as ``pollux policies`` lists it."""

    name: str
    defaults: Mapping[str, Any]
    """Default by cluster kind (``"one type"``, ``"several types"``); a single entry
    keyed ``""`` when the kind does not matter."""
    doc: str = ""


class Policy(ABC):
    """A scheduling policy. Instances may keep state across rounds (e.g. a GA population)."""

    name: str
    """The policy's name as records, logs and the service show it: its class's registered
    name, or, when :func:`~pollux.policies.registry.make_policy` built it, the canonical
    spec it was asked for (``pollux-paper``, ``pollux(p=-0.5)``, ``my.mod:Mine``)."""
    exploration_factor: float | None = None
    """How fast the drivers let a job with hints grow: at most this times the most
    replicas it has profiled (:func:`pollux.policies.snapshot.exploration_bound`); None:
    the paper's rule (twice)."""
    initial_replicas: int = 1
    """On a cluster of several GPU types, how many replicas the drivers let a job that has
    not run anywhere start with (its cap on every type until it has run); 1: the paper's
    and Sia's rule."""

    def growth_rule(self, gpu_types: Sequence[str]) -> tuple[float | None, int]:
        """``(exploration_factor, initial_replicas)`` the drivers apply to the jobs on a
        cluster of ``gpu_types``; a policy that hands clusters of several types to another
        optimizer answers with that one's rule."""
        return self.exploration_factor, self.initial_replicas

    def __init__(self, *, seed: int | None = None) -> None:  # noqa: B027 - optional hook
        """Every policy is built with an explicit seed (see
        :func:`~pollux.policies.registry.make_policy`); one without randomness ignores it."""

    def optimize_teams(
        self,
        jobs: Sequence[JobInfo],
        nodes: Sequence[NodeInfo],
        previous_allocations: Allocations,
        teams: Teams,
    ) -> PolicyDecision:
        """Decide a round whose jobs belong to ``teams`` (each job's ``team`` names one);
        a policy that schedules by teams overrides this, the others decide as without
        teams (team-blind)."""
        return self.optimize(jobs, nodes, previous_allocations)

    @abstractmethod
    def optimize(
        self,
        jobs: Sequence[JobInfo],
        nodes: Sequence[NodeInfo],
        previous_allocations: Allocations,
    ) -> PolicyDecision:
        """Decide every job's allocation for the next round."""

