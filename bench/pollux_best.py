"""Which options `pollux` defaults to on each cluster kind: the README's rule, checked.

    python bench/pollux_best.py --run              # simulate the variants not yet stored
    python bench/pollux_best.py                    # apply the rule to the stored runs, plot

The rule (README, "pollux is our best"): on each cluster kind the default options of
`pollux` are those of the best measured variant (lowest pooled average JCT) whose

* pooled average JCT <= 0.9 x the anchor's,
* pooled p99 JCT and GPU-hours per job each <= 1.02 x the anchor's, and
* max finish-time fairness no worse than the anchor's (when both are measured),

the anchor being the paper's objective (`pollux-paper`) on the 16 x 4 cluster over the 8
paper workloads, and `sia` on the typed cluster over the 8 Philly workloads. Where no
variant qualifies, the paper's objective stays the default on that kind. Pooled: over
every job of the 8 workloads together (p99 of the 1,280 JCTs, not a mean of per-workload
p99s). Every run goes through `pollux simulate ... --json` (any number of files under
bench/results/pollux_best/KIND/, runs grouped by their policy spec), so the simulator's
refactors do not break this bench.
The plot (bench/results/pollux_best.png) is average JCT against p99 for every variant.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pollux.policies.registry import canonical_spec

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
RESULTS = ROOT / "bench" / "results" / "pollux_best"
REMAINING = "remaining_weight=0.5,remaining_restart=true,min_restart_gain=0.2,shrink_whole_nodes=true"
WM = "move_discount=both,remaining_exponent=0.5,weighted_moves=true"


@dataclass(frozen=True)
class Kind:
    """A cluster kind: where it runs, its anchor and its variants (label -> spec)."""

    args: tuple[str, ...]
    anchor: str
    variants: dict[str, str]


def kinds(shared: Path) -> dict[str, Kind]:
    """The cluster kinds, with the artifacts under ``shared`` (each artifact's folder)."""
    return {
    "16x4": Kind(
        (str(shared / "pollux-artifact" / "workloads"),
         "--traces", str(shared / "pollux-artifact" / "traces")),
        "paper", {
            "paper": "pollux-paper",
            "paper-x4": "pollux-paper(exploration_factor=4)",
            "alpha0.5-rr-g20-whole": f"pollux-paper({REMAINING})",
            "alpha0.5-rr-g20-whole-x4": f"pollux-paper({REMAINING},exploration_factor=4)",
            "alpha0.5-rr-g20-whole-x4-eff0.5-uw": f"pollux-paper({REMAINING},exploration_factor"
                                                  "=4,efficient_boost=0.5,unweighted_restarts=true)",
            "alpha1-rr-g20-whole-x4": f"pollux-paper({REMAINING.replace('0.5', '1', 1)},"
                                      "exploration_factor=4)",
            "p0.5-alpha2-rr-g20-whole-x4": f"pollux-paper({REMAINING.replace('0.5', '2', 1)},"
                                           "exploration_factor=4,p=-0.5)",
        }),
    "typed": Kind(
        (str(shared / "sia-artifact" / "workloads" / "philly"),
         "--cluster", "aws:6x4,dgx-ext:2x8,rtx:3x8",
         "--traces", str(shared / "sia-artifact" / "traces")),
        "sia", {
            "sia": "sia",
            "paper": "pollux-paper",
            "wm": f"pollux-paper({WM})",
            "wm-g4": f"pollux-paper({WM},exploration_factor=4)",
            "wm-g4i4": f"pollux-paper({WM},exploration_factor=4,initial_replicas=4)",
            "wm2-g4i4": f"pollux-paper({WM},exploration_factor=4,initial_replicas=4,"
                        "max_weight_ratio=2)",
            "pollux": "pollux",
        }),
    }


KINDS = kinds(SHARED)


NAN = math.nan
RECORDED: dict[str, dict[str, tuple[float, float, float, float]]] = {
    "16x4": {  # bench/pollux_ablation.md, 8 workloads: MEANS of per-workload avg and p99
        "paper": (2755.2, 40581, NAN, 1.83), "pollux-ga": (2741.7, 40749, NAN, 1.89),
        "alpha0.5": (2585.2, 42254, NAN, 1.78),
        "alpha0.5-rr-g20-whole": (2580.1, 41019, NAN, 1.78),
        "alpha1-rr-g20-whole": (2531.2, 41380, NAN, 1.78),
        "alpha0.5-rr-g20big-whole": (2557.7, 42384, NAN, 1.78),
        "alpha1-rr-g20big-whole": (2518.4, 42521, NAN, 1.78),
        "alpha1.5-rr-g20big-whole": (2535.8, 44174, NAN, 1.78),
        "alpha2-rr-g20big-whole": (2551.0, 44097, NAN, 1.78),
        "alpha0.5-rr-g20-whole-x4": (2486.6, 42047, NAN, 1.78),
        "alpha0.5-rr-g20-whole-x4-eff0.5-uw": (2501.7, 41707, NAN, 1.78),
        "alpha1-rr-g20-whole-x4": (2422.5, 42855, NAN, 1.78),
        "p0.5-alpha2-rr-g20-whole-x4": (2393.8, 42596, NAN, 1.78),
        "p0.5-alpha2-rr-g20-whole": (2531.2, 42056, NAN, 1.78),
        "p0.5-alpha2-rr-g20-whole-x4-eff0.5-uw": (2430.7, 43149, NAN, 1.78),
    },
    "typed": {  # bench/hetero_policy.md sections 5 and 7.2: pooled over 1,280 jobs
        "sia": (2269.9, 9.395 * 3600, 4.2044, NAN), "paper": (2273, 9.27 * 3600, 4.15, NAN),
        "both": (2299, 9.48 * 3600, 3.87, NAN), "both-boost": (2262, 9.62 * 3600, 4.07, NAN),
        "both-smith": (2227, 10.00 * 3600, 4.12, NAN),
        "both-smith2": (2220, 9.72 * 3600, 3.92, NAN),
        "wm": (2193, 9.80 * 3600, 3.96, NAN), "both-smith2-wm": (2214, 9.73 * 3600, 3.98, NAN),
        "wm-g4": (2089, 10.01 * 3600, 4.30, NAN), "wm-g4t20r2": (2175, 9.46 * 3600, 4.12, NAN),
        "wm-g4i4r2": (2052, 9.77 * 3600, 4.28, NAN), "wm-g4i4": (2012, 9.73 * 3600, 4.28, NAN),
        "wm2-g4i4": (2030.5, 9.478 * 3600, 4.2055, NAN),
        "wm1.5-g4i4": (2034, 9.88 * 3600, 4.26, NAN),
        "wm2-g4i4p0.5": (2035, 9.85 * 3600, 4.17, NAN),
        "wm2-g4i4p0.5t5": (2070, 9.78 * 3600, 4.09, NAN),
    },
}
"""Figures recorded by earlier sessions (same simulator and code paths, not rerun here):
plotted hollow and checked against the rule as recorded; the 16 x 4 ones are means of
per-workload figures without GPU-hours, so they cannot pass it, only show the frontier."""


@dataclass(frozen=True)
class Pooled:
    """One variant's figures pooled over every job of its workloads."""

    avg_jct_s: float
    p99_jct_s: float
    gpu_hours_per_job: float
    max_ftf: float
    num_jobs: int
    num_workloads: int


def stored_runs(kind: str) -> dict[str, list[dict[str, Any]]]:
    """Canonical policy spec -> its runs, from every `--json` file stored for ``kind``."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((RESULTS / kind).glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            found.setdefault(run["policy"], []).append(run)
    return found


def pooled(runs: list[dict[str, Any]]) -> Pooled:
    """The figures of ``runs`` pooled over their jobs."""
    jobs = [job for run in runs for job in run["jobs"]]
    jcts = [job["jct_s"] for job in jobs if job["jct_s"] is not None]
    ftfs = [run.get("max_ftf") for run in runs]
    return Pooled(float(np.mean(jcts)), float(np.percentile(jcts, 99)),
                  sum(job["gpu_hours"] for job in jobs) / len(jobs),
                  max((f for f in ftfs if f is not None), default=math.nan)
                  if all(f is not None for f in ftfs) else math.nan,
                  len(jobs), len(runs))


def qualifies(variant: Pooled, anchor: Pooled) -> tuple[bool, str]:
    """Whether ``variant`` passes the rule against ``anchor``, and why (or why not)."""
    ratios = (variant.avg_jct_s / anchor.avg_jct_s, variant.p99_jct_s / anchor.p99_jct_s,
              variant.gpu_hours_per_job / anchor.gpu_hours_per_job)
    why = f"avg {ratios[0]:.4f}x, p99 {ratios[1]:.4f}x, GPU-h/job {ratios[2]:.4f}x"
    fair = True
    if math.isnan(variant.max_ftf) or math.isnan(anchor.max_ftf):
        why += ", max_ftf not measured"
    else:
        fair = variant.max_ftf <= anchor.max_ftf + 1e-9
        why += f", max_ftf {variant.max_ftf:.2f} vs {anchor.max_ftf:.2f}"
    return ratios[0] <= 0.9 and ratios[1] <= 1.02 and ratios[2] <= 1.02 and fair, why


def run_missing(kind: str, labels: list[str], timeout_s: float, shared: Path = SHARED
                ) -> None:
    """Simulate each variant of ``kind`` without stored runs (one process each), on the
    artifacts under ``shared``."""
    folder = RESULTS / kind
    folder.mkdir(parents=True, exist_ok=True)
    for label in labels:
        out = folder / f"{label}.json"
        if canonical_spec(KINDS[kind].variants[label]) in stored_runs(kind):
            continue
        command = [sys.executable, "-m", "pollux.cli.main", "simulate", *kinds(shared)[kind].args,
                   "--policy", KINDS[kind].variants[label], "--processes", "1",
                   "--json", str(out) + ".part"]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True, timeout=timeout_s, stdout=subprocess.DEVNULL)
        Path(str(out) + ".part").rename(out)


def recorded(kind: str) -> dict[str, Pooled]:
    return {label: Pooled(*figures, 1280 if kind == "typed" else 0, 8)
            for label, figures in RECORDED.get(kind, {}).items()}


def check(kind: str, found: dict[str, Pooled], title: str) -> str | None:
    """Print the rule's table over ``found``; the qualifying best label, if any."""
    spec = KINDS[kind]
    anchor = found[spec.anchor]
    print(f"\n{kind}, {title} (anchor {spec.anchor}: avg {anchor.avg_jct_s:,.1f} s, p99 "
          f"{anchor.p99_jct_s:,.0f} s, {anchor.gpu_hours_per_job:.4f} GPU-h/job)")
    best = None
    for label, figures in sorted(found.items(), key=lambda item: item[1].avg_jct_s):
        ok, why = qualifies(figures, anchor)
        print(f"  {'PASS' if ok else '    '} {label:38s} {figures.avg_jct_s:9,.1f} s  {why}")
        if ok and best is None and label != spec.anchor:
            best = label
    print(f"  -> best qualifying: {best or 'none (the paper objective stays)'}")
    return best


def markdown(results: dict[str, dict[str, Pooled]]) -> str:
    """The rule's tables over the runs measured here, one per cluster kind, as Markdown."""
    lines = []
    for kind, found in results.items():
        spec = KINDS[kind]
        anchor = found.get(spec.anchor)
        if anchor is None:
            continue
        lines += [f"**{kind}** (anchor `{spec.variants[spec.anchor]}`; pooled over "
                  f"{anchor.num_jobs:,} jobs of {anchor.num_workloads} workloads)", "",
                  "| variant | policy spec | avg JCT (s) | p99 JCT (h) | GPU-hours per job "
                  "| max FTF | against the anchor | passes |", "|---|---|---|---|---|---|---|---|"]
        for label, figures in sorted(found.items(), key=lambda item: item[1].avg_jct_s):
            ok, why = qualifies(figures, anchor)
            ftf = "-" if math.isnan(figures.max_ftf) else f"{figures.max_ftf:.2f}"
            lines.append(f"| {label} | `{spec.variants[label]}` | {figures.avg_jct_s:,.1f} | "
                         f"{figures.p99_jct_s / 3600:.3f} | {figures.gpu_hours_per_job:.4f} | "
                         f"{ftf} | {why} | "
                         f"{'anchor' if label == spec.anchor else 'yes' if ok else 'no'} |")
        lines.append("")
    return "\n".join(lines)


def report(kind: str) -> tuple[str | None, dict[str, Pooled]]:
    """Print the rule's table for ``kind``; the qualifying best (None: the paper stays)."""
    spec, runs = KINDS[kind], stored_runs(kind)
    found = {label: pooled(runs[canonical_spec(text)]) for label, text in spec.variants.items()
             if canonical_spec(text) in runs}
    if spec.anchor in recorded(kind):
        check(kind, recorded(kind), "recorded by earlier sessions")
    if spec.anchor not in found:
        print(f"{kind}: anchor {spec.anchor!r} not measured here yet")
        return None, found
    for label, figures in found.items():
        print(f"  measured here: {label} = {spec.variants[label]} ({figures.num_jobs} jobs, "
              f"{figures.num_workloads} workloads)")
    best = check(kind, found, "measured here (pooled)")
    print(f"  -> default of pollux on {kind}: " + (
        f"{best} = {spec.variants[best]}" if best else "the paper's objective"))
    return best, found


def plot(results: dict[str, dict[str, Pooled]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (kind, found) in zip(axes[0], results.items()):
        anchor = found.get(KINDS[kind].anchor) or recorded(kind).get(KINDS[kind].anchor)
        for label, figures in recorded(kind).items():
            ax.scatter(figures.p99_jct_s / 3600, figures.avg_jct_s, facecolors="none",
                       edgecolors="C3" if label == KINDS[kind].anchor else "C7")
            ax.annotate(label, (figures.p99_jct_s / 3600, figures.avg_jct_s), fontsize=6,
                        color="C7")
        for label, figures in found.items():
            ax.scatter(figures.p99_jct_s / 3600, figures.avg_jct_s, color="C3"
                       if label == KINDS[kind].anchor else "C0")
            ax.annotate(label, (figures.p99_jct_s / 3600, figures.avg_jct_s), fontsize=7)
        if anchor is not None:
            ax.axhline(0.9 * anchor.avg_jct_s, color="gray", ls="--", lw=0.8)
            ax.axvline(1.02 * anchor.p99_jct_s / 3600, color="gray", ls=":", lw=0.8)
        ax.set(title=f"{kind}: anchor {KINDS[kind].anchor} (red)\nfilled: pooled, measured by "
                     "this bench; hollow: recorded earlier"
                     + ("\n(hollow: means of per-workload figures)" if kind == "16x4" else "")
                     + "\nbelow the dashed line, left of the dotted one: avg and p99 within the rule"
                     "\n(GPU-hours and max_ftf: the bench's table)",
               xlabel="pooled p99 JCT (h)", ylabel="pooled average JCT (s)")
        ax.title.set_fontsize(9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--variants", default=None, help="labels to run (default: all)")
    parser.add_argument("--run", action="store_true", help="simulate the missing variants")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="per variant")
    parser.add_argument("--shared", type=Path, default=SHARED, metavar="DIR",
                        help="the folder holding pollux-artifact/ and sia-artifact/ (--run)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                        help="also write the rule's tables as Markdown to PATH (the docs' "
                             "research pages include it)")
    args = parser.parse_args()
    names = args.kinds.split(",")
    if args.run:
        for kind in names:
            labels = [v for v in (args.variants.split(",") if args.variants
                                  else KINDS[kind].variants) if v in KINDS[kind].variants]
            run_missing(kind, labels, args.timeout_s, args.shared)
    results = {kind: report(kind)[1] for kind in names}
    plot(results, RESULTS.parent / "pollux_best.png")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(results))
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    raise SystemExit(main())
