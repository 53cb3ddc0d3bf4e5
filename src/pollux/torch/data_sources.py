"""Where an :class:`~pollux.torch.AdaptiveDataLoader`'s samples come from, besides the
agent's own seeded order of a map-style data set.

* **A custom sampler** (``sampler=`` of a map-style data set: weighted, grouped by
  length, curriculum...): rank 0 draws each epoch's order from it (after
  ``sampler.set_epoch(epoch)`` when it has one) and every replica receives that order, so
  the replicas agree even when the sampler is random and unseeded. The order is
  checkpointed with the cursor: the resume is exact on any number of replicas, as with
  the agent's own order.
* **An IterableDataset** (a stream): every replica reads the whole stream and keeps its
  share of each optimizer step (the step's samples split over the replicas as
  :func:`~pollux.torch.elastic_sampler.plan_step` splits them), so the batch size may
  change at any step and the global cursor counts the samples consumed. A pass ends
  when the stream does. Resuming a pass: a data set with ``state_dict()`` and
  ``load_state_dict()`` (torchdata's ``Stateful`` protocol) is checkpointed with the
  cursor and restored before the stream is read again: exact, and nothing is read
  twice. Without them, the stream is read again from its start and the samples the job
  had consumed are skipped: exact only when the stream yields the same samples in the
  same order every time, and costs reading them again.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch.distributed as dist
import torch.utils.data

from pollux.errors import ConfigError
from pollux.torch.batch_size import BatchConfig
from pollux.torch.elastic_sampler import ElasticSampler, IndexArray, StepPlan, plan_step

if TYPE_CHECKING:
    from pollux.torch.job import JobContext

logger = logging.getLogger(__name__)

Step = tuple[StepPlan, bool, Iterator[Any]]
"""An optimizer step to hand out: its plan, whether it keeps its gradient for the noise
measurement (a probe), and the iterator its micro-batches come from (in order)."""

ProbeRule = Callable[[int], bool] | None
"""``wants_probe(steps_ahead)`` of the model, or None: no step is a probe."""


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` offers ``state_dict()`` and ``load_state_dict(state)``."""
    return callable(getattr(obj, "state_dict", None)) and \
        callable(getattr(obj, "load_state_dict", None))


def draw_order(sampler: Iterable[Any], epoch: int, job: JobContext,
               num_samples: int) -> IndexArray:
    """The order of ``epoch`` drawn by rank 0's ``sampler``, the same on every replica.

    Indices must be integers in ``[0, num_samples)`` (a ``ConfigError`` names the first
    one that is not)."""
    order: IndexArray | None = None
    if job.rank == 0:
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        order = np.fromiter((int(i) for i in sampler), dtype=np.int64)
    if job.num_replicas > 1:
        box: list[Any] = [order]
        dist.broadcast_object_list(box, src=0, group=job.control_group)
        order = box[0]
    assert order is not None
    bad = np.flatnonzero((order < 0) | (order >= num_samples))
    if bad.size:
        raise ConfigError("sampler", int(order[bad[0]]),
                          f"a sampler must yield indices in [0, {num_samples}) (len(dataset))")
    if order.size == 0:
        raise ConfigError("sampler", "no index", "a sampler must yield at least one index")
    return order


class StreamReader:
    """The global cursor into an IterableDataset's stream, and the stream's reader.

    ``state_dict`` holds the epoch, the cursor and, for a stateful data set, its state at
    the cursor (taken at an agreement point, where every replica has read exactly the
    samples of the steps done).
    """

    def __init__(self, dataset: Any, collate: Callable[[list[Any]], Any]) -> None:
        self.dataset = dataset
        self.collate = collate
        self.stateful = is_stateful(dataset)
        self.epoch = 0
        self.position = 0
        """Samples of the stream consumed by completed optimizer steps this pass."""
        self.exhausted = False
        self._iterator: Iterator[Any] | None = None
        self._restored_state: Any = None
        """The data set's state to load when the pass in progress resumes."""

    def start(self, epoch: int, resume: bool) -> None:
        """Open the stream for a pass: from its start, or where the pass stopped."""
        self.exhausted = False
        if not resume:
            self.epoch, self.position, self._restored_state = int(epoch), 0, None
            set_epoch = getattr(self.dataset, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)
            self._iterator = iter(self.dataset)
            return
        if self.stateful and self._restored_state is not None:
            self.dataset.load_state_dict(self._restored_state)
            self._iterator = iter(self.dataset)
        else:
            if self.position:
                logger.info("resuming a stream with no state_dict: reading its first %d "
                            "samples again to skip them", self.position)
            set_epoch = getattr(self.dataset, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)
            self._iterator = iter(self.dataset)
            skipped = sum(1 for _ in itertools.islice(self._iterator, self.position))
            if skipped < self.position:
                raise ConfigError("dataset", f"{skipped} samples",
                                  f"the stream ended before the {self.position} samples the "
                                  "job had consumed; a stream without state_dict() must "
                                  "yield the same samples every time it is iterated")
        self._restored_state = None

    def next_step(self, rank: int, num_replicas: int, local_bsz: int, accum_steps: int,
                  drop_last: bool) -> tuple[StepPlan, list[Any]] | None:
        """Read the next optimizer step's samples: its plan (indices are positions in the
        stream) and this rank's collated micro-batches; None when the pass is over."""
        assert self._iterator is not None
        wanted = num_replicas * local_bsz * (accum_steps + 1)
        chunk = list(itertools.islice(self._iterator, wanted))
        if len(chunk) < wanted:
            self.exhausted = True
        if not chunk or (len(chunk) < wanted and drop_last):
            return None
        start = self.position
        positions = np.arange(start, start + len(chunk), dtype=np.int64)
        plan = plan_step(positions, 0, num_replicas, local_bsz, accum_steps)
        plan = StepPlan(start, plan.num_samples, plan.num_padding, plan.batches,
                        plan.regular, plan.padding)
        batches = [self.collate([chunk[int(i) - start] for i in micro])
                   for micro in plan.batches[rank]]
        return plan, batches

    @property
    def remaining(self) -> int:
        """0 once the pass's stream has ended; before, unknown, read as 1."""
        return 0 if self.exhausted else 1

    def commit(self, plan: StepPlan) -> None:
        if plan.start != self.position:
            raise ConfigError("step.start", plan.start,
                              f"commit steps in order (cursor is at {self.position})")
        self.position = plan.end

    def close(self) -> None:
        self._iterator = None

    def state_dict(self, iterating: bool) -> dict[str, Any]:
        state: Any = self._restored_state
        if iterating and self.stateful:
            state = copy.deepcopy(self.dataset.state_dict())
        return {"epoch": self.epoch, "position": self.position, "dataset": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._restored_state = state.get("dataset")


def check_stream_options(shuffle: bool, sampler: Any, loader_kwargs: dict[str, Any]) -> None:
    """An IterableDataset takes no ``shuffle`` or ``sampler`` (as with PyTorch's loader)
    and is read in this process (``num_workers=0``)."""
    if shuffle:
        raise ConfigError("shuffle", shuffle, "an IterableDataset is read in its own order: "
                          "shuffle inside it (e.g. a shuffle buffer), or drop shuffle=True")
    if sampler is not None:
        raise ConfigError("sampler", sampler, "an IterableDataset takes no sampler")
    unknown = sorted(set(loader_kwargs) - {"collate_fn", "num_workers"})
    if unknown:
        raise ConfigError(unknown[0], loader_kwargs[unknown[0]],
                          "an IterableDataset's loader takes only collate_fn")
    if loader_kwargs.get("num_workers", 0) != 0:
        raise ConfigError("num_workers", loader_kwargs["num_workers"],
                          "an IterableDataset is read by the training process: use 0 "
                          "(do the heavy work in the data set's own threads)")


def planned_steps(sampler: ElasticSampler, dataset: Any, loader_kwargs: dict[str, Any],
                  rank: int, num_replicas: int, config: BatchConfig, drop_last: bool,
                  wants_probe: ProbeRule) -> Generator[Step, None, None]:
    """The steps left in the pass over a map-style data set, planned at once from the
    cursor and loaded by one torch ``DataLoader`` (its workers prefetch across steps).
    With ``drop_last``, the last incomplete step is left out."""
    plans: list[StepPlan] = []
    probes: set[int] = set()
    position = sampler.position
    order = sampler.order
    while position < sampler.num_samples:
        plan = plan_step(order, position, num_replicas, config.local_bsz, config.accum_steps)
        if not plan.regular and drop_last:
            break
        if wants_probe is not None and plan.regular and wants_probe(len(plans)):
            probes.add(len(plans))
        plans.append(plan)
        position = plan.end
    if not plans:
        return
    batch_lists = [batch.tolist() for plan in plans for batch in plan.batches[rank]]
    batches = iter(torch.utils.data.DataLoader(dataset, batch_sampler=batch_lists,
                                               **loader_kwargs))
    for number, plan in enumerate(plans):
        yield plan, number in probes, batches


def stream_steps(stream: StreamReader, rank: int, num_replicas: int, config: BatchConfig,
                 drop_last: bool, wants_probe: ProbeRule) -> Generator[Step, None, None]:
    """The steps of a stream, each read when it is due (after its agreement point, so a
    checkpoint there holds the stream's state at the cursor)."""
    while True:
        step = stream.next_step(rank, num_replicas, config.local_bsz, config.accum_steps,
                                drop_last)
        if step is None:
            return
        plan, batches = step
        probe = wants_probe is not None and plan.regular and wants_probe(0)
        yield plan, probe, iter(batches)
