"""Decisions of `pollux-ga` over the first hours of a workload, to check that a change
meant to be behaviour-neutral (e.g. a faster GA) decides exactly as before.

    python bench/pollux_ga_golden.py --workload workload-6 --hours 4 --out before.txt
    (change the code)
    python bench/pollux_ga_golden.py --workload workload-6 --hours 4 --compare before.txt

One line per round: a digest of the allocations and the objective value (repr). Also
prints the median and mean CPU time of a round.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from pollux.policies.registry import make_policy
from pollux.sim.runner import load_applications
from pollux.sim.simulator import ClusterConfig, Simulator
from pollux.sim.workload import read_workload, workload_files

ARTIFACT = Path(__file__).resolve().parents[1].parent / "shared" / "pollux-artifact"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="workload-6")
    parser.add_argument("--hours", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--artifact", default=str(ARTIFACT))
    parser.add_argument("--out", default=None, help="write the round lines here")
    parser.add_argument("--compare", default=None, help="round lines to compare with")
    args = parser.parse_args()
    artifact = Path(args.artifact)
    apps = load_applications(str(artifact / "traces"))
    workload = next(w for w in (read_workload(p, set(apps))
                                for p in workload_files([artifact / "workloads"]))
                    if w.name == args.workload)
    policy = make_policy("pollux-ga", seed=args.seed)
    optimize = policy.optimize
    lines: list[str] = []
    cpu_s: list[float] = []

    def recorded(*call: Any) -> Any:
        tic = time.process_time()
        decision = optimize(*call)
        cpu_s.append(time.process_time() - tic)
        digest = hashlib.sha1(json.dumps(sorted(decision.allocations.items())).encode())
        lines.append(f"{digest.hexdigest()[:16]} {decision.info.get('objective')!r}")
        return decision

    policy.optimize = recorded  # type: ignore[method-assign, assignment]
    Simulator(workload, apps, policy, ClusterConfig(max_time_s=args.hours * 3600)).run()
    print(f"{len(lines)} rounds, CPU per round: median {1e3 * np.median(cpu_s):.1f} ms, "
          f"mean {1e3 * np.mean(cpu_s):.1f} ms")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    if args.compare:
        before = Path(args.compare).read_text().splitlines()
        differing = [i for i, (a, b) in enumerate(zip(before, lines)) if a != b]
        if differing or len(before) != len(lines):
            print(f"DIFFERENT: first at round {differing[0] if differing else len(before)}"
                  f" ({len(before)} vs {len(lines)} rounds)")
            return 1
        print(f"identical decisions and objective values in all {len(lines)} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
