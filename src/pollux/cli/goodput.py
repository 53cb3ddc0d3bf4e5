"""``pollux goodput``: show the goodput model end to end on a synthetic profile.

It generates step-time observations from known parameters (with noise), fits the model,
and prints the goodput-optimal batch configuration and speedup per allocation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import numpy as np
from rich.table import Table

from pollux.cli.output import make_console
from pollux.errors import ConfigError
from pollux.models import (
    GoodputFunction,
    GradientStats,
    SpeedupFunction,
    ThroughputObservations,
    ThroughputParams,
    fit_throughput,
)
from pollux.models.goodput import check_batch_bounds
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


def format_params(params: ThroughputParams) -> str:
    """Each parameter with 4 significant digits (the fit is not more precise)."""
    return ", ".join(f"{field.name}={getattr(params, field.name):.4g}"
                     for field in dataclasses.fields(params))


def run(args: argparse.Namespace) -> int:
    # validate the inputs before spending time on the fit
    if args.init_batch_size < 1:
        raise ConfigError("--init-batch-size", args.init_batch_size, "must be >= 1")
    if args.max_batch_size < args.init_batch_size:
        raise ConfigError("--max-batch-size", args.max_batch_size,
                          f"must be >= --init-batch-size ({args.init_batch_size})")
    check_batch_bounds(args.init_batch_size, args.max_batch_size, (16, 256))
    if not args.noise_ratio >= 0:
        raise ConfigError("--noise-ratio", args.noise_ratio, "must be >= 0")
    console = make_console()
    rng = np.random.default_rng(args.seed)
    obs = synthetic_observations(EXAMPLE_PARAMS, rng)
    fit = fit_throughput(obs)
    if not args.json:
        console.print(f"fitted {len(obs)} observations: loss={fit.loss:.4f} "
                      f"converged={fit.converged}")
        console.print(f"  true:   {format_params(EXAMPLE_PARAMS)}", highlight=False)
        console.print(f"  fitted: {format_params(fit.params)}", highlight=False)
    goodput = GoodputFunction(fit.params, GradientStats(sqr=1.0, var=args.noise_ratio),
                              args.init_batch_size)
    speedup = SpeedupFunction(goodput, args.max_batch_size, (16, 256), accumulation=True)
    table = Table(title="goodput-optimal configuration per allocation")
    for col in ("nodes", "replicas", "batch", "atomic bsz", "accum",
                "goodput (samples/s)", "speedup"):
        table.add_column(col, justify="right")
    nodes = np.array([1, 1, 1, 2, 2, 4, 4, 8])
    replicas = np.array([1, 2, 4, 4, 8, 8, 16, 32])
    good, bsz, steps = goodput.optimize(nodes, replicas, args.max_batch_size, (16, 256), True)
    ups = speedup(nodes, replicas)
    rows = []
    for row in zip(nodes, replicas, bsz, steps, good, ups):
        n, k, b, s, g, u = (int(row[0]), int(row[1]), int(row[2]), int(row[3]),
                            float(row[4]), float(row[5]))
        rows.append({"nodes": n, "replicas": k, "batch_size": k * b * (s + 1),
                     "local_bsz": b, "accum_steps": s, "goodput": g, "speedup": u})
        table.add_row(str(n), str(k), str(k * b * (s + 1)), str(b), str(s),
                      f"{g:.1f}", f"{u:.2f}")
    if args.json:
        print(json.dumps({"fit": {"loss": fit.loss, "converged": bool(fit.converged),
                                  "params": dataclasses.asdict(fit.params),
                                  "true_params": dataclasses.asdict(EXAMPLE_PARAMS)},
                          "allocations": rows}, indent=2))
        return 0
    console.print(table)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("goodput", help="demonstrate the goodput model end to end",
                                   description=__doc__)
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the synthetic noise (default: %(default)s)")
    parser.add_argument("--init-batch-size", type=int, default=128,
                        help="initial (smallest) total batch size (default: %(default)s)")
    parser.add_argument("--max-batch-size", type=int, default=4096,
                        help="largest total batch size allowed (default: %(default)s)")
    parser.add_argument("--noise-ratio", type=float, default=20.0,
                        help="gradient variance over squared norm at the initial batch "
                             "(default: %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print the fit and the table as JSON")
    parser.set_defaults(func=run)
