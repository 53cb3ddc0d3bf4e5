"""Oracle knowledge the simulator can hand out: true step times and remaining steps.

Optimus+Oracle knows each job's true throughput and how many iterations it has left; the
simulator hands that knowledge to the policy as :attr:`JobInfo.remaining_time_fn`,
``remaining_s(num_nodes, num_replicas)``, so the policy itself stays a pure function of
its snapshot. :func:`true_throughput_params` is the step-time model a job would fit if it
had measured every configuration (for ``JobKnowledge.ORACLE`` experiments).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from pollux.models import ThroughputParams, fit_throughput_params
from pollux.models.throughput import FloatArray
from pollux.sim.applications import Application
from pollux.sim.placement import packed_placement


class StepTimeTable:
    """Seconds per optimizer step (accumulation included) of one fixed total batch size,
    by replica count, with replicas packed onto as few nodes as possible."""

    def __init__(self, app: Application, batch_size: int, gpus_per_node: int) -> None:
        self.app = app
        self.batch_size = batch_size
        self.gpus_per_node = gpus_per_node
        self._by_replicas = np.array([np.inf])

    def step_time(self, num_nodes: int, num_replicas: int) -> float:
        """Predicted step seconds on ``num_replicas`` spread over ``num_nodes`` nodes."""
        if num_replicas <= 0:
            return float("inf")
        spec = self.app.spec
        atomic, accum = spec.fixed_batch_config(self.batch_size, num_replicas)
        placement = packed_placement(num_replicas, self.gpus_per_node, num_nodes)
        step, sync = self.app.step_sync_time(placement, atomic)
        return step + (step - sync) * accum

    def packed(self, num_replicas: FloatArray) -> FloatArray:
        """Step seconds at each replica count, packed placements (memoized)."""
        top = int(num_replicas.max()) if num_replicas.size else 0
        if top >= self._by_replicas.size:
            start = self._by_replicas.size
            extra = [self.step_time(-(-k // self.gpus_per_node), k)
                     for k in range(start, top + 1)]
            self._by_replicas = np.concatenate([self._by_replicas, extra])
        return self._by_replicas[num_replicas.astype(np.int64)]


class RemainingTimeOracle:
    """``remaining_s(num_nodes, num_replicas)`` for one job at one moment (0 replicas: inf)."""

    def __init__(self, table: StepTimeTable, remaining_iterations: float) -> None:
        self.table = table
        self.remaining_iterations = remaining_iterations
        self._last: tuple[object, FloatArray] | None = None

    def __call__(self, num_nodes: ArrayLike, num_replicas: ArrayLike) -> FloatArray:
        nodes, replicas = np.broadcast_arrays(np.asarray(num_nodes, dtype=np.float64),
                                              np.asarray(num_replicas, dtype=np.float64))
        key = (nodes.shape, nodes.tobytes(), replicas.tobytes())
        if self._last is not None and self._last[0] == key:
            return self._last[1]  # a policy asks the same every round of an epoch
        times = self._times(nodes, replicas)
        times.flags.writeable = False
        self._last = (key, times)
        return times

    def _times(self, nodes: FloatArray, replicas: FloatArray) -> FloatArray:
        g = self.table.gpus_per_node
        packed = nodes == np.ceil(replicas / g)
        if np.all(packed | (replicas <= 0)):
            steps = self.table.packed(np.maximum(replicas, 0).ravel()).reshape(replicas.shape)
        else:
            steps = np.array([self.table.step_time(int(n), int(k))
                              for n, k in zip(nodes.ravel(), replicas.ravel())]
                             ).reshape(replicas.shape)
        return steps * self.remaining_iterations


def remaining_iterations(app: Application, batch_size: int, epoch: int) -> float:
    """Optimizer steps left at a fixed batch size from the start of ``epoch`` (at least 1)."""
    last = app.spec.max_epochs - 1
    if epoch >= last:
        return 1.0
    return app.iterations(batch_size, last) - app.iterations(batch_size, epoch)


def fixed_batch_max_replicas(app: Application, batch_size: int) -> int:
    """The most replicas a fixed total batch can feed: each gets at least the smallest
    atomic batch, within the application's useful replicas (at least 1)."""
    spec = app.spec
    return max(1, min(batch_size // spec.min_local_bsz, spec.max_useful_replicas))


class OracleTables:
    """The Optimus oracle of fixed-batch jobs, with one :class:`StepTimeTable` per
    (application, total batch size, GPUs per node) kept for the run."""

    def __init__(self) -> None:
        self._tables: dict[tuple[Application, int, int], StepTimeTable] = {}
        self._oracles: dict[tuple[StepTimeTable, int, float], RemainingTimeOracle] = {}

    def oracle(self, app: Application, batch_size: int, gpus_per_node: int, epoch: int,
               rate_factor: float = 1.0) -> RemainingTimeOracle:
        """Remaining seconds of a job at ``batch_size`` from the start of ``epoch``, its
        progress rate times ``rate_factor`` (a calibration)."""
        key = (app, batch_size, gpus_per_node)
        table = self._tables.get(key)
        if table is None:
            table = StepTimeTable(app, batch_size, gpus_per_node)
            self._tables[key] = table
        oracle = self._oracles.get((table, epoch, rate_factor))
        if oracle is None:  # the same all epoch long
            oracle = RemainingTimeOracle(
                table, remaining_iterations(app, batch_size, epoch) / rate_factor)
            self._oracles[(table, epoch, rate_factor)] = oracle
        return oracle


def true_throughput_params(app: Application, gpus_per_node: int,
                           max_replicas: int = 64) -> ThroughputParams:
    """The step-time model fitted to the application's true times on packed placements of
    1, 2, 4, ... up to ``max_replicas`` replicas, at five atomic batch sizes spread
    geometrically over the allowed local batch range."""
    spec = app.spec
    low, high = spec.min_local_bsz, max(spec.min_local_bsz, spec.max_local_bsz)
    sizes = np.unique(np.geomspace(low, high, 5).round().astype(int))
    rows = []
    replicas = 1
    while replicas <= max_replicas:
        placement = packed_placement(replicas, gpus_per_node)
        for bsz in sizes:
            step, sync = app.step_sync_time(placement, float(bsz))
            rows.append((float(len(placement)), float(replicas), float(bsz),
                         max(step - sync, 1e-6 * step), step))
        replicas *= 2
    return fit_throughput_params(rows)
