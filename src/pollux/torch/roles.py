"""What the agent's parts need of each other, as protocols, so none imports another in a
circle.

The :class:`~pollux.torch.job.JobContext` sits below every part that takes a ``job=``:
it keeps the models and the loader being iterated, but knows them only by the roles
below; :class:`~pollux.torch.AdaptiveDataParallel` and
:class:`~pollux.torch.AdaptiveDataLoader` play them without importing this module's
users. A test (``tests/test_import_cycles.py``) counts the circles among the
``pollux.torch`` modules with ``TYPE_CHECKING`` imports included: there are none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from pollux.models import GradientStats
from pollux.torch.batch_size import BatchLimits
from pollux.torch.gradient_noise import GradientNoiseEstimator


class DrivenModel(Protocol):
    """A wrapped model as the data loader and the control loop drive it (what
    :class:`~pollux.torch.AdaptiveDataParallel` offers them)."""

    noise: GradientNoiseEstimator
    """Its gradient-noise estimator (read at agreement points)."""
    grad_stats: GradientStats | None
    """The agreed gradient statistics at the initial batch (None until measured)."""

    @property
    def optimizer_steps(self) -> int: ...

    @property
    def has_pending_gradients(self) -> bool: ...

    @property
    def progress(self) -> float: ...

    @property
    def lr_factor(self) -> float: ...

    @property
    def compute_end_mark(self) -> Any: ...

    def noise_scale(self) -> float | None: ...

    def begin_micro_step(self, index: int, num_micro_steps: int, local_bsz: int,
                         step_batch_size: int, init_batch_size: int, regular: bool,
                         mark_compute_end: bool = False, probe: bool = False) -> None: ...

    def wants_probe(self, steps_ahead: int = 0) -> bool: ...

    def set_grad_stats(self, stats: GradientStats | None) -> None: ...

    def bounded_limits(self, limits: BatchLimits) -> BatchLimits: ...


class IteratedLoader(Protocol):
    """A data loader being iterated (what ``current_dataloader`` returns)."""

    name: str
    @property
    def current_batch_size(self) -> int | None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...
