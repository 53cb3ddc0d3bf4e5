"""What the service remembers of its recent past, for the dashboard: one sample of every
active job and of the cluster per scheduling round, kept in memory (bounded; lost when the
server restarts), and the time each round's policy call took.

The allocation loop hands each round's policy time to :class:`RoundRecorder` (its
``on_round`` hook), which samples the store. One :class:`History` per service; nothing global.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pollux.errors import ConfigError
from pollux.models.goodput import GoodputFunction
from pollux.models.hints import JobHints
from pollux.models.speedup import SpeedupFunction
from pollux.policies.base import GPU, NodeInfo
from pollux.service.storage.records import JobRecord

DEFAULT_MAX_SAMPLES = 720
"""Samples kept per job and for the cluster: 6 hours of 30 s rounds."""
DEFAULT_MAX_JOBS = 500
"""Jobs whose samples are kept (the least recently sampled are forgotten first)."""


@dataclass(frozen=True)
class JobSample:
    """One job at one scheduling round."""

    time: float
    state: str
    replicas: int
    nodes: int
    batch_size: int | None
    """Total batch size the job reported (None before its first hints)."""
    goodput: float | None
    """Useful samples/s of the running configuration, from the job's own model."""
    efficiency: float | None
    """Statistical efficiency of ``batch_size`` (1 at the initial batch size)."""
    speedup: float | None
    """Best goodput on this allocation over best goodput on one replica (the policy's
    view of the job), from the job's own model."""


@dataclass(frozen=True)
class ClusterSample:
    """The cluster at one scheduling round."""

    time: float
    slots_used: int
    """Slots (GPUs, or CPU slots) held by a job's allocation."""
    slots_total: int
    num_active_jobs: int
    round_s: float
    """Wall time of the policy's ``optimize`` call."""


@dataclass(frozen=True)
class JobModel:
    """A job's latest hints with the goodput and speedup models built from them."""

    hints: JobHints | None
    goodput: GoodputFunction | None
    speedup: SpeedupFunction | None


def job_model(record: JobRecord) -> JobModel:
    """The models of ``record``'s hints (all None before usable hints); built once per
    hints version and kept with the hints (:class:`~pollux.service.storage.records.JobDecoder`)."""
    hints = record.hints
    if hints is None:
        return JobModel(None, None, None)
    try:
        return JobModel(hints, hints.goodput_function(), hints.speedup_function())
    except ConfigError:  # a model that refuses the hints: the job has no model here
        return JobModel(None, None, None)


def running_goodput(record: JobRecord) -> float | None:
    """Goodput (useful samples/s) of the running configuration, from the job's model;
    None without one, or when the model gives no finite value (one job's model never
    breaks a list, a sample or a scrape). ``pollux ls``, the dashboard and /metrics all
    show this one."""
    hints = record.hints
    if hints is None or not record.state.has_replicas or not record.allocation:
        return None
    try:
        goodput = hints.goodput_function()
        if goodput is None or hints.local_bsz is None:
            return None
        with np.errstate(all="ignore"):  # a zero step time: inf, refused below
            value = float(goodput.evaluate(len(set(record.allocation)),
                                           len(record.allocation), hints.local_bsz,
                                           hints.accum_steps or 0))
    except (ArithmeticError, ValueError):  # ConfigError among them
        return None
    return value if math.isfinite(value) else None


def goodput_and_efficiency(record: JobRecord, model: JobModel
                           ) -> tuple[float | None, float | None]:
    """(goodput in samples/s, statistical efficiency) of the job's running configuration."""
    hints, goodput_fn = model.hints, model.goodput
    if (hints is None or goodput_fn is None or hints.batch_size is None
            or not record.state.has_replicas or not record.allocation):
        return None, None
    return running_goodput(record), float(goodput_fn.efficiency(hints.batch_size))


def speedup_of_allocation(model: JobModel, allocation: Sequence[str]) -> float | None:
    """The job's speedup on ``allocation`` over one replica, or None without a model."""
    if model.speedup is None or not allocation:
        return None
    try:
        return float(model.speedup(len(set(allocation)), len(allocation)))
    except ConfigError:
        return None


def job_sample(record: JobRecord, now: float) -> JobSample:
    """``record`` now."""
    model = job_model(record)
    running = record.allocation if record.state.has_replicas else ()
    goodput, efficiency = goodput_and_efficiency(record, model)
    return JobSample(time=now, state=record.state.value, replicas=len(running),
                     nodes=len(set(running)),
                     batch_size=None if model.hints is None else model.hints.batch_size,
                     goodput=goodput, efficiency=efficiency,
                     speedup=speedup_of_allocation(model, running))


def slots_used_and_total(records: Sequence[JobRecord], nodes: Sequence[NodeInfo]
                         ) -> tuple[int, int]:
    """Slots held by running jobs' allocations, and all slots of ``nodes``."""
    names = {node.name for node in nodes}
    used = sum(1 for record in records if record.state.has_replicas
               for node in record.allocation if node in names)
    total = sum(int(node.resources.get(GPU, 0)) for node in nodes)
    return used, total


class History:
    """Recent samples per job and for the cluster (thread-safe, bounded)."""

    def __init__(self, max_samples: int = DEFAULT_MAX_SAMPLES,
                 max_jobs: int = DEFAULT_MAX_JOBS) -> None:
        if max_samples < 1 or max_jobs < 1:
            raise ConfigError("max_samples", (max_samples, max_jobs), "keep at least one")
        self.max_samples = max_samples
        self.max_jobs = max_jobs
        self._lock = threading.Lock()
        self._jobs: OrderedDict[str, deque[JobSample]] = OrderedDict()
        self._cluster: deque[ClusterSample] = deque(maxlen=max_samples)

    def record_round(self, now: float, round_s: float, records: Sequence[JobRecord],
                     nodes: Sequence[NodeInfo]) -> None:
        """Sample every non-final job in ``records`` and the cluster."""
        active = [r for r in records if not r.state.is_final]
        samples = [(r.id, job_sample(r, now)) for r in active]
        used, total = slots_used_and_total(active, nodes)
        with self._lock:
            self._cluster.append(ClusterSample(now, used, total, len(active), round_s))
            for job_id, sample in samples:
                series = self._jobs.pop(job_id, None)
                if series is None:
                    series = deque(maxlen=self.max_samples)
                series.append(sample)
                self._jobs[job_id] = series
            while len(self._jobs) > self.max_jobs:
                self._jobs.popitem(last=False)

    def job(self, job_id: str) -> list[JobSample]:
        with self._lock:
            return list(self._jobs.get(job_id, ()))

    def cluster(self) -> list[ClusterSample]:
        with self._lock:
            return list(self._cluster)


def samples_as_columns(samples: Sequence[Any]) -> dict[str, list[Any]]:
    """Dataclass samples as ``{field: [values...]}`` (compact JSON for charts)."""
    if not samples:
        return {}
    rows = [asdict(sample) for sample in samples]
    return {key: [row[key] for row in rows] for key in rows[0]}


class RoundRecorder:
    """The allocator's ``on_round`` hook in the service: samples the store into a
    :class:`History` and passes the duration on (e.g. to a Prometheus histogram). An
    error here is the allocator's to log (telemetry never stops scheduling)."""

    def __init__(self, history: History, list_jobs: Callable[[], Sequence[JobRecord]],
                 list_nodes: Callable[[], Sequence[NodeInfo]], clock: Callable[[], float],
                 on_duration: Callable[[float], None] | None = None) -> None:
        self.history = history
        self.list_jobs = list_jobs
        self.list_nodes = list_nodes
        self.clock = clock
        self.on_duration = on_duration

    def __call__(self, round_s: float) -> None:
        if self.on_duration is not None:
            self.on_duration(round_s)
        self.history.record_round(self.clock(), round_s, self.list_jobs(), self.list_nodes())
