"""How wrong is the bootstrap of a job's model onto a GPU type it has not run on?

For every application of the Sia artifact and every ordered pair of GPU types (d -> c),
fit the 7-parameter model to what a job measured on d, project it to c, and compare the
predicted throughput (samples/s) with the measured one at every row of c's placements
file (nodes, replicas, local batch). Projections:

* ``sia``: every time scaled by the ratio of 1-GPU throughputs c:d (Sia's bootstrap,
  :func:`pollux.models.typed.project_params`; ratio = max local_bsz / max step_time over
  the 1-replica rows of each type's placements file);
* ``compute``: only the compute times scaled, the sync times kept from d;
* ``fit-on-c``: the model fitted on c itself from the same kind of data (the floor: what
  the job would know after running there).

Source data: ``1gpu`` (the 1-replica rows of d: a job that has just started) or ``all``
(every placement of d). Prints the median and 90th percentile of |predicted/measured - 1|
per (source data, method), pooled over applications and type pairs, and per application.

    python bench/hetero_bootstrap.py [--traces ../shared/sia-artifact/traces]
    python bench/hetero_bootstrap.py --traces DIR --markdown docs/research/results/hetero-bootstrap.md
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np

from pollux.models import ThroughputParams, fit_throughput_params, throughput
from pollux.models.typed import project_params
from pollux.sim.traces import TraceData, read_trace_dir

TYPES = ("aws", "dgx-ext", "rtx")
APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


def rows(trace: TraceData, one_gpu_only: bool) -> list[tuple[float, float, float, float, float]]:
    """(nodes, replicas, local_bsz, compute s, step s) of every placement measurement."""
    out = []
    for placement, data in trace.placements.items():
        nodes, replicas = sum(1 for c in placement if c), sum(placement)
        if one_gpu_only and replicas != 1:
            continue
        for bsz, step, sync in zip(data.local_bsz, data.step_time, data.sync_time):
            out.append((float(nodes), float(replicas), float(bsz), max(step - sync, 1e-9),
                        float(step)))
    return out


def one_gpu_throughput(trace: TraceData) -> float:
    """Sia's 1-GPU throughput: max local batch / max step time over 1-replica rows."""
    found = [(float(d.local_bsz.max()), float(d.step_time.max()))
             for p, d in trace.placements.items() if sum(p) == 1]
    return max(b for b, _ in found) / max(t for _, t in found)


def one_gpu_line(trace: TraceData) -> tuple[float, float]:
    """Least-squares (intercept s, slope s/sample) of 1-GPU step time over local batch."""
    data = np.array(rows(trace, one_gpu_only=True))
    slope, intercept = np.polyfit(data[:, 2], data[:, 4], 1)
    return max(float(intercept), 1e-6), max(float(slope), 1e-9)


def errors(params: ThroughputParams, target: TraceData, one_gpu_only: bool = False
           ) -> np.ndarray:
    data = np.array(rows(target, one_gpu_only))
    nodes, replicas, bsz, _, step = data.T
    predicted = throughput(params, nodes, replicas, bsz)
    measured = replicas * bsz / step
    return np.abs(predicted / measured - 1.0)


def project_linear(source: ThroughputParams, ratio: float, line_d: tuple[float, float],
                   line_c: tuple[float, float]) -> ThroughputParams:
    """Compute intercept and slope each scaled by its own 1-GPU ratio, sync by ``ratio``."""
    scaled = project_params(source, ratio)
    return replace(scaled, alpha_c=source.alpha_c * line_c[0] / line_d[0],
                   beta_c=source.beta_c * line_c[1] / line_d[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=str(Path("..", "shared", "sia-artifact", "traces")))
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                        help="also write the pooled table as Markdown to PATH (the docs' "
                             "research pages include it)")
    args = parser.parse_args()
    traces = {(app, t): read_trace_dir(Path(args.traces, app), t) for app in APPS for t in TYPES}
    pooled: dict[tuple[str, str], list[np.ndarray]] = {}
    pooled_one: dict[tuple[str, str], list[np.ndarray]] = {}
    per_app: dict[tuple[str, str, str], list[np.ndarray]] = {}
    for source_kind in ("1gpu", "all"):
        fits = {key: fit_throughput_params(rows(trace, source_kind == "1gpu"))
                for key, trace in traces.items()}
        for app, (d, c) in itertools.product(APPS, itertools.permutations(TYPES, 2)):
            ratio = one_gpu_throughput(traces[app, c]) / one_gpu_throughput(traces[app, d])
            source = fits[app, d]
            methods = {
                "sia": project_params(source, ratio),
                "compute": replace(source, alpha_c=source.alpha_c / ratio,
                                   beta_c=source.beta_c / ratio),
                "linear": project_linear(source, ratio, one_gpu_line(traces[app, d]),
                                         one_gpu_line(traces[app, c])),
                "fit-on-c": fits[app, c],
            }
            for method, params in methods.items():
                err = errors(params, traces[app, c])
                pooled.setdefault((source_kind, method), []).append(err)
                one = errors(params, traces[app, c], one_gpu_only=True)
                pooled_one.setdefault((source_kind, method), []).append(one)
                per_app.setdefault((source_kind, method, app), []).append(err)
    print("|predicted/measured - 1| of throughput on the unseen type (all its placements)")
    print("on every placement of the unseen type, and (1-GPU) on its 1-GPU rows only")
    print(f"{'source':<6} {'method':<9} {'median':>7} {'p90':>7} {'1-GPU':>7} {'p90':>7}"
          "   per app (median)")
    table = ["| source data | projection | median | p90 | median, 1-GPU rows | p90, 1-GPU rows |",
             "|---|---|---|---|---|---|"]
    for (source_kind, method), errs in pooled.items():
        err = np.concatenate(errs)
        one = np.concatenate(pooled_one[source_kind, method])
        apps = " ".join(
            f"{app}={np.median(np.concatenate(per_app[source_kind, method, app])):.2f}"
            for app in APPS)
        print(f"{source_kind:<6} {method:<9} {np.median(err):7.3f} "
              f"{np.percentile(err, 90):7.3f} {np.median(one):7.3f} "
              f"{np.percentile(one, 90):7.3f}   {apps}")
        table.append(f"| {source_kind} | {method} | {np.median(err):.3f} | "
                     f"{np.percentile(err, 90):.3f} | {np.median(one):.3f} | "
                     f"{np.percentile(one, 90):.3f} |")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join(table) + "\n")
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
