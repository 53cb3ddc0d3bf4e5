"""What AdaptDL's ``AdaptiveDataLoaderMixin`` gives a custom loader: ``self._elastic``,
an :class:`AdaptiveDataLoaderHelper` that runs the agent's rhythm for batches the
loader makes itself (a BPTT iterator, a streaming reader).

A custom loader calls, as with AdaptDL::

    def __iter__(self):
        with self._elastic.context():                 # one loop over the data
            if self._elastic.skipdone():              # finished before a restart
                return
            local_bsz = self._elastic._sync_local_bsz()   # agreed by every replica
            for start in range(self._elastic.current_index, end, step):
                with self._elastic.profile(self.training and start > 0):
                    yield make_batch(start, local_bsz)    # one optimizer step
                    self._elastic.current_index += step

Inside ``profile`` the agent times the step (when ``commit``), tells the model the
step's batch, and every so many steps holds an agreement point: there a stop request
(SIGTERM, a rescale) checkpoints ``current_index``/``end_index`` and exits, and a new
batch size is agreed, which the loader takes at its next ``_sync_local_bsz()``. No
gradient accumulation: each batch is one optimizer step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.torch.batch_size import BatchConfig, BatchLimits
from pollux.torch.control_loop import ControlLoop
from pollux.torch.profiler import MicroStepTiming

if TYPE_CHECKING:
    from pollux.torch.job import JobContext
    from pollux.torch.roles import DrivenModel


def loader_name(kind: str) -> str:
    """A loader's checkpoint name, stable across restarts like AdaptDL's: by the epoch it
    is created in (``None`` outside the epoch loop) and its rank among that epoch's, so
    a loader made anew in every epoch finds its own state again after a restart."""
    epoch = DEFAULT_JOB.job.epoch if DEFAULT_JOB.job is not None and \
        DEFAULT_JOB.in_epoch_loop else None
    return DEFAULT_JOB.next_name(f"{kind}-epoch{epoch}-")


def check_autoscale(batch_size: int, max_batch_size: Any,
                    local_bsz_bounds: tuple[int | None, int | None] | None) -> None:
    """AdaptDL's checks of ``autoscale_batch_size`` (``ValueError`` naming the field)."""
    if not isinstance(max_batch_size, int) or max_batch_size < batch_size:
        raise ValueError(f"invalid max_batch_size={max_batch_size!r}: give an int >= the "
                         f"loader's batch_size ({batch_size})")
    if local_bsz_bounds is not None:
        low, high = local_bsz_bounds
        if (low is not None and low > batch_size) or (high is not None and high < batch_size):
            raise ValueError(f"invalid local_bsz_bounds={local_bsz_bounds!r}: the bounds "
                             f"must include the loader's batch_size ({batch_size})")


@dataclass
class _EpochCursor:
    """What :class:`~pollux.torch.control_loop.ControlLoop` reads as ``loader.sampler``."""

    epoch: int = 0


class AdaptiveDataLoaderHelper:
    """AdaptDL's helper for custom loaders (see the module); ``batch_size`` is the
    initial total batch size over all replicas."""

    def __init__(self, batch_size: int, owner: Any = None) -> None:
        self.owner = owner
        """The loader that owns this helper (what ``current_dataloader()`` returns)."""
        self.batch_size = int(batch_size)
        self.init_batch_size = self.batch_size
        self.limits = BatchLimits(self.batch_size, self.batch_size, (1, self.batch_size),
                                  accumulation=False)
        self.batch_config: BatchConfig | None = None
        self.config_replicas = 0
        self.sampler = _EpochCursor()
        self.current_index = 0
        """Samples of the current loop processed so far over all replicas (checkpointed)."""
        self.end_index = 0
        """The loop's end, if the loader tracks it across restarts (checkpointed)."""
        self._last_position: dict[int, int] = {}
        self._position: dict[int, int] = {}
        self._loop_local_bsz = 0
        self._steps_since_sync = 0
        self._control: ControlLoop | None = None
        self.job: JobContext | None = None
        self.name = loader_name("adaptdl-custom-loader")
        DEFAULT_JOB.when_bound(self._bind)

    def _bind(self, job: JobContext) -> None:
        self.job = job
        self._control = ControlLoop(cast(Any, self))
        job.checkpoint.register(f"adaptdl/loader/{self.name}", self)

    # -- checkpoint ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        config = self.batch_config
        return {"current_index": self.current_index, "end_index": self.end_index,
                "last_position": dict(self._last_position),
                "batch_config": None if config is None else [config.local_bsz, 0],
                "config_replicas": self.config_replicas}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.current_index = int(state["current_index"])
        self.end_index = int(state["end_index"])
        self._last_position = {int(k): int(v) for k, v in state["last_position"].items()}
        config = state.get("batch_config")
        self.batch_config = None if config is None else BatchConfig(int(config[0]), 0)
        self.config_replicas = int(state.get("config_replicas", 0))

    # -- configuration -----------------------------------------------------------------------

    def autoscale_batch_size(self, max_batch_size: int,
                             local_bsz_bounds: tuple[int, int] | None = None,
                             gradient_accumulation: bool = False) -> None:
        """Let the agent pick the batch size (no accumulation for custom loaders)."""
        check_autoscale(self.batch_size, max_batch_size, local_bsz_bounds)
        low, high = local_bsz_bounds if local_bsz_bounds is not None else (None, None)
        self.limits = BatchLimits(self.batch_size, int(max_batch_size),
                                  (int(low or 1), int(high or max_batch_size)),
                                  accumulation=False)

    @property
    def max_batch_size(self) -> int | None:
        return self.limits.max_batch_size if self.limits.adaptive else None

    @property
    def local_bsz_bounds(self) -> tuple[int, int] | None:
        return self.limits.local_bsz_bounds if self.limits.adaptive else None

    @property
    def training(self) -> bool:
        return self.limits.adaptive

    @property
    def current_local_bsz(self) -> int | None:
        """The local batch size of the loop being iterated (else the agreed one)."""
        if self._loop_local_bsz:
            return self._loop_local_bsz
        return None if self.batch_config is None else self.batch_config.local_bsz

    @property
    def accumulation_steps(self) -> int:
        return 0

    @property
    def current_batch_size(self) -> int | None:
        job = self.job
        local = self.current_local_bsz
        return None if job is None or local is None else local * job.num_replicas

    # -- the loop ----------------------------------------------------------------------------

    def _require(self) -> tuple[JobContext, ControlLoop, DrivenModel]:
        job = DEFAULT_JOB.require("iterating a custom AdaptDL loader")
        if job.model is None or self._control is None:
            raise RuntimeError("wrap the model with AdaptiveDataParallel before iterating "
                               "the data loader")
        return job, self._control, job.model

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """One loop over the data (every replica; no other loader loop inside)."""
        job, _, _ = self._require()
        if DEFAULT_JOB.current_loader is not None:
            raise RuntimeError("overlapping data loader loops")
        epoch = job.epoch
        self.sampler.epoch = epoch
        DEFAULT_JOB.current_loader = self.owner if self.owner is not None else self
        job.current_dataloader = cast(Any, DEFAULT_JOB.current_loader)  # the same answer
        try:
            yield
        finally:
            job.current_dataloader = None
            self.current_index = 0
            self.end_index = 0
            self._loop_local_bsz = 0
            position = self._position.get(epoch, 0)
            self._last_position[epoch] = position
            self._position[epoch] = position + 1
            DEFAULT_JOB.current_loader = None

    def skipdone(self) -> bool:
        """Whether this loop already finished before a restart (then skip it)."""
        job, _, _ = self._require()
        epoch = job.epoch
        position = self._position.get(epoch, 0)
        if position <= self._last_position.get(epoch, -1):
            self._position[epoch] = position + 1
            return True
        return False

    def _sync_local_bsz(self) -> int:
        """Agree on the batch configuration now (every replica); the local batch size."""
        _, control, model = self._require()
        control.synchronize(model)
        self._steps_since_sync = 0
        assert self.batch_config is not None
        self._loop_local_bsz = self.batch_config.local_bsz
        return self._loop_local_bsz

    @contextlib.contextmanager
    def profile(self, commit: bool) -> Iterator[None]:
        """Around each batch handed out: one optimizer step (timed when ``commit``)."""
        job, control, model = self._require()
        if self._steps_since_sync >= control.next_sync_steps:
            # a stop request checkpoints and exits here; a new batch configuration is
            # taken by the loader at its next _sync_local_bsz()
            control.synchronize(model)
            self._steps_since_sync = 0
        local_bsz = self._loop_local_bsz or self.batch_size
        profiling = commit and job.rank == 0
        clock = job.profiler.clock
        model.begin_micro_step(0, 1, local_bsz, local_bsz * job.num_replicas,
                               self.init_batch_size, True, profiling)
        start = clock.mark() if profiling else None
        yield
        if start is not None:
            job.profiler.record(MicroStepTiming(
                key=(job.num_nodes, job.num_replicas, local_bsz), optimizer_step=True,
                start=start, end=clock.mark(), compute_end=model.compute_end_mark))
        self._steps_since_sync += 1

    def to_tensorboard(self, writer: Any, global_step: int, tag_prefix: str = "") -> None:
        """AdaptDL's loader scalars (see :func:`write_loader_scalars`)."""
        write_loader_scalars(writer, global_step, tag_prefix, self.current_batch_size,
                             self.current_local_bsz, 0)


def write_loader_scalars(writer: Any, global_step: int, tag_prefix: str, total: int | None,
                         local: int | None, accumulation_steps: int) -> None:
    """``Total_Batch_Size``, ``Local_Batch_Size`` and ``Accumulation_Steps`` (AdaptDL's
    tags) under ``tag_prefix`` (a ``/`` is added); nothing before the first loop."""
    if tag_prefix and not tag_prefix.endswith("/"):
        tag_prefix += "/"
    if total is None or local is None:
        return
    writer.add_scalar(tag_prefix + "Total_Batch_Size", total, global_step)
    writer.add_scalar(tag_prefix + "Local_Batch_Size", local, global_step)
    writer.add_scalar(tag_prefix + "Accumulation_Steps", accumulation_steps, global_step)
