"""Gradient noise scale from the gradients a data-parallel step computes anyway.

Let ``G`` be the true gradient and ``Sigma`` the covariance of one sample's gradient. A
gradient averaged over ``b`` samples has ``E|g_b|^2 = |G|^2 + tr(Sigma) / b``. Each step
gives two such norms at two batch sizes, at no extra compute:

* several replicas: the mean over replicas of each replica's own (pre-averaging)
  squared norm, at ``b_small = b * micro_steps``, and the norm of the averaged gradient
  at ``b_big = K * b_small``;
* one replica with accumulation: the first micro-batch's norm at ``b_small = b`` and the
  accumulated gradient's at ``b_big = b * micro_steps``.

Solving the two equations gives unbiased estimates of ``tr(Sigma)`` and ``|G|^2``;
exponential moving averages (bias-corrected, as in Adam) smooth each separately and
their ratio is the noise scale ``phi = tr(Sigma) / |G|^2``. In the terms of
:class:`pollux.models.GradientStats`: ``sqr = |G|^2``, ``var = tr(Sigma) / M0``.

The averages live on the gradients' device and are updated without any host
synchronization; non-finite estimates (AMP overflow) are skipped on the device too.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import torch

from pollux.errors import ConfigError
from pollux.models import GradientStats

Norm = TypeVar("Norm", float, torch.Tensor)


def two_batch_estimates(small_sqr: Norm, small_bsz: float, big_sqr: Norm,
                        big_bsz: float) -> tuple[Norm, Norm]:
    """Unbiased ``(|G|^2, tr(Sigma))`` from mean squared norms at two batch sizes
    (floats or tensors alike)."""
    if not 0 < small_bsz < big_bsz:
        raise ConfigError("small_bsz", small_bsz, f"must lie in (0, big_bsz={big_bsz})")
    trace = (small_sqr - big_sqr) / (1.0 / small_bsz - 1.0 / big_bsz)
    sqr = big_sqr - trace / big_bsz
    return sqr, trace


class GradientNoiseEstimator:
    """Bias-corrected moving averages of ``|G|^2`` and ``tr(Sigma)``, on the device.

    ``smoothing`` is the averages' decay per optimizer step at the initial batch size;
    a step at ``scale`` times that batch decays by ``smoothing ** scale`` (it carries
    ``scale`` times the information).

    >>> noise = GradientNoiseEstimator(smoothing=0.9)
    >>> noise.update(small_sqr=3.0, small_bsz=8, big_sqr=1.5, big_bsz=32)
    >>> round(noise.noise_scale(), 3)  # tr(Sigma) / |G|^2 in samples
    16.0
    """

    def __init__(self, *, smoothing: float = 0.999,
                 device: torch.device | str = "cpu") -> None:
        if not 0.0 < smoothing < 1.0:
            raise ConfigError("noise_smoothing", smoothing, "must lie in (0, 1)")
        self.smoothing = float(smoothing)
        self.device = torch.device(device)
        # [ema of |G|^2, ema of tr(Sigma), total weight, number of accepted updates]:
        # a tensor on an accelerator (no host sync), plain floats on the CPU (where reading
        # a value is free and a handful of tiny tensor operations is not).
        self._state = torch.zeros(4, dtype=torch.float64, device=self.device)
        self._host: list[float] | None = [0.0] * 4 if self.device.type == "cpu" else None

    def update(self, small_sqr: torch.Tensor | float, small_bsz: float,
               big_sqr: torch.Tensor | float, big_bsz: float, scale: float = 1.0) -> None:
        """Fold one step's two squared norms in; a non-finite estimate is skipped.

        ``scale`` is the step's total batch over the initial batch size.
        """
        beta = self.smoothing ** max(float(scale), 1e-6)
        if self._host is not None:
            sqr, trace = two_batch_estimates(float(small_sqr), small_bsz, float(big_sqr),
                                             big_bsz)
            if not (math.isfinite(sqr) and math.isfinite(trace)):
                return
            old = self._host
            self._host = [beta * old[0] + (1.0 - beta) * sqr,
                          beta * old[1] + (1.0 - beta) * trace,
                          beta * old[2] + (1.0 - beta), old[3] + 1.0]
            return
        small = torch.as_tensor(small_sqr, dtype=torch.float64, device=self.device)
        big = torch.as_tensor(big_sqr, dtype=torch.float64, device=self.device)
        sqr_d, trace_d = two_batch_estimates(small, small_bsz, big, big_bsz)
        ok = torch.isfinite(sqr_d) & torch.isfinite(trace_d)
        new = torch.stack([
            beta * self._state[0] + (1.0 - beta) * torch.nan_to_num(sqr_d),
            beta * self._state[1] + (1.0 - beta) * torch.nan_to_num(trace_d),
            beta * self._state[2] + (1.0 - beta),
            self._state[3] + 1.0,
        ])
        self._state = torch.where(ok, new, self._state)

    def raw(self) -> torch.Tensor:
        """The state as a tensor (on the device: copy it to the host asynchronously)."""
        if self._host is not None:
            return torch.tensor(self._host, dtype=torch.float64)
        return self._state

    @staticmethod
    def stats_from_raw(values: list[float], init_batch_size: int) -> GradientStats | None:
        """``GradientStats`` at the initial batch from a host copy of :meth:`raw`."""
        ema_sqr, ema_trace, weight, _ = values
        if not weight > 0 or not (math.isfinite(ema_sqr) and math.isfinite(ema_trace)):
            return None
        sqr = max(ema_sqr / weight, 0.0)
        trace = max(ema_trace / weight, 0.0)
        return GradientStats(sqr=sqr, var=trace / init_batch_size)

    @property
    def num_updates(self) -> int:
        """Accepted updates so far (reads the device: a host sync on GPU)."""
        return int(self.raw()[3].item())

    def stats(self, init_batch_size: int) -> GradientStats | None:
        """Current statistics at ``init_batch_size`` (reads the device: a sync on GPU)."""
        return self.stats_from_raw(self.raw().tolist(), init_batch_size)

    def noise_scale(self) -> float | None:
        """``tr(Sigma) / |G|^2`` in samples, or None before any estimate."""
        stats = self.stats(1)
        return None if stats is None else stats.noise_scale(1)

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.raw().detach().cpu().tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # tr(Sigma) and |G|^2 do not depend on the initial batch size: always valid.
        values = [float(v) for v in state["state"]]
        if self._host is not None:
            self._host = values
        else:
            self._state = torch.tensor(values, dtype=torch.float64, device=self.device)
