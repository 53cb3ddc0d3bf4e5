"""The process-wide current job of the AdaptDL-shaped API.

AdaptDL's functions take no job argument (``adaptdl.torch.current_epoch()``,
``adaptdl.torch.Accumulator()``), as torch.distributed's collectives default to the
process group made by ``init_process_group``. :data:`DEFAULT_JOB` is that one slot:
:func:`pollux.adaptdl.torch.init_process_group` fills it with the agent's
:class:`~pollux.torch.JobContext`, and every function of :mod:`pollux.adaptdl` reads
it. It is the only mutable state of the tree; the native API (:mod:`pollux.torch`)
passes the job explicitly instead.

It also remembers what AdaptDL lets a script create *before* ``init_process_group``
(data loaders, checkpoint states): their names are handed out here in creation order,
so they match across replicas and restarts, and they are bound to the job when it exists.

>>> from pollux.adaptdl.default_job import DEFAULT_JOB
>>> DEFAULT_JOB.job is None  # before init_process_group
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pollux.errors import NotInitializedError

if TYPE_CHECKING:
    from pollux.torch.job import JobContext


class DefaultJob:
    """The current job of this process (one per process, like the default process group)."""

    def __init__(self) -> None:
        self.job: JobContext | None = None
        """The job made by ``init_process_group`` (None before it and after :meth:`clear`)."""
        self.current_loader: Any = None
        """The AdaptDL-shaped data loader being iterated now (None between loops)."""
        self.in_epoch_loop = False
        """Whether ``remaining_epochs_until`` is being iterated."""
        self.states: dict[str, Any] = {}
        """Every ``adaptdl.checkpoint.State`` by its (unique) name."""
        self.early_states: dict[str, Any] | None = None
        """Before ``init_process_group``: the states of the checkpoint the job would
        restart from, read once (None: not read yet)."""
        self._counts: dict[str, int] = {}
        self._pending: list[Any] = []

    def require(self, what: str) -> JobContext:
        """The job, or a clear error naming ``what`` needed it."""
        if self.job is None:
            raise NotInitializedError(what)
        return self.job

    def next_name(self, kind: str) -> str:
        """``kind0``, ``kind1``, ...: stable names in creation order (same on every rank)."""
        count = self._counts.get(kind, 0)
        self._counts[kind] = count + 1
        return f"{kind}{count}"

    def when_bound(self, bind: Any) -> None:
        """Call ``bind(job)`` now if the job exists, else once ``init_process_group`` runs."""
        if self.job is not None:
            bind(self.job)
        else:
            self._pending.append(bind)

    def set(self, job: JobContext) -> None:
        """Install ``job`` (by ``init_process_group``) and bind what waited for it."""
        if self.job is not None:
            raise RuntimeError("init_process_group was already called in this process "
                               "(call adaptdl.torch.destroy_process_group() first)")
        self.job = job
        self.early_states = None
        pending, self._pending = self._pending, []
        for bind in pending:
            bind(job)

    def clear(self) -> None:
        """Forget the job and every name (after the job is closed; tests start afresh)."""
        self.job = None
        self.current_loader = None
        self.in_epoch_loop = False
        self.states = {}
        self.early_states = None
        self._counts = {}
        self._pending = []


DEFAULT_JOB = DefaultJob()
"""The one default-job slot (see the module's documentation)."""
