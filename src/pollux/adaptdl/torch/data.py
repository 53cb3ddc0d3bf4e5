"""``adaptdl.torch.data``: ``AdaptiveDataLoader`` and ``current_dataloader`` with
AdaptDL's call shapes, over :class:`pollux.torch.AdaptiveDataLoader`.

Differences from the native loader, all AdaptDL's behaviour:

* no ``job`` argument, and it may be created before ``init_process_group`` (it joins
  the job when the job exists; loaders are named by the epoch they are made in and
  their rank there, so a restart restores each one);
* ``current_local_bsz``, ``accumulation_steps``, ``current_batch_size``, ``training``
  and ``to_tensorboard(writer, step, tag_prefix="")`` with AdaptDL's tags.

The defaults are the same: ``shuffle=False``, ``drop_last=False``, no gradient
accumulation unless asked (``autoscale_batch_size(..., gradient_accumulation=True)``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.adaptdl.torch.custom import (
    AdaptiveDataLoaderHelper,
    check_autoscale,
    loader_name,
    write_loader_scalars,
)
from pollux.adaptdl.torch.sampler import ElasticSampler
from pollux.torch.data_loader import AdaptiveDataLoader as NativeLoader

if TYPE_CHECKING:
    from pollux.torch.job import JobContext

__all__ = ["AdaptiveDataLoader", "AdaptiveDataLoaderMixin", "ElasticSampler",
           "current_dataloader"]


def current_dataloader() -> Any:
    """The loader being iterated now, the very object the user made (AdaptDL returns its
    helper, ``loader._elastic``, whose public attributes the loader has too), or None;
    ``pollux.torch.current_dataloader(job)`` answers the same object."""
    return DEFAULT_JOB.current_loader


class AdaptiveDataLoaderMixin:
    """AdaptDL's base for custom loaders: ``self._elastic`` (an
    :class:`~pollux.adaptdl.torch.custom.AdaptiveDataLoaderHelper`, see that module for
    the loop a custom loader writes) and the public methods of AdaptDL's loaders.

    >>> class Stream(Reader, AdaptiveDataLoaderMixin):  # doctest: +SKIP
    ...     def __init__(self, path, batch_size):
    ...         Reader.__init__(self, path)
    ...         AdaptiveDataLoaderMixin.__init__(self, batch_size)
    """

    _elastic: AdaptiveDataLoaderHelper | _NativeBacked

    def __init__(self, batch_size: int) -> None:
        self.batch_size = int(batch_size)
        self._elastic = AdaptiveDataLoaderHelper(batch_size, owner=self)

    def autoscale_batch_size(self, max_batch_size: int,
                             local_bsz_bounds: tuple[int, int] | None = None,
                             gradient_accumulation: bool = False) -> None:
        """Let the agent choose the total batch size between ``batch_size`` and
        ``max_batch_size``, with a local batch in ``local_bsz_bounds`` on each replica
        and, only if asked (and only for :class:`AdaptiveDataLoader`), accumulation."""
        self._elastic.autoscale_batch_size(max_batch_size, local_bsz_bounds,
                                           gradient_accumulation)

    @property
    def max_batch_size(self) -> int | None:
        """The largest total batch size allowed (None: the batch size is fixed)."""
        return self._elastic.max_batch_size

    @property
    def local_bsz_bounds(self) -> tuple[int, int] | None:
        return self._elastic.local_bsz_bounds

    @property
    def training(self) -> bool:
        """Whether this loader adapts its batch size (AdaptDL's training loader)."""
        return self._elastic.training

    @property
    def current_local_bsz(self) -> int | None:
        """Samples per replica per micro-batch now (None before the first loop)."""
        return self._elastic.current_local_bsz

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step, less one (0 without accumulation)."""
        return self._elastic.accumulation_steps

    @property
    def current_batch_size(self) -> int | None:
        """Total batch size over all replicas and micro-steps now."""
        return self._elastic.current_batch_size

    def to_tensorboard(self, writer: Any, global_step: int, tag_prefix: str = "") -> None:
        """Add ``Total_Batch_Size``, ``Local_Batch_Size`` and ``Accumulation_Steps``
        (AdaptDL's tags, under ``tag_prefix``) to a ``SummaryWriter``."""
        write_loader_scalars(writer, global_step, tag_prefix, self.current_batch_size,
                             self.current_local_bsz, self.accumulation_steps)


class _NativeBacked:
    """The state of an :class:`AdaptiveDataLoader`, read by its public methods."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.native: NativeLoader | None = None
        self.autoscale: tuple[int, tuple[int, int], bool] | None = None

    def autoscale_batch_size(self, max_batch_size: int,
                             local_bsz_bounds: tuple[int, int] | None = None,
                             gradient_accumulation: bool = False) -> None:
        check_autoscale(self.batch_size, max_batch_size, local_bsz_bounds)
        low, high = local_bsz_bounds if local_bsz_bounds is not None else (None, None)
        bounds = (int(low) if low is not None else 1,
                  int(high) if high is not None else max_batch_size)
        self.autoscale = (max_batch_size, bounds, bool(gradient_accumulation))
        if self.native is not None:
            self.native.autoscale_batch_size(*self.autoscale)

    @property
    def max_batch_size(self) -> int | None:
        return None if self.autoscale is None else self.autoscale[0]

    @property
    def local_bsz_bounds(self) -> tuple[int, int] | None:
        return None if self.autoscale is None else self.autoscale[1]

    @property
    def training(self) -> bool:
        return self.autoscale is not None

    @property
    def current_local_bsz(self) -> int | None:
        config = None if self.native is None else self.native.batch_config
        return None if config is None else config.local_bsz

    @property
    def accumulation_steps(self) -> int:
        config = None if self.native is None else self.native.batch_config
        return 0 if config is None else config.accum_steps

    @property
    def current_batch_size(self) -> int | None:
        return None if self.native is None else self.native.current_batch_size


class AdaptiveDataLoader(AdaptiveDataLoaderMixin):
    """AdaptDL's ``AdaptiveDataLoader(dataset, batch_size=1, shuffle=False, **kwargs)``.

    ``batch_size`` is the initial total batch size over all replicas; ``drop_last``,
    ``num_workers``, ``collate_fn``, ``pin_memory``, ... are PyTorch's; ``sampler`` and
    ``batch_sampler`` are not allowed (the agent's elastic sampler decides).

    >>> loader = AdaptiveDataLoader(dataset, batch_size=64, shuffle=True)  # doctest: +SKIP
    >>> loader.autoscale_batch_size(1024, local_bsz_bounds=(32, 128))  # doctest: +SKIP
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 **kwargs: Any) -> None:
        if kwargs.get("sampler") is not None or kwargs.get("batch_sampler") is not None:
            raise ValueError("AdaptiveDataLoader does not support a custom 'sampler' or "
                             "'batch_sampler': remove it (the agent's elastic sampler "
                             "partitions the data over replicas)")
        kwargs.pop("sampler", None)
        kwargs.pop("batch_sampler", None)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"invalid batch_size={batch_size!r}: give an int >= 1")
        self.batch_size = batch_size
        self._elastic = _NativeBacked(batch_size)
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.drop_last = bool(kwargs.pop("drop_last", False))
        self._kwargs = kwargs
        self.name = loader_name("adaptdl-loader")
        DEFAULT_JOB.when_bound(self._bind)

    def _bind(self, job: JobContext) -> None:
        native = NativeLoader(self.dataset, self.batch_size, self.shuffle, job=job,
                              name=self.name, drop_last=self.drop_last, **self._kwargs)
        elastic = cast(_NativeBacked, self._elastic)
        elastic.native = native
        if elastic.autoscale is not None:
            native.autoscale_batch_size(*elastic.autoscale)

    @property
    def _native(self) -> NativeLoader | None:
        return cast(_NativeBacked, self._elastic).native

    def _require(self) -> NativeLoader:
        if self._native is None:
            DEFAULT_JOB.require("iterating an AdaptiveDataLoader")
        assert self._native is not None
        return self._native

    def __iter__(self) -> Iterator[Any]:
        native = self._require()
        if DEFAULT_JOB.current_loader is not None:
            raise RuntimeError("overlapping data loader loops: finish iterating one "
                               "AdaptiveDataLoader before starting another")
        DEFAULT_JOB.current_loader = self
        try:
            for batch in native:
                # pollux.torch.current_dataloader(job) answers the loader the user made
                native.job.current_dataloader = self
                yield batch
        finally:
            DEFAULT_JOB.current_loader = None

    def __len__(self) -> int:
        """Batches this replica gets per epoch with the current batch size."""
        if self._native is not None:
            return len(self._native)
        total = len(self.dataset)
        return total // self.batch_size if self.drop_last else math.ceil(total / self.batch_size)
