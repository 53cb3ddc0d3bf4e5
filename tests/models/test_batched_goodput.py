"""Many jobs' goodputs in one numpy pass are exactly one call per job's."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.models import GoodputFunction, GradientStats, SpeedupFunction, ThroughputParams
from pollux.models.goodput import best_goodputs
from pollux.models.speedup import speedup_matrix

NODES = np.array([1, 1, 1, 1, 1, 2, 3, 4, 8])
REPLICAS = np.array([1, 2, 3, 5, 8, 16, 24, 32, 64])


def random_job(rng: np.random.Generator) -> tuple[GoodputFunction, float, tuple[float, float],
                                                  bool]:
    params = ThroughputParams(
        alpha_c=rng.uniform(0.02, 0.2), beta_c=rng.uniform(1e-4, 3e-3),
        alpha_n=rng.uniform(0.05, 0.5), beta_n=rng.uniform(0.0, 0.02),
        alpha_r=rng.uniform(0.01, 0.1), beta_r=rng.uniform(0.0, 0.005),
        gamma=rng.uniform(1.0, 3.0))
    m0 = float(rng.choice([32, 64, 128, 256]))
    stats = GradientStats(float(rng.choice([0.0, 1.0])), float(rng.choice([0.0, 50.0, 300.0])))
    bounds = (16.0, 256.0) if rng.random() < 0.7 else (m0 / 2, m0)
    return (GoodputFunction(params, stats, m0), m0 * float(rng.choice([1, 8, 64])), bounds,
            bool(rng.random() < 0.7))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 12))
def test_batched_goodputs_equal_one_call_per_job(seed: int, num_jobs: int) -> None:
    rng = np.random.default_rng(seed)
    jobs = [random_job(rng) for _ in range(num_jobs)]
    batched = best_goodputs([j[0] for j in jobs], [j[1] for j in jobs], [j[2] for j in jobs],
                            [j[3] for j in jobs], NODES, REPLICAS)
    single = np.array([fn.optimize(NODES, REPLICAS, m_max, bounds, acc)[0]
                       for fn, m_max, bounds, acc in jobs])
    np.testing.assert_array_equal(batched, single)


def test_speedup_matrix_equals_calls_and_fills_the_memo() -> None:
    rng = np.random.default_rng(3)
    jobs = [random_job(rng) for _ in range(7)]

    def fresh() -> list[SpeedupFunction]:
        return [SpeedupFunction(fn, m_max, bounds, acc) for fn, m_max, bounds, acc in jobs]

    fns = fresh()
    fns[0](NODES[:3], REPLICAS[:3])  # partly memoized already
    matrix = speedup_matrix(fns, NODES, REPLICAS)
    np.testing.assert_array_equal(matrix, np.array([fn(NODES, REPLICAS) for fn in fresh()]))
    assert all(not np.isnan(fn._table[NODES, REPLICAS]).any() for fn in fns)
