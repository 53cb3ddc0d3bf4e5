"""Loop shapes: which pass over a data loader a ``for`` loop is, and what it yields.

The rules (``docs/train/loops.md`` explains them with the loops they serve):

1. Every pass over an :class:`~pollux.torch.AdaptiveDataLoader` is a full pass over its
   data set, unless a restart resumes the pass that was in progress when the job stopped.
2. A pass in which the model took an optimizer step is a *training* pass; the others
   (forward passes only) are *evaluation* passes, which are never profiled and never
   move the epoch.
3. Outside :func:`~pollux.torch.remaining_epochs_until`, a training pass that ends (its
   last batch, or a ``break``) ends the epoch: the job's epoch advances, so the next
   pass draws the next epoch's order and a checkpoint records how far the job is.
   Inside it, only ``remaining_epochs_until`` advances the epoch.
4. A restarted script runs again from its top. Passes count in the order the script
   begins them (every loader's together): within the restored epoch under
   ``remaining_epochs_until`` (its earlier epochs are not run again), from the start of
   the run in a plain loop. A pass that had ended before the stop is replayed empty (no
   batch), the one in progress resumes from its cursor, later ones are full.

A :class:`PassMark` (checkpointed with each loader) says where the loader's latest pass
stands; the :class:`PassLog` (a part of the job, not checkpointed: a replayed script
counts its passes again) numbers the passes as they begin.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pollux.torch.job import JobContext


class PassStart(enum.Enum):
    """How a pass that begins now runs."""

    FRESH = "fresh"
    """From the first sample of the epoch's order."""
    RESUME = "resume"
    """From the cursor of the pass in progress when the job stopped."""
    REPLAY = "replay"
    """Empty: the pass had ended before the restart (a replayed script passes it again)."""


@dataclass(frozen=True)
class PassMark:
    """Where a loader's latest pass stands (checkpointed with the loader).

    >>> mark = PassMark(scope=None, index=2, ended=False, trained=True)
    >>> [mark.start_of(None, i).value for i in (1, 2, 3)]
    ['replay', 'resume', 'fresh']
    """

    scope: int | None
    """The epoch the pass was counted in under ``remaining_epochs_until``; None: in a
    plain loop (counted from the start of the run)."""
    index: int
    """The pass's number in its scope, among every loader's passes."""
    ended: bool
    """Whether it ended (its last batch, or a ``break``) before the last checkpoint."""
    trained: bool
    """Whether the model took an optimizer step in it."""

    def start_of(self, scope: int | None, index: int) -> PassStart:
        """How the pass numbered ``index`` in ``scope``, beginning now, runs."""
        if scope != self.scope or index > self.index:
            return PassStart.FRESH
        if index < self.index or self.ended:
            return PassStart.REPLAY
        return PassStart.RESUME

    def to_state(self) -> list[Any]:
        return [self.scope, self.index, self.ended, self.trained]

    @classmethod
    def from_state(cls, state: Any) -> PassMark | None:
        if state is None:
            return None
        scope, index, ended, trained = state
        return cls(None if scope is None else int(scope), int(index), bool(ended),
                   bool(trained))


class PassLog:
    """Numbers the passes of one job as they begin (one per job: :meth:`of`)."""

    def __init__(self, job: JobContext) -> None:
        self._job = job
        self.epoch_loops = 0
        """How many ``remaining_epochs_until`` loops are being iterated now."""
        self._scope: int | None = None
        self._count = 0

    @classmethod
    def of(cls, job: JobContext) -> PassLog:
        """The job's pass log."""
        return job.part(cls, lambda: cls(job))

    @property
    def in_epoch_loop(self) -> bool:
        return self.epoch_loops > 0

    def scope(self) -> int | None:
        """The epoch under ``remaining_epochs_until``, None in a plain loop."""
        return self._job.epoch if self.in_epoch_loop else None

    def begin(self) -> tuple[int | None, int]:
        """(scope, number) of a pass beginning now."""
        scope = self.scope()
        if scope != self._scope:
            self._scope, self._count = scope, 0
        index = self._count
        self._count += 1
        return scope, index
