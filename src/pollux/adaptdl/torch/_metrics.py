"""AdaptDL's private ``adaptdl.torch._metrics``, as far as its DCGAN example reads it:
``_metrics_state().grad_params`` (the driving model's ``(|G|^2, variance)``) and
``.progress``. Prefer ``model.gns`` or :func:`pollux.torch.current_dataloader`."""

from __future__ import annotations

from dataclasses import dataclass

from pollux.adaptdl.default_job import DEFAULT_JOB


@dataclass(frozen=True)
class MetricsState:
    grad_params: tuple[float, float]
    """``(|G|^2, tr(Sigma) / M0)`` of the model that drives the batch size (zeros
    before the first estimate)."""
    progress: float
    """That model's statistical progress."""


def _metrics_state() -> MetricsState:
    model = DEFAULT_JOB.require("_metrics_state").model
    stats = None if model is None else model.grad_stats
    return MetricsState(grad_params=(0.0, 0.0) if stats is None else (stats.sqr, stats.var),
                        progress=0.0 if model is None else model.progress)
