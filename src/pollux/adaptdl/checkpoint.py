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
replica, then rank 0's ``save()`` is kept. As in AdaptDL, none of this needs
``init_process_group``: a state may be created, loaded (:func:`load_state` reads the
checkpoint the job would restart from) and saved (:func:`save_all_states` writes a new
checkpoint that keeps everything else of the last one) before it, and joins the job's
checkpoint when the job exists. A name already taken is refused when the state is made.
"""

from __future__ import annotations

import io
from typing import IO, TYPE_CHECKING, Any

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.torch.checkpoint import CheckpointManager, latest_valid_checkpoint
from pollux.torch.launch import effective_checkpoint_dir, read_launch_environment

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

    Raises ``ValueError`` when another state already has ``name`` (as AdaptDL does).
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"invalid State name={name!r}: give a non-empty string")
        if name in DEFAULT_JOB.states:
            raise ValueError(f"invalid State name={name!r}: a State with this name already "
                             "exists in this process; give each State its own name")
        DEFAULT_JOB.states[name] = self
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


def _check(state: Any, what: str) -> State:
    if not isinstance(state, State) or not hasattr(state, "_entry"):
        raise ValueError(f"invalid state={state!r} for adaptdl.checkpoint.{what}: give a "
                         "State created with State.__init__(name) (call "
                         "super().__init__(name) in its __init__)")
    return state


def early_states() -> dict[str, Any]:
    """Before ``init_process_group``: the entries of the checkpoint the job would restart
    from (empty when there is none or checkpointing is off), read once."""
    if DEFAULT_JOB.early_states is None:
        directory = effective_checkpoint_dir()
        found = None if directory is None else latest_valid_checkpoint(directory)
        DEFAULT_JOB.early_states = {} if found is None else dict(found[1]["states"])
    return DEFAULT_JOB.early_states


def load_state(state: State) -> bool:
    """Load ``state`` from the checkpoint the job restarted from; returns True when it was
    saved there (False on a fresh start, and ``state`` is left as it is)."""
    _check(state, "load_state")
    if DEFAULT_JOB.job is None:
        saved = early_states().get(STATE_PREFIX + state.name)
    else:
        assert state._entry is not None  # bound when the job was made
        saved, state._entry.saved = state._entry.saved, None
    if saved is None:
        return False
    state.load(io.BytesIO(saved))
    return True


class _Kept:
    """An entry of the last checkpoint written again as it was."""

    def __init__(self) -> None:
        self.value: Any = None

    def state_dict(self) -> Any:
        return self.value

    def load_state_dict(self, value: Any) -> None:
        self.value = value


def _save_before_init() -> str | None:
    """AdaptDL's ``save_all_states`` with no job yet: every state syncs, and rank 0
    writes a new checkpoint with the states replaced and every other entry kept."""
    launch = read_launch_environment()
    directory = effective_checkpoint_dir(launch=launch)
    states = list(DEFAULT_JOB.states.values())
    if directory is None or launch.rank != 0:
        for state in states:
            state.sync()
        return directory
    manager = CheckpointManager(directory, rank=0)
    ours = {STATE_PREFIX + state.name for state in states}
    for name in early_states():
        if name not in ours:
            manager.register(name, _Kept())
    for state in states:
        manager.register(STATE_PREFIX + state.name, _StateEntry(state, 0))
    manager.save()
    DEFAULT_JOB.early_states = None  # read the new checkpoint next time
    return directory


def save_all_states() -> str | None:
    """Checkpoint every state now (every replica, at the same point); returns the
    checkpoint directory (None when checkpointing is off). With a job, this is the job's
    whole checkpoint; before ``init_process_group``, see :func:`_save_before_init`."""
    job = DEFAULT_JOB.job
    if job is None:
        return _save_before_init()
    job.checkpoint.save()
    return job.launch.checkpoint_dir


def save_state(state: State, checkpoint_dir: Any = None, sync: bool = True) -> None:
    """Save ``state``: under Pollux every state lives in the job's one checkpoint, so this
    checkpoints the job (every replica, at the same point). ``checkpoint_dir`` is the
    job's and ``sync`` is always done (AdaptDL's arguments, kept for the call shape)."""
    _check(state, "save_state")
    save_all_states()
