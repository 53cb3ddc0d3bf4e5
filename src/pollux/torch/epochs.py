"""``remaining_epochs_until``: the epoch loop that resumes where a restarted job stopped;
``epoch_scope`` for a framework's own epoch loop; ``current_epoch`` and
``current_dataloader`` for code deep in a training loop."""

from __future__ import annotations

import contextlib
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
    with epoch_scope(job):
        while job.epoch < num_epochs:
            yield job.epoch
            job.finish_epoch()
    job.checkpoint.save()


@contextlib.contextmanager
def epoch_scope(job: JobContext) -> Iterator[None]:
    """Inside, the passes over the job's loaders are counted within the job's epoch and
    never move it: the caller does (``job.finish_epoch()``), as
    :func:`remaining_epochs_until` does. For a framework's own epoch loop that starts
    again at the restored epoch after a restart (a ``Trainer``), so that its first pass
    resumes the one in progress instead of being taken for a replay of the run's first
    pass (:mod:`pollux.torch.passes`).

    >>> with epoch_scope(job):  # doctest: +SKIP
    ...     while job.epoch < num_epochs:
    ...         train_one_epoch(loader)
    ...         job.finish_epoch()
    """
    log = PassLog.of(job)
    log.epoch_loops += 1
    try:
        yield
    finally:
        log.epoch_loops -= 1


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
