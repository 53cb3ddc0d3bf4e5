"""Cloud autoscalers: how many nodes the cluster should have, decided every round.

An :class:`Autoscaler` is asked, every scheduling round, for the desired number of nodes
given the active jobs (the same :class:`~pollux.policies.base.JobInfo` records the policy
sees) and the cluster's current size (nodes ready plus nodes being provisioned). Every
node is a copy of one :class:`NodeTemplate`. The answer is bounded by ``min_nodes`` and
``max_nodes`` and smoothed over a window of rounds (see :meth:`Autoscaler.decide`).

To judge a candidate size ``n`` an autoscaler asks an *estimator* policy (by default the
Pollux policy with its default optimizer, restart penalty off) for the best allocation
of the jobs on ``n`` empty template nodes: a pure "what if", memoized for the round.

- :class:`PolluxAutoscaler` (``pollux``, goodput-aware): keeps the cluster utility
  (:func:`~pollux.policies.autoscaling.utility.cluster_utility`) of that best allocation
  inside a band ``[low_util, high_util]``. Above the band jobs still scale well, so it
  grows; below it they waste what they hold, so it shrinks; either way it moves to the
  size whose utility lands nearest the middle of the band. Inside the band the size is
  kept (hysteresis). Utility falls as the cluster grows (each job gets more replicas,
  each worth less), so a binary search finds it. The band trades cost for time: a
  higher band keeps fewer nodes busier and finishes later (``bench/autoscale.py``).
- :class:`ThroughputAutoscaler` (``throughput``, the baseline, after Or et al., MLSys'20):
  grows while another node still adds at least ``min_marginal_efficiency`` of its ideal
  throughput (samples per second, statistical efficiency ignored) and shrinks while the
  last node does not.
- :class:`FixedSizeAutoscaler` (``none``): keeps the current size.

Sizes beyond what the jobs can use at all (the nodes their best allocation occupies on
``max_nodes`` nodes) are never proposed, so a cluster whose jobs cannot use another node
does not grow.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pollux.errors import ConfigError
from pollux.policies.autoscaling.estimate import (
    SizeEstimate,
    SizeEvaluator,
    default_estimator,
    identical_nodes,
)
from pollux.policies.autoscaling.objective import BatchObjective
from pollux.policies.autoscaling.utility import THROUGHPUT_SPEEDUP_KEY
from pollux.policies.base import JobInfo, NodeInfo, Policy

logger = logging.getLogger(__name__)

DEFAULT_NODE_PRICE_PER_HOUR = 3.912
"""US$ per hour of an AWS g4dn.12xlarge (4 NVIDIA T4 GPUs) on demand in us-east-1, the
node type of the Pollux paper's testbed and traces."""


@dataclass(frozen=True)
class NodeTemplate:
    """What one more node of the cluster would be."""

    resources: Mapping[str, float]
    """Total resources of the node, e.g. ``{"gpu": 4}``."""
    price_per_hour: float = DEFAULT_NODE_PRICE_PER_HOUR
    """Cost of running the node for an hour (any currency; only reported)."""

    def __post_init__(self) -> None:
        if not isinstance(self.resources, Mapping) or not any(
                float(v) > 0 for v in self.resources.values()):
            raise ConfigError("NodeTemplate.resources", self.resources,
                              'give the resources of one node, e.g. {"gpu": 4}')
        for name, amount in self.resources.items():
            if not (math.isfinite(float(amount)) and float(amount) >= 0):
                raise ConfigError(f"NodeTemplate.resources[{name!r}]", amount,
                                  "use a finite amount >= 0")
        if not (math.isfinite(self.price_per_hour) and self.price_per_hour >= 0):
            raise ConfigError("price_per_hour", self.price_per_hour,
                              "use a finite price per node-hour >= 0")

    def nodes(self, count: int, prefix: str = "virtual") -> list[NodeInfo]:
        """``count`` nodes made from the template."""
        return identical_nodes(self.resources, count, prefix)


@dataclass(frozen=True)
class AutoscalerConfig:
    """What every autoscaler needs: the node template, the bounds and the smoothing."""

    template: NodeTemplate
    min_nodes: int = 1
    """Never fewer nodes than this (>= 0)."""
    max_nodes: int = 16
    """Never more nodes than this (>= max(min_nodes, 1))."""
    window_rounds: int = 5
    """Proposals of this many recent rounds must agree before the cluster shrinks."""
    grow_window_rounds: int | None = None
    """... and before it grows (None: ``window_rounds``)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.min_nodes, int) and self.min_nodes >= 0):
            raise ConfigError("min_nodes", self.min_nodes, "use a whole number >= 0")
        if not (isinstance(self.max_nodes, int) and self.max_nodes >= max(self.min_nodes, 1)):
            raise ConfigError("max_nodes", self.max_nodes,
                              f"use a whole number >= min_nodes ({self.min_nodes}) and >= 1")
        for name in ("window_rounds", "grow_window_rounds"):
            value = getattr(self, name)
            if not (value is None and name == "grow_window_rounds"
                    or isinstance(value, int) and value >= 1):
                raise ConfigError(name, value, "use a whole number >= 1")

    @property
    def grow_window(self) -> int:
        return self.window_rounds if self.grow_window_rounds is None else self.grow_window_rounds

    def clamp(self, num_nodes: int) -> int:
        return int(min(max(num_nodes, self.min_nodes), self.max_nodes))


@dataclass(frozen=True)
class Proposal:
    """One round's unsmoothed answer of an autoscaler."""

    num_nodes: int
    reason: str
    """Why, in a few words (for logs and views)."""
    utility: float | None = None
    """Estimated cluster utility at ``num_nodes`` (None: not estimated or no allocation)."""
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScalingDecision:
    """What an autoscaler answers for one round."""

    num_nodes: int
    """Desired cluster size: smoothed over the window, within [min_nodes, max_nodes]."""
    proposed_num_nodes: int
    """This round's own proposal, before smoothing."""
    current_num_nodes: int
    reason: str
    utility: float | None = None
    """Estimated cluster utility at the proposed size (None when not estimated)."""
    price_per_hour: float = 0.0
    """Cost per hour of ``num_nodes`` template nodes."""
    info: Mapping[str, Any] = field(default_factory=dict)
    num_nodes_by_type: Mapping[str, int] = field(default_factory=dict)
    """Desired nodes per GPU type of a typed autoscaler; empty: ``num_nodes`` of the
    cluster's one type (:meth:`Autoscaler.decide_by_type`)."""


class Autoscaler(ABC):
    """Desired cluster size per round. Instances keep the recent proposals (smoothing)."""

    name: ClassVar[str]
    batch_objective: ClassVar[BatchObjective] = BatchObjective.GOODPUT
    """What the adaptive jobs of a cluster run by this autoscaler maximize when they pick
    their batch size (see :mod:`~pollux.policies.autoscaling.objective`)."""

    def __init__(self, config: AutoscalerConfig, estimator: Policy | None = None) -> None:
        self.config = config
        self.estimator = default_estimator() if estimator is None else estimator
        self._recent: deque[int] = deque(maxlen=max(config.window_rounds, config.grow_window))

    @abstractmethod
    def propose(self, jobs: Sequence[JobInfo], num_nodes: int) -> Proposal:
        """This round's desired size, unsmoothed (bounds are applied by :meth:`decide`)."""

    def decide(self, jobs: Sequence[JobInfo], num_nodes: int) -> ScalingDecision:
        """The desired size: this round's proposal, smoothed and bounded.

        Smoothing: the size grows only when each of the last ``grow_window_rounds``
        proposals exceeds it (to the smallest of them) and shrinks only when each of the
        last ``window_rounds`` is below it (to the largest of them); otherwise it stays.
        A lone round never moves the cluster (with windows > 1), and a size that proposals
        straddle is kept. A size outside [min_nodes, max_nodes] is brought inside at once.
        """
        cfg = self.config
        current = int(num_nodes)
        proposal = self.propose(jobs, current)
        proposed = cfg.clamp(proposal.num_nodes)
        self._recent.append(proposed)
        recent = list(self._recent)
        up = recent[-cfg.grow_window:] if len(recent) >= cfg.grow_window else []
        down = recent[-cfg.window_rounds:] if len(recent) >= cfg.window_rounds else []
        if up and min(up) > current:
            desired, how = min(up), "grow"
        elif down and max(down) < current:
            desired, how = max(down), "shrink"
        else:
            desired, how = current, "hold"
        desired = cfg.clamp(desired)
        if desired != current:
            logger.debug("%s autoscaler: %s %d -> %d (%s)", self.name, how, current, desired,
                         proposal.reason)
        return ScalingDecision(
            num_nodes=desired, proposed_num_nodes=proposed, current_num_nodes=current,
            reason=proposal.reason, utility=proposal.utility,
            price_per_hour=desired * cfg.template.price_per_hour,
            info={"window": list(self._recent), **proposal.info})

    def decide_by_type(self, jobs: Sequence[JobInfo], current: Mapping[str, int]
                       ) -> ScalingDecision:
        """The desired size per GPU type given the size per type ``current`` (nodes ready
        and being provisioned). Here, on a cluster of one type (or none yet): :meth:`decide`
        on its size, whose ``num_nodes`` is that type's (``num_nodes_by_type`` stays empty);
        the typed autoscaler (:mod:`.typed`) decides several."""
        if len(current) > 1:
            raise ConfigError("autoscaler", self.name, "this autoscaler sizes a cluster of "
                              "one GPU type; a typed cluster takes --autoscaler pollux")
        return self.decide(jobs, sum(int(n) for n in current.values()))

    def evaluator(self, jobs: Sequence[JobInfo]) -> SizeEvaluator:
        return SizeEvaluator(self.estimator, jobs, self.config.template.resources)

    def useful_nodes(self, evaluator: SizeEvaluator) -> int:
        """Most nodes worth having: those the best allocation on ``max_nodes`` occupies."""
        top = evaluator.estimate(self.config.max_nodes)
        return max(self.config.min_nodes, top.num_used_nodes)


class FixedSizeAutoscaler(Autoscaler):
    """``none``: the cluster keeps its size."""

    name = "none"

    def propose(self, jobs: Sequence[JobInfo], num_nodes: int) -> Proposal:
        return Proposal(num_nodes, "fixed size")

    def decide(self, jobs: Sequence[JobInfo], num_nodes: int) -> ScalingDecision:
        return ScalingDecision(num_nodes=num_nodes, proposed_num_nodes=num_nodes,
                               current_num_nodes=num_nodes, reason="fixed size",
                               price_per_hour=num_nodes * self.config.template.price_per_hour)


DEFAULT_LOW_UTIL = 0.6
DEFAULT_HIGH_UTIL = 0.78
"""The default utility band. Chosen with ``bench/autoscale.py`` to save cost at a similar
completion time against the throughput autoscaler (the measurements are on the docs'
page research/autoscaling.md). A lower band (e.g. 0.35-0.65) grows sooner and finishes
sooner at a higher cost."""


class PolluxAutoscaler(Autoscaler):
    """``pollux``: keeps the cluster utility of the best allocation inside a band."""

    name = "pollux"

    def __init__(self, config: AutoscalerConfig, estimator: Policy | None = None, *,
                 low_util: float = DEFAULT_LOW_UTIL,
                 high_util: float = DEFAULT_HIGH_UTIL) -> None:
        super().__init__(config, estimator)
        if not 0 < low_util < 1:
            raise ConfigError("low_util", low_util,
                              f"use a utility in (0, 1), e.g. {DEFAULT_LOW_UTIL}")
        if not low_util < high_util <= 1:
            raise ConfigError("high_util", high_util,
                              f"use a utility in ({low_util}, 1], e.g. {DEFAULT_HIGH_UTIL}")
        self.low_util = float(low_util)
        self.high_util = float(high_util)

    @property
    def target_util(self) -> float:
        """The middle of the band, where a resize aims."""
        return 0.5 * (self.low_util + self.high_util)

    def in_band(self, utility: float | None) -> bool:
        return utility is not None and self.low_util <= utility <= self.high_util

    def _above_target(self, estimate: SizeEstimate) -> bool:
        # no allocation at all while jobs wait: as good as infinitely high utility
        return estimate.utility is None or estimate.utility >= self.target_util

    def _distance(self, estimate: SizeEstimate) -> float:
        return math.inf if estimate.utility is None else abs(estimate.utility - self.target_util)

    def propose(self, jobs: Sequence[JobInfo], num_nodes: int) -> Proposal:
        cfg = self.config
        if not jobs:
            return Proposal(cfg.min_nodes, "no active jobs")
        evaluator = self.evaluator(jobs)
        cap = self.useful_nodes(evaluator)
        current = min(max(num_nodes, cfg.min_nodes), cap)
        now = evaluator.estimate(current)
        stats = {"useful_nodes": cap}
        if current == num_nodes and self.in_band(now.utility):
            return Proposal(num_nodes, f"utility {now.utility:.2f} within the band",
                            now.utility, {**stats, "evaluations": evaluator.num_evaluations})
        best = self._search(evaluator, cfg.min_nodes, cap)
        if not self.in_band(evaluator.estimate(best).utility):
            best = self._scan_for_band(evaluator, cfg.min_nodes, cap, best)
        found = evaluator.estimate(best)
        shown = "none" if found.utility is None else f"{found.utility:.2f}"
        if now.utility is None or now.utility > self.high_util:
            where = "above the band"
        elif now.utility < self.low_util:
            where = "below the band"
        else:
            where = "within the band but beyond the useful size"
        return Proposal(best, f"utility {where} at {num_nodes} nodes; {shown} at {best}",
                        found.utility, {**stats, "evaluations": evaluator.num_evaluations})

    def _scan_for_band(self, evaluator: SizeEvaluator, low: int, high: int,
                       searched: int) -> int:
        """The in-band size in [low, high] nearest the band's middle (the smallest on a
        tie), else ``searched``. Utility usually falls with size, but not always (a node
        more can give every job a node of its own), so when the search misses the band,
        every size is looked at."""
        in_band = [n for n in range(max(low, 1), high + 1)
                   if self.in_band(evaluator.estimate(n).utility)]
        if not in_band:
            return searched
        return min(in_band, key=lambda n: (self._distance(evaluator.estimate(n)), n))

    def _search(self, evaluator: SizeEvaluator, low: int, high: int) -> int:
        """The size in [low, high] whose utility is nearest the band's middle, assuming
        utility does not rise with size: the last size at or above the middle, or the
        next one, whichever is nearer."""
        low = max(low, 1) if high >= 1 else low
        if low >= high:
            return high
        if not self._above_target(evaluator.estimate(low)):
            return low
        if self._above_target(evaluator.estimate(high)):
            return high
        while high - low > 1:  # invariant: above at low, below at high
            middle = (low + high) // 2
            if self._above_target(evaluator.estimate(middle)):
                low = middle
            else:
                high = middle
        if self._distance(evaluator.estimate(high)) < self._distance(evaluator.estimate(low)):
            return high
        return low


class ThroughputAutoscaler(Autoscaler):
    """``throughput``: grows while another node adds enough throughput (efficiency ignored).

    Each job's throughput speedup comes from ``JobInfo.extras["throughput_speedup_fn"]``
    (see :data:`~pollux.policies.autoscaling.utility.THROUGHPUT_SPEEDUP_KEY`), else its
    ``speedup_fn``, else perfect scaling (``None``, as every policy reads it). The estimator allocates by those speedups; a
    node's marginal efficiency is the throughput it adds over the replicas it adds.

    Its jobs ignore statistical efficiency as well (``batch_objective`` THROUGHPUT): each
    trains at its throughput-optimal batch size, as in the system of Or et al.
    """

    name = "throughput"
    batch_objective = BatchObjective.THROUGHPUT

    def __init__(self, config: AutoscalerConfig, estimator: Policy | None = None, *,
                 min_marginal_efficiency: float = 0.5) -> None:
        super().__init__(config, estimator)
        if not 0 < min_marginal_efficiency <= 1:
            raise ConfigError("min_marginal_efficiency", min_marginal_efficiency,
                              "use a fraction of ideal scaling in (0, 1], e.g. 0.5")
        self.min_marginal_efficiency = float(min_marginal_efficiency)

    @staticmethod
    def throughput_jobs(jobs: Sequence[JobInfo]) -> list[JobInfo]:
        """The jobs with their throughput speedups in place of their goodput speedups."""
        out = []
        for job in jobs:
            fn = job.extras.get(THROUGHPUT_SPEEDUP_KEY) or job.on().speedup_fn  # None: linear
            out.append(job.with_default(speedup_fn=fn))
        return out

    def marginal_efficiency(self, evaluator: SizeEvaluator, num_nodes: int) -> float:
        """Throughput node ``num_nodes + 1`` adds per replica it adds (0: adds none)."""
        before, after = evaluator.estimate(num_nodes), evaluator.estimate(num_nodes + 1)
        added = after.num_replicas - before.num_replicas
        if added <= 0:
            return 0.0
        return float(np.clip((after.total_speedup - before.total_speedup) / added, -1e9, 1e9))

    def propose(self, jobs: Sequence[JobInfo], num_nodes: int) -> Proposal:
        cfg = self.config
        if not jobs:
            return Proposal(cfg.min_nodes, "no active jobs")
        evaluator = self.evaluator(self.throughput_jobs(jobs))
        cap = self.useful_nodes(evaluator)
        threshold = self.min_marginal_efficiency
        size = min(max(num_nodes, cfg.min_nodes, 1), cap)
        if size < cap and self.marginal_efficiency(evaluator, size) >= threshold:
            while size < cap and self.marginal_efficiency(evaluator, size) >= threshold:
                size += 1
            reason = "another node still adds enough throughput"
        else:
            while size > max(cfg.min_nodes, 1) and (
                    self.marginal_efficiency(evaluator, size - 1) < threshold):
                size -= 1
            reason = ("the last node adds too little throughput" if size < num_nodes
                      else "the next node would add too little throughput")
        return Proposal(size, reason, None,
                        {"useful_nodes": cap, "evaluations": evaluator.num_evaluations})
