"""``Accumulator``: metrics summed (or averaged, or maxed) over replicas.

Each replica adds its own numbers like into a ``dict`` (``acc["loss"] += loss.item()``);
inside ``with acc.synchronized():`` every read gives the value reduced over all replicas.
Entering ``synchronized()`` is a collective: every replica enters it at the same point.

The values are checkpointed with the job, so an accumulator that spans training steps
(e.g. the loss of an epoch) survives a rescale: a restarted job, on any number of
replicas, continues the same sums. State saved in an earlier epoch is not restored (an
evaluation's accumulator of the previous epoch does not leak into this one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Literal

import torch.distributed as dist

from pollux.errors import ConfigError

if TYPE_CHECKING:
    from pollux.torch.job import JobContext

Reduction = Literal["sum", "mean", "max"]
REDUCTIONS: tuple[str, ...] = ("sum", "mean", "max")


def _reduce(how: str, values: list[float]) -> float:
    if how == "max":
        return max(values)
    total = sum(values)
    return total / len(values) if how == "mean" else total


def _number(value: Any) -> float:
    """A Python number from ``value`` (a tensor or numpy scalar via ``item()``): integers
    stay integers (so sums of counts read 7, not 7.0), booleans become 0/1, the rest float."""
    plain = value.item() if hasattr(value, "item") else value
    if isinstance(plain, bool):
        return int(plain)
    if isinstance(plain, int):
        return plain
    return float(plain)


class AccumulatorStates:
    """Every accumulator of a job by name, checkpointed as one state object."""

    def __init__(self, job: JobContext) -> None:
        self._job = job
        self._live: dict[str, Accumulator] = {}
        self._restored: dict[str, dict[str, Any]] = {}

    @classmethod
    def of(cls, job: JobContext) -> AccumulatorStates:
        """The job's accumulators (made and checkpointed with the first one)."""

        def make() -> AccumulatorStates:
            states = cls(job)
            job.checkpoint.register("pollux/accumulators", states)
            return states

        return job.part(cls, make)

    def attach(self, name: str, accumulator: Accumulator) -> dict[str, Any] | None:
        """Track ``accumulator`` under ``name`` (replacing an older one); returns what
        the checkpoint saved for it (``epoch``, ``values`` and, when the accumulator kept
        any, ``extra``), or None."""
        self._live[name] = accumulator
        return self._restored.pop(name, None)

    def state_dict(self) -> dict[str, Any]:
        states: dict[str, Any] = {}
        for name, acc in self._live.items():
            record = {"epoch": acc.written_epoch, "values": acc.reduced_for_checkpoint()}
            extra = acc.extra_state()
            if extra is not None:
                record["extra"] = extra
            states[name] = record
        return states

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restored = dict(state)


class Accumulator(MutableMapping[str, float]):
    """Named numbers added up on each replica and reduced over replicas when read.

    ``reductions`` maps a name to ``"sum"`` (default), ``"mean"`` (of the replicas'
    values) or ``"max"``. Integers (and integer tensors) stay integers: a sum or maximum
    of counts reads ``7``, not ``7.0``; a mean is a float. ``name`` identifies the accumulator in checkpoints (default:
    where it is created, so one created anew in a function keeps its identity).

    >>> acc = Accumulator(job=job, reductions={"best": "max"})  # doctest: +SKIP
    >>> acc["loss_sum"] += 2.5; acc["count"] += 10; acc["best"] = 0.9  # doctest: +SKIP
    >>> with acc.synchronized():  # every replica, at the same point  # doctest: +SKIP
    ...     print(acc["loss_sum"] / acc["count"], acc["best"])
    0.25 0.9
    """

    def __init__(self, *, job: JobContext, reductions: Mapping[str, Reduction] | None = None,
                 name: str | None = None) -> None:
        for key, how in (reductions or {}).items():
            if how not in REDUCTIONS:
                raise ConfigError(f"reductions[{key!r}]", how,
                                  f"choose from: {', '.join(REDUCTIONS)}")
        self.job = job
        self.reductions: dict[str, str] = dict(reductions or {})
        self.name = name if name is not None else _caller_site()
        self._local: dict[str, float] = {}
        self._synced: dict[str, float] | None = None
        self.written_epoch = job.epoch
        """The epoch of the last write (a checkpoint restores the values in that epoch)."""
        saved = AccumulatorStates.of(job).attach(self.name, self)
        if saved is not None:
            self.load_extra_state(saved.get("extra"))
            if self.restores_values_of(int(saved["epoch"])):
                self._local = self._share_of(dict(saved["values"]))

    # -- the mapping ------------------------------------------------------------------------

    def __getitem__(self, key: str) -> float:
        values = self._synced if self._synced is not None else self._local
        return values.get(key, 0)  # a missing name reads 0, so `acc[k] += x` just works

    def __setitem__(self, key: str, value: Any) -> None:
        if self._synced is not None:
            raise ConfigError("Accumulator", key, "write outside `with acc.synchronized()`")
        self._local[key] = _number(value)
        self.written_epoch = self.job.epoch

    def __delitem__(self, key: str) -> None:
        del self._local[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._synced if self._synced is not None else self._local)

    def __len__(self) -> int:
        return len(self._synced if self._synced is not None else self._local)

    def reset(self) -> None:
        """Forget this replica's values (e.g. at the start of an epoch)."""
        self._local.clear()

    # -- reduction --------------------------------------------------------------------------

    def reduced(self) -> dict[str, float]:
        """Every value reduced over all replicas (a collective: call on every replica)."""
        gathered = self._gather()
        keys = sorted({key for values in gathered for key in values})
        return {key: _reduce(self.reductions.get(key, "sum"),
                             [values.get(key, 0) for values in gathered]
                             if self.reductions.get(key, "sum") != "max" else
                             [values[key] for values in gathered if key in values])
                for key in keys}

    @contextlib.contextmanager
    def synchronized(self) -> Iterator[Accumulator]:
        """Within the block, reads give the values reduced over all replicas."""
        self._synced = self.reduced()
        try:
            yield self
        finally:
            self._synced = None

    def _gather(self) -> list[dict[str, float]]:
        if not dist.is_initialized() or self.job.num_replicas == 1:
            return [dict(self._local)]
        gathered: list[Any] = [None] * self.job.num_replicas
        dist.all_gather_object(gathered, dict(self._local), group=self.job.control_group)
        return gathered

    # -- checkpoint -------------------------------------------------------------------------

    def reduced_for_checkpoint(self) -> dict[str, float]:
        return self.reduced()

    def restores_values_of(self, epoch: int) -> bool:
        """Whether values saved by a checkpoint in ``epoch`` (of their last write) are
        restored: only in that same epoch (overridable)."""
        return epoch == self.job.epoch

    def extra_state(self) -> Any:
        """More state saved beside the values (None: nothing; for subclasses)."""
        return None

    def load_extra_state(self, extra: Any) -> None:
        """Restore what :meth:`extra_state` saved (None when nothing was)."""

    def _share_of(self, reduced: dict[str, float]) -> dict[str, float]:
        """This replica's part of saved totals: sums on rank 0, means and maxima on all."""
        return {key: value for key, value in reduced.items()
                if self.reductions.get(key, "sum") != "sum" or self.job.rank == 0}


def _caller_site() -> str:
    import inspect

    frame = inspect.currentframe()
    try:
        caller = frame.f_back.f_back if frame and frame.f_back else None
        if caller is None:
            return "accumulator"
        return f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}"
    finally:
        del frame
