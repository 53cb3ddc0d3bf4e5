"""AdaptiveDataLoader: hands each replica its micro-batches and runs the job's rhythm.

Iterating the loader drives what must happen at optimizer-step boundaries on every rank
at once: the agreement points of the control loop (:mod:`pollux.torch.control_loop`: a
stop request leads to a checkpoint and exit, a periodic checkpoint, a new batch
configuration); the sampler's cursor moves past each step once the user asks for the
next batch (a checkpoint never loses or repeats a step's samples, even in the middle of
an accumulation). It also marks micro-step times for the profile and reports hints.

The ``batch_size`` given is the initial *total* batch size ``M0``, split over replicas.
The defaults are PyTorch's ``DataLoader``'s (and AdaptDL's): ``shuffle=False``,
``drop_last=False``, and ``autoscale_batch_size`` accumulates gradients only when asked
(``gradient_accumulation=True``). Every micro-batch handed out holds the configuration's
local batch size, except in the epoch's last step (or none of it, with ``drop_last``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Generator, Iterator, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.utils.data
from torch.utils.data import default_collate

from pollux.errors import ConfigError
from pollux.torch.batch_size import BatchConfig, BatchLimits
from pollux.torch.control_loop import ControlLoop
from pollux.torch.data_sources import (
    Step,
    StreamReader,
    check_stream_options,
    draw_order,
    planned_steps,
    stream_steps,
)
from pollux.torch.elastic_sampler import ElasticSampler, IndexArray, StepPlan
from pollux.torch.passes import PassLog, PassMark, PassStart
from pollux.torch.profiler import MicroStepTiming

if TYPE_CHECKING:
    from pollux.torch.job import JobContext
    from pollux.torch.roles import DrivenModel

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


class AdaptiveDataLoader:
    """Data loader over an elastic, seeded, checkpointed sample order.

    Extra keyword arguments go to :class:`torch.utils.data.DataLoader` (``num_workers``,
    ``collate_fn``, ``pin_memory``, ...). A ``sampler=`` draws each epoch's order (rank
    0's, checkpointed); an ``IterableDataset`` is read as a stream (see
    :mod:`pollux.torch.data_sources` for both); ``batch_sampler`` is the agent's.
    ``shuffle`` (default False, as in PyTorch) draws a new seeded order every epoch;
    ``drop_last`` (default False) drops the epoch's last, incomplete optimizer step (fewer
    samples than the total batch) instead of spreading it over the replicas.

    >>> loader = AdaptiveDataLoader(dataset, batch_size=64, job=job, num_workers=2)  # doctest: +SKIP
    >>> loader.autoscale_batch_size(1024, local_bsz_bounds=(16, 256))  # doctest: +SKIP
    >>> for x, y in loader:  # doctest: +SKIP
    ...     ...
    """

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool = False, *,
                 job: JobContext, seed: int = 0, name: str | None = None,
                 drop_last: bool = False, **loader_kwargs: Any) -> None:
        if "batch_sampler" in loader_kwargs:
            raise ConfigError("batch_sampler", loader_kwargs["batch_sampler"],
                              "the agent decides the batches; give a sampler= instead")
        custom_sampler = loader_kwargs.pop("sampler", None)
        streaming = isinstance(dataset, torch.utils.data.IterableDataset) or (
            not isinstance(dataset, Sized) and hasattr(dataset, "__iter__"))
        if not streaming and not isinstance(dataset, Sized):
            raise ConfigError("dataset", type(dataset).__name__, "give a map-style data set "
                              "(__len__ and __getitem__) or an IterableDataset")
        if streaming:
            check_stream_options(shuffle, custom_sampler, loader_kwargs)
        self.job = job
        self.dataset: Any = dataset
        self.init_batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.limits = BatchLimits(self.init_batch_size, self.init_batch_size,
                                  (1, self.init_batch_size), accumulation=False)
        self.custom_sampler: Any = custom_sampler
        """The ``sampler=`` given (rank 0 draws each epoch's order from it), or None."""
        self.sampler: ElasticSampler | StreamReader = (
            StreamReader(dataset, loader_kwargs.get("collate_fn") or default_collate)
            if streaming else ElasticSampler(len(dataset), shuffle=shuffle, seed=seed))
        """The cursor: into the epoch order of a map-style data set, or into a stream."""
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
        self.trains: bool | None = None
        """Whether optimizer steps are taken while iterating this loader (True: a
        training loader; False: an evaluation loader, which runs forward passes only;
        None: not iterated yet). An evaluation loader reports no hints."""
        self._handed_out = 0
        """Micro-batches of the steps completed in this pass by this process (for
        ``len``)."""
        self.mark: PassMark | None = None
        """Where this loader's latest pass stands (:mod:`pollux.torch.passes`; None: no
        pass yet)."""
        self._noted_no_model = False
        self._control = ControlLoop(self)
        job.checkpoint.register(f"pollux/loader/{self.name}", self)

    # -- configuration -------------------------------------------------------------------

    def autoscale_batch_size(self, max_batch_size: int,
                             local_bsz_bounds: tuple[int, int] | None = None,
                             gradient_accumulation: bool = False) -> None:
        """Let the agent pick the batch size between ``batch_size`` and ``max_batch_size``,
        with a per-replica batch within ``local_bsz_bounds`` and, only if
        ``gradient_accumulation``, several micro-batches per optimizer step."""
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
        """Micro-batches of this pass on this rank: those of the steps completed so far
        in it plus those the rest of it takes with the current configuration (between
        passes: a whole pass, or the rest of the pass a restart resumes). Equal to the
        iterations of a pass when the batch size does not change during it."""
        config = self.batch_config or BatchConfig(
            math.ceil(self.init_batch_size / self.job.num_replicas))
        sampler = self.sampler
        if isinstance(sampler, StreamReader):
            if not isinstance(self.dataset, Sized):
                raise TypeError("an AdaptiveDataLoader over an IterableDataset without "
                                "__len__ has no len()")
            total = len(self.dataset)
            remaining = max(total - sampler.position, 0)
        else:
            total, remaining = sampler.num_samples, sampler.remaining
            if self.custom_sampler is not None and not sampler.drawn:
                total = len(self.custom_sampler)
        mark = self.mark
        replicas = self.job.num_replicas
        if mark is None or mark.ended:
            return config.micro_batches_per_rank(total, replicas, self.drop_last)
        return self._handed_out + config.micro_batches_per_rank(remaining, replicas,
                                                                self.drop_last)

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
        sampler = self.sampler
        return {"sampler": (sampler.state_dict(self.job.current_dataloader is self)
                            if isinstance(sampler, StreamReader) else sampler.state_dict()),
                "batch_config": None if config is None else [config.local_bsz,
                                                             config.accum_steps],
                "config_replicas": self.config_replicas,
                "epoch_padding": self.epoch_padding,
                "pass": None if self.mark is None else self.mark.to_state(),
                "trains": self.trains}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        config = state.get("batch_config")
        self.batch_config = None if config is None else BatchConfig(int(config[0]),
                                                                    int(config[1]))
        self.config_replicas = int(state.get("config_replicas", 0))
        self.epoch_padding = int(state.get("epoch_padding", 0))
        self.mark = PassMark.from_state(state.get("pass"))
        trains = state.get("trains")
        self.trains = None if trains is None else bool(trains)

    # -- agreement ---------------------------------------------------------------------

    def _model(self) -> DrivenModel | None:
        """The model that drives the job; None (noted once) when no model was wrapped:
        the loader hands out every batch at its initial size, without adaptation."""
        if self.job.model is None and not self._noted_no_model:
            self._noted_no_model = True
            logger.warning("loader %r is iterated with no AdaptiveDataParallel model: "
                           "batch size fixed at %d, nothing measured (wrap the model with "
                           "AdaptiveDataParallel(..., job=job) to adapt)", self.name,
                           self.init_batch_size)
        return self.job.model

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """One pass: full, or the rest of the pass a restart resumes, or empty when a
        restarted script replays a pass that had ended (:mod:`pollux.torch.passes`)."""
        job = self.job
        model = self._model()
        scope, index = PassLog.of(job).begin()
        start = PassStart.FRESH if self.mark is None else self.mark.start_of(scope, index)
        if start is PassStart.REPLAY:
            logger.debug("loader %r: pass %d ended before the restart; replayed empty",
                         self.name, index)
            return
        trained = False
        sampler = self.sampler
        if start is PassStart.FRESH:
            if isinstance(sampler, StreamReader):
                sampler.start(job.epoch, resume=False)
            else:
                order = (None if self.custom_sampler is None else
                         draw_order(self.custom_sampler, job.epoch, job, len(self.dataset)))
                sampler.start_pass(job.epoch, order)
            self.epoch_padding = 0
            self._handed_out = 0
        else:
            assert self.mark is not None
            trained = self.mark.trained
            if isinstance(sampler, StreamReader):
                sampler.start(sampler.epoch, resume=True)
            logger.info("loader %r: resuming its pass at sample %d", self.name,
                        sampler.position)
        self.mark = PassMark(scope, index, ended=False, trained=trained)
        job.current_dataloader = self
        ended = False
        try:
            yield from self._iterate(model)
            ended = True
        except GeneratorExit:  # a break (or the loop's iterator dropped): the pass ends
            ended = True
            raise
        finally:
            job.current_dataloader = None
            self._control.stop_watch.settle()
            if isinstance(sampler, StreamReader):
                sampler.close()
            if ended:
                self._end_pass()

    def _end_pass(self) -> None:
        mark = self.mark
        assert mark is not None
        self.mark = PassMark(mark.scope, mark.index, ended=True, trained=mark.trained)
        if mark.trained and mark.scope is None:  # a plain loop: the epoch ends with it
            self.job.finish_epoch()

    def _trained_now(self) -> None:
        mark = self.mark
        if mark is not None and not mark.trained:
            self.mark = PassMark(mark.scope, mark.index, mark.ended, trained=True)

    def _steps(self, config: BatchConfig,
               model: DrivenModel | None) -> Generator[Step, None, None]:
        """The steps left in this pass with ``config``; a step keeps its gradient for the
        noise measurement of one replica (a probe) when the loader adapts its batch size
        and :meth:`AdaptiveDataParallel.wants_probe` says so."""
        job = self.job
        may_probe = model is not None and self.limits.adaptive and config.accum_steps == 0
        wants_probe = model.wants_probe if may_probe and model is not None else None
        sampler = self.sampler
        if isinstance(sampler, StreamReader):
            return stream_steps(sampler, job.rank, job.num_replicas, config,
                                self.drop_last, wants_probe)
        return planned_steps(sampler, self.dataset, self._loader_kwargs, job.rank,
                             job.num_replicas, config, self.drop_last, wants_probe)

    def _iterate(self, model: DrivenModel | None) -> Iterator[Any]:
        job = self.job
        epoch = self.sampler.epoch
        profiling = job.rank == 0 and model is not None
        clock = job.profiler.clock
        self._control.synchronize(model)
        while self.sampler.remaining > 0:  # a stream's: 1 until it has ended
            config = self.batch_config
            assert config is not None
            steps = self._steps(config, model)
            steps_since_sync = 0
            reconfigured = False
            key = (job.num_nodes, job.num_replicas, config.local_bsz)
            warmup = job.config.profile_warmup_steps
            step_number = 0
            while True:
                stopping = self._control.stop_watch.poll(job.stop_requested.is_set())
                if stopping or steps_since_sync >= self._control.next_sync_steps:
                    steps_since_sync = 0
                    if self._control.synchronize(model):
                        reconfigured = True
                        break
                step = next(steps, None)
                if step is None:
                    break
                plan, probe, batches = step
                profile_step = profiling and plan.regular and step_number >= warmup
                num_micro = plan.num_micro_steps
                step_batch = plan.total_batch_size
                for micro in range(num_micro):
                    last = micro == num_micro - 1
                    data = next(batches)
                    self._current = (epoch, plan, micro, config)
                    if model is None:  # no model to tell training from evaluation
                        yield data
                        self._trained_now()
                        continue
                    steps_before = model.optimizer_steps
                    start = clock.mark() if profile_step else None
                    model.begin_micro_step(micro, num_micro, config.local_bsz, step_batch,
                                           self.init_batch_size, plan.regular,
                                           profile_step and last, probe=probe)
                    yield data
                    # only what trained is a step: an evaluation pass (forward only) over
                    # a loader is neither profiled nor counted as training
                    trained = (model.optimizer_steps > steps_before if last
                               else model.has_pending_gradients)
                    self.trains = bool(self.trains) or trained
                    if trained:
                        self._trained_now()
                    if start is not None and trained:
                        job.profiler.record(MicroStepTiming(
                            key=key, optimizer_step=last, start=start, end=clock.mark(),
                            compute_end=model.compute_end_mark if last else None))
                self.sampler.commit(plan)
                self._handed_out += num_micro
                self.epoch_padding += plan.num_padding
                steps_since_sync += 1
                step_number += 1
                self._control.steps_done += 1
            steps.close()
            if not reconfigured:
                break
        config = self.batch_config
        rest = (self.sampler.plan(job.num_replicas, config.local_bsz, config.accum_steps)
                if isinstance(self.sampler, ElasticSampler) and config is not None else None)
        if rest is not None:  # drop_last: the incomplete last step is skipped
            self.sampler.commit(rest)

