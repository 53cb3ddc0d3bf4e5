"""When to change the batch configuration: a confidence rule with hysteresis.

At every agreement point (about once a second) rank 0 recomputes the goodput-optimal
configuration from the latest estimates: the throughput fit and the gradient noise.
The estimates fluctuate, most of all early in training, and acting on each one made a
stationary job go 64 -> 124 -> 64 within seconds. :class:`BatchDecider` changes the
configuration only when three conditions hold:

1. **Gain**: the proposal's predicted goodput beats the current configuration's by more
   than ``min_gain`` (``AgentConfig.min_goodput_gain``, 5%), both predicted from the
   same, latest estimates.
2. **Confidence**: ``confirmations`` agreement points in a row
   (``AgentConfig.batch_change_confirmations``, 3) propose a change in the same
   direction (a larger total batch, a smaller one, or the same total split otherwise);
   the last proposal is adopted. A point that proposes no change, or the other
   direction, starts the count again.
3. **Hysteresis**: once the batch size has moved one way, a move back the other way
   needs ``reversal_gain`` (``AgentConfig.batch_reversal_gain``, 25%; at least
   ``min_gain``) instead of ``min_gain``.

A transient estimate therefore never changes the batch size, and noise smaller than the
reversal margin cannot undo a change: a stationary job's batch size moves in one
direction and settles (``tests/torch/test_batch_decider.py`` checks this as a property).
A change of the replica count starts the count and the hysteresis afresh (the optimum
moves with it), from the total batch size carried over
(:func:`~pollux.torch.batch_size.carried_batch_config`). And no change is made from a
configuration until the throughput fit includes enough step times measured in it
(``measured``; ``AgentConfig.min_profiled_steps``, 10 optimizer steps): acting on the
fit's extrapolation to a new replica count made a relaunched job go 128 -> 36 -> 128
within 2 s (the first agreement points come every step), and on its first few, noisy
steps at a new placement 128 -> 32 -> 128 within 7 s. Only a job with nothing to carry
(its first start, or a total the new count cannot hold) takes the predicted optimum at
once.
"""

from __future__ import annotations

from dataclasses import dataclass

from pollux.errors import ConfigError
from pollux.models import GradientStats, ThroughputParams
from pollux.torch.batch_size import BatchConfig, BatchLimits, initial_batch_config, predicted_best


@dataclass(frozen=True)
class DecisionRule:
    """The thresholds of :class:`BatchDecider`.

    >>> DecisionRule(min_gain=0.05, confirmations=3, reversal_gain=0.25).confirmations
    3
    """

    min_gain: float = 0.05
    confirmations: int = 3
    reversal_gain: float = 0.25

    def __post_init__(self) -> None:
        if not self.min_gain >= 0:
            raise ConfigError("min_goodput_gain", self.min_gain, "must be >= 0")
        if self.confirmations < 1:
            raise ConfigError("batch_change_confirmations", self.confirmations,
                              "must be >= 1 (1: act on every agreement point)")
        if not self.reversal_gain >= 0:
            raise ConfigError("batch_reversal_gain", self.reversal_gain, "must be >= 0")


def _direction(candidate: BatchConfig, current: BatchConfig, num_replicas: int) -> int:
    """+1 for a larger total batch, -1 for a smaller one, 0 for the same total."""
    change = candidate.total(num_replicas) - current.total(num_replicas)
    return (change > 0) - (change < 0)


class BatchDecider:
    """Rank 0's batch-size decisions over a run (see the module docstring).

    >>> decider = BatchDecider(DecisionRule())
    >>> limits = BatchLimits(64, 1024, (16, 256), accumulation=False)
    >>> decider.decide(limits, None, None, 1, 1, None)  # nothing measured yet
    BatchConfig(local_bsz=64, accum_steps=0)
    """

    def __init__(self, rule: DecisionRule) -> None:
        self.rule = rule
        self._streak = 0
        self._streak_direction = 0
        self._last_move = 0
        """Direction of the last change made (0: none yet)."""
        self._replicas = 0
        """The replica count of the last decision."""

    def decide(self, limits: BatchLimits, params: ThroughputParams | None,
               grad_stats: GradientStats | None, num_nodes: int, num_replicas: int,
               current: BatchConfig | None, measured: bool = True) -> BatchConfig:
        """The configuration to use from this agreement point on.

        ``current`` is None before the first choice, and after a change of the replica
        count that could not carry the total batch size over: then the optimum (or the
        initial configuration) is taken at once. ``measured``: whether the throughput fit
        includes enough step times of ``current`` (otherwise ``current`` is kept).
        """
        if current is None or num_replicas != self._replicas:
            self._streak = self._streak_direction = self._last_move = 0
            self._replicas = num_replicas
        fallback = current if current is not None else initial_batch_config(limits,
                                                                              num_replicas)
        predicted = predicted_best(limits, params, grad_stats, num_nodes, num_replicas,
                                   current)
        if predicted is None:
            self._streak = 0
            return fallback
        candidate, best, now = predicted
        if current is None:
            return candidate
        if not measured:  # the fit only extrapolates to this placement yet
            self._streak = 0
            return current
        direction = _direction(candidate, current, num_replicas)
        reversal = self._last_move != 0 and direction == -self._last_move
        needed = (max(self.rule.reversal_gain, self.rule.min_gain) if reversal
                  else self.rule.min_gain)
        if candidate == current or not best > (1.0 + needed) * now:
            self._streak = 0
            return current
        if self._streak > 0 and direction == self._streak_direction:
            self._streak += 1
        else:
            self._streak, self._streak_direction = 1, direction
        if self._streak < self.rule.confirmations:
            return current
        self._streak = 0
        if direction != 0:
            self._last_move = direction
        return candidate
