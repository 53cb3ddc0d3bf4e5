"""``adaptdl.torch.epoch``: the epoch loop of the default job.

>>> for epoch in remaining_epochs_until(30):  # doctest: +SKIP
...     train(epoch)
"""

from __future__ import annotations

from collections.abc import Iterator

from pollux.adaptdl.checkpoint import early_states
from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.torch import epochs

JOB_STATE = "pollux/job"
"""The checkpoint entry of the job's epoch counter (:class:`pollux.torch.JobContext`)."""


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
    """Epochs finished so far (restored after a restart). Before ``init_process_group``,
    the count in the checkpoint the job would restart from (0 without one), as AdaptDL
    reads it."""
    job = DEFAULT_JOB.job
    if job is not None:
        return job.epoch
    saved = early_states().get(JOB_STATE)
    return int(saved["epoch"]) if isinstance(saved, dict) and "epoch" in saved else 0
