"""Choosing the atomic batch size and accumulation steps (numpy only, no process group).

At agreement points rank 0's :class:`~pollux.torch.batch_decider.BatchDecider` picks the
configuration (a gain threshold, confirmations and hysteresis, so that noisy estimates
cannot make the job flap) and broadcasts it; :func:`choose_batch_config` is the one-shot
gain rule alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pollux.errors import ConfigError
from pollux.models import GoodputFunction, GradientStats, ThroughputParams
from pollux.models.goodput import check_batch_bounds


@dataclass(frozen=True)
class BatchLimits:
    """What the job accepts: set by ``AdaptiveDataLoader.autoscale_batch_size``.

    >>> BatchLimits(64, 1024, (16, 256)).adaptive
    True
    """

    init_batch_size: int
    """Initial total batch size ``M0`` (the loader's ``batch_size``)."""
    max_batch_size: int
    """Largest total batch; equal to ``init_batch_size`` when not autoscaling."""
    local_bsz_bounds: tuple[int, int]
    """Smallest and largest atomic (per-replica, per-micro-step) batch."""
    accumulation: bool = True
    """Whether gradient accumulation may be used."""

    def __post_init__(self) -> None:
        if self.init_batch_size < 1:
            raise ConfigError("batch_size", self.init_batch_size, "must be >= 1")
        lo, hi = check_batch_bounds(self.init_batch_size, self.max_batch_size,
                                    self.local_bsz_bounds)
        object.__setattr__(self, "local_bsz_bounds", (lo, hi))

    @property
    def adaptive(self) -> bool:
        return self.max_batch_size > self.init_batch_size


@dataclass(frozen=True)
class BatchConfig:
    """Per-replica atomic batch and accumulation steps: total = K * local_bsz * (s + 1).

    >>> BatchConfig(local_bsz=32, accum_steps=1).total(num_replicas=4)
    256
    """

    local_bsz: int
    accum_steps: int = 0

    def __post_init__(self) -> None:
        if self.local_bsz < 1:
            raise ConfigError("local_bsz", self.local_bsz, "must be >= 1")
        if self.accum_steps < 0:
            raise ConfigError("accum_steps", self.accum_steps, "must be >= 0")

    def total(self, num_replicas: int) -> int:
        return num_replicas * self.local_bsz * (self.accum_steps + 1)

    def micro_batches_per_rank(self, num_samples: int, num_replicas: int,
                               drop_last: bool) -> int:
        """Micro-batches each rank takes for ``num_samples`` samples of an epoch (as
        :func:`~pollux.torch.elastic_sampler.plan_step` plans them: full steps, then the
        last, short step spread over the replicas unless ``drop_last``).

        >>> BatchConfig(local_bsz=8, accum_steps=1).micro_batches_per_rank(100, 2, False)
        7
        """
        micro = self.accum_steps + 1
        full_steps, rest = divmod(num_samples, num_replicas * self.local_bsz * micro)
        share = -(-rest // num_replicas)  # the last, short step's samples per replica
        last = 0 if rest == 0 or drop_last else -(-share // self.local_bsz)
        return full_steps * micro + last


def initial_batch_config(limits: BatchLimits, num_replicas: int) -> BatchConfig:
    """The configuration closest to ``M0`` on ``num_replicas`` replicas.

    With one replica, an adaptive job that may accumulate uses two micro-batches so the
    gradient noise can be measured (it needs two gradients per step).
    """
    lo, hi = limits.local_bsz_bounds
    micro = 1
    if limits.accumulation:
        micro = max(1, math.ceil(limits.init_batch_size / (num_replicas * hi)))
        if num_replicas == 1 and limits.adaptive and limits.init_batch_size >= 2 * lo:
            micro = max(micro, 2)
    local = math.ceil(limits.init_batch_size / (num_replicas * micro))
    return BatchConfig(local_bsz=min(max(local, lo), hi), accum_steps=micro - 1)


def carried_batch_config(limits: BatchLimits, config: BatchConfig | None,
                         from_replicas: int, num_replicas: int) -> BatchConfig | None:
    """``config``'s total batch size (chosen on ``from_replicas`` replicas) split over
    ``num_replicas``: the configuration a relaunched job resumes with, so that its first
    batch-size change after a rescale waits for the confirmations of
    :class:`~pollux.torch.batch_decider.BatchDecider` (the throughput fit has no
    measurement at the new replica count yet). None when there is nothing to carry or
    the total cannot be kept within the limits (then the optimum is taken at once).

    >>> limits = BatchLimits(64, 1024, (16, 256), accumulation=False)
    >>> carried_batch_config(limits, BatchConfig(64), 2, 1)  # 128 in all, kept
    BatchConfig(local_bsz=128, accum_steps=0)
    >>> carried_batch_config(limits, BatchConfig(256), 4, 1) is None  # 1,024 > 256 x 1
    True
    """
    if config is None or from_replicas < 1 or num_replicas < 1:
        return None
    total = config.total(from_replicas)
    lo, hi = limits.local_bsz_bounds
    micro = max(1, math.ceil(total / (num_replicas * hi))) if limits.accumulation else 1
    local = round(total / (num_replicas * micro))
    if not lo <= local <= hi or not limits.init_batch_size <= local * num_replicas * micro:
        return None
    carried = BatchConfig(local_bsz=local, accum_steps=micro - 1)
    return carried if carried.total(num_replicas) <= limits.max_batch_size else None


def predicted_best(
    limits: BatchLimits,
    params: ThroughputParams | None,
    grad_stats: GradientStats | None,
    num_nodes: int,
    num_replicas: int,
    current: BatchConfig | None,
) -> tuple[BatchConfig, float, float] | None:
    """The goodput-optimal configuration, its predicted goodput and ``current``'s (NaN when
    ``current`` is None), or None when there is nothing to predict with (not adaptive, no
    throughput fit or gradient statistics, no positive goodput)."""
    if not limits.adaptive or params is None or grad_stats is None:
        return None
    goodput = GoodputFunction(params, grad_stats, limits.init_batch_size)
    best, local_bsz, accum = goodput.optimize(
        num_nodes=num_nodes, num_replicas=num_replicas,
        max_batch_size=limits.max_batch_size, local_bsz_bounds=limits.local_bsz_bounds,
        accumulation=limits.accumulation)
    best_goodput = float(best)
    if not best_goodput > 0:
        return None
    now = (math.nan if current is None else
           float(goodput.evaluate(num_nodes, num_replicas, current.local_bsz,
                                  current.accum_steps)))
    return BatchConfig(local_bsz=int(local_bsz), accum_steps=int(accum)), best_goodput, now


def choose_batch_config(
    limits: BatchLimits,
    params: ThroughputParams | None,
    grad_stats: GradientStats | None,
    num_nodes: int,
    num_replicas: int,
    current: BatchConfig | None,
    min_gain: float = 0.05,
) -> BatchConfig:
    """The goodput-optimal configuration, if it beats ``current`` by ``min_gain``.

    Without a throughput fit or gradient statistics there is nothing to predict with:
    the current (or initial) configuration stays.
    """
    fallback = current if current is not None else initial_batch_config(limits, num_replicas)
    predicted = predicted_best(limits, params, grad_stats, num_nodes, num_replicas, current)
    if predicted is None:
        return fallback
    candidate, best_goodput, now = predicted
    if current is None:
        return candidate
    if candidate != current and best_goodput > (1.0 + min_gain) * now:
        return candidate
    return current
