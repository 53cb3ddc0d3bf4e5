"""Finish-time fairness: each job's JCT against its JCT alone on an equal share.

``rho = JCT / JCT_isolated``, where ``JCT_isolated`` is the job's completion time if it
ran alone on ``GPUs / (average number of active jobs during its lifetime)`` GPUs, started
at the first scheduling round after its submission, restart delay included (so a job
that has its share all along scores rho = 1). Fixed-batch jobs run their
tuned batch size there; adaptive jobs pick the goodput-optimal batch from the true
application model (an oracle, so the reference is an ideal). Fractional shares interpolate
speed (1 / JCT) between the whole GPU counts around them; below one GPU the job is
time-sliced (``JCT(1) / share``). Isolated runs are memoized per (application, batch, GPUs).
On a typed cluster the share is of the cluster's GPUs, of the type where one GPU trains the
job fastest (its 1-GPU throughput; with the type's nodes, the semantics' calibration and
restart delay): one type's isolated runs, not every type's, keep it as cheap as on one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from pollux.sim.applications import Application, TypedApplication, typed_on
from pollux.sim.config import ClusterConfig
from pollux.sim.job import BatchMode, JobSpec, SimJob
from pollux.sim.oracle import fixed_batch_max_replicas
from pollux.sim.placement import packed_placement

HORIZON_S = 1e12
"""Simulated seconds an isolated run may take (it always finishes well before)."""


class IsolatedRuns:
    """Memoized JCTs of jobs run alone on a whole number of GPUs of one type."""

    def __init__(self, applications: Mapping[str, Application] | Mapping[str, TypedApplication],
                 config: ClusterConfig) -> None:
        self.applications = {name: typed_on(app, config.spec.gpu_types)
                             for name, app in applications.items()}
        self.config = config
        self._cache: dict[tuple[str, str, BatchMode, int | None, int], float] = {}
        self._fastest: dict[str, str] = {}

    def max_gpus(self, app: Application, batch_size: int | None) -> int:
        """GPUs beyond which the job cannot spread its batch any further."""
        if batch_size is None:
            return app.spec.max_useful_replicas
        return fixed_batch_max_replicas(app, batch_size)

    def jct_s(self, application: str, gpu_type: str, mode: BatchMode, batch_size: int | None,
              num_gpus: int) -> float:
        key = (application, gpu_type, mode, batch_size, num_gpus)
        found = self._cache.get(key)
        if found is None:
            found = self._run(application, gpu_type, mode, batch_size, num_gpus)
            self._cache[key] = found
        return found

    def _run(self, application: str, gpu_type: str, mode: BatchMode, batch_size: int | None,
             num_gpus: int) -> float:
        app = self.applications[application].by_type[gpu_type]
        sem = self.config.semantics
        spec = JobSpec("isolated", 0.0, app.name, num_gpus, batch_size or app.spec.init_batch_size)
        job = SimJob(spec, TypedApplication.of(app, gpu_type), mode,
                     rate_factor=sem.calibration(application),
                     placement_limits=sem.placement_batch_limits)
        placement = packed_placement(num_gpus, self.config.gpus_per_node_of(gpu_type))
        allocation = tuple(f"n{i}" for i, count in enumerate(placement) for _ in range(count))
        job.reallocate(allocation, placement,
                       sem.restart_delay_s(application, self.config.restart_delay_s))
        job.advance(0.0, HORIZON_S)
        return float(job.completion_time_s if job.completion_time_s is not None else math.inf)

    def fastest_type(self, application: str) -> str:
        """The type where one GPU trains ``application`` fastest (the only one, on one)."""
        found = self._fastest.get(application)
        if found is None:
            app = self.applications[application]
            speeds = app.type_speeds() if len(app.by_type) > 1 else {}
            found = max(speeds, key=lambda t: speeds[t]) if speeds else next(iter(app.by_type))
            self._fastest[application] = found
        return found

    def share_jct_s(self, application: str, mode: BatchMode, batch_size: int | None,
                    share_gpus: float) -> float:
        """Isolated JCT on a possibly fractional number of GPUs of the fastest type."""
        return self._share_jct_s(application, self.fastest_type(application), mode,
                                 batch_size, share_gpus)

    def _share_jct_s(self, application: str, gpu_type: str, mode: BatchMode,
                     batch_size: int | None, share_gpus: float) -> float:
        app = self.applications[application].by_type[gpu_type]
        cap = self.max_gpus(app, batch_size)
        share = min(share_gpus, float(cap))
        if share <= 1.0:
            return self.jct_s(application, gpu_type, mode, batch_size, 1) / max(share, 1e-9)
        lo, hi = math.floor(share), math.ceil(share)
        jct_lo = self.jct_s(application, gpu_type, mode, batch_size, lo)
        if hi == lo:
            return jct_lo
        jct_hi = self.jct_s(application, gpu_type, mode, batch_size, hi)
        frac = share - lo
        return 1.0 / ((1.0 - frac) / jct_lo + frac / jct_hi)


def average_active(times_s: np.ndarray, num_active: np.ndarray, start_s: float,
                   end_s: float) -> float:
    """Mean number of active jobs over the rounds within [start, end] (at least 1)."""
    lo = int(np.searchsorted(times_s, start_s, side="left"))
    hi = int(np.searchsorted(times_s, end_s, side="right"))
    if hi <= lo:
        hi = min(lo + 1, len(times_s))
    if hi <= lo:
        return 1.0
    return max(1.0, float(np.mean(num_active[lo:hi])))


def finish_time_fairness(jobs: Sequence[SimJob], times_s: np.ndarray, num_active: np.ndarray,
                         num_gpus: int, isolated: IsolatedRuns, interval_s: float
                         ) -> dict[str, float]:
    """rho per completed job (see the module docstring)."""
    rho: dict[str, float] = {}
    for job in jobs:
        if job.completion_time_s is None:
            continue
        start = job.spec.submission_time_s
        share = num_gpus / average_active(times_s, num_active, start, job.completion_time_s)
        mode = BatchMode.FIXED if job.target_batch_size is not None else BatchMode.ORACLE
        first_round = max(interval_s, math.ceil(start / interval_s - 1e-9) * interval_s)
        wait = first_round - start
        ideal = wait + isolated.share_jct_s(job.spec.application, mode, job.target_batch_size,
                                            share)
        rho[job.name] = (job.completion_time_s - start) / ideal
    return rho
