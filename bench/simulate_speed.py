"""The simulator's speed against an older checkout, side by side in one run.

    git worktree add /tmp/sim-old <base commit>
    nice -n 19 python bench/simulate_speed.py --old /tmp/sim-old [--quick] [--repeat 3] [--only typed]

Runs two command lines with each checkout's code (``PYTHONPATH=<checkout>/src``; ``--new``
another checkout than this one, e.g. a ``git archive`` of a commit, so editing this one
meanwhile changes nothing), the new one first for the first and the old one first for
the second, so drifting load on a shared machine falls on both: the 8 Philly workloads
under ``sia,pollux`` on ``aws:6x4,dgx-ext:2x8,rtx:3x8`` and the 16 baseline runs (8
Pollux workloads x tiresias, optimus). It prints the wall seconds and the CPU seconds
(user + system of the simulations, the figure that a busy machine disturbs least; with
``--repeat``, the least of the repeats, old and new interleaved) of each, and whether the
average JCTs agree (relative difference per run). ``--quick`` takes Philly workload-1
and Pollux workloads 1-2. ``--blas-threads 1`` gives both checkouts one BLAS thread: the
simulations' own work alone (idle BLAS threads that spin on a busy machine once cost the
older code 5.5-5.7 CPU-s in a run's summary, and made its figures scatter up to 12x).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def commands(quick: bool, typed_policies: str) -> dict[str, list[str]]:
    def pick(folder: Path, count: int) -> list[str]:
        return ([str(folder / f"workload-{w}.csv") for w in range(1, count + 1)] if quick
                else [str(folder)])
    sia, pollux = SHARED / "sia-artifact", SHARED / "pollux-artifact"
    return {
        f"typed {typed_policies}": [
            "simulate", *pick(sia / "workloads" / "philly", 1), "--cluster",
            "aws:6x4,dgx-ext:2x8,rtx:3x8", "--traces", str(sia / "traces"),
            "--policy", typed_policies],
        "baselines (tiresias,optimus)": [
            "simulate", *pick(pollux / "workloads", 2), "--traces", str(pollux / "traces"),
            "--policy", "tiresias,optimus"],
    }


def timed(src: Path, args: list[str], processes: int, blas_threads: int | None = None
          ) -> tuple[float, float, dict[str, float]]:
    """(wall s, CPU s, run -> average JCT) of ``pollux <args>`` with ``src``'s code
    (``blas_threads``: BLAS thread pools of that size, set through the environment)."""
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    if blas_threads is not None:
        env.update({name: str(blas_threads) for name in
                    ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        tic = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pollux.cli.main", *args, "--processes",
                        str(processes), "--json", str(out)], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - tic
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs = json.loads(out.read_text())["runs"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, {f"{r['policy']}/{r['workload']}": r["avg_jct_s"] for r in runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, type=Path, help="the older checkout")
    parser.add_argument("--new", type=Path, default=ROOT, help="the newer checkout (this one)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each (least kept)")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true",
                        help="Philly workload-1 and Pollux workloads 1-2 only")
    parser.add_argument("--only", choices=("typed", "baselines"),
                        help="one of the two command lines")
    parser.add_argument("--typed-policies", default="sia,pollux",
                        help="policies of the typed run (default sia,pollux; the same "
                             "name must mean the same policy in both checkouts)")
    parser.add_argument("--blas-threads", type=int,
                        help="BLAS threads of both checkouts (1: compares the simulation "
                             "work alone; by default each sets its own, and code that lets "
                             "idle BLAS threads spin pays for it)")
    args = parser.parse_args()
    print("| runs | old wall s | new wall s | old CPU s | new CPU s | new / old CPU | "
          "max avg-JCT difference | CPU s of each run (old; new) |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (name, cmd) in enumerate(commands(args.quick, args.typed_policies).items()):
        if args.only is not None and not name.startswith(args.only):
            continue
        order = [("new", args.new), ("old", args.old)]
        runs: dict[str, list[tuple[float, float, dict[str, float]]]] = {"new": [], "old": []}
        for r in range(args.repeat):
            for label, src in (order if (i + r) % 2 == 0 else order[::-1]):
                runs[label].append(timed(src, cmd, args.processes, args.blas_threads))
        (ow, oc, oj), (nw, nc, nj) = (min(runs[label], key=lambda run: run[1])
                                      for label in ("old", "new"))
        diff = max(abs(nj[k] / oj[k] - 1) for k in oj) if set(oj) == set(nj) else float("nan")
        each = "; ".join(" ".join(f"{run[1]:.1f}" for run in runs[label])
                         for label in ("old", "new"))
        print(f"| {name} | {ow:.0f} | {nw:.0f} | {oc:.1f} | {nc:.1f} | {nc / oc:.2f} | "
              f"{diff:.2e} | {each} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
