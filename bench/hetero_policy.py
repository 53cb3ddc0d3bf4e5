"""Variants of the typed ``pollux`` policy against ``sia`` on the Philly workloads.

Runs named variants (policy settings, and an *oracle* that hands the policy every job's
per-type model fitted to the whole trace instead of the bootstrap projection) over the
chosen workloads of ``../shared/sia-artifact/workloads/philly`` on
``aws:6x4,dgx-ext:2x8,rtx:3x8`` and prints, per variant, pooled average / p99 JCT,
GPU-hours and restarts per job, per workload average JCT, and a per-application
breakdown (JCT, first-allocation wait, restarts, GPU-hours, share of rounds on each type).

    python bench/hetero_policy.py --variants sia,pollux,oracle --workloads 1,7 [--json OUT]

The study and its figures: ``bench/hetero_policy.md``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pollux.cluster_spec import parse_cluster_spec
from pollux.models import fit_throughput_params
from pollux.models.typed import TypedGoodput, TypeProfile
from pollux.policies.registry import make_policy
from pollux.sim.applications import load_typed_applications
from pollux.sim.config import ClusterConfig
from pollux.sim.job import SimJob
from pollux.sim.semantics import SIA_ARTIFACT
from pollux.sim.simulator import SimulationResult, Simulator
from pollux.sim.workload import read_workload

ARTIFACT = Path("..", "shared", "sia-artifact")
CLUSTER = "aws:6x4,dgx-ext:2x8,rtx:3x8"

def _paper(options: str) -> str:
    """``pollux-paper`` (the typed program, every option off) with ``options``."""
    return f"pollux-paper({options})"


WM = "move_discount=both,remaining_exponent=0.5,weighted_moves=true"
G4 = f"{WM},exploration_factor=4"
VARIANTS: dict[str, str] = {
    "sia": "sia",
    "paper": "pollux-paper",  # the typed default before pollux took the best (sections 1-7)
    "pollux": "pollux",  # = wm2-g4i4 (README rule)
    "age": _paper("move_discount=age,remaining_exponent=0"),
    "rem": _paper("move_discount=remaining,remaining_exponent=0"),
    "both": _paper("move_discount=both,remaining_exponent=0"),
    "smith": _paper("move_discount=age,remaining_exponent=0.5"),
    "both-smith": _paper("move_discount=both,remaining_exponent=0.5"),
    "both-smith2": _paper("move_discount=both,remaining_exponent=0.5,max_weight_ratio=2"),
    "both-smith-wm": _paper(WM),
    "both-smith2-wm": _paper(f"{WM},max_weight_ratio=2"),
    "both-boost": _paper("move_discount=both,remaining_exponent=0.5,min_weight=1"),
    "wm-g4": _paper(G4),
    "wm-g8": _paper(f"{WM},exploration_factor=8"),
    "wm-g4s2": _paper(f"{G4},fast_growth_share=0.02"),
    "wm-g8s2": _paper(f"{WM},exploration_factor=8,fast_growth_share=0.02"),
    **{f"wm-g4p{price}": _paper(f"{G4},gpu_price={price / 1000}") for price in (2, 5, 10, 20)},
    **{f"wm-g4t{share}": _paper(f"{G4},tail_share={share / 100}") for share in (5, 10, 20)},
    **{f"wm-g4r{scale}": _paper(f"{G4},restart_scale={scale}") for scale in (2, 4)},
    **{f"wm-g4t20w{weight}": _paper(f"{G4},tail_share=0.2,tail_weight={weight}")
       for weight in (2, 4)},
    **{f"wm-g4t{share}r2": _paper(f"{G4},tail_share={share / 100},restart_scale=2")
       for share in (10, 20)},
    **{f"wm-g4i{start}": _paper(f"{G4},initial_replicas={start}") for start in (2, 4, 8)},
    "wm-g4i4r2": _paper(f"{G4},initial_replicas=4,restart_scale=2"),
    "wm-g4i4t20r2": _paper(f"{G4},initial_replicas=4,tail_share=0.2,restart_scale=2"),
    **{f"wm-g4i4t20w{weight}": _paper(
        f"{G4},initial_replicas=4,tail_share=0.2,tail_weight={weight / 100}")
       for weight in (50, 100)},
    **{f"wm{ratio}-g4i4": _paper(f"{G4},initial_replicas=4,max_weight_ratio={ratio}")
       for ratio in (1.5, 2)},
    "wm2-g4i4p0.5": _paper(f"{G4},initial_replicas=4,max_weight_ratio=2,gpu_price=0.0005"),
    "wm2-g4i4p0.5t5": _paper(f"{G4},initial_replicas=4,max_weight_ratio=2,gpu_price=0.0005,"
                             "tail_share=0.05"),
    "age-g4": _paper("exploration_factor=4"),
}
"""Variant name -> policy spec (``pollux policies`` lists the options); ``oracle-<variant>`` runs it with oracle models,
``linear-<variant>`` with the per-term linear bootstrap, ``norestart-<variant>`` with
every restart delay 0 (a ceiling)."""


def _typed_traces(traces_dir: str) -> Iterator[tuple[Any, str]]:
    """(trace, GPU type) of every application directory measured on each of the
    cluster's types (an application without a type is skipped)."""
    from pollux.sim.traces import read_trace_dir
    for app_dir in sorted(Path(traces_dir).iterdir()):
        if not app_dir.is_dir():
            continue
        for gpu_type in parse_cluster_spec(CLUSTER).gpu_types:
            try:
                trace = read_trace_dir(app_dir, gpu_type)
            except Exception:  # noqa: BLE001 - an application without this type
                continue
            yield trace, gpu_type


def _oracle_models(traces_dir: str) -> dict[tuple[str, str], Any]:
    """(application, type) -> throughput params fitted to every placement measured."""
    fits = {}
    for trace, gpu_type in _typed_traces(traces_dir):
        rows = []
        for placement, data in trace.placements.items():
            nodes, replicas = sum(1 for c in placement if c), sum(placement)
            for bsz, step, sync in zip(data.local_bsz, data.step_time, data.sync_time):
                rows.append((float(nodes), float(replicas), float(bsz),
                             max(float(step - sync), 1e-9), float(step)))
        fits[trace.name, gpu_type] = fit_throughput_params(rows)
    return fits


def _install_oracle(traces_dir: str) -> None:
    """Jobs describe themselves to the policy with the whole-trace fit on every type."""
    fits = _oracle_models(traces_dir)

    def typed_goodput(self: SimJob) -> TypedGoodput | None:
        if self.grad_stats is None:
            return None
        key = ("oracle", self.grad_stats,
               tuple(p.max_profiled_replicas for p in self.profiles.values()))
        if self._model is not None and self._model[0] == key:
            return self._model[1]
        ref = self.app.reference().spec
        profiles = {t: TypeProfile(fits[self.app.name, t],
                                   self.profiles[t].max_profiled_replicas)
                    for t in self.app.by_type}
        bounds = {t: (float(a.spec.min_local_bsz), float(a.spec.max_local_bsz))
                  for t, a in self.app.by_type.items()}
        model = TypedGoodput(profiles, self.grad_stats, ref.init_batch_size,
                             ref.max_batch_size, bounds, True, None)
        self._model = (key, model)
        return model

    SimJob.typed_goodput = typed_goodput  # type: ignore[method-assign]


def _one_gpu_lines(traces_dir: str) -> dict[tuple[str, str], tuple[float, float]]:
    """(application, type) -> least-squares (intercept s, slope s/sample) of the 1-GPU
    step time over the local batch (what profiling one GPU at two batches gives)."""
    lines = {}
    for trace, gpu_type in _typed_traces(traces_dir):
        bsz, step = [], []
        for placement, data in trace.placements.items():
            if sum(placement) == 1:
                bsz += [float(b) for b in data.local_bsz]
                step += [float(t) for t in data.step_time]
        slope, intercept = np.polyfit(bsz, step, 1)
        lines[trace.name, gpu_type] = (max(float(intercept), 1e-6), max(float(slope), 1e-9))
    return lines


def _install_linear(traces_dir: str) -> None:
    """Jobs project their fitted model onto unseen types per term: the compute intercept
    and slope each by the ratio of the 1-GPU lines' intercepts and slopes, the sync times
    by the 1-GPU speed ratio (``bench/hetero_bootstrap.py``: error 0.20 against 0.28)."""
    from pollux.models.typed import project_params
    lines = _one_gpu_lines(traces_dir)
    original = SimJob.typed_goodput

    def typed_goodput(self: SimJob) -> TypedGoodput | None:
        model = original(self)
        if model is None or not model.projected_from or self.type_speeds is None:
            return model
        cached = getattr(self, "_linear", None)
        if cached is not None and cached[0] is model:
            return cached[1]
        profiles = dict(model.profiles)
        for gpu_type, source in model.projected_from.items():
            fitted = model.params[source]
            ratio = self.type_speeds[gpu_type] / self.type_speeds[source]
            line_d, line_c = lines[self.app.name, source], lines[self.app.name, gpu_type]
            params = replace(project_params(fitted, ratio),
                             alpha_c=fitted.alpha_c * line_c[0] / line_d[0],
                             beta_c=fitted.beta_c * line_c[1] / line_d[1])
            profiles[gpu_type] = TypeProfile(params, 0)
        ref = self.app.reference().spec
        bounds = {t: (float(a.spec.min_local_bsz), float(a.spec.max_local_bsz))
                  for t, a in self.app.by_type.items()}
        linear = TypedGoodput(profiles, model.grad_stats, ref.init_batch_size,
                              ref.max_batch_size, bounds, True, None)
        self._linear = (model, linear)  # type: ignore[attr-defined]
        return linear

    SimJob.typed_goodput = typed_goodput  # type: ignore[method-assign]


def run_one(variant: str, workload_path: str, traces_dir: str) -> dict[str, Any]:
    """One simulation; per-job details for the breakdown."""
    base = variant.removeprefix("oracle-")
    if base != variant:
        _install_oracle(traces_dir)
    elif variant.startswith("linear-"):
        base = variant.removeprefix("linear-")
        _install_linear(traces_dir)
    config = ClusterConfig(cluster=parse_cluster_spec(CLUSTER), semantics=SIA_ARTIFACT)
    if variant.startswith("norestart-"):  # a ceiling: every restart free
        base = variant.removeprefix("norestart-")
        config = replace(config, semantics=replace(SIA_ARTIFACT, restart_delays_s=None),
                         restart_delay_s=0.0)
    apps = load_typed_applications(traces_dir, parse_cluster_spec(CLUSTER).gpu_types)
    workload = read_workload(workload_path)
    result: SimulationResult = Simulator(workload, apps, make_policy(VARIANTS[base]),
                                         config).run()
    first: dict[str, float] = {}
    for log in result.rounds:
        for name in log.gpus:
            first.setdefault(name, log.time_s)
    jobs = []
    for job in result.jobs:
        done = job.completion_time_s
        jobs.append({
            "name": job.name, "app": job.spec.application,
            "jct_s": None if done is None else done - job.spec.submission_time_s,
            "wait_s": first.get(job.name, np.nan) - job.spec.submission_time_s,
            "restarts": job.num_restarts or 0, "gpu_h": job.held_gpu_s / 3600.0,
            "types": result.gpu_types.get(job.name, {}),
        })
    return {"variant": variant, "workload": workload.name, "jobs": jobs,
            "wall_s": result.wall_s}


def report(runs: list[dict[str, Any]]) -> None:
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_variant.setdefault(run["variant"], []).append(run)
    workloads = sorted({run["workload"] for run in runs})
    print(f"{'variant':<28} {'avgJCT':>7} {'p99 h':>6} {'GPUh/j':>6} {'rst/j':>5}  "
          + " ".join(f"{w[-2:]:>6}" for w in workloads))
    for variant, vruns in by_variant.items():
        jobs = [j for r in vruns for j in r["jobs"]]
        jct = np.array([j["jct_s"] for j in jobs if j["jct_s"] is not None])
        per = {r["workload"]: np.mean([j["jct_s"] for j in r["jobs"]]) for r in vruns}
        print(f"{variant:<28} {jct.mean():7.0f} {np.percentile(jct, 99) / 3600:6.2f} "
              f"{np.mean([j['gpu_h'] for j in jobs]):6.2f} "
              f"{np.mean([j['restarts'] for j in jobs]):5.2f}  "
              + " ".join(f"{per.get(w, np.nan):6.0f}" for w in workloads))
    print("\nper application: n, avg JCT s, avg wait s, restarts/job, GPU-h/job, "
          "type shares of rounds (aws/dgx-ext/rtx)")
    apps = sorted({j["app"] for r in runs for j in r["jobs"]})
    for variant, vruns in by_variant.items():
        print(variant)
        for app in apps:
            jobs = [j for r in vruns for j in r["jobs"] if j["app"] == app]
            if not jobs:
                continue
            shares = {t: sum(j["types"].get(t, 0) for j in jobs) for t in ("aws", "dgx-ext",
                                                                            "rtx")}
            total = max(sum(shares.values()), 1)
            print(f"  {app:<12} {len(jobs):4d} {np.mean([j['jct_s'] for j in jobs]):8.0f} "
                  f"{np.nanmean([j['wait_s'] for j in jobs]):7.0f} "
                  f"{np.mean([j['restarts'] for j in jobs]):5.2f} "
                  f"{np.mean([j['gpu_h'] for j in jobs]):6.2f}  "
                  + "/".join(f"{shares[t] / total:.2f}" for t in shares))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="sia,pollux")
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--traces", default=str(ARTIFACT / "traces"))
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", help="write every run's per-job details here")
    args = parser.parse_args()
    tasks = [(v, str(ARTIFACT / "workloads" / "philly" / f"workload-{w}.csv"), args.traces)
             for v in args.variants.split(",") for w in args.workloads.split(",")]
    runs = []
    # a fresh process per run: the oracle and linear variants patch SimJob
    with ProcessPoolExecutor(max_workers=args.processes, max_tasks_per_child=1) as pool:
        for run in pool.map(run_one, *zip(*tasks)):  # kept as they come
            runs.append(run)
            jct = np.mean([j["jct_s"] for j in run["jobs"]])
            print(f"{run['variant']} on {run['workload']}: {jct:,.0f} s", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(runs))
    report(runs)


if __name__ == "__main__":
    main()
