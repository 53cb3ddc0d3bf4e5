"""Sia's integer program on a cluster of one GPU type, from the jobs' own speedups.

:class:`~pollux.policies.hetero_pollux.HeteroPolluxPolicy` picks one configuration per job
(1 .. a node's GPUs on one node, then whole nodes) by one MILP over goodputs normalized to
one GPU, raised to ``p``, each term weighted by the job's remaining work
(``remaining_exponent``), with each job's own restart factor. It reads typed goodput
models, which the snapshot builds only on clusters of several types; this subclass feeds
it each job's ``speedup_fn`` instead (speedup over one replica is exactly the normalized
goodput row), so the same program can be measured against ``pollux`` on the paper's
one-type clusters (``bench/pollux_variants.py``, variants ``milp*``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pollux.policies.base import JobInfo
from pollux.policies.hetero_pollux import HeteroPolluxPolicy
from pollux.policies.sia import INVALID_GOODPUT, Config


class OneTypeMilpPolicy(HeteroPolluxPolicy):
    """:class:`HeteroPolluxPolicy`'s program with rows from ``JobInfo.speedup_fn``."""

    name = "pollux-milp"

    def goodput_row(self, job: JobInfo, configs: Sequence[Config]) -> np.ndarray:
        """Speedup over one replica at each configuration (beyond the cap: 1e-4; a job
        without a model may take one GPU only)."""
        row = np.full(len(configs), INVALID_GOODPUT)
        gpus = np.array([c.num_gpus for c in configs])
        nodes = np.array([c.num_nodes for c in configs])
        valid = gpus <= max(job.max_replicas, 1)
        if job.speedup_fn is None:
            row[np.argmin(gpus)] = 1.0
            return row
        if valid.any():
            values = np.asarray(job.speedup_fn(nodes[valid], gpus[valid]), dtype=np.float64)
            row[valid] = np.where(np.isfinite(values), values, 0.0)
        useful = row > INVALID_GOODPUT
        if useful.any():
            row[useful] /= row[useful].min()
        return np.maximum(row, INVALID_GOODPUT)

    def goodput_matrix(self, jobs: Sequence[JobInfo], configs: Sequence[Config]) -> np.ndarray:
        """:meth:`goodput_row` of every job."""
        if not jobs:
            return np.zeros((0, len(configs)))
        return np.stack([self.goodput_row(job, configs) for job in jobs])
