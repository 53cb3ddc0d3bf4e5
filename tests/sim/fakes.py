"""Test doubles for the simulator: a toy application with closed-form behaviour, a greedy
policy (every job gets as many GPUs as it may use, in order), and the artifact location."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from pollux.policies.base import Allocations, JobInfo, NodeInfo, Policy, PolicyDecision
from pollux.policies.tiresias import free_slots, pack_onto_most_free
from pollux.sim.applications import Application, ApplicationSpec
from pollux.sim.placement import Placement

ARTIFACT = Path(__file__).resolve().parents[2].parent / "shared" / "pollux-artifact"
"""../shared/pollux-artifact seen from the repository root."""

needs_artifact = pytest.mark.skipif(
    not (ARTIFACT / "traces").is_dir(),
    reason=f"the Pollux artifact data is not at {ARTIFACT} (../shared/pollux-artifact)")


class ToyApplication(Application):
    """Step time ``0.1 + 0.001 * b`` s, plus 0.05 s sync across replicas (0.1 s across
    nodes); noise ratio ``var / sqr = ratio``; every epoch is ``progress_per_epoch``."""

    def __init__(self, name: str = "toy", epochs: int = 3, ratio: float = 0.0,
                 progress_per_epoch: float = 1000.0, pinned: tuple[int, int] | None = None
                 ) -> None:
        super().__init__(ApplicationSpec(
            name=name, init_batch_size=32, max_batch_size=1024, min_local_bsz=16,
            max_local_bsz=256, max_epochs=epochs,
            pinned_replicas=None if pinned is None else pinned[0],
            pinned_batch_size=None if pinned is None else pinned[1]))
        self.ratio = ratio
        self.progress_per_epoch = progress_per_epoch

    def _measure(self, placement: Placement, local_bsz: float) -> tuple[float, float]:
        sync = 0.0 if sum(placement) == 1 else (0.05 if len(placement) == 1 else 0.1)
        return 0.1 + 0.001 * local_bsz + sync, sync

    def _grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        return 1.0, self.ratio

    def epoch_progress(self, epoch: int) -> float:
        return self.progress_per_epoch * epoch

    def iterations(self, batch_size: float, epoch: int) -> float:
        return self.progress_per_epoch * (epoch + 1) * 32 / batch_size


class GreedyPolicy(Policy):
    """Each job in order takes min(max_replicas, free GPUs), packed; unchanged sizes keep
    their nodes. Gets adaptive (Pollux) jobs."""

    name: ClassVar[str] = "greedy"
    adaptive_jobs: ClassVar[bool] = True

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        free = {node.name: node.num_gpus for node in nodes}
        total = sum(free.values())
        wanted = {}
        for job in jobs:
            wanted[job.name] = min(job.max_replicas, total)
            total -= wanted[job.name]
        kept = {name: tuple(alloc) for name, alloc in previous_allocations.items()
                if name in wanted and len(alloc) == wanted[name]}
        free = free_slots(nodes, {job.name: job for job in jobs}, kept)
        allocations = dict(kept)
        for job in jobs:
            if job.name not in allocations and wanted[job.name] > 0:
                allocations[job.name] = pack_onto_most_free(free, wanted[job.name],
                                                            [n.name for n in nodes])
        return PolicyDecision({job.name: allocations.get(job.name, ()) for job in jobs})


class FixedGreedyPolicy(GreedyPolicy):
    """The greedy policy with fixed-batch (tuned) jobs."""

    name: ClassVar[str] = "greedy-fixed"
    adaptive_jobs: ClassVar[bool] = False


class FixedAllocationPolicy(Policy):
    """Returns the allocations it was built with, whatever the snapshot."""

    name: ClassVar[str] = "fixed-allocation"
    adaptive_jobs: ClassVar[bool] = False

    def __init__(self, allocations: dict[str, tuple[str, ...]]) -> None:
        self.allocations = allocations

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        active = {job.name for job in jobs}
        return PolicyDecision({k: v for k, v in self.allocations.items() if k in active})
