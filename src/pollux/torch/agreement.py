"""Agreement points: one small host-side collective that keeps every replica in step.

Every so many optimizer steps (the same step on every rank, decided at the previous
agreement) the data loader calls :func:`agree`. It is one ``all_reduce`` (SUM) of a
few float64 numbers on the gloo control group: each rank adds its "asked to stop"
flag, and rank 0, the only one that decides, adds its proposal (batch configuration,
checkpoint now, next agreement, gradient statistics for the learning-rate rule).
Other ranks add zeros, so the sum is rank 0's proposal exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pollux.models import GradientStats
from pollux.torch.batch_size import BatchConfig

_SIZE = 8


@dataclass(frozen=True)
class Agreement:
    """What every replica does from this step on."""

    stop: bool
    """Some replica was asked to stop (SIGTERM): checkpoint and exit, all at this step."""
    save_checkpoint: bool
    """Take a periodic checkpoint now."""
    batch_config: BatchConfig
    """Atomic batch and accumulation steps from now on."""
    next_sync_steps: int
    """Optimizer steps until the next agreement (>= 1)."""
    grad_stats: GradientStats | None
    """Gradient statistics (at the initial batch) for gains and learning-rate factors."""


def _encode(rank_stop: bool, proposal: Agreement | None) -> torch.Tensor:
    vector = torch.zeros(_SIZE, dtype=torch.float64)
    vector[0] = 1.0 if rank_stop else 0.0
    if proposal is not None:
        vector[1] = 1.0 if proposal.save_checkpoint else 0.0
        vector[2] = proposal.batch_config.local_bsz
        vector[3] = proposal.batch_config.accum_steps
        vector[4] = proposal.next_sync_steps
        if proposal.grad_stats is not None:
            vector[5] = proposal.grad_stats.sqr
            vector[6] = proposal.grad_stats.var
            vector[7] = 1.0
        vector[0] += 1.0 if proposal.stop else 0.0
    return vector


def _decode(vector: torch.Tensor) -> Agreement:
    values = vector.tolist()
    stats = None
    if values[7] > 0 and math.isfinite(values[5]) and math.isfinite(values[6]):
        stats = GradientStats(sqr=max(values[5], 0.0), var=max(values[6], 0.0))
    return Agreement(
        stop=values[0] > 0,
        save_checkpoint=values[1] > 0,
        batch_config=BatchConfig(local_bsz=int(round(values[2])),
                                 accum_steps=int(round(values[3]))),
        next_sync_steps=max(1, int(round(values[4]))),
        grad_stats=stats,
    )


def agree(group: dist.ProcessGroup | None, *, rank: int, stop_requested: bool,
          proposal: Agreement | None) -> Agreement:
    """Combine every rank's stop flag with rank 0's ``proposal`` (None on other ranks)."""
    if rank == 0 and proposal is None:
        raise ValueError("rank 0 must make a proposal")
    vector = _encode(stop_requested, proposal)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(vector, op=dist.ReduceOp.SUM, group=group)
    return _decode(vector)


class StopWatch:
    """Notices a stop request (SIGTERM on any replica) within two optimizer steps.

    Agreement points come about once a second, many steps apart for a fast model. So at
    every step boundary each rank also starts a one-number asynchronous ``all_reduce``
    (SUM) of its "asked to stop" flag on the control group and reads the previous one,
    long finished by then: every rank sees the same sums at the same step, and when one
    is positive they all go to an agreement point at once (which checkpoints and exits).
    One replica reads its own flag. Cost: one tiny collective per step, off the critical
    path.
    """

    def __init__(self, group: dist.ProcessGroup | None, num_replicas: int) -> None:
        self.group = group
        self.num_replicas = num_replicas
        self._pending: tuple[dist.Work, torch.Tensor] | None = None

    def poll(self, stop_requested: bool) -> bool:
        """At a step boundary (every rank, every step): whether some replica had asked to
        stop by the previous boundary (by this one, with one replica)."""
        if self.num_replicas == 1 or not dist.is_initialized():
            return stop_requested
        seen = False
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            seen = flag.item() > 0
            self._pending = None
        if not seen:
            flag = torch.tensor([1.0 if stop_requested else 0.0], dtype=torch.float64)
            work = dist.all_reduce(flag, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            if work is not None:
                self._pending = (work, flag)
        return seen

    def settle(self) -> None:
        """Finish the collective in flight (before the group is used otherwise at an end)."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None
