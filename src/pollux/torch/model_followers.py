"""Several models in one job (``AdaptiveDataParallel(..., name=...)``), e.g. a GAN's
generator and discriminator trained from one data loader.

The first model wrapped drives the job: its gradient noise and progress choose the
batch size. Every later model *follows* it: it is told the same micro-steps (so its
optimizer also accumulates, and skips its step, when the loader splits a step), it
measures its own gradient noise, and at each agreement point its learning-rate scaling
takes its own statistics (read from its own estimator: every rank holds the same
values, as the norms are all-reduced).

>>> d = AdaptiveDataParallel(disc, opt_d, job=job, name="discriminator")  # doctest: +SKIP
>>> g = AdaptiveDataParallel(gen, opt_g, job=job, name="generator")  # doctest: +SKIP
>>> job.model is d, job.followers() == [g]  # doctest: +SKIP
(True, True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pollux.torch.gradient_noise import GradientNoiseEstimator

if TYPE_CHECKING:
    from pollux.torch.gradient_norms import MicroStep
    from pollux.torch.job import JobContext


class Leader(Protocol):
    """The model that drives the job, as its followers see it (an
    :class:`~pollux.torch.AdaptiveDataParallel`): its job and its micro-step state."""

    job: JobContext
    _step: MicroStep


def begin_followers_micro_step(leader: Leader, index: int,
                               num_micro_steps: int, local_bsz: int, step_batch_size: int,
                               init_batch_size: int, regular: bool, probe: bool) -> None:
    """Announce the leader's micro-step to every follower (no profiling marks)."""
    if leader.job.model is not leader:
        return
    for follower in leader.job.followers():
        follower.begin_micro_step(index, num_micro_steps, local_bsz, step_batch_size,
                                  init_batch_size, regular, False, probe=probe)


def refresh_followers_stats(leader: Leader) -> None:
    """At an agreement point: each follower's statistics from its own estimator (None
    until it has ``min_noise_updates`` updates)."""
    job = leader.job
    if job.model is not leader:
        return
    init = leader._step.init_batch_size
    for follower in job.followers():
        raw = follower.noise.raw().tolist()
        enough = init is not None and raw[3] >= job.config.min_noise_updates
        follower.grad_stats = (GradientNoiseEstimator.stats_from_raw(raw, init)
                               if enough and init is not None else None)
