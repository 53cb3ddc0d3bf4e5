"""One scheduling round, request in and reply out, for both drivers.

The simulator and the service only gather what their jobs reported and carry the reply
out (the shape of Ray autoscaler v2's ``schedule(request) -> reply``). A round is a
pipeline of named steps:

1. **records**: every job's report (:class:`~pollux.policies.snapshot.JobReport`) becomes
   the policy's :class:`~pollux.policies.base.JobInfo` through
   :func:`~pollux.policies.snapshot.job_info`, with the policy's growth rule on the
   cluster's GPU types and, on a typed cluster whose policy is heterogeneity-aware, typed
   models from the jobs' hints and the GPU type speeds learned from them;
2. **scale** (with an autoscaler, idle rounds too): the nodes wanted per GPU type, which
   the driver carries out at once through its ``resize`` (the nodes there are then come
   back; a job holding a node that is gone holds nothing);
3. **allocate**: the policy is asked on those nodes; when it fails on the jobs' models,
   the round is asked again with every job as one without a model (an ``info`` event per
   job says so), so one bad model never stops scheduling;
4. **check**: :func:`~pollux.policies.decision.check_decision` moves allocations that
   cannot be applied into ``infeasible``; each becomes a ``warning`` event once per job
   and reason (again only when the reason changes).

Infeasible allocations are returned, never raised. A :class:`SchedulingRound` keeps what
outlives one round: the speedup functions (rebuilt when a job's hints change) and the
reasons already reported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pollux.policies.autoscaling import Autoscaler, ScalingDecision
from pollux.policies.base import Allocation, JobInfo, NodeInfo, Policy, PolicyDecision
from pollux.policies.decision import check_decision
from pollux.policies.snapshot import (
    JobReport,
    Snapshot,
    SpeedupCache,
    job_info,
    learned_type_speeds,
    without_models,
)
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.teams import Teams

logger = logging.getLogger(__name__)

Resize = Callable[[Mapping[str, int]], Sequence[NodeInfo]]
"""The driver's hand: carries out the nodes wanted per GPU type and returns the nodes the
policy may use now."""


@dataclass(frozen=True)
class RoundRequest:
    """What the driver gathered for one round."""

    time_s: float
    """The round's time (seconds, the clock jobs' submissions are stamped on)."""
    reports: tuple[JobReport, ...]
    """Every active job as the driver knows it and as it reported itself, in the order
    the policy sees them."""
    nodes: tuple[NodeInfo, ...]
    """The nodes the policy may use now (before any resize)."""
    previous_allocations: Mapping[str, Allocation] = field(default_factory=dict)
    """Job name -> what it holds or was promised (jobs holding nothing may be left out)."""
    num_nodes_by_type: Mapping[str, int] | None = None
    """The cluster's size per GPU type for the autoscaler: nodes ready plus nodes being
    provisioned (None: the ``nodes``, counted by type)."""
    teams: Teams | None = None
    """The teams the jobs belong to (:mod:`pollux.teams`; each report's ``team``); the
    policy decides by them (:meth:`~pollux.policies.base.Policy.optimize_teams`). None:
    no teams file."""


@dataclass(frozen=True)
class JobEvent:
    """Something a job's owner should read about this round."""

    job: str
    level: str
    """``info`` or ``warning``."""
    message: str


@dataclass(frozen=True)
class RoundReply:
    """What the driver carries out."""

    decision: PolicyDecision
    """The checked decision: ``allocations`` (every job of the request, empty for those
    that get nothing) and ``infeasible`` (job -> why its allocation was not applied)."""
    snapshot: Snapshot | None = None
    """The question the policy was asked (the final one, after a retry); None when there
    was nothing to ask (no job and no autoscaler)."""
    scaling: ScalingDecision | None = None
    """The autoscaler's answer (None without one)."""
    events: tuple[JobEvent, ...] = ()
    """Job events of this round: infeasible allocations (once per reason), a retry."""
    unusable_models: Mapping[str, str] = field(default_factory=dict)
    """Job name -> why its speedup model is not used (its hints refused, or it failed)."""
    type_speeds: Mapping[str, float] = field(default_factory=dict)
    """GPU type -> relative speed used this round (typed clusters; declared and learned)."""
    policy_s: float = 0.0
    """Wall seconds the policy spent (both tries on a retry)."""


class SchedulingRound:
    """The one round both drivers call (module docstring), one per driver. ``guarded``:
    speedup functions that cannot fail a round (the service's hints come from outside);
    ``declared_type_speeds``: the operator's GPU type speeds (the others are learned)."""

    def __init__(self, policy: Policy, autoscaler: Autoscaler | None = None, *,
                 guarded: bool = False,
                 declared_type_speeds: Mapping[str, float] | None = None) -> None:
        self.policy = policy
        self.autoscaler = autoscaler
        self.declared_type_speeds = dict(declared_type_speeds or {})
        self._speedups = SpeedupCache(guarded=guarded)
        self._infeasible: dict[str, str] = {}

    @property
    def adaptive_jobs(self) -> bool:
        """Whether the policy's jobs adapt (report hints): a job of the service that has
        not reported yet is then bounded as one that has profiled nothing, as a simulated
        adaptive job is in its first round."""
        return bool(getattr(type(self.policy), "adaptive_jobs", True))

    def growth_rule(self, gpu_types: Sequence[str]) -> tuple[float | None, int]:
        """The policy's ``(exploration_factor, initial_replicas)`` on ``gpu_types``, for a
        driver whose reports carry per-type caps themselves (the simulator's typed jobs)."""
        return self.policy.growth_rule(gpu_types)

    def schedule(self, request: RoundRequest, resize: Resize | None = None) -> RoundReply:
        """One round (module docstring); ``resize`` carries out the nodes wanted."""
        types = tuple(dict.fromkeys(node.gpu_type for node in request.nodes))
        jobs, type_speeds = self._job_records(request, types)
        nodes = request.nodes
        scaling: ScalingDecision | None = None
        if self.autoscaler is not None:
            scaling, wanted = self._scale(self.autoscaler, jobs, request)
            if resize is not None:
                nodes = tuple(resize(wanted))
        if not jobs and self.autoscaler is None:
            return RoundReply(PolicyDecision(allocations={}), type_speeds=type_speeds)
        names = {node.name for node in nodes}
        previous = {name: alloc for name, alloc in request.previous_allocations.items()
                    if alloc and all(node in names for node in alloc)}
        snapshot = Snapshot(request.time_s, jobs, nodes, previous, request.teams)
        events: list[JobEvent] = []
        decision, policy_s = PolicyDecision(allocations={}), 0.0
        if jobs:
            decision, snapshot, policy_s = self._allocate(snapshot, events)
        decision = check_decision(decision, snapshot)
        events.extend(self._infeasible_events(jobs, decision))
        return RoundReply(decision, snapshot, scaling, tuple(events),
                          self._speedups.problems(), type_speeds, policy_s)

    # --- the steps ----------------------------------------------------------------------

    def _job_records(self, request: RoundRequest, types: tuple[str, ...]
                     ) -> tuple[tuple[JobInfo, ...], dict[str, float]]:
        """The policy's records of the reports, and the type speeds they were built with."""
        aware = type(self.policy).heterogeneity_aware
        typed = len(types) > 1 and aware  # an unaware policy gets one pooled model a job
        type_speeds = (learned_type_speeds(request.reports, types, self.declared_type_speeds)
                       if typed else {})
        factor, initial = self.policy.growth_rule(types)
        jobs = tuple(job_info(report, request.time_s, self._speedups,
                              throughput_speedups=self.autoscaler is not None,
                              gpu_types=types if typed else (), exploration_factor=factor,
                              initial_replicas=initial,
                              type_speeds=type_speeds if typed else None)
                     for report in request.reports)
        self._speedups.forget(report.name for report in request.reports)  # ended jobs
        return jobs, type_speeds

    @staticmethod
    def _scale(autoscaler: Autoscaler, jobs: Sequence[JobInfo], request: RoundRequest
               ) -> tuple[ScalingDecision, dict[str, int]]:
        """The autoscaler's decision on the cluster's size per type, and the nodes wanted
        per type (a one-type decision's size goes to the cluster's one type)."""
        current = request.num_nodes_by_type
        if current is None:
            counted: dict[str, int] = {}
            for node in request.nodes:
                counted[node.gpu_type] = counted.get(node.gpu_type, 0) + 1
            current = counted
        scaling = autoscaler.decide_by_type(jobs, current)
        wanted = dict(scaling.num_nodes_by_type) or {
            next(iter(current), DEFAULT_GPU_TYPE): scaling.num_nodes}
        return scaling, wanted

    def _allocate(self, snapshot: Snapshot, events: list[JobEvent]
                  ) -> tuple[PolicyDecision, Snapshot, float]:
        """The policy's decision, retried without the jobs' models when it fails."""
        started_s = time.perf_counter()
        try:
            decision = self._ask(snapshot)
        except Exception as exc:  # never a round that fails for all: retry without models
            logger.exception("policy failed; retrying the round without the jobs' models")
            snapshot = Snapshot(snapshot.time_s, without_models(snapshot.jobs),
                                snapshot.nodes, snapshot.previous_allocations, snapshot.teams)
            decision = self._ask(snapshot)
            events.extend(JobEvent(
                job.name, "info", f"scheduling round failed ({type(exc).__name__}: {exc}); "
                "this round treats every job as one without a model") for job in snapshot.jobs)
        return decision, snapshot, time.perf_counter() - started_s

    def _ask(self, snapshot: Snapshot) -> PolicyDecision:
        if snapshot.teams is not None:
            return self.policy.optimize_teams(list(snapshot.jobs), list(snapshot.nodes),
                                              dict(snapshot.previous_allocations),
                                              snapshot.teams)
        return self.policy.optimize(list(snapshot.jobs), list(snapshot.nodes),
                                    dict(snapshot.previous_allocations))

    def _infeasible_events(self, jobs: Sequence[JobInfo], decision: PolicyDecision
                           ) -> list[JobEvent]:
        """A warning per job whose allocation cannot be applied, once per reason."""
        events = []
        for job in jobs:
            reason = decision.infeasible.get(job.name)
            if reason is None:
                self._infeasible.pop(job.name, None)
            elif self._infeasible.get(job.name) != reason:
                self._infeasible[job.name] = reason
                events.append(JobEvent(job.name, "warning", f"policy {self.policy.name}: "
                                                            f"allocation infeasible: {reason}"))
        active = {job.name for job in jobs}
        for name in set(self._infeasible) - active:  # ended jobs
            del self._infeasible[name]
        return events
