"""The built-in catalog: compact parametric models of the six applications of the paper.

Each application is a handful of figures fitted to the published measurements
(``pollux/data/catalog.json``, regenerated from a trace directory by
:mod:`pollux.sim.catalog_fit`), so the simulator runs with no data at hand:

* throughput: :class:`~pollux.models.ThroughputParams` (7 numbers) for the step and sync
  time at any (nodes, replicas, atomic batch);
* epochs: every epoch is worth the same statistical progress (``progress_per_epoch``,
  optimizer steps at the initial batch size, i.e. dataset size / initial batch);
* gradient statistics: the noise ratio ``var / sqr`` (at the initial batch scale; only the
  ratio matters to efficiency) as a piecewise-linear function of the epoch in log space,
  one row of knots per measured batch size, interpolated in log batch size between rows;
* iterations: derived from the same model, ``progress_per_epoch / gain`` per epoch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from pollux.errors import ConfigError
from pollux.models import ThroughputParams, scaled_gain
from pollux.models.throughput import compute_time, optimizer_step_time
from pollux.sim.applications import PINNED_CONFIGS, Application, ApplicationSpec
from pollux.sim.placement import Placement

CATALOG_RESOURCE = "catalog.json"
"""File name of the built-in catalog in the package data folder ``pollux/data``."""


@dataclass(frozen=True)
class NoiseModel:
    """log(var / sqr) on a grid of (measured batch size) x (epoch knot)."""

    batch_sizes: tuple[int, ...]
    knot_epochs: tuple[float, ...]
    log_ratio: tuple[tuple[float, ...], ...]
    """``log_ratio[i][j]``: log noise ratio at ``batch_sizes[i]`` and ``knot_epochs[j]``."""

    def ratio(self, batch_size: ArrayLike, epoch: float) -> np.ndarray:
        """Noise ratio var / sqr during ``epoch`` at total ``batch_size`` (arrays too)."""
        rows = np.array([np.interp(epoch, self.knot_epochs, row) for row in self.log_ratio])
        log_b = np.log(np.asarray(self.batch_sizes, dtype=np.float64))
        return np.exp(np.interp(np.log(np.asarray(batch_size, dtype=np.float64)), log_b, rows))


@dataclass(frozen=True)
class AppModel:
    """Everything the catalog stores for one application."""

    spec: ApplicationSpec
    throughput: ThroughputParams
    progress_per_epoch: float
    noise: NoiseModel

    def to_dict(self) -> dict[str, Any]:
        s = self.spec
        return {
            "init_batch_size": s.init_batch_size, "max_batch_size": s.max_batch_size,
            "min_local_bsz": s.min_local_bsz, "max_local_bsz": s.max_local_bsz,
            "max_epochs": s.max_epochs,
            "throughput": self.throughput.to_dict(),
            "progress_per_epoch": self.progress_per_epoch,
            "noise": {"batch_sizes": list(self.noise.batch_sizes),
                      "knot_epochs": list(self.noise.knot_epochs),
                      "log_ratio": [list(row) for row in self.noise.log_ratio]},
        }

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> AppModel:
        try:
            pinned = PINNED_CONFIGS.get(name)
            spec = ApplicationSpec(
                name=name,
                init_batch_size=int(data["init_batch_size"]),
                max_batch_size=int(data["max_batch_size"]),
                min_local_bsz=int(data["min_local_bsz"]),
                max_local_bsz=int(data["max_local_bsz"]),
                max_epochs=int(data["max_epochs"]),
                pinned_replicas=None if pinned is None else pinned[0],
                pinned_batch_size=None if pinned is None else pinned[1])
            noise = data["noise"]
            return cls(
                spec=spec,
                throughput=ThroughputParams.from_dict(dict(data["throughput"])),
                progress_per_epoch=float(data["progress_per_epoch"]),
                noise=NoiseModel(tuple(int(b) for b in noise["batch_sizes"]),
                                 tuple(float(e) for e in noise["knot_epochs"]),
                                 tuple(tuple(float(v) for v in row)
                                       for row in noise["log_ratio"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"catalog[{name!r}]", type(exc).__name__,
                              f"malformed entry ({exc}); regenerate it with "
                              "python -m pollux.sim.catalog_fit") from exc


class ParametricApplication(Application):
    """An application simulated from its :class:`AppModel`."""

    def __init__(self, model: AppModel) -> None:
        super().__init__(model.spec)
        self.model = model
        self._iterations: dict[float, np.ndarray] = {}

    def _measure(self, placement: Placement, local_bsz: float) -> tuple[float, float]:
        step, sync = self.step_sync_times(placement, np.array([local_bsz], dtype=np.float64))
        return float(step[0]), float(sync[0])

    def step_sync_times(self, placement: Placement, local_bsz: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
        params = self.model.throughput
        num_nodes, num_replicas = len(placement), sum(placement)
        bsz = np.asarray(local_bsz, dtype=np.float64)
        step = np.asarray(optimizer_step_time(params, num_nodes, num_replicas, bsz),
                          dtype=np.float64)
        return step, np.maximum(step - compute_time(params, bsz), 0.0)

    def grad_stats_many(self, batch_size: np.ndarray, epoch: int
                        ) -> tuple[np.ndarray, np.ndarray]:
        ratio = self.model.noise.ratio(batch_size, epoch)
        return np.ones_like(ratio), ratio

    def _grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        return 1.0, float(self.model.noise.ratio(batch_size, epoch))

    def epoch_progress(self, epoch: int) -> float:
        return self.model.progress_per_epoch * max(epoch, 0)

    def iterations(self, batch_size: float, epoch: int) -> float:
        cumulative = self._iterations.get(float(batch_size))
        if cumulative is None:
            scale = batch_size / self.spec.init_batch_size
            steps = []
            for e in range(self.spec.max_epochs):
                sqr, var = self.grad_stats(batch_size, e)
                gain = float(scaled_gain(sqr, var, scale))
                steps.append(self.model.progress_per_epoch / gain)
            cumulative = np.cumsum(steps)
            self._iterations[float(batch_size)] = cumulative
        return float(cumulative[min(max(epoch, 0), len(cumulative) - 1)])


def read_catalog(data: Mapping[str, Any]) -> dict[str, AppModel]:
    """Parse a catalog document ``{"applications": {name: {...}}}``."""
    apps = data.get("applications") if isinstance(data, Mapping) else None
    if not isinstance(apps, Mapping) or not apps:
        raise ConfigError("catalog", type(data).__name__,
                          'expected {"applications": {name: {...}}}')
    return {name: AppModel.from_dict(name, entry) for name, entry in apps.items()}


def load_builtin_applications() -> dict[str, Application]:
    """The six built-in applications, from the catalog shipped with the package."""
    text = resources.files("pollux").joinpath("data").joinpath(CATALOG_RESOURCE).read_text()
    return {name: ParametricApplication(model)
            for name, model in read_catalog(json.loads(text)).items()}
