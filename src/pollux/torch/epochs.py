"""``remaining_epochs_until``: the epoch loop that resumes where a restarted job stopped;
``current_epoch`` and ``current_dataloader`` for code deep in a training loop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from pollux.errors import ConfigError
from pollux.torch.passes import PassLog

if TYPE_CHECKING:
    from pollux.torch.data_loader import AdaptiveDataLoader
    from pollux.torch.job import JobContext


def remaining_epochs_until(num_epochs: int, job: JobContext) -> Iterator[int]:
    """Yield the epochs still to run, from the checkpointed epoch up to ``num_epochs - 1``.

    After a restart mid-epoch, that epoch is yielded again and the data loader continues
    from its cursor. When every epoch is done, a final checkpoint is saved, so a finished
    job relaunched by mistake ends at once. Inside this loop only it moves the epoch
    (a training pass does in a plain loop: :mod:`pollux.torch.passes`).

    >>> for epoch in remaining_epochs_until(30, job):  # doctest: +SKIP
    ...     train_one_epoch(epoch)
    """
    if num_epochs < 0:
        raise ConfigError("num_epochs", num_epochs, "must be >= 0")
    log = PassLog.of(job)
    log.epoch_loops += 1
    try:
        while job.epoch < num_epochs:
            yield job.epoch
            job.finish_epoch()
    finally:
        log.epoch_loops -= 1
    job.checkpoint.save()


def current_epoch(job: JobContext) -> int:
    """The epoch being trained (restored after a restart).

    >>> current_epoch(job)  # doctest: +SKIP
    0
    """
    return job.epoch


def current_dataloader(job: JobContext) -> AdaptiveDataLoader | None:
    """The :class:`~pollux.torch.AdaptiveDataLoader` being iterated now, or None.

    >>> loader = current_dataloader(job)  # doctest: +SKIP
    >>> loader.current_batch_size  # doctest: +SKIP
    64
    """
    return cast("AdaptiveDataLoader | None", job.current_dataloader)
