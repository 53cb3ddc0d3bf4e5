"""AdamScale: AdaScale for Adam-like optimizers (AdaptDL's rule, the Pollux paper's
choice for Adam).

Adam moves each coordinate by its gradient divided by ``sqrt(v_hat) + eps`` (its
running RMS), so the gradient noise that matters for it is that of the *preconditioned*
gradient ``g / (sqrt(v_hat) + eps)``. With this rule the model's noise estimator
measures the squared norms of preconditioned gradients (:class:`AdamPreconditioner`),
and the learning-rate factor is the square root of the resulting gain.

>>> AdamGainScale().lr_factor(scale=8.0, gain=4.0, progress=0.0)
2.0
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from pollux.errors import ConfigError
from pollux.torch.scaling_rules import ScalingRule, default_scaling_rule


@dataclass(frozen=True)
class AdamGainScale(ScalingRule):
    """Learning-rate factor ``gain ** power`` (0.5: AdamScale), with the noise measured on
    Adam-preconditioned gradients (the model sets that up when given this rule)."""

    power: float = 0.5

    def __post_init__(self) -> None:
        if not (math.isfinite(self.power) and self.power > 0):
            raise ConfigError("power", self.power, "must be a number > 0 (0.5: AdamScale)")

    def lr_factor(self, scale: float, gain: float, progress: float) -> float:
        return float(gain) ** self.power


class AdamPreconditioner:
    """Squared norms of gradients divided by Adam's ``sqrt(v_hat) + eps``.

    Reads ``exp_avg_sq`` and ``step`` from the optimizer's state and ``betas``/``eps`` from its
    parameter group. Works with any optimizer keeping Adam's state names (Adam, AdamW).
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._group_of: dict[int, tuple[float, float]] = {}
        for group in optimizer.param_groups:
            beta2 = float(group.get("betas", (0.9, 0.999))[1])
            eps = float(group.get("eps", 1e-8))
            for param in group["params"]:
                self._group_of[id(param)] = (beta2, eps)

    def divisor(self, param: torch.Tensor) -> torch.Tensor | None:
        """``sqrt(v_hat) + eps`` of ``param`` (None before its first Adam step)."""
        state = self.optimizer.state.get(param)
        if not state or "exp_avg_sq" not in state or id(param) not in self._group_of:
            return None
        beta2, eps = self._group_of[id(param)]
        step = float(state.get("step", 1))
        correction = 1.0 - beta2 ** max(step, 1.0)
        return state["exp_avg_sq"].sqrt().div(math.sqrt(correction)).add(eps)

    def squared_norm(self, params: Iterable[torch.Tensor],
                     flat: torch.Tensor | None = None) -> torch.Tensor:
        """Sum of squared preconditioned gradients of ``params``: their ``.grad``, or the
        consecutive slices of ``flat`` (a DDP bucket laid out in ``params`` order). NaN
        before Adam's first step (the noise estimator skips non-finite measurements).

        One fused pass per operation over all the tensors (``torch._foreach_*``), in
        float32 (float64 tensors stay float64), with one temporary the size of the
        gradients; the per-tensor norms are summed in float64."""
        grads: list[torch.Tensor] = []
        second_moments: list[torch.Tensor] = []
        corrections: list[float] = []
        epsilons: list[float] = []
        offset = 0
        device: torch.device | None = None
        for param in params:
            if flat is not None:
                grad = flat[offset:offset + param.numel()].view_as(param)
                offset += param.numel()
            elif param.grad is None:
                continue
            else:
                grad = param.grad
            device = grad.device
            state = self.optimizer.state.get(param)
            if not state or "exp_avg_sq" not in state or id(param) not in self._group_of:
                # before Adam's first step: no metric yet, no estimate
                return torch.full((), math.nan, dtype=torch.float64, device=grad.device)
            beta2, eps = self._group_of[id(param)]
            step = float(state.get("step", 1))
            corrections.append(1.0 / math.sqrt(1.0 - beta2 ** max(step, 1.0)))
            epsilons.append(eps)
            grads.append(_exact(grad.detach()))
            second_moments.append(_exact(state["exp_avg_sq"]))
        if not grads:
            return torch.zeros((), dtype=torch.float64, device=device)
        # g / (sqrt(v) / sqrt(1 - beta2^t) + eps), in place in one temporary
        quotients = torch._foreach_sqrt(second_moments)
        torch._foreach_mul_(quotients, corrections)
        torch._foreach_add_(quotients, epsilons)
        torch._foreach_reciprocal_(quotients)
        torch._foreach_mul_(quotients, grads)
        norms = torch._foreach_norm(quotients)
        return torch.stack([norm.double() for norm in norms]).square().sum()


def _exact(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32 or float64 (low-precision tensors are widened to float32)."""
    return tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()


def scaling_rule_for(optimizer: torch.optim.Optimizer) -> ScalingRule:
    """AdamScale (the noise of Adam-preconditioned gradients) for Adam and AdamW, else the
    agent's default (AdaScale for SGD, square-root for other adaptive optimizers): the rule
    the framework integrations choose when the user names none."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return AdamGainScale()
    return default_scaling_rule(optimizer)
