"""Which samples each replica trains on, so that a job can be resized mid-epoch.

An epoch is one seeded permutation of the data set (the *epoch order*). The job's only
data position is a single global cursor into that order: the number of samples consumed
by completed optimizer steps. Each optimizer step takes the next ``K * b * (s + 1)``
samples of the order (``K`` replicas, atomic batch ``b``, ``s`` accumulation steps);
replica ``r`` gets the ``r``-th contiguous share, cut into ``s + 1`` micro-batches.

Because the cursor is global, a restart with any number of replicas (or batch size)
continues exactly where the job stopped: every sample is consumed exactly once per epoch.
The last step of an epoch takes what is left, spread evenly over the replicas; when that
does not divide evenly it is padded with at most ``K - 1`` samples from the start of the
epoch order, and the padding is reported.

Pure numpy: no torch, no process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pollux.errors import ConfigError

IndexArray = NDArray[np.int64]


def epoch_order(num_samples: int, epoch: int, seed: int, shuffle: bool = True) -> IndexArray:
    """The order in which an epoch visits the data set (a seeded permutation).

    >>> epoch_order(5, epoch=0, seed=0, shuffle=False).tolist()
    [0, 1, 2, 3, 4]
    """
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)])
    return rng.permutation(num_samples).astype(np.int64)


@dataclass(frozen=True)
class StepPlan:
    """The samples of one optimizer step, for every replica.

    >>> plan = plan_step(epoch_order(10, 0, seed=0, shuffle=False), 0, 2, 2, 0)
    >>> [b.tolist() for b in plan.batches[1]], plan.end
    ([[2, 3]], 4)
    """

    start: int
    """Cursor (position in the epoch order) before this step."""
    num_samples: int
    """Real samples this step consumes: the cursor advances by this much."""
    num_padding: int
    """Repeated samples added so every replica gets the same count (< num_replicas)."""
    batches: tuple[tuple[IndexArray, ...], ...]
    """``batches[replica][micro_step]``: data-set indices of each micro-batch."""
    regular: bool
    """True when every micro-batch holds exactly ``local_bsz`` samples."""
    padding: tuple[tuple[int, ...], ...] = ()
    """``padding[replica][micro_step]``: how many of that batch's last indices are padding
    (empty when the step has none)."""

    def num_padding_in(self, replica: int, micro_step: int) -> int:
        return self.padding[replica][micro_step] if self.padding else 0

    @property
    def num_micro_steps(self) -> int:
        return len(self.batches[0])

    @property
    def total_batch_size(self) -> int:
        """Samples (padding included) over all replicas and micro-steps."""
        return self.num_samples + self.num_padding

    @property
    def end(self) -> int:
        return self.start + self.num_samples


def plan_step(
    order: IndexArray, start: int, num_replicas: int, local_bsz: int, accum_steps: int
) -> StepPlan:
    """Plan the optimizer step that begins at cursor ``start`` of the epoch ``order``.

    >>> order = epoch_order(10, 0, seed=0, shuffle=False)
    >>> plan = plan_step(order, start=8, num_replicas=2, local_bsz=4, accum_steps=0)
    >>> [b.tolist() for b in plan.batches[0]], plan.num_padding  # the last, short step
    ([[8]], 0)
    """
    n = int(order.size)
    if num_replicas < 1:
        raise ConfigError("num_replicas", num_replicas, "must be >= 1")
    if local_bsz < 1:
        raise ConfigError("local_bsz", local_bsz, "must be >= 1")
    if accum_steps < 0:
        raise ConfigError("accum_steps", accum_steps, "must be >= 0")
    if not 0 <= start < n:
        raise ConfigError("start", start, f"must lie in [0, {n}) (the epoch has ended?)")
    micro = accum_steps + 1
    full = num_replicas * local_bsz * micro
    remaining = n - start
    if remaining >= full:
        chunk = order[start:start + full]
        per_replica = chunk.reshape(num_replicas, micro, local_bsz)
        batches = tuple(tuple(per_replica[r, j].copy() for j in range(micro))
                        for r in range(num_replicas))
        return StepPlan(start, full, 0, batches, regular=True)
    share = -(-remaining // num_replicas)  # ceil
    padding = share * num_replicas - remaining
    chunk = np.concatenate([order[start:], order[np.arange(padding) % n]])
    is_pad = np.arange(chunk.size) >= remaining
    num_micro = -(-share // local_bsz)
    batches = tuple(tuple(part.copy() for part in
                          np.array_split(chunk[r * share:(r + 1) * share], num_micro))
                    for r in range(num_replicas))
    pads = tuple(tuple(int(part.sum()) for part in
                       np.array_split(is_pad[r * share:(r + 1) * share], num_micro))
                 for r in range(num_replicas))
    return StepPlan(start, remaining, padding, batches, regular=False,
                    padding=pads if padding else ())


class ElasticSampler:
    """The epoch order and the global cursor of one data set, checkpointable.

    ``state_dict`` holds only ``epoch`` and ``position`` (plus the seed, checked on
    load), so it restores under any number of replicas.

    >>> sampler = ElasticSampler(10, shuffle=False)
    >>> plan = sampler.plan(num_replicas=2, local_bsz=2, accum_steps=0)
    >>> sampler.commit(plan)
    >>> sampler.state_dict()["position"]
    4
    """

    def __init__(self, num_samples: int, *, shuffle: bool = True, seed: int = 0) -> None:
        if num_samples < 1:
            raise ConfigError("len(dataset)", num_samples, "the data set must not be empty")
        self.num_samples = int(num_samples)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0
        self._order: IndexArray | None = None
        self.drawn = False
        """Whether the current order was drawn by a custom sampler (and is checkpointed)."""

    def start_pass(self, epoch: int, order: IndexArray | None = None) -> None:
        """Begin a full pass over ``epoch``'s order (``order`` when given: one drawn by a
        custom sampler, then checkpointed with the cursor): the cursor goes back to 0."""
        if order is not None:
            if order.ndim != 1 or order.size < 1:
                raise ConfigError("sampler", f"{order.size} indices",
                                  "a sampler must yield at least one index per epoch")
            self._order = order.astype(np.int64)
            self.num_samples = int(order.size)
            self.drawn = True
        elif epoch != self.epoch or self.drawn:
            self._order = None
        self.epoch = int(epoch)
        self.position = 0

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``; the cursor restarts at 0 unless it already is this epoch."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self.position = 0
            self._order = None

    @property
    def order(self) -> IndexArray:
        if self._order is None:
            self._order = epoch_order(self.num_samples, self.epoch, self.seed, self.shuffle)
        return self._order

    @property
    def remaining(self) -> int:
        return self.num_samples - self.position

    def plan(self, num_replicas: int, local_bsz: int, accum_steps: int) -> StepPlan | None:
        """The next step from the cursor, or None when the epoch is done."""
        if self.position >= self.num_samples:
            return None
        return plan_step(self.order, self.position, num_replicas, local_bsz, accum_steps)

    def commit(self, step: StepPlan) -> None:
        """Record that ``step`` was trained on: the cursor moves past it."""
        if step.start != self.position:
            raise ConfigError("step.start", step.start,
                              f"commit steps in order (cursor is at {self.position})")
        self.position = step.end

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"epoch": self.epoch, "position": self.position,
                                 "num_samples": self.num_samples, "seed": self.seed,
                                 "shuffle": self.shuffle}
        if self.drawn:
            state["order"] = self.order.copy()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("order") is not None:
            self.epoch = int(state["epoch"])
            self.start_pass(self.epoch, np.asarray(state["order"], dtype=np.int64))
            self.position = int(state["position"])
            return
        for key in ("num_samples", "seed", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(f"sampler.{key}", state[key],
                                  f"the checkpoint was taken with {key}={state[key]!r}, "
                                  f"this run has {getattr(self, key)!r}; use the same")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = None
