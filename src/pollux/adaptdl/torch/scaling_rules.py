"""``adaptdl.torch.scaling_rules``: how the learning rate follows the batch size.

AdaptDL's rule classes, each backed by the agent's rule
(:mod:`pollux.torch.scaling_rules`): ``scale`` is the total batch size over the initial
one, and the agent applies the factor at every optimizer step.

==============  ==========================================================
AdaScale        factor = gain (the step's statistical gain); SGD's default
AdamScale       factor = sqrt(gain) with Adam-preconditioned gradient noise;
                the default for Adam and AdamW
LinearScale     factor = scale
SqrtScale       factor = sqrt(scale)
LEGWScale       sqrt(scale), warmed up over ``base_warmup_epochs * scale`` epochs
==============  ==========================================================

A rule of your own subclasses :class:`ScalingRuleBase` and defines
``scale_lr(scale)``; ``self.adp`` is the model (``self.adp.gns`` its noise estimates).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.torch import scaling_rules as native
from pollux.torch.adam_scale import AdamGainScale

__all__ = ["AdaScale", "AdamScale", "LEGWScale", "LinearScale", "ScalingRuleBase",
           "SqrtScale"]


class ScalingRuleBase:
    """Base of AdaptDL's scaling rules: ``scale_lr(scale)`` gives the factor."""

    def __init__(self) -> None:
        self.adp: Any = None
        self._optimizer: Any = None

    def scale_lr(self, scale: float) -> Any:
        """The learning-rate factor (or one per parameter group, averaged) at ``scale``."""
        raise NotImplementedError

    def initialize(self, adp: Any, optimizer: Any, patch_optimizer: bool = False) -> None:
        """Attach to the model (done by ``AdaptiveDataParallel``); the agent patches the
        optimizer itself, so ``patch_optimizer`` is ignored."""
        self.adp = adp
        self._optimizer = optimizer

    def native(self) -> native.ScalingRule:
        """The agent's rule that applies this one."""
        return _ScaleLr(self)


class _ScaleLr(native.ScalingRule):
    """A user's ``scale_lr`` as an agent rule."""

    def __init__(self, rule: ScalingRuleBase) -> None:
        self.rule = rule

    def lr_factor(self, scale: float, gain: float, progress: float) -> float:
        return float(np.average(self.rule.scale_lr(scale)))


class AdaScale(ScalingRuleBase):
    """AdaScale (Johnson et al., 2020): the factor is the step's gain."""

    def scale_lr(self, scale: float) -> float:
        return float(self.adp.gns.gain(scale)) if self.adp is not None else 1.0

    def native(self) -> native.ScalingRule:
        return native.AdaScale()


class AdamScale(AdaScale):
    """AdaScale for Adam, AdamW and RMSprop: the square root of the gain, with the
    gradient noise measured on Adam-preconditioned gradients
    (:mod:`pollux.torch.adam_scale`)."""

    def scale_lr(self, scale: float, power: float = 0.5) -> float:
        return float(np.power(super().scale_lr(scale), power))

    def native(self) -> native.ScalingRule:
        return AdamGainScale()


class LinearScale(ScalingRuleBase):
    """The factor is the batch scale (Goyal et al., 2017)."""

    def scale_lr(self, scale: float) -> float:
        return float(scale)

    def native(self) -> native.ScalingRule:
        return native.LinearScale()


class SqrtScale(ScalingRuleBase):
    """The factor is the square root of the batch scale."""

    def scale_lr(self, scale: float) -> float:
        return math.sqrt(scale)

    def native(self) -> native.ScalingRule:
        return native.SqrtScale()


class LEGWScale(ScalingRuleBase):
    """LEGW (You et al., 2019): ``sqrt(scale)``, ramped up linearly over the first
    ``base_warmup_epochs * scale`` epochs of progress (``data_size`` samples each)."""

    def __init__(self, base_warmup_epochs: float, data_size: int) -> None:
        super().__init__()
        if not base_warmup_epochs > 0 or not data_size > 0:
            raise ValueError(f"invalid LEGWScale(base_warmup_epochs={base_warmup_epochs!r}, "
                             f"data_size={data_size!r}): both must be > 0")
        self._base_warmup_epochs = float(base_warmup_epochs)
        self._data_size = int(data_size)

    def scale_lr(self, scale: float) -> float:
        progress = 0.0 if self.adp is None else float(self.adp.gns.get_progress())
        return _LegwRule(self).ramp(scale, progress)

    def native(self) -> native.ScalingRule:
        return _LegwRule(self)


class _LegwRule(native.ScalingRule):
    def __init__(self, rule: LEGWScale) -> None:
        self.rule = rule

    def ramp(self, scale: float, progress: float) -> float:
        loader = DEFAULT_JOB.current_loader
        batch_size = loader.batch_size if loader is not None else 1
        total_steps = (self.rule._base_warmup_epochs * scale * self.rule._data_size
                       / batch_size)
        factor = math.sqrt(scale)
        return factor * min(progress / total_steps, 1.0) if total_steps > 0 else factor

    def lr_factor(self, scale: float, gain: float, progress: float) -> float:
        return self.ramp(scale, progress)


def native_rule(rule: Any, optimizer: Any) -> native.ScalingRule:
    """The agent's rule for AdaptDL's ``scaling_rule`` argument: an AdaptDL-shaped rule,
    an agent rule as it is, or AdaptDL's default (AdamScale for Adam and AdamW, else
    AdaScale)."""
    import torch

    if rule is None:
        adam = isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))
        rule = AdamScale() if adam else AdaScale()
    if isinstance(rule, native.ScalingRule):
        return rule
    if isinstance(rule, ScalingRuleBase):
        return rule.native()
    raise ValueError(f"invalid scaling_rule={rule!r}: give an adaptdl.torch.scaling_rules "
                     "rule (AdaScale(), AdamScale(), ...) or a pollux.torch.ScalingRule")
