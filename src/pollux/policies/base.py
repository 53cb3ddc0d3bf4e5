"""The one scheduling-policy interface, shared by the simulator and the service.

A policy is asked, every scheduling round, to map a *snapshot* of the cluster (the active
jobs and the nodes, as frozen records) plus the previous allocations to new allocations.
It knows nothing of processes, files or simulated time beyond what the records say.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeVar

import numpy as np
from numpy.typing import ArrayLike

from pollux.errors import ConfigError
from pollux.models.typed import TypedGoodput, TypeSpeedup
from pollux.resources import CPU, DEFAULT_GPU_TYPE, GPU, MEMORY, NodeInfo
from pollux.teams import DEFAULT_TEAM, Teams

__all__ = [
    "CPU", "GPU", "MEMORY", "Allocation", "Allocations", "JobFacts", "JobInfo", "NodeInfo",
    "OptionDoc", "Policy", "PolicyDecision", "RemainingTimeFn", "SpeedupFn", "TunedConfig",
    "TypeFacts", "facts_by_type", "typed_facts",
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
class TypeFacts:
    """What is known of a job on one GPU type: how far it may grow there, its goodput
    model there and its oracle of remaining time there."""

    max_replicas: int = 64
    """Upper bound on replicas (the default entry: in a report the spec's, in the
    policy's record also the exploration bound of Pollux jobs; a type's: its growth cap
    on that type)."""
    speedup_fn: SpeedupFn | None = None
    """Goodput speedup (the default entry: over one replica; a type's: a view of the
    job's model per type, :class:`~pollux.models.typed.TypeSpeedup`); None: no model."""
    remaining_time_fn: RemainingTimeFn | None = None
    """Oracle of remaining seconds at an allocation (Optimus+Oracle); None when unknown."""


def facts_by_type(max_replicas: int = 64, speedup_fn: SpeedupFn | None = None,
                  remaining_time_fn: RemainingTimeFn | None = None,
                  per_type: Mapping[str, TypeFacts] | None = None
                  ) -> dict[str, TypeFacts]:
    """A job's :attr:`JobFacts.by_type`: its facts on any type (the
    :data:`DEFAULT_GPU_TYPE` entry, a homogeneous cluster's one type) and, on a cluster
    of several types, its own on each (``per_type``)."""
    return {DEFAULT_GPU_TYPE: TypeFacts(max_replicas, speedup_fn, remaining_time_fn),
            **(per_type or {})}


def typed_facts(caps: Mapping[str, int], model: TypedGoodput | None = None,
                oracles: Mapping[str, RemainingTimeFn] | None = None
                ) -> dict[str, TypeFacts]:
    """Each type's own :class:`TypeFacts` on a cluster of several types: its growth cap
    (``caps``), the view of ``model`` on it (where it models the type) and its oracle."""
    oracles = oracles or {}
    return {gpu_type: TypeFacts(cap, None if model is None else model.on(gpu_type),
                                oracles.get(gpu_type))
            for gpu_type, cap in caps.items()}


_Facts = TypeVar("_Facts", bound="JobFacts")


@dataclass(frozen=True)
class JobFacts:
    """What a job's record for the policy (:class:`JobInfo`) and its driver's report
    (:class:`~pollux.policies.snapshot.JobReport`) both say about it."""

    name: str
    resources: Mapping[str, float]
    """Resources per replica, e.g. ``{"gpu": 1, "cpu": 4, "memory": 16e9}``."""
    min_replicas: int = 0
    """Below this many replicas the job cannot run and gets nothing."""
    by_type: Mapping[str, TypeFacts] = field(default_factory=facts_by_type)
    """GPU type -> the job's bound, model and oracle there (:class:`TypeFacts`). The
    :data:`DEFAULT_GPU_TYPE` entry is the job on any type without an entry of its own
    (on a homogeneous cluster its one type; on a cluster of several types its bound over
    all of them and the model it reports regardless of type); :meth:`on` reads it."""
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
    remaining_s: float | None = None
    """Estimated seconds of training left at one replica (the unit of the default
    entry's ``speedup_fn``: at an allocation with speedup ``S`` about ``remaining_s / S``
    seconds); None: unknown."""
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

    def __post_init__(self) -> None:
        if DEFAULT_GPU_TYPE not in self.by_type:
            raise ConfigError(f"JobFacts({self.name!r}).by_type", sorted(self.by_type),
                              f"give the {DEFAULT_GPU_TYPE!r} entry (facts_by_type() "
                              "builds one)")

    def on(self, gpu_type: str = DEFAULT_GPU_TYPE) -> TypeFacts:
        """The job's facts on ``gpu_type``: its entry, else the default entry."""
        found = self.by_type.get(gpu_type)
        return self.by_type[DEFAULT_GPU_TYPE] if found is None else found

    def own(self, gpu_type: str) -> TypeFacts | None:
        """The job's entry of ``gpu_type`` itself (None: the type has none; the default
        entry is nobody's own on a cluster of several types)."""
        return None if gpu_type == DEFAULT_GPU_TYPE else self.by_type.get(gpu_type)

    def own_caps(self) -> dict[str, int]:
        """The growth cap of each GPU type with an entry of its own (:meth:`own`)."""
        return {t: f.max_replicas for t, f in self.by_type.items() if t != DEFAULT_GPU_TYPE}

    @property
    def max_replicas(self) -> int:
        """The default entry's bound: the most replicas on any type."""
        return self.by_type[DEFAULT_GPU_TYPE].max_replicas

    @property
    def typed_goodput(self) -> TypedGoodput | None:
        """On a cluster of several types: the one model whose views are the types'
        speedups (fitted where the job ran, projected elsewhere); None without one."""
        for facts in self.by_type.values():
            if isinstance(facts.speedup_fn, TypeSpeedup):
                return facts.speedup_fn.model
        return None

    def with_default(self: _Facts, **changes: Any) -> _Facts:
        """This record with ``changes`` to its default entry (:class:`TypeFacts` fields)."""
        default = replace(self.by_type[DEFAULT_GPU_TYPE], **changes)
        return replace(self, by_type={**self.by_type, DEFAULT_GPU_TYPE: default})


@dataclass(frozen=True)
class JobInfo(JobFacts):
    """One active job as a policy sees it."""

    age_s: float = 0.0
    """Seconds since submission."""

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
    adaptive_jobs: ClassVar[bool] = True
    """Trait: the simulator runs this policy's jobs *adaptive* (each fits its own model
    and picks its batch size, as the agent does); False: *fixed*, each at its tuned
    configuration (``JobInfo.tuned``, the baselines). Default: adaptive."""
    heterogeneity_aware: ClassVar[bool] = True
    """Trait: on a cluster of several GPU types the policy is given each job's own facts
    per type; False: one model pooled over every type (as Sia's artifact runs Pollux),
    with the batch limits of :attr:`pooled_limits_type`. Default: aware."""
    pooled_limits_type: ClassVar[str | None] = None
    """Trait, with ``heterogeneity_aware = False``: the GPU type whose batch limits the
    pooled model takes; None: the application's reference type. Default: None."""
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

