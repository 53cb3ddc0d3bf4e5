"""``adaptdl.torch.Accumulator``: metrics summed over replicas, AdaptDL's way.

Like :class:`pollux.torch.Accumulator` (which it extends: sums are checkpointed and
survive a restart), plus AdaptDL's *synchronized mode*: inside
``with accum.synchronized():`` the accumulator is an ordinary ``dict`` holding the sums
over replicas, and writes there (``accum["accuracy"] = accum["correct"] / accum["total"]``,
``accum.clear()``) stay: the replicas make the same writes, so they keep agreeing.

After a restart, the code of the interrupted epoch runs again from its start, but the
data loader loops that had finished yield nothing. So that this code sees what it saw
before, each ``synchronized()`` entered outside a data loader loop is recorded (its
values, by epoch and position among the epoch's synchronizations, checkpointed with
the sums), and the same synchronization after the restart *replays* them, as AdaptDL
does: the block reads the recorded values, its writes touch only that copy, and updates
made since the restart, before it (a re-run of code that counted before the restart),
are dropped. An accumulator made outside ``remaining_epochs_until`` keeps its sums
across epochs and restarts; one made inside an epoch is restored only in that epoch.

>>> stats = Accumulator()  # doctest: +SKIP
>>> stats["correct"] += 10  # on each of 2 replicas  # doctest: +SKIP
>>> with stats.synchronized():  # doctest: +SKIP
...     stats["accuracy"] = stats["correct"] / 40
...     print(stats)
{'correct': 20, 'accuracy': 0.5}
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.adaptdl.torch.epoch import current_epoch
from pollux.torch.accumulator import Accumulator as NativeAccumulator


def _call_site(depth: int = 2) -> str:
    frame = inspect.stack()[depth]
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"


class Accumulator(NativeAccumulator):
    """AdaptDL's ``Accumulator(*args, **kwargs)`` (initial values as for ``dict``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        job = DEFAULT_JOB.require("Accumulator")
        self._created_in_epoch = current_epoch()
        self._history: dict[int | None, list[dict[str, Any]]] = {}
        """What each synchronization outside a loader loop read, by epoch (checkpointed)."""
        self._syncs: dict[int | None, int] = {}
        """Synchronizations outside loader loops entered in this run, by epoch."""
        self._replaying = False
        super().__init__(job=job, name=f"adaptdl:{_call_site()}")
        self._at_restart = dict(self._local)
        """This replica's values as restored (what a replayed synchronization resets to)."""
        initial = dict(*args, **kwargs)
        if initial and job.rank == 0 and not self._local:  # counted once, on rank 0
            for key, value in initial.items():
                self._local[key] = value

    # -- checkpoint ---------------------------------------------------------------------

    def restores_values_of(self, epoch: int) -> bool:
        return self._created_in_epoch is None or epoch == self.job.epoch

    def extra_state(self) -> Any:
        return {"history": {epoch: [dict(values) for values in recorded]
                            for epoch, recorded in self._history.items()}}

    def load_extra_state(self, extra: Any) -> None:
        if isinstance(extra, dict) and isinstance(extra.get("history"), dict):
            self._history = {epoch: [dict(values) for values in recorded]
                             for epoch, recorded in extra["history"].items()}

    # -- synchronized mode --------------------------------------------------------------

    @contextlib.contextmanager
    def synchronized(self) -> Iterator[Accumulator]:
        """Within the block, the accumulator is a ``dict`` of the values summed over the
        replicas (a collective, unless it replays a synchronization recorded before a
        restart: see the module)."""
        if self._synced is not None:  # already synchronized
            yield self
            return
        if DEFAULT_JOB.current_loader is not None:  # a loop resumes: never replayed
            self._synced = self.reduced()
        else:
            epoch = current_epoch()
            if epoch is not None:  # finished epochs are never replayed
                self._history = {key: value for key, value in self._history.items()
                                 if key is None or key >= epoch}
            position = self._syncs.get(epoch, 0)
            self._syncs[epoch] = position + 1
            recorded = self._history.setdefault(epoch, [])
            if position < len(recorded):
                self._local = dict(self._at_restart)
                self._synced = dict(recorded[position])
                self._replaying = True
            else:
                self._synced = self.reduced()
                recorded.append(dict(self._synced))
                self.written_epoch = self.job.epoch
        try:
            yield self
        finally:
            self._synced = None
            self._replaying = False

    def __setitem__(self, key: str, value: Any) -> None:
        synced = self._synced
        value = value.item() if hasattr(value, "item") else value
        if synced is None:
            super().__setitem__(key, value)
            return
        # synchronized mode: every replica writes the same value; rank 0 carries the
        # difference so that later sums over replicas start from it (not when replaying:
        # the live sums are already past this point)
        if self.job.rank == 0 and not self._replaying:
            self._local[key] = self._local.get(key, 0) + value - synced.get(key, 0)
        synced[key] = value

    def __delitem__(self, key: str) -> None:
        if self._synced is not None:
            del self._synced[key]
        if not self._replaying:
            self._local.pop(key, None)

    def clear(self) -> None:
        """Forget every value (in synchronized mode: on every replica, the sums too)."""
        if self._synced is not None:
            self._synced.clear()
        if not self._replaying:
            self._local.clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Add the given values (AdaptDL's additive ``update``)."""
        for key, value in dict(*args, **kwargs).items():
            self[key] += value

    def subtract(self, *args: Any, **kwargs: Any) -> None:
        """Subtract the given values."""
        for key, value in dict(*args, **kwargs).items():
            self[key] -= value

    def __iadd__(self, other: Mapping[str, Any]) -> Accumulator:
        self.update(other)
        return self

    def __isub__(self, other: Mapping[str, Any]) -> Accumulator:
        self.subtract(other)
        return self

    def __repr__(self) -> str:
        return repr(dict(self._synced if self._synced is not None else self._local))
