"""``remaining_epochs_until``: the epoch loop that resumes where a restarted job stopped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pollux.errors import ConfigError

if TYPE_CHECKING:
    from pollux.torch.job import JobContext


def remaining_epochs_until(num_epochs: int, job: JobContext) -> Iterator[int]:
    """Yield the epochs still to run, from the checkpointed epoch up to ``num_epochs - 1``.

    After a restart mid-epoch, that epoch is yielded again and the data loader continues
    from its cursor. When every epoch is done, a final checkpoint is saved, so a finished
    job relaunched by mistake ends at once.
    """
    if num_epochs < 0:
        raise ConfigError("num_epochs", num_epochs, "must be >= 0")
    while job.epoch < num_epochs:
        yield job.epoch
        job.finish_epoch()
    job.checkpoint.save()
