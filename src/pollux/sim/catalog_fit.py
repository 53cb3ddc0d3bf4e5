"""Regenerating the built-in catalog from a trace directory (artifact format).

    python -m pollux.sim.catalog_fit ARTIFACT/traces \\
        -o src/pollux/data/catalog.json

For each application: batch bounds and epochs as the reference simulator derives them;
:class:`~pollux.models.ThroughputParams` fitted with
:func:`~pollux.models.fit_throughput_params` to every placement and scalability
measurement (compute time = step time - sync time); the progress of one epoch; and, per
measured batch size, the noise ratio ``var / sqr`` over epochs reduced to a few knots of a
piecewise-linear function (in log space) fitted so that each epoch's time multiplier
``1 / gain`` at that batch size is kept in least squares.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.optimize

from pollux.models import fit_throughput_params
from pollux.sim.applications import TraceApplication
from pollux.sim.catalog import AppModel, NoiseModel
from pollux.sim.traces import TraceData, application_dirs, read_trace_dir

MAX_NOISE_KNOTS = 10
"""Knots of the piecewise-linear noise-ratio curve per batch size (geometric in epochs:
the noise ratio changes fastest early in training)."""
MAX_LOG_RATIO = 25.0
"""Bound on log(var / sqr) (a zero squared gradient means pure noise)."""


def throughput_rows(trace: TraceData) -> list[tuple[float, float, float, float, float]]:
    """(nodes, replicas, local_bsz, compute_s, step_s) of every measurement."""
    rows: list[tuple[float, float, float, float, float]] = []
    for placement, meas in trace.placements.items():
        nodes, replicas = float(sum(1 for c in placement if c)), float(sum(placement))
        for bsz, step, sync in zip(meas.local_bsz, meas.step_time, meas.sync_time):
            rows.append((nodes, replicas, bsz, max(step - sync, 1e-6 * step), step))
    num_groups = len({r[:3] for r in rows})
    for (nodes, replicas, bsz), (step, sync) in zip(trace.scale_points[num_groups:],
                                                   trace.scale_values[num_groups:]):
        rows.append((nodes, replicas, bsz, max(step - sync, 1e-6 * step), step))
    return rows


def _hat_basis(epochs: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation matrix: values at ``epochs`` from values at knots."""
    basis = np.zeros((epochs.size, knots.size))
    for j in range(knots.size):
        unit = np.zeros(knots.size)
        unit[j] = 1.0
        basis[:, j] = np.interp(epochs, knots, unit)
    return basis


def fit_noise_row(grad_sqr: np.ndarray, grad_var: np.ndarray, scale: float,
                  knots: np.ndarray) -> np.ndarray:
    """Knot values of log(var/sqr) keeping ``1 / gain`` per epoch at ``scale``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(np.where(grad_sqr > 0, grad_var / grad_sqr, np.inf))
    log_ratio = np.clip(np.nan_to_num(log_ratio, nan=0.0, posinf=MAX_LOG_RATIO),
                        -MAX_LOG_RATIO, MAX_LOG_RATIO)
    epochs = np.arange(log_ratio.size, dtype=np.float64)
    basis = _hat_basis(epochs, knots)

    def multiplier(log_r: np.ndarray) -> np.ndarray:
        r = np.exp(log_r)
        return (r / scale + 1.0) / (r + 1.0)

    target = multiplier(log_ratio)
    start = np.linalg.lstsq(basis, log_ratio, rcond=None)[0]
    if scale <= 1.0:  # at the initial batch the ratio does not change the time
        return start
    weight = np.sqrt(log_ratio.size)

    def residuals(z: np.ndarray) -> np.ndarray:
        fitted = multiplier(basis @ z)
        # Per-epoch errors, plus the error of the total (the training time) weighted up.
        return np.append(fitted - target, weight * (fitted.sum() - target.sum()))

    result = scipy.optimize.least_squares(residuals, np.clip(start, -MAX_LOG_RATIO,
                                                             MAX_LOG_RATIO),
                                          bounds=(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    return np.asarray(result.x)


def fit_application(trace: TraceData) -> AppModel:
    app = TraceApplication(trace)
    spec = app.spec
    epochs = spec.max_epochs
    knots = np.unique(np.geomspace(1, epochs, min(epochs, MAX_NOISE_KNOTS)).round() - 1)
    rows = []
    for val in trace.validation:
        scale = val.batch_size / spec.init_batch_size
        rows.append(tuple(float(v) for v in fit_noise_row(
            val.grad_sqr[:epochs], val.grad_var[:epochs], scale, knots)))
    return AppModel(
        spec=spec,
        throughput=fit_throughput_params(throughput_rows(trace)),
        progress_per_epoch=app.epoch_progress(epochs) / epochs,
        noise=NoiseModel(trace.batch_sizes, tuple(float(k) for k in knots), tuple(rows)),
    )


def build_catalog(traces_dir: str | Path) -> dict[str, Any]:
    """The catalog document for every application of a trace directory."""
    apps = {name: fit_application(read_trace_dir(path)).to_dict()
            for name, path in application_dirs(traces_dir).items()}
    return {"source": "fitted by pollux.sim.catalog_fit to the Pollux artifact traces "
                      "(petuum/adaptdl osdi21-artifact, Apache-2.0)",
            "applications": apps}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pollux.sim.catalog_fit",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", help="trace directory (one folder per application)")
    parser.add_argument("-o", "--output", help="catalog JSON to write (default: stdout)")
    args = parser.parse_args(argv)
    text = json.dumps(build_catalog(args.traces), indent=1) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
