"""Time per scheduling round of the Pollux policies on synthetic clusters.

Prints median and p99 wall time of ``optimize`` for ``pollux`` (default optimizer) and
``pollux-ga`` side by side with 10, 50 and 200 active jobs on 64 GPUs (16 nodes x 4), and
for ``pollux`` alone with 1,000 active jobs on 2,048 GPUs (256 nodes x 8). ``--typed``
times ``pollux`` and ``sia`` on typed clusters instead, side by side with the ratio of
their medians: 64 GPUs of 3 types (aws:6x4,dgx-ext:2x8,rtx:3x8) with 50 and 100 jobs, and
2,048 GPUs of 3 types with 1,000 jobs; typed jobs carry a model per type (fitted on one,
projected to the others). It also re-solves pollux's programs of up to 5 rounds per size
with the exact MILP and prints the relative objective gap of its fast solver.

The rounds evolve like a busy cluster: each round feeds the previous decision back, ages
every job by the interval, replaces a tenth of the jobs by new arrivals, and gives a fifth
of the jobs a freshly built speedup function (as after a refit or new gradient statistics,
which empties its memo). Jobs are plausible: random step-time parameters, gradient noise,
batch limits and exploration bounds, built with ``pollux.models``.

    python bench/policy_round.py              # the full table
    python bench/policy_round.py --quick      # fewer rounds
    python bench/policy_round.py --ga --cpu   # pollux-ga alone, CPU time (loaded machines)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from pollux.cluster_spec import parse_cluster_spec
from pollux.models import GoodputFunction, GradientStats, SpeedupFunction, ThroughputParams
from pollux.models.typed import TypedGoodput, TypeProfile
from pollux.policies import JobInfo, NodeInfo, make_policy
from pollux.policies.base import Allocation, Policy, facts_by_type, typed_facts
from pollux.policies.pollux.options import BASES, SEVERAL_TYPES, PolluxOptions
from pollux.policies.pollux.typed import TypedPollux
from pollux.policies.sia import Config

INTERVAL_S = 60.0


TYPED_SMALL = "aws:6x4,dgx-ext:2x8,rtx:3x8"
TYPED_BIG = "aws:128x4,dgx-ext:96x8,rtx:96x8"


def random_params(rng: np.random.Generator) -> ThroughputParams:
    return ThroughputParams(
        alpha_c=rng.uniform(0.02, 0.2), beta_c=rng.uniform(1e-4, 3e-3),
        alpha_n=rng.uniform(0.05, 0.5), beta_n=rng.uniform(0.0, 0.02),
        alpha_r=rng.uniform(0.01, 0.1), beta_r=rng.uniform(0.0, 0.005),
        gamma=rng.uniform(1.0, 3.0))


def typed_goodput(rng: np.random.Generator) -> TypedGoodput | None:
    """A model fitted on one type, projected to the others by random speed ratios."""
    if rng.random() < 0.1:
        return None
    m0 = int(rng.choice([32, 64, 128, 256]))
    speeds = {"aws": 1.0, "dgx-ext": float(rng.uniform(2.0, 10.0)),
              "rtx": float(rng.uniform(0.4, 2.5))}
    ran = str(rng.choice(list(speeds)))
    return TypedGoodput({ran: TypeProfile(random_params(rng), int(rng.choice([1, 2, 4, 8])))},
                        GradientStats(1.0, float(rng.uniform(1.0, 300.0))), m0,
                        m0 * int(rng.choice([8, 16, 64])), (16, 256), True, speeds)


def speedup_function(rng: np.random.Generator) -> SpeedupFunction:
    params = random_params(rng)
    m0 = int(rng.choice([32, 64, 128, 256]))
    stats = GradientStats(sqr=1.0, var=float(rng.uniform(1.0, 300.0)))
    return SpeedupFunction(GoodputFunction(params, stats, m0), m0 * int(rng.choice([8, 16, 64])),
                           (16, 256), accumulation=True)


def new_job(index: int, now_s: float, rng: np.random.Generator, typed: bool = False
            ) -> JobInfo:
    cap = int(rng.choice([1, 2, 4, 8, 16, 32, 64]))
    submission_s = now_s - float(rng.uniform(0, 3600))
    age_s, num_restarts = float(rng.uniform(0, 3600)), int(rng.integers(0, 4))
    speedup = None if typed or rng.random() < 0.1 else speedup_function(rng)
    model = typed_goodput(rng) if typed else None
    caps = {t: cap for t in ("aws", "dgx-ext", "rtx")} if typed else {}
    return JobInfo(
        name=f"job-{index:05d}", resources={"gpu": 1},
        by_type=facts_by_type(cap, speedup, per_type=typed_facts(caps, model)),
        submission_time_s=submission_s, age_s=age_s, num_restarts=num_restarts)


def cluster(num_nodes: int, gpus_per_node: int) -> list[NodeInfo]:
    return [NodeInfo(f"node-{i:03d}", {"gpu": gpus_per_node}) for i in range(num_nodes)]


def time_rounds(policy_name: str, num_jobs: int, nodes: list[NodeInfo], rounds: int,
                seed: int, typed: bool = False, policy: Policy | None = None,
                clock: Callable[[], float] = time.perf_counter) -> np.ndarray:
    """Seconds of each round on ``clock`` (wall by default) of ``policy`` if given, else
    of ``policy_name``."""
    rng = np.random.default_rng(seed)
    if policy is None:
        policy = (make_policy(policy_name) if policy_name == "sia"
                  else make_policy(policy_name, seed=seed))
    jobs = [new_job(i, 0.0, rng, typed) for i in range(num_jobs)]
    next_index = num_jobs
    previous: dict[str, Allocation] = {}
    times = []
    for r in range(rounds):
        now = r * INTERVAL_S
        tic = clock()
        decision = policy.optimize(jobs, nodes, previous)
        times.append(clock() - tic)
        previous = {k: v for k, v in decision.allocations.items() if v}
        evolved = []
        for job in jobs:
            if rng.random() < 0.1:  # completed; a new job arrives
                previous.pop(job.name, None)
                evolved.append(new_job(next_index, now, rng, typed))
                next_index += 1
                continue
            refit = rng.random() < 0.2
            fn = speedup_function(rng) if refit and not typed else job.on().speedup_fn
            model = typed_goodput(rng) if refit and typed else job.typed_goodput
            evolved.append(replace(job, age_s=job.age_s + INTERVAL_S, by_type=facts_by_type(
                job.max_replicas, fn, per_type=typed_facts(job.own_caps(), model))))
        jobs = evolved
    return np.array(times)


class GapRecorder(TypedPollux):
    """Typed pollux-paper that also solves each round's program exactly (MILP) and records
    the relative objective gap of its fast solution; it follows the fast solution."""

    def __init__(self) -> None:
        super().__init__(PolluxOptions(**BASES["paper"][SEVERAL_TYPES]))
        self.gaps: list[float] = []

    def _solve(self, jobs: Sequence[JobInfo], configs: Sequence[Config], cost: np.ndarray,
               previous_config: Sequence[int | None],
               groups: Mapping[str, Sequence[NodeInfo]]) -> list[int | None]:
        weights = self._job_weights(jobs)
        found = {}
        for solver in ("milp", "fast"):
            self.solver = solver
            chosen = super()._solve(jobs, configs, cost, previous_config, groups)
            found[solver] = chosen, sum(weights[i] * (cost[i, c] - self.lambda_n)
                                        for i, c in enumerate(chosen) if c is not None)
        exact, fast = found["milp"][1], found["fast"][1]
        self.gaps.append((fast - exact) / abs(exact) if exact else 0.0)
        return found["fast"][0]


def typed_table(seed: int, rounds: int, rounds_big: int,
                clock: Callable[[], float] = time.perf_counter) -> None:
    """Round times of pollux and sia per typed size side by side, sia's over pollux's,
    and the objective gap of pollux's fast solver to the exact MILP on its own rounds."""
    print("typed clusters: round time (ms) median / p99; gap = pollux's objective vs the "
          "exact MILP on the same programs (mean / max)")
    print(f"{'cluster':>32} {'GPUs':>5} {'jobs':>5} | {'pollux':>17} | {'sia':>17} | "
          f"{'sia/pollux':>10} | {'gap':>15}")
    for spec, num_jobs, num_rounds in ((TYPED_SMALL, 50, rounds), (TYPED_SMALL, 100, rounds),
                                       (TYPED_BIG, 1000, rounds_big)):
        nodes = list(parse_cluster_spec(spec).node_infos())
        cells, medians = [], []
        for name in ("pollux", "sia"):
            t = time_rounds(name, num_jobs, nodes, num_rounds, seed, typed=True,
                            clock=clock) * 1e3
            medians.append(float(np.median(t)))
            cells.append(f"{np.median(t):7.1f} / {np.percentile(t, 99):7.1f}")
        recorder = GapRecorder()
        time_rounds("pollux", num_jobs, nodes, min(num_rounds, 5), seed, typed=True,
                    policy=recorder)
        gap = f"{100 * np.mean(recorder.gaps):.3f}% / {100 * np.max(recorder.gaps):.3f}%"
        print(f"{spec:>32} {sum(n.num_gpus for n in nodes):>5} {num_jobs:>5} | {cells[0]:>17} | "
              f"{cells[1]:>17} | {medians[1] / medians[0]:>10.1f} | {gap:>15}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--typed", action="store_true",
                        help="typed clusters: pollux and sia (see above)")
    parser.add_argument("--ga", action="store_true",
                        help="pollux-ga alone (10, 50 and 200 jobs on 16 x 4 GPUs)")
    parser.add_argument("--cpu", action="store_true",
                        help="CPU time of the process instead of wall time")
    args = parser.parse_args()
    rounds_default, rounds_ga, rounds_big = (8, 3, 3) if args.quick else (40, 10, 10)
    if args.ga:
        clock = time.process_time if args.cpu else time.perf_counter
        for num_jobs in (10, 50, 200):
            t = time_rounds("pollux-ga", num_jobs, cluster(16, 4), rounds_ga, args.seed,
                            clock=clock) * 1e3
            print(f"pollux-ga, 16 nodes x 4 GPUs, {num_jobs} jobs: median {np.median(t):.1f} ms,"
                  f" p99 {np.percentile(t, 99):.1f} ms ({'CPU' if args.cpu else 'wall'})",
                  flush=True)
        return
    if args.typed:
        typed_table(args.seed, rounds_default, rounds_big,
                    time.process_time if args.cpu else time.perf_counter)
        return

    small = cluster(16, 4)
    print("round time (ms), median / p99, 16 nodes x 4 GPUs")
    print(f"{'active jobs':>12} | {'pollux':>20} | {'pollux-ga':>20}")
    for num_jobs in (10, 50, 200):
        cells = []
        for name, rounds in (("pollux", rounds_default), ("pollux-ga", rounds_ga)):
            t = time_rounds(name, num_jobs, small, rounds, args.seed) * 1e3
            cells.append(f"{np.median(t):8.1f} / {np.percentile(t, 99):8.1f}")
        print(f"{num_jobs:>12} | {cells[0]:>20} | {cells[1]:>20}", flush=True)
    t = time_rounds("pollux", 1000, cluster(256, 8), rounds_big, args.seed) * 1e3
    print(f"\n256 nodes x 8 GPUs, 1000 active jobs, pollux: "
          f"median {np.median(t):.1f} ms, p99 {np.percentile(t, 99):.1f} ms")


if __name__ == "__main__":
    main()
