"""The largest local batch that fits in the device's memory.

Two bounds, the tighter one wins (:meth:`LocalBatchBound.upper_bound`):

* **Predicted**, where the device reports its memory (CUDA, or any
  :class:`MemoryReader` given as ``AdaptiveDataParallel(memory_reader=...)``): the peak
  memory of each optimizer step is read (the peak is reset at its first micro-step) and
  kept per local batch; a line ``peak = fixed + per_sample * local_bsz`` is fitted above
  every point (the least-squares slope, the intercept raised to cover the highest
  point; one batch size seen: everything counted per sample, which over-estimates the
  slope, so the prediction errs small), and the largest batch whose predicted peak stays
  under :data:`MEMORY_HEADROOM` of the device's capacity is the bound.
* **Measured**: a step that raises ``torch.OutOfMemoryError`` (in the forward pass, in
  the optimizer step, or in the backward pass where the agent runs it: the Lightning and
  Hugging Face integrations) lowers the bound of this GPU type to the largest local
  batch that has completed a step there (half the failed batch if none has). The bound
  and the failed batch are written at once to ``memory-bounds.json`` in the checkpoint
  directory (no consistent checkpoint can be taken in the middle of a step) and kept in
  every later checkpoint, so they survive the restart that follows.
* **Rising again**: an out-of-memory error may be transient (fragmentation, another
  process on the device). After :data:`RISE_AFTER_STEPS` steps at the measured bound,
  when the fit of peak memory predicts more fits, the bound rises halfway to the batch
  that failed (never to it): a bisection between the largest batch known to fit and the
  smallest known not to, which another out-of-memory error lowers again. Without a
  memory reader (CPU) nothing is predicted and the bound stays.

The agent never chooses a local batch above the bound, and its hints report it as the
upper end of ``local_bsz_bounds``, so the scheduler's goodput model never assumes more.
Bounds are kept per GPU type (the memory of the device), never mixed between types.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from pollux.jobenv import RESCALE_EXIT_CODE
from pollux.torch.batch_size import BatchLimits

logger = logging.getLogger(__name__)

MEMORY_HEADROOM = 0.9
"""Fraction of the device's capacity a predicted peak may use (fragmentation, spikes)."""
BOUNDS_FILE = "memory-bounds.json"
"""In the checkpoint directory: GPU type -> ``{"bound": largest local batch allowed,
"failed": smallest local batch that ran out of memory}``."""
RISE_AFTER_STEPS = 50
"""Steps completed at the measured bound before it may rise (see the module)."""


class MemoryReader(Protocol):
    """What the bound reads from the device (``CudaMemoryReader``, or a fake in tests)."""

    def reset_peak(self) -> None:
        """Start a new peak (called at the first micro-step of an optimizer step)."""

    def peak_bytes(self) -> int | None:
        """The peak allocated since :meth:`reset_peak` (None: unknown)."""

    def capacity_bytes(self) -> int | None:
        """The memory the device has for this process (None: unknown)."""


class CudaMemoryReader:
    """The CUDA caching allocator's peak (host-side counters: no device synchronization)
    and the device's total memory."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int | None:
        return int(torch.cuda.max_memory_allocated(self.device))

    def capacity_bytes(self) -> int | None:
        return int(torch.cuda.get_device_properties(self.device).total_memory)


def default_memory_reader(device: torch.device) -> MemoryReader | None:
    """A CUDA device's reader; None where the device reports no memory (CPU)."""
    return CudaMemoryReader(device) if device.type == "cuda" else None


@dataclass(frozen=True)
class MemoryFit:
    """``peak_bytes = fixed_bytes + per_sample_bytes * local_bsz``, above every point.

    >>> MemoryFit(1000.0, 100.0).largest_fitting(capacity_bytes=10_000, headroom=1.0)
    90
    """

    fixed_bytes: float
    per_sample_bytes: float

    def largest_fitting(self, capacity_bytes: float, headroom: float = MEMORY_HEADROOM) -> int:
        """The largest local batch whose predicted peak is within ``headroom`` of the
        capacity (0: not even one sample)."""
        room = capacity_bytes * headroom - self.fixed_bytes
        return max(int(math.floor(room / self.per_sample_bytes)), 0)


def fit_peak_memory(peaks: dict[int, int]) -> MemoryFit | None:
    """The line of :class:`MemoryFit` through ``local_bsz -> peak bytes`` (None when
    there is nothing to fit: no positive peak)."""
    points = sorted((b, p) for b, p in peaks.items() if b > 0 and p > 0)
    if not points:
        return None
    sizes = np.array([b for b, _ in points], dtype=np.float64)
    bytes_ = np.array([p for _, p in points], dtype=np.float64)
    conservative = MemoryFit(0.0, float((bytes_ / sizes).max()))
    if len(points) < 2:
        return conservative
    slope = float(np.polyfit(sizes, bytes_, 1)[0])
    if not slope > 0:
        return conservative
    fixed = float((bytes_ - slope * sizes).max())  # the line lies above every point
    return MemoryFit(max(fixed, 0.0), slope)


class LocalBatchBound:
    """The job's memory bounds on the local batch (see the module docstring).

    >>> bound = LocalBatchBound("cpu", None)
    >>> bound.observe_step(32); bound.out_of_memory(96)
    32
    >>> bound.upper_bound()
    32
    """

    def __init__(self, gpu_type: str, reader: MemoryReader | None, *,
                 directory: str | os.PathLike[str] | None = None,
                 headroom: float = MEMORY_HEADROOM) -> None:
        self.gpu_type = gpu_type
        self.reader = reader
        self.directory = None if directory is None else Path(directory)
        self.headroom = headroom
        self._oom: dict[str, int] = {}
        """GPU type -> largest local batch allowed after an out-of-memory there."""
        self._failed: dict[str, int] = {}
        """GPU type -> smallest local batch that ran out of memory there."""
        self._steps_at_bound = 0
        """Steps completed at this type's measured bound since it last moved."""
        self._peaks: dict[int, int] = {}
        """Local batch -> highest peak bytes of a step at this type."""
        self._largest_ok = 0
        """Largest local batch that completed a step at this type (this launch)."""
        self._read_file()

    # -- measuring ------------------------------------------------------------------------

    def begin_step(self) -> None:
        if self.reader is not None:
            self.reader.reset_peak()

    def observe_step(self, local_bsz: int) -> None:
        """An optimizer step at ``local_bsz`` completed: note its peak memory."""
        self._largest_ok = max(self._largest_ok, int(local_bsz))
        if self.reader is None:
            return
        peak = self.reader.peak_bytes()
        if peak is not None and peak > 0:
            self._peaks[int(local_bsz)] = max(self._peaks.get(int(local_bsz), 0), int(peak))
        if self._oom.get(self.gpu_type) == int(local_bsz):
            self._steps_at_bound += 1
            if self._steps_at_bound >= RISE_AFTER_STEPS:
                self._maybe_rise()

    def _maybe_rise(self) -> None:
        """Raise the measured bound halfway to the failed batch when the fit predicts it
        fits (see the module)."""
        self._steps_at_bound = 0
        bound = self._oom[self.gpu_type]
        failed = self._failed.get(self.gpu_type, 2 * bound)
        predicted = self.predicted()
        if predicted is None or predicted <= bound or failed - bound < 2:
            return
        new = min(predicted, (bound + failed) // 2)
        self._oom[self.gpu_type] = new
        logger.info("memory bound on %s raised from %d to %d (the fit of peak memory "
                    "predicts up to %d; %d ran out of memory)", self.gpu_type, bound, new,
                    predicted, failed)
        self._write_file(lowered=False)

    def out_of_memory(self, local_bsz: int) -> int:
        """A step at ``local_bsz`` ran out of memory: lower this type's bound and write it
        to the checkpoint directory at once; returns the new bound."""
        failed = int(local_bsz)
        new = self._largest_ok if 0 < self._largest_ok < failed else max(failed // 2, 1)
        self._oom[self.gpu_type] = min(self._oom.get(self.gpu_type, new), new)
        self._failed[self.gpu_type] = min(self._failed.get(self.gpu_type, failed), failed)
        self._steps_at_bound = 0
        self._write_file()
        return self._oom[self.gpu_type]

    # -- the bound ------------------------------------------------------------------------

    def predicted(self) -> int | None:
        """The largest local batch the memory fit says fits (None: no prediction)."""
        if self.reader is None:
            return None
        capacity = self.reader.capacity_bytes()
        fit = fit_peak_memory(self._peaks)
        if fit is None or capacity is None or capacity <= 0:
            return None
        return fit.largest_fitting(capacity, self.headroom)

    def upper_bound(self) -> int | None:
        """The tighter of this type's out-of-memory bound and the prediction (None:
        nothing known)."""
        bounds = [b for b in (self._oom.get(self.gpu_type), self.predicted()) if b is not None]
        return min(bounds) if bounds else None

    def limits(self, limits: BatchLimits) -> BatchLimits:
        """``limits`` with the largest local batch lowered to the bound (never below the
        smallest one, the job's own floor)."""
        bound = self.upper_bound()
        lo, hi = limits.local_bsz_bounds
        if bound is None or bound >= hi:
            return limits
        return dataclasses.replace(limits, local_bsz_bounds=(lo, max(bound, lo)))

    # -- persistence ------------------------------------------------------------------------

    def _read_file(self) -> None:
        if self.directory is None:
            return
        path = self.directory / BOUNDS_FILE
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        if isinstance(saved, dict):
            self._merge(saved)

    def _merge(self, saved: dict[str, Any], *, failed: dict[str, Any] | None = None) -> None:
        """Take the lower bounds of ``saved`` (type -> ``{"bound", "failed"}``, or an int
        bound as written before failed batches were kept)."""
        for gpu_type, entry in saved.items():
            if not isinstance(gpu_type, str):
                continue
            bound = entry.get("bound") if isinstance(entry, dict) else entry
            fail = entry.get("failed") if isinstance(entry, dict) else None
            if failed is not None:
                fail = failed.get(gpu_type, fail)
            if isinstance(bound, int) and bound >= 1:
                self._oom[gpu_type] = min(self._oom.get(gpu_type, bound), bound)
            if isinstance(fail, int) and fail >= 1:
                self._failed[gpu_type] = min(self._failed.get(gpu_type, fail), fail)

    def _entries(self) -> dict[str, dict[str, int]]:
        return {gpu_type: {"bound": bound, "failed": self._failed.get(gpu_type, 2 * bound)}
                for gpu_type, bound in self._oom.items()}

    def _write_file(self, *, lowered: bool = True) -> None:
        """Write the bounds (merged with another replica's lower ones when ``lowered``;
        a rise is this process's decision, written as it is)."""
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / BOUNDS_FILE
        if lowered:
            self._read_file()  # another replica may have written a lower one
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._entries(), sort_keys=True))
        os.replace(tmp, path)

    def state_dict(self) -> dict[str, Any]:
        return {"oom": dict(self._oom), "failed": dict(self._failed),
                "gpu_type": self.gpu_type,
                "peaks": {str(b): p for b, p in self._peaks.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._merge(dict(state.get("oom", {})), failed=dict(state.get("failed", {})))
        if state.get("gpu_type") == self.gpu_type:
            for b, p in dict(state.get("peaks", {})).items():
                self._peaks[int(b)] = max(self._peaks.get(int(b), 0), int(p))


def leave_after_out_of_memory(bound: LocalBatchBound, local_bsz: int, smallest: int,
                              close: Callable[[], None], device: torch.device) -> None:
    """A step at ``local_bsz`` ran out of memory: lower the bound, free the cached
    memory, close the job and raise ``SystemExit`` with the rescale exit code, so that
    the job restarts from its last checkpoint at a batch that fits, not counted as a
    failure (a plain training loop cannot be resumed in the middle of its body). Returns
    (the caller re-raises the error) when a smaller batch cannot help: ``local_bsz`` is
    already the job's ``smallest``."""
    if local_bsz <= smallest:
        return
    new = bound.out_of_memory(local_bsz)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    logger.warning("out of memory at a local batch of %d on %s: at most %d from now on; "
                   "restarting from the last checkpoint (exit %d, not a failure)",
                   local_bsz, bound.gpu_type, max(new, smallest), RESCALE_EXIT_CODE)
    close()
    raise SystemExit(RESCALE_EXIT_CODE)
