"""Optional TensorBoard scalars (goodput, throughput, batch size, noise scale, ...).

TensorBoard is used only when ``torch.utils.tensorboard`` imports (it needs the
``tensorboard`` package); otherwise :class:`MetricsWriter` quietly does nothing.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)


def tensorboard_available() -> bool:
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class MetricsWriter:
    """Writes scalars under ``pollux/`` when a log directory is given and TensorBoard exists."""

    def __init__(self, log_dir: str | os.PathLike[str] | None) -> None:
        self._writer: Any = None
        if log_dir is None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            logger.info("tensorboard is not installed; metrics are not written")
            return
        self._writer = SummaryWriter(log_dir=os.fspath(log_dir))

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def write(self, step: int, scalars: Mapping[str, float | None]) -> None:
        """Add each finite scalar at ``step``."""
        if self._writer is None:
            return
        for name, value in scalars.items():
            if value is not None and math.isfinite(value):
                self._writer.add_scalar(f"pollux/{name}", value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
