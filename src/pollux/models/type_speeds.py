"""How fast each GPU type trains, relative to the others, learned from the jobs.

The projection that bootstraps a job's model on a type it has not run on
(:mod:`pollux.models.typed`) needs a relative speed per type. The simulator reads them
from per-type traces; a live cluster has no traces, but it has jobs that ran on several
types, and each such job measured how much faster one type is *for it*. Their
1-GPU throughputs (samples per second at the job's largest atomic batch, from each type's
fitted step-time model) give, per job ``j`` and type ``t``, ``log s[j, t] = x[t] + c[j]``:
a speed per type times a size per job, fitted over every job that ran on two or more types
by alternating passes: each job's ``c`` the mean of its residuals, each type's ``x`` the
*median* over jobs (so one job reporting absurd profiles cannot move a type's speed once
three jobs have run there). Types joined to the reference type by no job
get no estimate. Speeds an operator declares (``pollux server --gpu-type-speeds``) are
kept as given, and a learned type is scaled to them through a declared type it is joined
to. Estimates are rounded to 1% so that a round's models are rebuilt only when a speed
really moves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from pollux.errors import ConfigError
from pollux.models.throughput import ThroughputParams, throughput

ALTERNATING_PASSES = 50
"""Passes of the alternating means (converged to far below the 1% rounding)."""
SPEED_STEP = 0.01
"""Learned log-speeds are rounded to multiples of this (1%)."""


def one_gpu_speed(params: ThroughputParams, local_bsz: float) -> float:
    """Samples per second of one GPU at atomic batch ``local_bsz``."""
    return float(throughput(params, 1, 1, local_bsz))


def check_type_speeds(speeds: Mapping[str, float], field: str = "gpu_type_speeds"
                      ) -> dict[str, float]:
    """Declared speeds: finite numbers > 0 by type name."""
    checked = {}
    for name, speed in speeds.items():
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(field, name, "name each GPU type, e.g. a100=6.9,t4=1")
        try:
            value = float(speed)
        except (TypeError, ValueError):
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{field}[{name!r}]", speed, "use a finite number > 0")
        checked[name] = value
    return checked


def estimate_type_speeds(jobs: Iterable[Mapping[str, float]],
                         declared: Mapping[str, float] | None = None) -> dict[str, float]:
    """Relative speed per GPU type from each job's 1-GPU speed per type it ran on (see the
    module docstring); ``declared`` speeds win and set the scale where joined."""
    given = check_type_speeds(declared or {})
    rows = [{t: math.log(s) for t, s in job.items() if s > 0 and math.isfinite(s)}
            for job in jobs]
    rows = [row for row in rows if len(row) >= 2]
    learned = _least_squares(rows)
    if not learned:
        return given
    anchor = next((t for t in given if t in learned), None)
    if anchor is not None:
        shift = math.log(given[anchor]) - learned[anchor]
    elif given:
        return given  # nothing joins the learned types to the declared scale
    else:
        shift = -min(learned.values())  # the slowest learned type = 1
    out = {t: math.exp(round((x + shift) / SPEED_STEP) * SPEED_STEP)
           for t, x in learned.items()}
    out.update(given)
    return out


def _least_squares(rows: list[dict[str, float]]) -> dict[str, float]:
    """Log-speeds of the types joined to the most-observed type (it is 0)."""
    if not rows:
        return {}
    types = sorted({t for row in rows for t in row})
    index = {t: i for i, t in enumerate(types)}
    job_of = np.concatenate([np.full(len(row), j) for j, row in enumerate(rows)])
    type_of = np.array([index[t] for row in rows for t in row])
    value = np.array([v for row in rows for v in row.values()])
    counts = np.bincount(type_of, minlength=len(types))
    reference = int(np.argmax(counts))
    joined = _component(reference, job_of, type_of, len(types))
    keep = joined[type_of]
    job_of, type_of, value = job_of[keep], type_of[keep], value[keep]
    per_job = np.bincount(job_of, minlength=len(rows)).astype(np.float64)
    members = [np.flatnonzero(type_of == i) for i in range(len(types))]
    x = np.zeros(len(types))
    for _ in range(ALTERNATING_PASSES):
        c = np.bincount(job_of, value - x[type_of], len(rows)) / np.maximum(per_job, 1)
        residual = value - c[job_of]
        x = np.array([float(np.median(residual[m])) if len(m) else 0.0 for m in members])
        x -= x[reference]
    return {t: float(x[i]) for t, i in index.items() if joined[i]}


def _component(start: int, job_of: np.ndarray, type_of: np.ndarray, num_types: int
               ) -> np.ndarray:
    """Which types are joined to ``start`` through jobs that ran on both."""
    joined = np.zeros(num_types, dtype=bool)
    joined[start] = True
    while True:
        jobs = np.unique(job_of[joined[type_of]])
        grown = joined.copy()
        grown[type_of[np.isin(job_of, jobs)]] = True
        if (grown == joined).all():
            return joined
        joined = grown
