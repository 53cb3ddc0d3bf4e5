"""The goodput-aware autoscaler of a typed cluster: how many nodes of each GPU type.

:class:`TypedAutoscaler` (``pollux`` on a cluster of several types) asks, every round,
what each active job would use well and where that is cheapest. For each job and each
type it takes the most replicas (up to the job's cap on the type) at which the job still
runs at ``target_util`` (the middle of the utility band) of ideal scaling by its own
goodput model (:class:`~pollux.models.typed.TypedGoodput`), and the goodput per dollar
there (goodput / (replicas x the price of one GPU-hour of the type)). Jobs, best value
first, ask for their replicas, or for what room is left (the types' bounds), on the type
where they are worth most *at the margin*: among the types of at least ``spill`` of the
job's best goodput per dollar, the one of the most goodput per dollar of the nodes the
ask adds (``whole_nodes``: an ask that opens a new node pays for all of it, an ask that
fits on the last node of a type already asked for pays per GPU); a job whose eligible
types are full waits. So a job does not open an 8-GPU node for two replicas where
another type has room at nearly its value, and does not spill onto a much dearer type
when its best is full. A job without a model yet asks for its first replicas likewise by
1-GPU speed per dollar (its ``extras[TYPE_SPEEDS_KEY]``; without them, the cheapest
GPU). The replicas asked per type, in whole nodes, within each type's bounds and
``max_nodes`` in all, at least ``min_nodes`` (on the cheapest node's type), are this
round's proposal. Per type it is smoothed as :meth:`Autoscaler.decide` smooths one size:
a type grows only when the last ``grow_window_rounds`` proposals all exceed its size,
and shrinks only when the last ``window_rounds`` are all below it.

A one-type cluster keeps the plain autoscalers (:mod:`.autoscaler`); this one is built
where the cluster has several types (or one declared type), with one
:class:`~pollux.policies.autoscaling.autoscaler.NodeTemplate` (GPUs, price) per type.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from pollux.errors import ConfigError
from pollux.policies.autoscaling.autoscaler import (
    DEFAULT_HIGH_UTIL,
    DEFAULT_LOW_UTIL,
    Autoscaler,
    AutoscalerConfig,
    NodeTemplate,
    Proposal,
    ScalingDecision,
)
from pollux.policies.autoscaling.objective import BatchObjective
from pollux.policies.base import GPU, TYPE_SPEEDS_KEY, JobInfo

DEFAULT_SPILL = 0.8
"""A job may move off its best type onto one of at least this fraction of its goodput per
dollar there (1: every job on its best type only; 0, as before: onto any type when its
best is full). Chosen with ``bench/typed_autoscale.py`` on Philly workloads 1 and 7; on
all 8 the rule at the margin changes little next to the utility band (README)."""


class TypedAutoscaler(Autoscaler):
    """``pollux`` on a typed cluster: nodes per GPU type by goodput per dollar."""

    name: ClassVar[str] = "pollux"

    def __init__(self, config: AutoscalerConfig, templates: Mapping[str, NodeTemplate],
                 max_nodes: Mapping[str, int], *, low_util: float = DEFAULT_LOW_UTIL,
                 high_util: float = DEFAULT_HIGH_UTIL, spill: float = DEFAULT_SPILL,
                 whole_nodes: bool = True) -> None:
        super().__init__(config)
        if set(templates) != set(max_nodes) or not templates:
            raise ConfigError("max_nodes", dict(max_nodes), "give a bound for every type "
                              f"with a node template ({', '.join(templates)})")
        if not 0 < low_util < high_util <= 1:
            raise ConfigError("utility_band", f"{low_util}:{high_util}",
                              "use 0 < LOW < HIGH <= 1, e.g. 0.6:0.78")
        if not 0 <= spill <= 1:
            raise ConfigError("spill", spill, "use a fraction in [0, 1], e.g. 0.8")
        self.templates = dict(templates)
        self.max_nodes = {t: int(n) for t, n in max_nodes.items()}
        self.target_util = 0.5 * (low_util + high_util)
        self.spill = float(spill)
        self.whole_nodes = bool(whole_nodes)
        self._recent_by_type: deque[dict[str, int]] = deque(
            maxlen=max(config.window_rounds, config.grow_window))

    def gpus(self, gpu_type: str) -> int:
        return int(self.templates[gpu_type].resources.get(GPU, 0))

    def gpu_price(self, gpu_type: str) -> float:
        """Price of one GPU-hour of the type (its node's price over its GPUs)."""
        return self.templates[gpu_type].price_per_hour / max(self.gpus(gpu_type), 1)

    def cheapest_type(self) -> str:
        return min(self.templates, key=lambda t: (self.templates[t].price_per_hour, t))

    def _wants(self, job: JobInfo) -> list[tuple[float, str, int]]:
        """(goodput per dollar, type, replicas) the job would use well, best first."""
        caps = {t: max(1, int(job.max_replicas_by_type.get(t, job.max_replicas)))
                for t in self.templates}
        model = job.typed_goodput
        if model is None:
            speeds = job.extras.get(TYPE_SPEEDS_KEY) or {}
            return sorted(((float(speeds.get(t, 1.0)) / max(self.gpu_price(t), 1e-12), t,
                            caps[t]) for t in self.templates), reverse=True)
        wants = []
        for gpu_type, cap in caps.items():
            if gpu_type not in model.gpu_types:
                continue
            replicas = np.arange(1, cap + 1)
            nodes = np.ceil(replicas / max(self.gpus(gpu_type), 1))
            goodput = np.asarray(model.goodput(gpu_type, nodes, replicas), dtype=float)
            if not goodput[0] > 0:
                continue
            efficient = np.nonzero(goodput / (replicas * goodput[0])
                                   >= self.target_util - 1e-9)[0]
            k = int(efficient.max()) + 1 if efficient.size else 1
            price = max(self.gpu_price(gpu_type), 1e-12)
            wants.append((float(goodput[k - 1]) / (k * price), gpu_type, k))
        return sorted(wants, reverse=True)

    def propose_by_type(self, jobs: Sequence[JobInfo]) -> dict[str, int]:
        """This round's nodes per type, unsmoothed (the module docstring)."""
        room = {t: self.max_nodes[t] * self.gpus(t) for t in self.templates}
        asked = dict.fromkeys(self.templates, 0)
        wants = [self._wants(job) for job in jobs]
        def spare(gpu_type: str) -> int:
            """GPUs of the type still askable: its bound, and whole nodes within the
            cluster's ``max_nodes`` in all."""
            gpus = max(self.gpus(gpu_type), 1)
            used = sum(math.ceil(n / max(self.gpus(t), 1)) for t, n in asked.items())
            free_nodes = self.config.max_nodes - used
            partial = -asked[gpu_type] % gpus  # GPUs left on the type's last node
            return min(room[gpu_type] - asked[gpu_type], partial + free_nodes * gpus)

        for options in sorted(wants, key=lambda w: w[0][0] if w else 0.0, reverse=True):
            best: tuple[float, str, int] | None = None  # (value at the margin, type, GPUs)
            for value, gpu_type, replicas in options:
                if value < self.spill * options[0][0]:
                    break
                take = min(replicas, spare(gpu_type))
                if take < 1:
                    continue
                if self.whole_nodes:  # the nodes the ask opens cost in full
                    gpus = max(self.gpus(gpu_type), 1)
                    opened = math.ceil(max(take - (-asked[gpu_type] % gpus), 0) / gpus)
                    cost = take * self.gpu_price(gpu_type)
                    value *= cost / max(opened * self.templates[gpu_type].price_per_hour,
                                        cost, 1e-12)
                if best is None or value > best[0]:
                    best = (value, gpu_type, take)
                if not self.whole_nodes:
                    break  # the first with room, as before
            if best is not None:
                asked[best[1]] += best[2]
        nodes = {t: min(math.ceil(n / max(self.gpus(t), 1)), self.max_nodes[t])
                 for t, n in asked.items()}
        short = self.config.min_nodes - sum(nodes.values())
        if short > 0:
            cheapest = self.cheapest_type()
            nodes[cheapest] = min(nodes[cheapest] + short, self.max_nodes[cheapest])
        return nodes

    def propose(self, jobs: Sequence[JobInfo], num_nodes: int) -> Proposal:
        nodes = self.propose_by_type(jobs)
        return Proposal(sum(nodes.values()), "goodput per dollar by type", info=nodes)

    def decide_by_type(self, jobs: Sequence[JobInfo], current: Mapping[str, int]
                       ) -> ScalingDecision:
        """Nodes per type: this round's proposal smoothed per type (module docstring)."""
        cfg = self.config
        proposed = self.propose_by_type(jobs)
        self._recent_by_type.append(proposed)
        recent = list(self._recent_by_type)
        desired: dict[str, int] = {}
        for gpu_type in self.templates:
            now = int(current.get(gpu_type, 0))
            up = [r[gpu_type] for r in recent[-cfg.grow_window:]] \
                if len(recent) >= cfg.grow_window else []
            down = [r[gpu_type] for r in recent[-cfg.window_rounds:]] \
                if len(recent) >= cfg.window_rounds else []
            if up and min(up) > now:
                now = min(up)
            elif down and max(down) < now:
                now = max(down)
            desired[gpu_type] = min(max(now, 0), self.max_nodes[gpu_type])
        short = cfg.min_nodes - sum(desired.values())
        if short > 0:
            cheapest = self.cheapest_type()
            desired[cheapest] = min(desired[cheapest] + short, self.max_nodes[cheapest])
        while sum(desired.values()) > cfg.max_nodes:  # a type grew before another shrank
            grown = max(desired, key=lambda t: desired[t] - int(current.get(t, 0)))
            desired[grown] -= 1
        total = sum(desired.values())
        return ScalingDecision(
            num_nodes=total, proposed_num_nodes=sum(proposed.values()),
            current_num_nodes=sum(current.values()), reason="goodput per dollar by type",
            price_per_hour=sum(n * self.templates[t].price_per_hour
                               for t, n in desired.items()),
            info={"proposed_by_type": proposed}, num_nodes_by_type=desired)


class TypedThroughputAutoscaler(TypedAutoscaler):
    """``throughput`` on a typed cluster, the baseline: the same sizing by goodput per
    dollar, but its jobs ignore statistical efficiency (they pick throughput-optimal
    batches and report their throughput), and a job asks for replicas while each still
    adds ``min_marginal_efficiency`` of ideal scaling, as :class:`ThroughputAutoscaler`."""

    name: ClassVar[str] = "throughput"
    batch_objective: ClassVar[BatchObjective] = BatchObjective.THROUGHPUT

    def __init__(self, config: AutoscalerConfig, templates: Mapping[str, NodeTemplate],
                 max_nodes: Mapping[str, int], *, min_marginal_efficiency: float = 0.5
                 ) -> None:
        super().__init__(config, templates, max_nodes)
        if not 0 < min_marginal_efficiency <= 1:
            raise ConfigError("min_marginal_efficiency", min_marginal_efficiency,
                              "use a fraction in (0, 1], e.g. 0.5")
        self.target_util = float(min_marginal_efficiency)
