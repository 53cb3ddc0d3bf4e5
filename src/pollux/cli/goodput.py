"""``pollux goodput``: show the goodput model end to end on a synthetic profile.

It generates step-time observations from known parameters (with noise), fits the model,
and prints the goodput-optimal batch configuration and speedup per allocation.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from pollux.models import (
    GoodputFunction,
    GradientStats,
    SpeedupFunction,
    ThroughputObservations,
    ThroughputParams,
    fit_throughput,
)
from pollux.models.throughput import compute_time, optimizer_step_time

EXAMPLE_PARAMS = ThroughputParams(
    alpha_c=0.03, beta_c=0.0015, alpha_n=0.12, beta_n=0.008, alpha_r=0.03, beta_r=0.002,
    gamma=1.6)
"""A ResNet-like job on 4-GPU nodes (made-up but realistic magnitudes)."""


def synthetic_observations(
    params: ThroughputParams, rng: np.random.Generator, noise: float = 0.05
) -> ThroughputObservations:
    """Observations over a realistic profile: 1-4 replicas on 1 node, 2-16 on 2-4 nodes."""
    configs = [(1, k) for k in range(1, 5)]
    configs += [(n, k) for n in (2, 3, 4) for k in range(2 * n, 17, n)]
    rows = []
    for n, k in configs:
        for bsz in (32, 64, 128):
            t_c = float(compute_time(params, bsz)) * rng.lognormal(0.0, noise)
            t_o = float(optimizer_step_time(params, n, k, bsz)) * rng.lognormal(0.0, noise)
            rows.append((n, k, bsz, t_c, t_o))
    return ThroughputObservations.from_records(rows)


def run(args: argparse.Namespace) -> int:
    console = Console()
    rng = np.random.default_rng(args.seed)
    obs = synthetic_observations(EXAMPLE_PARAMS, rng)
    fit = fit_throughput(obs)
    console.print(f"fitted {len(obs)} observations: loss={fit.loss:.4f} "
                  f"converged={fit.converged}")
    console.print(f"  true:   {EXAMPLE_PARAMS}")
    console.print(f"  fitted: {fit.params}")
    goodput = GoodputFunction(fit.params, GradientStats(sqr=1.0, var=args.noise_ratio),
                              args.init_batch_size)
    speedup = SpeedupFunction(goodput, args.max_batch_size, (16, 256), accumulation=True)
    table = Table(title="goodput-optimal configuration per allocation")
    for col in ("nodes", "replicas", "batch", "atomic bsz", "accum", "goodput", "speedup"):
        table.add_column(col, justify="right")
    nodes = np.array([1, 1, 1, 2, 2, 4, 4, 8])
    replicas = np.array([1, 2, 4, 4, 8, 8, 16, 32])
    good, bsz, steps = goodput.optimize(nodes, replicas, args.max_batch_size, (16, 256), True)
    ups = speedup(nodes, replicas)
    for row in zip(nodes, replicas, bsz, steps, good, ups):
        n, k, b, s, g, u = (int(row[0]), int(row[1]), int(row[2]), int(row[3]),
                            float(row[4]), float(row[5]))
        table.add_row(str(n), str(k), str(k * b * (s + 1)), str(b), str(s),
                      f"{g:.1f}", f"{u:.2f}")
    console.print(table)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("goodput", help="demonstrate the goodput model end to end",
                                   description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic noise")
    parser.add_argument("--init-batch-size", type=int, default=128,
                        help="initial (smallest) total batch size")
    parser.add_argument("--max-batch-size", type=int, default=4096,
                        help="largest total batch size allowed")
    parser.add_argument("--noise-ratio", type=float, default=20.0,
                        help="gradient variance over squared norm at the initial batch")
    parser.set_defaults(func=run)
