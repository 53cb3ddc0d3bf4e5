"""``adaptdl.torch.epoch``: the epoch loop of the default job.

>>> for epoch in remaining_epochs_until(30):  # doctest: +SKIP
...     train(epoch)
"""

from __future__ import annotations

from collections.abc import Iterator

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.torch import epochs


def remaining_epochs_until(epoch: int) -> Iterator[int]:
    """The epochs still to run, up to ``epoch - 1``, resuming after a restart from the
    epoch it stopped in (see :func:`pollux.torch.remaining_epochs_until`)."""
    job = DEFAULT_JOB.require("remaining_epochs_until")
    if DEFAULT_JOB.in_epoch_loop:
        raise RuntimeError("overlapping epoch loops: remaining_epochs_until is already "
                           "being iterated")
    DEFAULT_JOB.in_epoch_loop = True
    try:
        yield from epochs.remaining_epochs_until(epoch, job)
    finally:
        DEFAULT_JOB.in_epoch_loop = False


def current_epoch() -> int | None:
    """The epoch being iterated by :func:`remaining_epochs_until`, else None."""
    job = DEFAULT_JOB.job
    if job is None or not DEFAULT_JOB.in_epoch_loop:
        return None
    return job.epoch


def finished_epochs() -> int:
    """Epochs finished so far (restored after a restart)."""
    return DEFAULT_JOB.require("finished_epochs").epoch
