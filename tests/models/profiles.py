"""Synthetic step-time profiles generated from known parameters."""

from __future__ import annotations

import numpy as np

from pollux.models import ThroughputObservations, ThroughputParams
from pollux.models.throughput import compute_time, optimizer_step_time

TRUE_PARAMS = ThroughputParams(
    alpha_c=0.05, beta_c=0.002, alpha_n=0.15, beta_n=0.01, alpha_r=0.04, beta_r=0.004,
    gamma=1.8)


def realistic_configs() -> list[tuple[int, int]]:
    """1-4 replicas on one node, 2-16 replicas on 2-4 nodes."""
    configs = [(1, k) for k in (1, 2, 3, 4)]
    configs += [(n, k) for n in (2, 3, 4) for k in range(2 * n, 17, 2)]
    return configs


def noisy_observations(
    params: ThroughputParams,
    configs: list[tuple[int, int]],
    local_bszs: tuple[int, ...] = (16, 32, 64),
    noise: float = 0.05,
    seed: int = 0,
) -> ThroughputObservations:
    rng = np.random.default_rng(seed)
    rows = []
    for n, k in configs:
        for b in local_bszs:
            t_c = float(compute_time(params, b)) * rng.lognormal(0.0, noise)
            t_o = float(optimizer_step_time(params, n, k, b)) * rng.lognormal(0.0, noise)
            rows.append((n, k, b, t_c, t_o))
    return ThroughputObservations.from_records(rows)
