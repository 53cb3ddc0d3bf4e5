"""Benchmark of the goodput model: fit time and speedup query time.

Prints the median time of one fit of 30 observations, and the time to evaluate the
speedup of 10,000 (nodes, replicas) pairs cold (first query) and warm (memoized).
Aims: a fit well under 50 ms; warm speedup queries for 10,000 pairs under 5 ms.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from pollux.models import (
    GoodputFunction,
    GradientStats,
    SpeedupFunction,
    ThroughputObservations,
    ThroughputParams,
    fit_throughput_params,
)
from pollux.models.throughput import compute_time, optimizer_step_time

TRUE = ThroughputParams(0.05, 0.002, 0.15, 0.01, 0.04, 0.004, 1.8)


def observations(num: int, rng: np.random.Generator) -> ThroughputObservations:
    nodes = rng.integers(1, 5, num)
    replicas = nodes * rng.integers(1, 5, num)
    bsz = rng.choice([16, 32, 64], num)
    t_c = compute_time(TRUE, bsz) * rng.lognormal(0, 0.05, num)
    t_o = optimizer_step_time(TRUE, nodes, replicas, bsz) * rng.lognormal(0, 0.05, num)
    return ThroughputObservations(nodes, replicas, bsz, t_c, t_o)


def main() -> None:
    rng = np.random.default_rng(0)
    fit_s = []
    for _ in range(30):
        obs = observations(30, rng)
        start = time.perf_counter()
        fit_throughput_params(obs)
        fit_s.append(time.perf_counter() - start)
    print(f"fit of 30 observations:      median {statistics.median(fit_s) * 1e3:7.2f} ms "
          f"(max {max(fit_s) * 1e3:.2f} ms; aim < 50 ms)")

    goodput = GoodputFunction(TRUE, GradientStats(1.0, 50.0), 128)
    nodes = rng.integers(1, 65, 10_000)
    replicas = nodes * rng.integers(1, 9, 10_000)
    cold_s, warm_s = [], []
    for _ in range(5):
        speedup = SpeedupFunction(goodput, 8192, (16, 256), accumulation=True)
        start = time.perf_counter()
        speedup(nodes, replicas)
        cold_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        speedup(nodes, replicas)
        warm_s.append(time.perf_counter() - start)
    cold, warm = statistics.median(cold_s), statistics.median(warm_s)
    print(f"speedup of 10,000 pairs cold: median {cold * 1e3:7.2f} ms")
    print(f"speedup of 10,000 pairs warm: median {warm * 1e3:7.2f} ms (aim < 5 ms); "
          f"cold/warm = {cold / warm:.0f}x")


if __name__ == "__main__":
    main()
