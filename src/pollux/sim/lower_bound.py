"""A lower bound on the average JCT any policy can reach on a workload and cluster.

Two relaxations, each valid for every policy the simulator runs; the reported bound is the
larger of their averages.

**Alone** (a per-job bound). A job cannot finish sooner than if it had the whole cluster to
itself from the start: it waits for the first scheduling round at or after its submission
(rounds are every ``interval_s``), pays one restart delay (the first start costs one too),
then trains every epoch at the best rate any configuration reaches in that epoch. A
configuration is a placement of ``K <= num_gpus`` replicas, an integer atomic batch and a
number of accumulation steps, the total batch at most the application's largest; the rate
is the true progress per second the simulator uses (gain over step seconds) with the
epoch's gradient statistics. Interference, further restarts and queueing are left out.

**Capacity** (a bound on the sum only). All GPUs together form one machine; a job holding
``K`` GPUs uses a share ``K / num_gpus`` of it and progresses at most ``K`` times the best
*per-GPU* rate of its epoch, so its work in machine-seconds is at least
``sum_e progress_e / (num_gpus * best_per_gpu_rate_e)``. Released at the same time as
above, the jobs then form a single-machine preemptive problem, for which shortest
remaining processing time first minimizes the sum of completion times; so the SRPT
average is a lower bound on the average JCT. (SRPT's completion of one job is not a bound
for that job, which is why the two are combined on the average, not per job.)

Epoch ends in the simulator are rounded to whole seconds, so an epoch may end up to half a
second early: its progress in that half second comes free, at most half a second at the
epoch's best rate. Each epoch's time alone is lowered by half a second, and its
machine-seconds by that free progress at the best per-GPU rate (not by half a second of
the whole machine: only the job's own GPUs are spared). The placements searched for a
configuration's step time: for every ``K`` and every number of nodes (up to 16 above the
fewest, and the widest spread: step times do not depend on more), the packed and the
balanced placement, plus every measured placement of a trace application that fits.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pollux.cluster_spec import ClusterSpec
from pollux.sim.applications import MAX_INTERPOLATION_NODES, Application, TypedApplication, typed_on
from pollux.sim.metrics import RunRecord
from pollux.sim.placement import Placement, canonical_placement, packed_placement
from pollux.sim.simulator import ClusterConfig
from pollux.sim.workload import Workload

EPOCH_ROUNDING_S = 0.5
"""The simulator ends an epoch at a whole second: up to this much sooner than exact."""


@dataclass(frozen=True)
class BestRates:
    """One application's best true progress rates on a cluster, per epoch."""

    application: str
    rate_per_s: tuple[float, ...]
    """Best progress per second over every configuration, per epoch."""
    rate_per_gpu_s: tuple[float, ...]
    """Best progress per second per GPU over every configuration, per epoch."""
    epoch_progress: tuple[float, ...]
    """Progress each epoch needs."""

    def alone_s(self) -> float:
        """Training seconds with the whole cluster at the best configuration."""
        return sum(max(p / r - EPOCH_ROUNDING_S, 0.0)
                   for p, r in zip(self.epoch_progress, self.rate_per_s))

    def machine_s(self, num_gpus: int) -> float:
        """Seconds of the whole cluster's time at the best per-GPU rate. The rounded end
        of an epoch credits at most ``EPOCH_ROUNDING_S`` of progress at the job's rate,
        at most its best rate: that progress costs no machine time."""
        return sum(max(p - EPOCH_ROUNDING_S * r, 0.0) / (r_gpu * num_gpus)
                   for p, r, r_gpu in zip(self.epoch_progress, self.rate_per_s,
                                          self.rate_per_gpu_s))


@dataclass(frozen=True)
class LowerBound:
    """Lower bounds on the average JCT of one workload on one cluster."""

    avg_jct_s: float
    """The bound: the larger of the two below."""
    alone_avg_jct_s: float
    """Average of each job alone on the whole cluster."""
    capacity_avg_jct_s: float
    """Average of preemptive SRPT on one machine as fast as the whole cluster."""
    job_alone_s: Mapping[str, float]
    """Per job: the alone bound on its JCT (valid for that job alone)."""


def _candidate_placements(app: Application, num_nodes: int, gpus_per_node: int,
                          max_replicas: int) -> list[Placement]:
    out: set[Placement] = set()
    for k in range(1, max_replicas + 1):
        fewest = -(-k // gpus_per_node)
        most = min(k, num_nodes)
        # Step times depend on the node count only up to MAX_INTERPOLATION_NODES (traces)
        # or only on one node vs several (the catalog), so a window above the fewest
        # nodes, plus the widest spread, covers every distinct value.
        counts = set(range(fewest, min(most, fewest + MAX_INTERPOLATION_NODES) + 1))
        for n in sorted(counts | {most}):
            out.add(canonical_placement(packed_placement(k, gpus_per_node, n)))
            out.add(canonical_placement(tuple(k // n + (i < k % n) for i in range(n))))
    trace = getattr(app, "trace", None)
    for placement in getattr(trace, "placements", {}) or {}:
        if (len(placement) <= num_nodes and max(placement) <= gpus_per_node
                and sum(placement) <= max_replicas):
            out.add(canonical_placement(placement))
    return sorted(out)


def _frontier(batch: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(batch, seconds per step) pairs no other pair beats (larger batch, fewer seconds):
    progress per step grows with the batch, so only these can be best in some epoch."""
    order = np.lexsort((seconds, -batch))
    ordered = seconds[order]
    before = np.concatenate([[math.inf], np.minimum.accumulate(ordered)[:-1]])
    keep = order[ordered < before]
    return batch[keep], seconds[keep]


def best_rates(app: Application, num_nodes: int, gpus_per_node: int) -> BestRates:
    """The best progress rates of ``app`` on a cluster of ``num_nodes`` x ``gpus_per_node``."""
    spec = app.spec
    num_gpus = num_nodes * gpus_per_node
    max_k = min(num_gpus, spec.max_useful_replicas)
    if spec.pinned_replicas is not None:
        max_k = min(max_k, spec.pinned_replicas)
    atomic = np.arange(max(spec.min_local_bsz, 1), max(spec.max_local_bsz, 1) + 1,
                       dtype=np.float64)
    batches: list[np.ndarray] = []
    seconds: list[np.ndarray] = []
    gpu_seconds: list[np.ndarray] = []
    seen: set[Hashable] = set()
    for placement in _candidate_placements(app, num_nodes, gpus_per_node, max_k):
        key = app.step_time_key(placement)
        if key in seen:  # the same pairs again: nothing new for a frontier
            continue
        seen.add(key)
        k = sum(placement)
        fits = atomic[atomic * k <= spec.max_batch_size]
        if len(fits) == 0:
            continue
        step, sync = app.step_sync_times(placement, fits)
        most = (spec.max_batch_size // (k * fits)).astype(np.int64)  # accumulation + 1
        reps = np.repeat(np.arange(len(fits)), most)
        accum = np.arange(len(reps)) - np.repeat(np.cumsum(most) - most, most)
        batch = k * fits[reps] * (accum + 1)
        t = step[reps] + (step[reps] - sync[reps]) * accum
        batches.append(batch)
        seconds.append(t)
        gpu_seconds.append(t * k)
    if not batches:
        raise ValueError(f"{spec.name}: no configuration fits the cluster")
    batch = np.concatenate(batches)
    alone = _frontier(batch, np.concatenate(seconds))
    per_gpu = _frontier(batch, np.concatenate(gpu_seconds))
    rates, rates_gpu, progress = [], [], []
    for epoch in range(spec.max_epochs):
        rates.append(_best_rate(app, alone, epoch))
        rates_gpu.append(_best_rate(app, per_gpu, epoch))
        progress.append(app.epoch_progress(epoch + 1) - app.epoch_progress(epoch))
    return BestRates(spec.name, tuple(rates), tuple(rates_gpu), tuple(progress))


def _best_rate(app: Application, frontier: tuple[np.ndarray, np.ndarray], epoch: int) -> float:
    batch, step_s = frontier
    sqr, var = app.grad_stats_many(batch, epoch)
    gain = (var + sqr) / (var * app.spec.init_batch_size / batch + sqr)
    return float(np.max(gain / step_s))


def srpt_completions(release_s: Sequence[float], work_s: Sequence[float]) -> list[float]:
    """Completion times of preemptive shortest-remaining-work-first on one machine."""
    order = sorted(range(len(release_s)), key=lambda i: release_s[i])
    done = [0.0] * len(release_s)
    heap: list[tuple[float, int]] = []
    now, nxt = 0.0, 0
    while nxt < len(order) or heap:
        if not heap:
            now = max(now, release_s[order[nxt]])
        while nxt < len(order) and release_s[order[nxt]] <= now:
            heapq.heappush(heap, (work_s[order[nxt]], order[nxt]))
            nxt += 1
        left, i = heapq.heappop(heap)
        horizon = release_s[order[nxt]] if nxt < len(order) else math.inf
        if now + left <= horizon:
            now += left
            done[i] = now
        else:
            heapq.heappush(heap, (left - (horizon - now), i))
            now = horizon
    return done


def bound_from_rates(workload: Workload, rates: Mapping[str, BestRates], num_gpus: int,
                     interval_s: float, restart_delay_s: Callable[[str], float]
                     ) -> LowerBound:
    """The two relaxations from each application's best rates; ``restart_delay_s`` of an
    application name is what its first start costs."""
    jobs = workload.jobs
    if not jobs:
        return LowerBound(0.0, 0.0, 0.0, {})
    release, alone, machine = [], [], []
    for job in jobs:
        first_round = max(interval_s, math.ceil(job.submission_time_s / interval_s - 1e-9)
                          * interval_s)
        release.append(first_round + restart_delay_s(job.application))
        best = rates[job.application]
        alone.append(release[-1] - job.submission_time_s + best.alone_s())
        machine.append(best.machine_s(num_gpus))
    completions = srpt_completions(release, machine)
    capacity = float(np.mean([c - job.submission_time_s for c, job in zip(completions, jobs)]))
    alone_avg = float(np.mean(alone))
    return LowerBound(max(alone_avg, capacity), alone_avg, capacity,
                      {job.name: a for job, a in zip(jobs, alone)})


def typed_best_rates(app: TypedApplication, cluster: ClusterSpec, calibration: float = 1.0
                     ) -> BestRates:
    """``app``'s best rates per epoch over every node group of ``cluster``, calibrated: a
    job's allocation never spans types, but it may change type between epochs for free
    (restarts are relaxed away), so each epoch's best rate is the largest over the types."""
    per_group = [best_rates(app.by_type[group.gpu_type], group.num_nodes,
                            group.gpus_per_node) for group in cluster.groups]
    rate = np.max([r.rate_per_s for r in per_group], axis=0) * calibration
    rate_gpu = np.max([r.rate_per_gpu_s for r in per_group], axis=0) * calibration
    return BestRates(app.name, tuple(rate.tolist()), tuple(rate_gpu.tolist()),
                     per_group[0].epoch_progress)


def cluster_lower_bound(workload: Workload,
                        applications: Mapping[str, Application] | Mapping[str, TypedApplication],
                        config: ClusterConfig, rates: dict[str, BestRates] | None = None
                        ) -> LowerBound:
    """Lower bounds on the average JCT of ``workload`` on ``config``'s cluster (its
    largest size when it is elastic). On a typed cluster a job alone uses one type's
    nodes at a time and the capacity bound counts its work at its best per-GPU rate on
    any type. ``rates`` (application -> best rates) is filled and reused."""
    spec = config.spec
    if config.cluster is None:
        spec = replace(spec, groups=(replace(spec.groups[0],
                                             num_nodes=config.scaling_max_nodes),))
    sem = config.semantics
    rates = {} if rates is None else rates
    for name in sorted({job.application for job in workload.jobs} - set(rates)):
        rates[name] = typed_best_rates(typed_on(applications[name], spec.gpu_types), spec,
                                       sem.calibration(name))
    return bound_from_rates(workload, rates, spec.num_gpus, config.interval_s,
                            lambda name: sem.restart_delay_s(name, config.restart_delay_s))


def with_lower_bounds(records: Sequence[RunRecord], workloads: Sequence[Workload],
                      applications: Mapping[str, Application] | Mapping[str, TypedApplication],
                      config: ClusterConfig) -> list[RunRecord]:
    """``records`` with ``lower_bound_avg_jct_s`` set from their workload (by name) on
    ``config``'s cluster (:func:`cluster_lower_bound`)."""
    rates: dict[str, BestRates] = {}
    bounds = {w.name: cluster_lower_bound(w, applications, config, rates).avg_jct_s
              for w in workloads}
    return [replace(r, lower_bound_avg_jct_s=bounds.get(r.workload, r.lower_bound_avg_jct_s))
            for r in records]
