"""Learning-rate scaling rules: how the learning rate follows the batch size.

At each optimizer step the agent multiplies every parameter group's learning rate by
``rule.lr_factor(scale, gain, progress)`` (and puts it back after the step, so user
schedulers keep working on the base rate), where ``scale = M / M0`` is the total batch
over the initial one, ``gain`` the statistical gain of this step (steps at ``M0`` it is
worth; see :func:`pollux.models.gain`) and ``progress`` the sum of gains so far.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from pollux.errors import ConfigError, UnknownPluginError


class ScalingRule(ABC):
    """Maps (batch scale, gain, progress) to a learning-rate multiplier.

    Subclass it for a rule of your own::

        class HalfLinear(ScalingRule):
            def lr_factor(self, scale, gain, progress):
                return 1 + (scale - 1) / 2

        model = AdaptiveDataParallel(net, optimizer, scaling_rule=HalfLinear(), job=job)
    """

    @abstractmethod
    def lr_factor(self, scale: float, gain: float, progress: float) -> float:
        """Multiplier of the base learning rate for a step at ``scale`` times ``M0``."""


@dataclass(frozen=True)
class AdaScale(ScalingRule):
    """AdaScale (Johnson et al., 2020): the learning rate grows with the gain.

    The default for SGD: each step moves as far as ``gain`` steps at ``M0`` would.

    >>> AdaScale().lr_factor(scale=4.0, gain=2.0, progress=0.0)
    2.0
    """

    def lr_factor(self, scale: float, gain: float, progress: float) -> float:
        return gain


@dataclass(frozen=True)
class SqrtScale(ScalingRule):
    """Square-root scaling, the default for Adam-like optimizers.

    >>> SqrtScale().lr_factor(scale=4.0, gain=2.0, progress=0.0)
    2.0
    """

    def lr_factor(self, scale: float, gain: float, progress: float) -> float:
        return math.sqrt(scale)


@dataclass(frozen=True)
class LinearScale(ScalingRule):
    """Linear scaling (Goyal et al., 2017): the learning rate grows with the batch.

    >>> LinearScale().lr_factor(scale=4.0, gain=2.0, progress=0.0)
    4.0
    """

    def lr_factor(self, scale: float, gain: float, progress: float) -> float:
        return scale


@dataclass(frozen=True)
class WarmupScale(ScalingRule):
    """A base rule with a linear warm-up whose length grows with the batch (LEGW-like).

    The factor ramps from 0 to the base rule's over ``warmup_steps * scale`` steps of
    progress (steps at ``M0``), so larger batches warm up for longer.

    >>> rule = WarmupScale(warmup_steps=100, base=LinearScale())
    >>> rule.lr_factor(scale=2.0, gain=1.5, progress=1000.0)  # warmed up: the base rule
    2.0
    """

    warmup_steps: float
    base: ScalingRule = field(default_factory=SqrtScale)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.warmup_steps) and self.warmup_steps > 0):
            raise ConfigError("warmup_steps", self.warmup_steps, "must be a number > 0")

    def lr_factor(self, scale: float, gain: float, progress: float) -> float:
        ramp = min(1.0, (progress + gain) / (self.warmup_steps * max(scale, 1.0)))
        return self.base.lr_factor(scale, gain, progress) * ramp


_ADAM_LIKE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam,
              torch.optim.RAdam, torch.optim.Adagrad, torch.optim.RMSprop)

SCALING_RULES: dict[str, type[ScalingRule]] = {
    "adascale": AdaScale,
    "sqrt": SqrtScale,
    "linear": LinearScale,
}


def default_scaling_rule(optimizer: torch.optim.Optimizer) -> ScalingRule:
    """Square-root for Adam-like (adaptive) optimizers, AdaScale otherwise (SGD).

    >>> import torch
    >>> default_scaling_rule(torch.optim.Adam([torch.zeros(1, requires_grad=True)]))
    SqrtScale()
    """
    return SqrtScale() if isinstance(optimizer, _ADAM_LIKE) else AdaScale()


def scaling_rule_by_name(name: str) -> ScalingRule:
    """A rule from its name: ``adascale``, ``sqrt`` or ``linear``."""
    try:
        return SCALING_RULES[name]()
    except KeyError:
        raise UnknownPluginError("scaling rule", name, SCALING_RULES) from None
