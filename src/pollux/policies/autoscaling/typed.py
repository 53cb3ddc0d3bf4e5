"""The goodput-aware autoscaler of a typed cluster: how many nodes of each GPU type.

:class:`TypedAutoscaler` (``pollux`` on a cluster of several types) asks, every round,
what each active job would use well and where that is cheapest. For each job and each
type it takes the most replicas (up to the job's cap on the type) at which the job still
runs at ``target_util`` (the middle of the utility band) of ideal scaling by its own
goodput model (:class:`~pollux.models.typed.TypedGoodput`), and the goodput per dollar
there (goodput / (replicas x the price of one GPU-hour of the type)); a job without a
model yet, its 1-GPU speed per dollar (its ``extras[TYPE_SPEEDS_KEY]``; without them, the
cheapest GPU) at its cap. Jobs, best value first, ask for those replicas on their best
type, or for the room left there; a job whose best type is full waits (on the Philly
workloads moving it onto a type of less goodput per dollar cost more and finished no
sooner: ``bench/typed_autoscale.py``). Room: each type's bound, and whole nodes within
``max_nodes`` and ``max_price_per_hour`` (a budget) in all. The replicas asked per type, in whole nodes, at
least ``min_nodes`` (on the cheapest node's type), are this round's proposal. Per type it
is smoothed as :meth:`Autoscaler.decide` smooths one size: a type grows only when the
last ``grow_window_rounds`` proposals all exceed its size, and shrinks only when the last
``window_rounds`` are all below it; over the bounds in all, what grew gives way.

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


class TypedAutoscaler(Autoscaler):
    """``pollux`` on a typed cluster: nodes per GPU type by goodput per dollar."""

    name: ClassVar[str] = "pollux"

    def __init__(self, config: AutoscalerConfig, templates: Mapping[str, NodeTemplate],
                 max_nodes: Mapping[str, int], *, low_util: float = DEFAULT_LOW_UTIL,
                 high_util: float = DEFAULT_HIGH_UTIL, max_price_per_hour: float = math.inf
                 ) -> None:
        super().__init__(config)
        if set(templates) != set(max_nodes) or not templates:
            raise ConfigError("max_nodes", dict(max_nodes), "give a bound for every type "
                              f"with a node template ({', '.join(templates)})")
        if not 0 < low_util < high_util <= 1:
            raise ConfigError("utility_band", f"{low_util}:{high_util}",
                              "use 0 < LOW < HIGH <= 1, e.g. 0.6:0.78")
        if not max_price_per_hour > 0:
            raise ConfigError("max_price_per_hour", max_price_per_hour, "use a price > 0")
        self.templates = dict(templates)
        self.max_nodes = {t: int(n) for t, n in max_nodes.items()}
        self.target_util = 0.5 * (low_util + high_util)
        self.max_price_per_hour = float(max_price_per_hour)
        self._recent_by_type: deque[dict[str, int]] = deque(
            maxlen=max(config.window_rounds, config.grow_window))

    def gpus(self, gpu_type: str) -> int:
        return int(self.templates[gpu_type].resources.get(GPU, 0))

    def gpu_price(self, gpu_type: str) -> float:
        """Price of one GPU-hour of the type (its node's price over its GPUs)."""
        return self.templates[gpu_type].price_per_hour / max(self.gpus(gpu_type), 1)

    def price(self, nodes: Mapping[str, int]) -> float:
        """Price per hour of ``nodes`` (type -> count)."""
        return sum(n * self.templates[t].price_per_hour for t, n in nodes.items())

    def cheapest_type(self) -> str:
        return min(self.templates, key=lambda t: (self.templates[t].price_per_hour, t))

    def _best(self, job: JobInfo) -> tuple[float, str, int] | None:
        """(goodput per dollar, type, replicas) the job would use well on its best type."""
        caps = {t: max(1, int(job.on(t).max_replicas)) for t in self.templates}
        model = job.typed_goodput
        if model is None:
            speeds = job.extras.get(TYPE_SPEEDS_KEY) or {}
            return max((float(speeds.get(t, 1.0)) / max(self.gpu_price(t), 1e-12), t, caps[t])
                       for t in self.templates)
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
        return max(wants, default=None)

    def room(self, asked: Mapping[str, int], gpu_type: str) -> int:
        """GPUs of ``gpu_type`` still askable after ``asked`` (type -> GPUs): its bound,
        and whole nodes within ``max_nodes`` and ``max_price_per_hour`` in all."""
        gpus = max(self.gpus(gpu_type), 1)
        nodes = {t: math.ceil(n / max(self.gpus(t), 1)) for t, n in asked.items()}
        affordable = (self.max_price_per_hour - self.price(nodes)) / max(
            self.templates[gpu_type].price_per_hour, 1e-12)
        free_nodes = min(self.config.max_nodes - sum(nodes.values()),
                         math.floor(min(affordable + 1e-9, 1e9)))
        partial = -asked[gpu_type] % gpus  # GPUs left on the type's last node
        return max(min(self.max_nodes[gpu_type] * gpus - asked[gpu_type],
                       partial + free_nodes * gpus), 0)

    def propose_by_type(self, jobs: Sequence[JobInfo]) -> dict[str, int]:
        """This round's nodes per type, unsmoothed (the module docstring)."""
        asked = dict.fromkeys(self.templates, 0)
        wants = [w for w in map(self._best, jobs) if w is not None]
        for _, gpu_type, replicas in sorted(wants, key=lambda w: w[0], reverse=True):
            asked[gpu_type] += min(replicas, self.room(asked, gpu_type))
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
        while sum(desired.values()) > cfg.max_nodes or (  # a type grew before another shrank
                self.price(desired) > self.max_price_per_hour + 1e-9 and any(desired.values())):
            grown = max((t for t in desired if desired[t]),
                        key=lambda t: desired[t] - int(current.get(t, 0)))
            desired[grown] -= 1
        total = sum(desired.values())
        return ScalingDecision(
            num_nodes=total, proposed_num_nodes=sum(proposed.values()),
            current_num_nodes=sum(current.values()), reason="goodput per dollar by type",
            price_per_hour=self.price(desired),
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
