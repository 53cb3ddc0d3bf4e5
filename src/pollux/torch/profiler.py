"""Step-time profile per (nodes, replicas, atomic batch) and the background refit.

The data loader marks the time at each micro-batch it hands out; the interval to the
next mark is that micro-step's time, data loading included. Accumulation micro-steps
give the compute time ``T_c``; the micro-step that synchronizes gives the optimizer step
time ``T_o``, and its compute part (up to the end of the backward pass, marked by the
gradient hook) a second reading of ``T_c`` when there is no accumulation.

On CUDA the marks are CUDA events read lazily (``query()`` before ``elapsed_time``), so
profiling adds no host synchronization; on CPU they are ``perf_counter`` readings.
The throughput model is refitted in a daemon thread, never inside a training step, each
refit warm-started from the previous one. A job keeps one profile per GPU type it has run
on (:class:`ProfilesByType`), named by :func:`device_gpu_type`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pollux.models import ThroughputObservations, ThroughputParams, fit_throughput_params
from pollux.models.hints import check_gpu_type
from pollux.models.typed import TypeProfile

logger = logging.getLogger(__name__)

ProfileKey = tuple[int, int, int]
"""(num_nodes, num_replicas, local_bsz)."""
Mark = Any
"""A ``perf_counter`` float on CPU, a recorded ``torch.cuda.Event`` on CUDA."""


class StepClock:
    """Time marks that never block: host time on CPU, CUDA events on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Mark:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def elapsed_s(self, start: Mark, end: Mark) -> float | None:
        """Seconds from ``start`` to ``end``; None while a CUDA event is pending."""
        if self.cuda:
            if not end.query():
                return None
            return float(start.elapsed_time(end)) / 1000.0
        return float(end - start)


@dataclass(frozen=True)
class MicroStepTiming:
    """Marks of one micro-step, resolved later."""

    key: ProfileKey
    optimizer_step: bool
    start: Mark
    end: Mark
    compute_end: Mark | None = None


class _Totals:
    """Running sums for one profile key: [n_accum, s_accum, n_opt, s_opt, n_cmp, s_cmp]."""

    __slots__ = ("values",)

    def __init__(self, values: list[float] | None = None) -> None:
        self.values = list(values) if values is not None else [0.0] * 6

    def add(self, slot: int, seconds: float) -> None:
        self.values[2 * slot] += 1.0
        self.values[2 * slot + 1] += seconds

    def mean(self, slot: int) -> float | None:
        count = self.values[2 * slot]
        return self.values[2 * slot + 1] / count if count > 0 else None


ACCUM, OPTIM, COMPUTE = 0, 1, 2


class StepProfiler:
    """Accumulates micro-step times and keeps a recent throughput fit."""

    def __init__(self, device: torch.device, *, refit_interval_s: float = 5.0) -> None:
        self.clock = StepClock(device)
        self.refit_interval_s = refit_interval_s
        self._totals: dict[ProfileKey, _Totals] = {}
        self._pending: list[MicroStepTiming] = []
        self._lock = threading.Lock()
        self._fit_thread: threading.Thread | None = None
        self._params: ThroughputParams | None = None
        self._fitted: dict[ProfileKey, int] = {}
        """Optimizer steps per configuration in the data of :attr:`params`."""
        self._observed_since_fit = 0
        self._last_fit_time = -float("inf")
        self.max_profiled_replicas = 0
        self._pinned = False

    def record(self, timing: MicroStepTiming) -> None:
        """Queue a micro-step's marks (resolved by :meth:`collect`)."""
        self._pending.append(timing)

    def collect(self) -> int:
        """Fold every resolved pending timing into the totals; returns how many."""
        done = 0
        still: list[MicroStepTiming] = []
        for timing in self._pending:
            total = self.clock.elapsed_s(timing.start, timing.end)
            if total is None:
                still.append(timing)
                continue
            compute = (None if timing.compute_end is None
                       else self.clock.elapsed_s(timing.start, timing.compute_end))
            if not (np.isfinite(total) and total > 0):
                continue
            totals = self._totals.setdefault(timing.key, _Totals())
            if timing.optimizer_step:
                totals.add(OPTIM, total)
                if compute is not None and 0 < compute <= total:
                    totals.add(COMPUTE, compute)
            else:
                totals.add(ACCUM, total)
            self.max_profiled_replicas = max(self.max_profiled_replicas, timing.key[1])
            done += 1
        self._pending = still
        self._observed_since_fit += done
        return done

    def observations(self) -> ThroughputObservations | None:
        """Mean compute and step time per key (keys with an optimizer step only)."""
        rows = []
        for (nodes, replicas, bsz), totals in sorted(self._totals.items()):
            step = totals.mean(OPTIM)
            compute = totals.mean(ACCUM)
            if compute is None:
                compute = totals.mean(COMPUTE)
            if step is None or compute is None:
                continue
            rows.append((nodes, replicas, bsz, min(compute, step), step))
        if not rows:
            return None
        return ThroughputObservations.from_records(rows)

    @property
    def params(self) -> ThroughputParams | None:
        """The most recent fit (None before the first one finished)."""
        with self._lock:
            return self._params

    def pin(self, params: ThroughputParams) -> None:
        """Use ``params`` as the throughput model from now on, never refitted, as if
        every configuration had been measured: the batch size then follows the gradient
        statistics alone, the same in every run (tests; a job whose step times are
        known). Step times are still collected (and checkpointed)."""
        with self._lock:
            self._params = params
            self._pinned = True

    def fit_covers(self, key: ProfileKey, min_steps: int = 1) -> bool:
        """Whether the current fit had at least ``min_steps`` optimizer steps of this
        configuration among its data (not only extrapolated to it from others)."""
        with self._lock:
            if self._pinned:
                return True
            return self._params is not None and self._fitted.get(key, 0) >= min_steps

    def steps_at(self, key: ProfileKey) -> int:
        """Optimizer steps of this configuration collected so far."""
        totals = self._totals.get(key)
        return 0 if totals is None else int(totals.values[2 * OPTIM])

    def _step_counts(self) -> dict[ProfileKey, int]:
        return {key: self.steps_at(key) for key in self._totals}

    def maybe_refit(self, *, force: bool = False) -> bool:
        """Start a background refit if there is new data and none is running; ``force``:
        before the refit interval, but at most one a second (a fit that keeps failing
        must not be retried at every agreement point)."""
        if self._pinned or (self._fit_thread is not None and self._fit_thread.is_alive()):
            return False
        now = time.monotonic()
        wait_s = min(1.0, self.refit_interval_s) if force else self.refit_interval_s
        if (not force and self._observed_since_fit == 0) or now - self._last_fit_time < wait_s:
            return False
        observations = self.observations()
        if observations is None:
            return False
        self._observed_since_fit = 0
        self._last_fit_time = now
        self._fit_thread = threading.Thread(
            target=self._fit, args=(observations, self.params, self._step_counts()),
            name="pollux-refit", daemon=True)
        self._fit_thread.start()
        return True

    def wait_for_fit(self, timeout_s: float | None = None) -> None:
        if self._fit_thread is not None:
            self._fit_thread.join(timeout_s)

    def _fit(self, observations: ThroughputObservations,
             previous: ThroughputParams | None = None,
             steps: dict[ProfileKey, int] | None = None) -> None:
        try:  # warm-started from the previous fit: one optimizer start instead of two
            params = fit_throughput_params(observations, initial_params=previous)
        except Exception:  # a fit failure must never stop training
            logger.exception("throughput refit failed")
            return
        with self._lock:
            self._params = params
            self._fitted = steps or {}
        logger.debug("throughput refit on %d configurations: %s", len(observations), params)

    def state_dict(self) -> dict[str, Any]:
        params = self.params
        return {
            "totals": {",".join(map(str, key)): totals.values
                       for key, totals in self._totals.items()},
            "max_profiled_replicas": self.max_profiled_replicas,
            "params": None if params is None else params.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._totals = {}
        for key, values in state.get("totals", {}).items():
            nodes, replicas, bsz = (int(v) for v in key.split(","))
            self._totals[(nodes, replicas, bsz)] = _Totals(values)
        self.max_profiled_replicas = int(state.get("max_profiled_replicas", 0))
        params = state.get("params")
        with self._lock:
            self._params = None if params is None else ThroughputParams.from_dict(params)
            self._fitted = self._step_counts()  # (the restored fit's data)
        self._observed_since_fit = 0


CPU_GPU_TYPE = "cpu"
"""The type an agent on a CPU names itself when nobody gave it a name."""


def device_gpu_type(device: torch.device, launched: str | None = None,
                    configured: str | None = None) -> str:
    """The name the job's profile on ``device`` is kept under: the scheduler's name for
    the node's type (``POLLUX_GPU_TYPE``, ``launched``) so that the policy finds it, else
    the script's (``AgentConfig.gpu_type``), else the CUDA device's name
    (``torch.cuda.get_device_name``), else ``"cpu"``."""
    if launched:
        name = launched
    elif configured:
        name = configured
    elif device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = CPU_GPU_TYPE
    return check_gpu_type("gpu_type", name)


class ProfilesByType:
    """The job's step-time profile on every GPU type it has run on: the live
    :class:`StepProfiler` of this launch's type, and what earlier launches measured on
    other types, kept as they were. Profiles of different types are never pooled: each
    type's model is fitted to what ran on that type only (a job moved from a fast type to
    a slow one would otherwise fit one model to both).

    Checkpointed under ``pollux/profile``; a checkpoint from before GPU types (one
    profile) is taken as this type's."""

    def __init__(self, gpu_type: str, live: StepProfiler) -> None:
        self.gpu_type = gpu_type
        self.live = live
        self._others: dict[str, dict[str, Any]] = {}
        """Type -> the saved state of its profiler (other types than this launch's)."""

    def type_profiles(self) -> dict[str, TypeProfile]:
        """Type -> its fitted model and the most replicas profiled there."""
        profiles = {}
        for gpu_type, state in sorted(self._others.items()):
            params = state.get("params")
            profiles[gpu_type] = TypeProfile(
                None if params is None else ThroughputParams.from_dict(params),
                int(state.get("max_profiled_replicas", 0)))
        profiles[self.gpu_type] = TypeProfile(self.live.params, self.live.max_profiled_replicas)
        return profiles

    def state_dict(self) -> dict[str, Any]:
        return {"gpu_type": self.gpu_type,
                "by_type": {**self._others, self.gpu_type: self.live.state_dict()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "by_type" not in state:  # saved before GPU types: one profile, taken as ours
            self.live.load_state_dict(state)
            return
        by_type = dict(state["by_type"])
        mine = by_type.pop(self.gpu_type, None)
        self._others = {str(gpu_type): dict(saved) for gpu_type, saved in by_type.items()}
        if mine is not None:
            self.live.load_state_dict(mine)
