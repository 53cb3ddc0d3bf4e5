"""The optimizer's and a ``GradScaler``'s methods as :class:`~pollux.torch.
AdaptiveDataParallel` patches them: no-ops during accumulation micro-steps (so that a loop
that steps after every batch accumulates correctly), and the optimizer's ``step`` routed
through the model (learning-rate scaling, gradient statistics, progress)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, Protocol

import torch

from pollux.torch.gradient_norms import MicroStep


class PatchingModel(Protocol):
    """What the patches need of the model."""

    _step: MicroStep
    _bypass_patches: bool

    @property
    def accumulating(self) -> bool: ...

    def _optimizer_step(self, original: Callable[..., Any], *args: Any, **kwargs: Any
                        ) -> Any: ...


def patch_optimizer(model: PatchingModel, optimizer: torch.optim.Optimizer) -> None:
    """``step`` through the model; ``zero_grad`` keeps accumulated gradients."""
    original_step = optimizer.step
    original_zero_grad = optimizer.zero_grad

    def step(opt: Any, *args: Any, **kwargs: Any) -> Any:
        return model._optimizer_step(original_step, *args, **kwargs)

    def zero_grad(opt: Any, *args: Any, **kwargs: Any) -> Any:
        if model._step.grads_pending and not model._bypass_patches:  # keep accumulated
            return None
        return original_zero_grad(*args, **kwargs)

    if getattr(original_step, "_wrapped_by_lr_sched", False):
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
    optimizer.zero_grad = types.MethodType(zero_grad, optimizer)  # type: ignore[method-assign]


def patch_grad_scaler(model: PatchingModel, scaler: Any) -> None:
    """``step``, ``update`` and ``unscale_`` skip accumulation micro-steps."""
    original_step, original_update = scaler.step, scaler.update
    original_unscale = scaler.unscale_

    def step(self_: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if model.accumulating:
            return None
        try:
            return original_step(optimizer, *args, **kwargs)
        finally:
            model._step.grads_pending = False  # even when the step was skipped (overflow)

    def update(self_: Any, *args: Any, **kwargs: Any) -> Any:
        return None if model.accumulating else original_update(*args, **kwargs)

    def unscale_(self_: Any, optimizer: Any) -> Any:
        return None if model.accumulating else original_unscale(optimizer)

    scaler.step = types.MethodType(step, scaler)
    scaler.update = types.MethodType(update, scaler)
    scaler.unscale_ = types.MethodType(unscale_, scaler)
