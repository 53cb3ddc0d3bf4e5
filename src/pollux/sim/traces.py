"""Reading an application's measurements in the Pollux artifact trace format.

A trace directory holds, per application, ``placements.csv``
(``placement,local_bsz,step_time,sync_time``), ``scalability.csv``
(``num_nodes,num_replicas,local_bsz,step_time,sync_time``) and one
``validation-<B>.csv`` (``progress,iteration,metric,grad_sqr,grad_var``) per total batch
size ``B`` trained to completion. See docs/research/simulator.md for the meaning of every
column. Malformed files raise :class:`~pollux.errors.WorkloadError` naming the
file, the line and the field.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from pollux.errors import WorkloadError
from pollux.models.throughput import FloatArray
from pollux.sim.placement import Placement

PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
VALIDATION_COLUMNS = ("progress", "iteration", "grad_sqr", "grad_var")
VALIDATION_FILE = re.compile(r"^validation-(\d+)\.csv$")


@dataclass(frozen=True)
class PlacementTrace:
    """Step and sync time of one exact placement, sorted by local batch size."""

    local_bsz: FloatArray
    step_time: FloatArray
    sync_time: FloatArray


@dataclass(frozen=True)
class ValidationTrace:
    """One full training run at total batch size ``batch_size``, one entry per epoch."""

    batch_size: int
    progress: FloatArray
    """Cumulative statistical progress at the end of each epoch (steps at the initial batch)."""
    iteration: FloatArray
    """Cumulative optimizer steps at the end of each epoch."""
    grad_sqr: FloatArray
    grad_var: FloatArray


@dataclass(frozen=True)
class TraceData:
    """All measurements of one application."""

    name: str
    placements: dict[Placement, PlacementTrace]
    """Exact placements (as written in the file) -> their measurements."""
    scale_points: FloatArray
    """(num_nodes, num_replicas, local_bsz) rows: placements averaged per group, then
    every scalability row (the reference simulator's interpolation points, in its order)."""
    scale_values: FloatArray
    """(step_time, sync_time) at each row of ``scale_points``."""
    validation: tuple[ValidationTrace, ...]
    """Sorted by batch size."""
    min_local_bsz: int
    max_local_bsz: int

    @cached_property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(v.batch_size for v in self.validation)


def _read_rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """Rows with their 1-based line numbers; missing columns raise WorkloadError."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            for col in columns:
                if col not in header:
                    raise WorkloadError(str(path), 1, col,
                                        f"missing column; the header must include {list(columns)}")
            return [(i + 2, row) for i, row in enumerate(reader)]
    except OSError as exc:
        raise WorkloadError(str(path), None, "file", f"cannot read: {exc}") from exc


def _number(path: Path, line: int, row: dict[str, str], col: str, positive: bool) -> float:
    text = row.get(col)
    try:
        value = float(text) if text is not None else float("nan")
    except ValueError:
        value = float("nan")
    if not np.isfinite(value) or value < 0 or (positive and value == 0):
        need = "a finite number > 0" if positive else "a finite number >= 0"
        raise WorkloadError(str(path), line, col, f"got {text!r}; need {need}")
    return value


def _parse_placement(path: Path, line: int, text: str | None) -> Placement:
    if not text or not text.isdigit():
        raise WorkloadError(str(path), line, "placement",
                            f"got {text!r}; need digits, one per node (e.g. 4, 22, 1111)")
    return tuple(int(c) for c in text)


def _read_placements(path: Path) -> tuple[dict[Placement, PlacementTrace], list[tuple[float, ...]]]:
    by_placement: dict[Placement, list[tuple[float, float, float]]] = {}
    raw: list[tuple[float, ...]] = []
    for line, row in _read_rows(path, PLACEMENT_COLUMNS):
        placement = _parse_placement(path, line, row.get("placement"))
        bsz = _number(path, line, row, "local_bsz", True)
        step = _number(path, line, row, "step_time", True)
        sync = _number(path, line, row, "sync_time", False)
        by_placement.setdefault(placement, []).append((bsz, step, sync))
        raw.append((float(sum(1 for c in placement if c)), float(sum(placement)), bsz, step, sync))
    if not raw:
        raise WorkloadError(str(path), None, "rows", "no measurements")
    traces = {}
    for placement, rows in by_placement.items():
        arr = np.array(sorted(rows), dtype=np.float64)
        traces[placement] = PlacementTrace(arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy())
    return traces, raw


def _read_scalability(path: Path) -> list[tuple[float, ...]]:
    rows = []
    for line, row in _read_rows(path, SCALABILITY_COLUMNS):
        rows.append(tuple(_number(path, line, row, col, col != "sync_time")
                          for col in SCALABILITY_COLUMNS))
    return rows


def _read_validation(path: Path, batch_size: int) -> ValidationTrace:
    rows = _read_rows(path, VALIDATION_COLUMNS)
    if not rows:
        raise WorkloadError(str(path), None, "rows", "no epochs")
    cols = {col: np.array([_number(path, line, row, col, False) for line, row in rows])
            for col in VALIDATION_COLUMNS}
    return ValidationTrace(batch_size, cols["progress"], cols["iteration"],
                           cols["grad_sqr"], cols["grad_var"])


def read_trace_dir(path: str | Path, gpu_type: str | None = None) -> TraceData:
    """Read one application's trace directory (its name is the directory name).

    With ``gpu_type`` the step times are that type's (``placements-<type>.csv`` and
    ``scalability-<type>.csv``, the Sia artifact's layout); validation files are shared.
    """
    root = Path(path)
    if not root.is_dir():
        raise WorkloadError(str(root), None, "traces", "not a directory of application traces")
    suffix = "" if gpu_type is None else f"-{gpu_type}"
    placements, raw = _read_placements(root / f"placements{suffix}.csv")
    scalability = _read_scalability(root / f"scalability{suffix}.csv")
    validation = []
    for child in sorted(root.iterdir()):
        match = VALIDATION_FILE.match(child.name)
        if match:
            validation.append(_read_validation(child, int(match.group(1))))
    if not validation:
        raise WorkloadError(str(root), None, "validation-<B>.csv",
                            "no validation files; need one per trained batch size")
    validation.sort(key=lambda v: v.batch_size)
    # Average placements per (num_nodes, num_replicas, local_bsz), sorted by that key.
    groups: dict[tuple[float, float, float], list[tuple[float, float]]] = {}
    for nodes, replicas, bsz, step, sync in raw:
        groups.setdefault((nodes, replicas, bsz), []).append((step, sync))
    points: list[tuple[float, ...]] = list(sorted(groups))
    values: list[tuple[float, ...]] = [tuple(np.mean(np.array(groups[key]), axis=0))
                                       for key in sorted(groups)]
    points += [row[:3] for row in scalability]
    values += [row[3:] for row in scalability]
    bsz_all = [row[2] for row in raw]
    return TraceData(
        name=root.name,
        placements=placements,
        scale_points=np.array(points, dtype=np.float64),
        scale_values=np.array(values, dtype=np.float64),
        validation=tuple(validation),
        min_local_bsz=int(min(bsz_all)),
        max_local_bsz=int(max(bsz_all)),
    )


def application_dirs(traces_dir: str | Path) -> dict[str, Path]:
    """Application name -> trace directory, for every subdirectory with placements.csv."""
    root = Path(traces_dir)
    if not root.is_dir():
        raise WorkloadError(str(root), None, "--traces", "not a directory")
    found = {child.name: child for child in sorted(root.iterdir())
             if child.is_dir() and (child / "placements.csv").is_file()}
    if not found:
        raise WorkloadError(str(root), None, "--traces",
                            "no application directories (each needs placements.csv)")
    return found
