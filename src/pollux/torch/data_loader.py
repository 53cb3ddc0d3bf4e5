"""AdaptiveDataLoader: hands each replica its micro-batches and runs the job's rhythm.

Iterating the loader drives everything that must happen at optimizer-step boundaries
on every rank at once: the agent's control loop (:mod:`pollux.torch.control_loop`) runs
its agreement points there, where a stop request leads to a checkpoint and exit, a
periodic checkpoint is taken, or a new batch configuration is adopted; the cursor of the elastic sampler moves past each step once the
user asks for the next batch (so a checkpoint never loses or repeats a step's samples,
even one taken in the middle of an accumulation). It also marks micro-step times for the
profile and reports hints.

The ``batch_size`` given is the initial *total* batch size ``M0``, split over replicas.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sized
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch.utils.data

from pollux.errors import ConfigError
from pollux.torch.batch_size import BatchConfig, BatchLimits
from pollux.torch.control_loop import ControlLoop
from pollux.torch.elastic_sampler import ElasticSampler, IndexArray, StepPlan, plan_step
from pollux.torch.profiler import MicroStepTiming

if TYPE_CHECKING:
    from pollux.torch.data_parallel import AdaptiveDataParallel
    from pollux.torch.job import JobContext

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchInfo:
    """The micro-batch the loader just handed out on this rank.

    >>> for x, y in loader:  # doctest: +SKIP
    ...     info = loader.batch_info
    ...     print(info.epoch, info.micro_step, info.num_micro_steps, len(info.indices))
    0 0 1 32
    """

    epoch: int
    step_start: int
    """Cursor of the optimizer step this micro-batch belongs to."""
    micro_step: int
    num_micro_steps: int
    indices: IndexArray
    """Data-set indices of this micro-batch, in order."""
    num_padding: int
    """How many of the last ``indices`` repeat samples only to even out the last step."""
    num_replicas: int
    local_bsz: int
    accum_steps: int


def split_in_halves(plan: StepPlan) -> StepPlan:
    """A one-replica, one-micro-batch step as two micro-batches of the same samples."""
    (batch,), = plan.batches
    half = (len(batch) + 1) // 2
    return replace(plan, batches=((batch[:half].copy(), batch[half:].copy()),))


class AdaptiveDataLoader:
    """Data loader over an elastic, seeded, checkpointed sample order.

    Extra keyword arguments go to :class:`torch.utils.data.DataLoader` (``num_workers``,
    ``collate_fn``, ``pin_memory``, ...); ``sampler``/``batch_sampler`` are the agent's.

    >>> loader = AdaptiveDataLoader(dataset, batch_size=64, job=job, num_workers=2)  # doctest: +SKIP
    >>> loader.autoscale_batch_size(1024, local_bsz_bounds=(16, 256))  # doctest: +SKIP
    >>> for x, y in loader:  # doctest: +SKIP
    ...     ...
    """

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool = True, *,
                 job: JobContext, seed: int = 0, name: str | None = None,
                 **loader_kwargs: Any) -> None:
        if not isinstance(dataset, Sized):
            raise ConfigError("dataset", type(dataset).__name__, "give a map-style data set "
                              "with __len__ and __getitem__")
        for key in ("sampler", "batch_sampler", "batch_size", "shuffle", "drop_last"):
            if key in loader_kwargs:
                raise ConfigError(key, loader_kwargs[key], "the agent decides this; remove it")
        self.job = job
        self.dataset: Any = dataset
        self.init_batch_size = int(batch_size)
        self.limits = BatchLimits(self.init_batch_size, self.init_batch_size,
                                  (1, self.init_batch_size), accumulation=False)
        self.sampler = ElasticSampler(len(dataset), shuffle=shuffle, seed=seed)
        self.name = job.new_loader_name(name)
        self.batch_config: BatchConfig | None = None
        self.config_replicas = 0
        """Replicas the batch configuration was chosen for (0: none chosen yet)."""
        self._loader_kwargs = loader_kwargs
        self._current: tuple[int, StepPlan, int, BatchConfig] | None = None
        """(epoch, plan, micro-step, config) of the micro-batch last handed out; the
        :attr:`batch_info` record is built from it only when asked for."""
        self.epoch_padding = 0
        """Padding samples handed out so far this epoch (at most replicas - 1)."""
        self._control = ControlLoop(self)
        job.checkpoint.register(f"pollux/loader/{self.name}", self)

    # -- configuration -------------------------------------------------------------------

    def autoscale_batch_size(self, max_batch_size: int,
                             local_bsz_bounds: tuple[int, int] | None = None,
                             gradient_accumulation: bool = True) -> None:
        """Let the agent pick the batch size between ``batch_size`` and ``max_batch_size``."""
        bounds = local_bsz_bounds if local_bsz_bounds is not None else (1, max_batch_size)
        self.limits = BatchLimits(self.init_batch_size, int(max_batch_size),
                                  (int(bounds[0]), int(bounds[1])),
                                  accumulation=bool(gradient_accumulation))

    @property
    def batch_info(self) -> BatchInfo | None:
        """The micro-batch most recently handed out (for logging and accounting)."""
        if self._current is None:
            return None
        epoch, plan, micro, config = self._current
        rank = self.job.rank
        micro_batches = plan.batches[rank]
        return BatchInfo(epoch=epoch, step_start=plan.start, micro_step=micro,
                         num_micro_steps=len(micro_batches), indices=micro_batches[micro],
                         num_padding=plan.num_padding_in(rank, micro),
                         num_replicas=len(plan.batches), local_bsz=config.local_bsz,
                         accum_steps=config.accum_steps)

    @property
    def current_batch_size(self) -> int | None:
        """Total batch size of the current configuration (None before iterating)."""
        if self.batch_config is None:
            return None
        return self.batch_config.total(self.job.num_replicas)

    def __len__(self) -> int:
        """Micro-batches per epoch on this rank with the current configuration (noise
        probes included: with one replica, an adaptive loader splits every
        ``probe_interval_steps``-th step in two)."""
        config = self.batch_config or BatchConfig(
            math.ceil(self.init_batch_size / self.job.num_replicas))
        num_micro = math.ceil(self.sampler.num_samples
                              / (self.job.num_replicas * config.local_bsz))
        if (self.job.num_replicas == 1 and self.limits.adaptive and config.accum_steps == 0
                and config.local_bsz >= 2):  # noise probes: one more micro-batch each
            num_micro += math.ceil(num_micro / self.job.config.probe_interval_steps)
        return num_micro

    def to_tensorboard(self, writer: Any, step: int, prefix: str = "pollux/") -> None:
        """Add the agent's view of this loader as scalars at ``step`` to ``writer`` (a
        ``torch.utils.tensorboard.SummaryWriter`` or anything with ``add_scalar``):
        ``batch_size``, ``goodput`` and ``throughput`` (samples/s), ``efficiency``,
        ``noise_scale`` (samples), ``local_bsz``, ``accum_steps``, ``lr_factor``,
        ``progress``. Values not known yet are left out. Call on rank 0 (or any).

        >>> writer = SummaryWriter("runs/mnist")  # doctest: +SKIP
        >>> loader.to_tensorboard(writer, epoch)  # doctest: +SKIP
        """
        if self.batch_config is None or self.job.model is None:
            return
        model = self.job.model
        metrics = self._control.metrics(model, model.grad_stats)
        for name, value in metrics.items():
            if value is not None and math.isfinite(value):
                writer.add_scalar(f"{prefix}{name}", value, step)

    # -- checkpoint ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        config = self.batch_config
        return {"sampler": self.sampler.state_dict(),
                "batch_config": None if config is None else [config.local_bsz,
                                                             config.accum_steps],
                "config_replicas": self.config_replicas,
                "epoch_padding": self.epoch_padding}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        config = state.get("batch_config")
        self.batch_config = None if config is None else BatchConfig(int(config[0]),
                                                                    int(config[1]))
        self.config_replicas = int(state.get("config_replicas", 0))
        self.epoch_padding = int(state.get("epoch_padding", 0))

    # -- agreement ---------------------------------------------------------------------

    def _model(self) -> AdaptiveDataParallel:
        if self.job.model is None:
            raise ConfigError("AdaptiveDataParallel", None, "wrap the model with "
                              "AdaptiveDataParallel(..., job=job) before iterating the loader")
        return self.job.model

    # -- iteration ---------------------------------------------------------------------

    def _plan_rest_of_epoch(self, config: BatchConfig,
                            model: AdaptiveDataParallel) -> tuple[list[StepPlan], set[int]]:
        """The steps left in this epoch, and which of them are noise probes (split in two
        micro-batches, see :meth:`AdaptiveDataParallel.wants_probe`)."""
        plans: list[StepPlan] = []
        probes: set[int] = set()
        position = self.sampler.position
        order = self.sampler.order
        # only a loader that adapts its batch size needs the noise (a fixed one keeps
        # exactly one micro-batch per optimizer step)
        may_probe = self.limits.adaptive and config.accum_steps == 0 and config.local_bsz >= 2
        while position < self.sampler.num_samples:
            plan = plan_step(order, position, self.job.num_replicas, config.local_bsz,
                             config.accum_steps)
            if may_probe and plan.regular and model.wants_probe(steps_ahead=len(plans)):
                probes.add(len(plans))
                plan = split_in_halves(plan)
            plans.append(plan)
            position = plan.end
        return plans, probes

    def _torch_loader(self, plans: list[StepPlan]) -> torch.utils.data.DataLoader[Any]:
        rank = self.job.rank
        batches = [batch.tolist() for plan in plans for batch in plan.batches[rank]]
        return torch.utils.data.DataLoader(self.dataset, batch_sampler=batches,
                                           **self._loader_kwargs)

    def __iter__(self) -> Iterator[Any]:
        job = self.job
        model = self._model()
        job.current_dataloader = self
        try:
            yield from self._iterate(model)
        finally:
            job.current_dataloader = None

    def _iterate(self, model: AdaptiveDataParallel) -> Iterator[Any]:
        job = self.job
        if self.sampler.epoch != job.epoch:
            self.epoch_padding = 0
        self.sampler.set_epoch(job.epoch)
        epoch = self.sampler.epoch
        profiling = job.rank == 0
        clock = job.profiler.clock
        self._control.synchronize(model)
        while self.sampler.remaining > 0:
            config = self.batch_config
            assert config is not None
            plans, probes = self._plan_rest_of_epoch(config, model)
            batches = iter(self._torch_loader(plans))
            steps_since_sync = 0
            reconfigured = False
            key = (job.num_nodes, job.num_replicas, config.local_bsz)
            warmup = job.config.profile_warmup_steps
            for step_number, plan in enumerate(plans):
                if steps_since_sync >= self._control.next_sync_steps:
                    steps_since_sync = 0
                    if self._control.synchronize(model):
                        reconfigured = True
                        break
                probe = step_number in probes
                profile_step = (profiling and plan.regular and step_number >= warmup
                                and not probe)
                num_micro = plan.num_micro_steps
                step_batch = plan.total_batch_size
                local_bsz = len(plan.batches[0][0]) if probe else config.local_bsz
                for micro in range(num_micro):
                    last = micro == num_micro - 1
                    start = clock.mark() if profile_step else None
                    data = next(batches)
                    self._current = (epoch, plan, micro, config)
                    model.begin_micro_step(micro, num_micro, local_bsz, step_batch,
                                           self.init_batch_size, plan.regular,
                                           profile_step and last, probe=probe)
                    yield data
                    if start is not None:
                        job.profiler.record(MicroStepTiming(
                            key=key, optimizer_step=last, start=start, end=clock.mark(),
                            compute_end=model.compute_end_mark if last else None))
                self.sampler.commit(plan)
                self.epoch_padding += plan.num_padding
                steps_since_sync += 1
            del batches
            if not reconfigured:
                break
