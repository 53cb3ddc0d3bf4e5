"""The agent's control loop: what happens at each agreement point of a data loader.

Every so many optimizer steps (decided at the previous agreement so that every rank
stops at the same step), the loader's iteration calls :meth:`ControlLoop.synchronize`.
Rank 0 collects the profile, refits the throughput model, reads the gradient statistics
and proposes a batch configuration (:mod:`pollux.torch.batch_decider`: a change needs a
gain confirmed at several agreement points, more to go back); one collective (:func:`pollux.torch.agreement.agree`)
makes every rank adopt it. When a replica was asked to stop (SIGTERM, SIGINT, a
rescale), every rank checkpoints and leaves *from inside the iteration*:
:meth:`~pollux.torch.job.JobContext.exit_for_rescale` raises ``SystemExit`` with the
rescale exit code. Rank 0 also reports hints to the scheduler and writes metrics.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

from pollux.models import GoodputFunction, GradientStats, JobHints
from pollux.torch.agreement import Agreement, StopWatch, agree
from pollux.torch.batch_decider import BatchDecider
from pollux.torch.batch_size import (
    BatchConfig,
    BatchLimits,
    carried_batch_config,
    initial_batch_config,
)
from pollux.torch.gradient_noise import GradientNoiseEstimator

if TYPE_CHECKING:
    from pollux.torch.job import JobContext
    from pollux.torch.roles import DrivenModel

logger = logging.getLogger(__name__)


def describe_batch(config: BatchConfig, num_replicas: int) -> str:
    """``'512 (2 replicas x 64 samples x 4 micro-steps)'``."""
    parts = [f"{num_replicas} replica{'s' if num_replicas != 1 else ''}",
             f"{config.local_bsz} sample{'s' if config.local_bsz != 1 else ''}"]
    if config.accum_steps:
        parts.append(f"{config.accum_steps + 1} micro-steps")
    return f"{config.total(num_replicas)} ({' x '.join(parts)})"


class EpochPosition(Protocol):
    """Where a loader's pass is (its elastic sampler, or a custom loader's cursor)."""

    epoch: int


class ControlledLoader(Protocol):
    """What the control loop reads and sets of the loader whose agreement points it runs
    (:class:`~pollux.torch.data_loader.AdaptiveDataLoader`, or AdaptDL's custom loaders)."""

    job: JobContext
    limits: BatchLimits
    init_batch_size: int
    batch_config: BatchConfig | None
    config_replicas: int

    @property
    def sampler(self) -> EpochPosition: ...


class ControlLoop:
    """Agreement points of one :class:`~pollux.torch.data_loader.AdaptiveDataLoader`."""

    def __init__(self, loader: ControlledLoader) -> None:
        self.loader = loader
        self.next_sync_steps = 1
        """Optimizer steps until the next agreement point (agreed by every rank)."""
        self._last_sync_time = time.monotonic()
        self.stop_watch = StopWatch(loader.job.control_group, loader.job.num_replicas)
        """Notices a stop request between agreement points (within two steps)."""
        self._decider = BatchDecider(loader.job.config.decision_rule())
        """Rank 0's batch-size decisions (a confidence rule with hysteresis)."""
        self.steps_done = 0
        """Steps handed out by the loader (counted by it: an evaluation loader's too)."""
        self._steps_at_last_sync = 0

    def _propose(self, model: DrivenModel | None) -> Agreement:
        """Rank 0's decisions at an agreement point."""
        loader = self.loader
        job = loader.job
        job_config = job.config
        profiler = job.profiler
        profiler.collect()
        # never more than fits in memory
        limits = loader.limits if model is None else model.bounded_limits(loader.limits)
        current = (loader.batch_config if loader.config_replicas == job.num_replicas
                   else carried_batch_config(limits, loader.batch_config,
                                             loader.config_replicas, job.num_replicas))
        if current is not None and current.local_bsz > limits.local_bsz_bounds[1]:
            current = carried_batch_config(limits, current, job.num_replicas,
                                           job.num_replicas)
        key = None if current is None else (job.num_nodes, job.num_replicas,
                                             current.local_bsz)
        needed = job_config.min_profiled_steps
        measured = key is None or profiler.fit_covers(key, needed)
        # a fit at once when the configuration has just been measured enough (not after
        # the refit interval): the batch size may then adapt within a second or so
        profiler.maybe_refit(force=not measured and key is not None
                             and profiler.steps_at(key) >= needed)
        stats = None
        if model is None:  # nothing measured: the initial configuration, kept
            chosen = current if current is not None else initial_batch_config(
                limits, job.num_replicas)
        else:
            raw = model.noise.raw().tolist()  # the one host read of the device statistics
            if raw[3] >= job_config.min_noise_updates:
                stats = GradientNoiseEstimator.stats_from_raw(raw, loader.init_batch_size)
            chosen = self._decider.decide(limits, profiler.params, stats,
                                          job.num_nodes, job.num_replicas, current,
                                          measured)
        steps = self.steps_done - self._steps_at_last_sync
        elapsed = time.monotonic() - self._last_sync_time
        if steps > 0 and elapsed > 0:
            wanted = job_config.control_interval_s * steps / elapsed
            next_steps = int(min(max(round(wanted), 1), job_config.max_control_interval_steps))
        else:
            next_steps = 1
        checkpoint = job.checkpoint
        save = checkpoint.enabled and (time.monotonic() - checkpoint.last_save_time
                                       >= job_config.checkpoint_interval_s)
        return Agreement(stop=False, save_checkpoint=save, batch_config=chosen,
                         next_sync_steps=next_steps, grad_stats=stats)

    def synchronize(self, model: DrivenModel | None) -> bool:
        """Run an agreement point; returns True when the batch configuration changed.

        Does not return when a stop was requested: checkpoints and exits instead. With
        no model (a loader iterated without one), nothing is measured and nothing
        reported: the batch configuration stays the initial one.
        """
        loader = self.loader
        job = loader.job
        proposal = self._propose(model) if job.rank == 0 else None
        agreement = agree(job.control_group, rank=job.rank,
                          stop_requested=job.stop_requested.is_set(), proposal=proposal)
        if model is not None:
            model.set_grad_stats(agreement.grad_stats)
        self.next_sync_steps = agreement.next_sync_steps
        self._last_sync_time = time.monotonic()
        self._steps_at_last_sync = self.steps_done
        if agreement.stop:
            job.checkpoint.save()
            job.exit_for_rescale()
        if agreement.save_checkpoint:
            job.checkpoint.save(background=True)
        changed = (agreement.batch_config != loader.batch_config
                   or loader.config_replicas != job.num_replicas)
        if changed:
            logger.info("batch size %s", describe_batch(agreement.batch_config,
                                                        job.num_replicas))
        loader.batch_config = agreement.batch_config
        loader.config_replicas = job.num_replicas
        if (model is not None and job.rank == 0
                and getattr(loader, "trains", None) is not False):  # not evaluation
            self._report(model, urgent=changed)
        return changed

    def _report(self, model: DrivenModel, urgent: bool) -> None:
        loader = self.loader
        job, config = loader.job, loader.batch_config
        assert config is not None
        stats = model.grad_stats
        limits = model.bounded_limits(loader.limits)  # the scheduler assumes no more
        hints = JobHints(
            init_batch_size=limits.init_batch_size,
            max_batch_size=limits.max_batch_size,
            local_bsz_bounds=limits.local_bsz_bounds,
            accumulation=limits.accumulation,
            throughput_params=job.profiler.params,
            grad_stats=stats,
            max_profiled_replicas=job.profiler.max_profiled_replicas,
            batch_size=config.total(job.num_replicas),
            local_bsz=config.local_bsz,
            accum_steps=config.accum_steps,
            epoch=loader.sampler.epoch,
            progress=model.progress,
            gpu_type=job.gpu_type,
            type_profiles=job.profiles.type_profiles(),
        )
        if job.hints is not None:
            job.hints.update(hints, urgent=urgent)
        if job.metrics.enabled:
            self._write_metrics(model, stats)

    def _write_metrics(self, model: DrivenModel, stats: GradientStats | None) -> None:
        self.loader.job.metrics.write(model.optimizer_steps, self.metrics(model, stats))

    def metrics(self, model: DrivenModel,
                stats: GradientStats | None) -> dict[str, float | None]:
        """Goodput, throughput (samples/s), efficiency, batch size, noise scale, ... now."""
        loader = self.loader
        job, config = loader.job, loader.batch_config
        assert config is not None
        params = job.profiler.params
        throughput = goodput = efficiency = None
        if params is not None:
            fn = GoodputFunction(params, stats or GradientStats(1.0, 0.0),
                                 loader.init_batch_size)
            args = (job.num_nodes, job.num_replicas, config.local_bsz, config.accum_steps)
            throughput = float(fn.throughput(*args))
            goodput = float(fn.evaluate(*args))
            efficiency = float(fn.efficiency(config.total(job.num_replicas)))
        return {
            "goodput": goodput, "throughput": throughput, "efficiency": efficiency,
            "batch_size": float(config.total(job.num_replicas)),
            "local_bsz": float(config.local_bsz), "accum_steps": float(config.accum_steps),
            "noise_scale": model.noise_scale(), "lr_factor": model.lr_factor,
            "progress": model.progress,
        }
