"""``adaptdl.checkpoint``: user state saved with the job's checkpoints and restored
after a restart.

Subclass :class:`State` with ``save(fileobj)``, ``load(fileobj)`` and, when the
replicas' copies differ, ``sync()``; create it with a unique name and call
:func:`load_state` once to get the saved copy back after a restart::

    class Best(adaptdl.checkpoint.State):
        def __init__(self):
            super().__init__("best-accuracy")
            self.value = 0.0
        def save(self, fileobj):
            pickle.dump(self.value, fileobj)
        def load(self, fileobj):
            self.value = pickle.load(fileobj)

    best = Best()
    adaptdl.checkpoint.load_state(best)   # True after a restart

Each state becomes one entry of the agent's checkpoint (:class:`pollux.torch.
CheckpointManager`), so it is written whenever the agent checkpoints (periodically,
before a rescale, after SIGTERM, at the end of training): ``sync()`` runs on every
replica, then rank 0's ``save()`` is kept. A state may be created before
``init_process_group``; it joins the checkpoint when the job exists.
"""

from __future__ import annotations

import io
from typing import IO, TYPE_CHECKING, Any

from pollux.adaptdl.default_job import DEFAULT_JOB

if TYPE_CHECKING:
    from pollux.torch.job import JobContext

STATE_PREFIX = "adaptdl/state/"
"""Checkpoint entries of :class:`State` objects are named ``adaptdl/state/<name>``."""


class _StateEntry:
    """A :class:`State` as the agent's checkpoint sees it (state_dict of bytes)."""

    def __init__(self, state: State, rank: int) -> None:
        self.state = state
        self.rank = rank
        self.saved: bytes | None = None
        """The bytes restored from the checkpoint, until :func:`load_state` reads them."""

    def state_dict(self) -> bytes | None:
        self.state.sync()
        if self.rank != 0:  # only rank 0's copy is written
            return None
        buffer = io.BytesIO()
        self.state.save(buffer)
        return buffer.getvalue()

    def load_state_dict(self, saved: bytes | None) -> None:
        self.saved = saved


class State:
    """A named piece of user state, saved in the job's checkpoints (see the module).

    Raises ``ValueError`` when another state already has ``name``.
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"invalid State name={name!r}: give a non-empty string")
        self.name = name
        self._entry: _StateEntry | None = None
        DEFAULT_JOB.when_bound(self._bind)

    def _bind(self, job: JobContext) -> None:
        entry = _StateEntry(self, job.rank)
        job.checkpoint.register(STATE_PREFIX + self.name, entry)
        self._entry = entry

    def save(self, fileobj: IO[bytes]) -> None:
        """Write the state to ``fileobj`` (override; called on rank 0)."""

    def load(self, fileobj: IO[bytes]) -> None:
        """Read the state back from ``fileobj`` (override)."""

    def sync(self) -> None:
        """Make the replicas' copies agree before a save (override when needed; called on
        every replica at the same point, so collectives are allowed here)."""


def _entry(state: State, what: str) -> _StateEntry:
    DEFAULT_JOB.require(f"adaptdl.checkpoint.{what}")
    if state._entry is None:
        raise ValueError(f"invalid state={state!r}: it was not created with "
                         "State.__init__(name); call super().__init__(name) in its __init__")
    return state._entry


def load_state(state: State) -> bool:
    """Load ``state`` from the checkpoint the job restarted from; returns True when it was
    saved there (False on a fresh start, and ``state`` is left as it is)."""
    entry = _entry(state, "load_state")
    if entry.saved is None:
        return False
    state.load(io.BytesIO(entry.saved))
    entry.saved = None
    return True


def save_all_states() -> str | None:
    """Checkpoint the whole job now (every replica, at the same point); returns the
    checkpoint directory (None when checkpointing is off)."""
    job = DEFAULT_JOB.require("adaptdl.checkpoint.save_all_states")
    job.checkpoint.save()
    return job.launch.checkpoint_dir


def save_state(state: State, checkpoint_dir: Any = None, sync: bool = True) -> None:
    """Save ``state``: under Pollux every state lives in the job's one checkpoint, so this
    checkpoints the job (every replica, at the same point). ``checkpoint_dir`` is the
    job's and ``sync`` is always done (AdaptDL's arguments, kept for the call shape)."""
    _entry(state, "save_state")
    save_all_states()
