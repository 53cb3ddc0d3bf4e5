"""``adaptdl.torch.Accumulator``: metrics summed over replicas, AdaptDL's way.

Like :class:`pollux.torch.Accumulator` (which it extends: sums are checkpointed and
survive a restart within the epoch), plus AdaptDL's *synchronized mode*: inside
``with accum.synchronized():`` the accumulator is an ordinary ``dict`` holding the sums
over replicas, and writes there (``accum["accuracy"] = accum["correct"] / accum["total"]``,
``accum.clear()``) stay: the replicas make the same writes, so they keep agreeing.

>>> stats = Accumulator()  # doctest: +SKIP
>>> stats["correct"] += 10  # on each of 2 replicas  # doctest: +SKIP
>>> with stats.synchronized():  # doctest: +SKIP
...     stats["accuracy"] = stats["correct"] / 40
...     print(stats)
{'correct': 20, 'accuracy': 0.5}
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.torch.accumulator import Accumulator as NativeAccumulator


def _call_site(depth: int = 2) -> str:
    frame = inspect.stack()[depth]
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"


class Accumulator(NativeAccumulator):
    """AdaptDL's ``Accumulator(*args, **kwargs)`` (initial values as for ``dict``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        job = DEFAULT_JOB.require("Accumulator")
        super().__init__(job=job, name=f"adaptdl:{_call_site()}")
        initial = dict(*args, **kwargs)
        if initial and job.rank == 0 and not self._local:  # counted once, on rank 0
            for key, value in initial.items():
                self._local[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        synced = self._synced
        value = value.item() if hasattr(value, "item") else value
        if synced is None:
            super().__setitem__(key, value)
            return
        # synchronized mode: every replica writes the same value; rank 0 carries the
        # difference so that later sums over replicas start from it
        if self.job.rank == 0:
            self._local[key] = self._local.get(key, 0) + value - synced.get(key, 0)
        synced[key] = value

    def __delitem__(self, key: str) -> None:
        if self._synced is not None:
            del self._synced[key]
        self._local.pop(key, None)

    def clear(self) -> None:
        """Forget every value (in synchronized mode: on every replica, the sums too)."""
        if self._synced is not None:
            self._synced.clear()
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
