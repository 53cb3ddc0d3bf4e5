"""PNG figures of simulation runs: JCT CDFs, GPUs allocated over time, per-job timelines,
and, for autoscaled runs, the cluster's size over time.

One style for every figure (:data:`STYLE`, applied per figure, never globally), one
colour per policy across figures, legends outside the plotted data, and the per-policy
timelines of a workload on one shared time axis and one shared GPU colour scale so that
they can be compared side by side.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from cycler import cycler  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pollux.sim.metrics import RunRecord  # noqa: E402
from pollux.sim.runner import Timeline  # noqa: E402

STYLE: dict[str, object] = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.25, "grid.linewidth": 0.6, "axes.prop_cycle":
        cycler(color=[plt.get_cmap("tab10")(i) for i in range(10)]),
    "figure.dpi": 120, "savefig.dpi": 120, "savefig.bbox": "tight",
}
"""A clean report style (used inside ``plt.rc_context``)."""
TIMELINE_CMAP = "viridis"
P = ParamSpec("P")
R = TypeVar("R")


def policy_colors(policies: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """The same colour for a policy in every figure of a set."""
    palette = plt.get_cmap("tab10")
    return {policy: tuple(palette(i % 10)) for i, policy in enumerate(policies)}


def _legend_outside(ax: plt.Axes) -> None:
    """The legend right of the axes, clear of the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.savefig(path)
    plt.close(fig)
    return path


def _styled(function: Callable[P, R]) -> Callable[P, R]:
    """Run a plotting function under :data:`STYLE`."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with plt.rc_context(cast(Any, STYLE)):
            return function(*args, **kwargs)

    return wrapper


@_styled
def plot_jct_cdf(records: Sequence[RunRecord], path: Path) -> Path:
    """CDF of job completion times per policy (all workloads pooled)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    policies = list(dict.fromkeys(r.policy for r in records))
    colors = policy_colors(policies)
    for policy in policies:
        jcts = np.sort([j.jct_s for r in records if r.policy == policy for j in r.jobs
                        if j.jct_s is not None])
        if jcts.size:
            ax.step(jcts / 3600.0, np.arange(1, jcts.size + 1) / jcts.size, where="post",
                    color=colors[policy], label=f"{policy} (mean {np.mean(jcts) / 3600:.2f} h)")
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT distribution per policy")
    _legend_outside(ax)
    return _save(fig, path)


@_styled
def plot_avg_jct(records: Sequence[RunRecord], path: Path) -> Path:
    """Average JCT per workload, one bar per policy, with the workload's lower bound on
    the average JCT any policy could reach (black line) where it was computed."""
    workloads = list(dict.fromkeys(r.workload for r in records))
    policies = list(dict.fromkeys(r.policy for r in records))
    by_key = {(r.workload, r.policy): r for r in records}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(workloads) + 2), 4.5))
    width = 0.8 / max(len(policies), 1)
    x = np.arange(len(workloads))
    colors = policy_colors(policies)
    for i, policy in enumerate(policies):
        values = [by_key[(w, policy)].avg_jct_s / 3600 if (w, policy) in by_key else np.nan
                  for w in workloads]
        ax.bar(x - 0.4 + width * (i + 0.5), values, width, label=policy, color=colors[policy])
    labelled = False
    for k, workload in enumerate(workloads):
        bound = next((r.lower_bound_avg_jct_s for r in records if r.workload == workload
                      and r.lower_bound_avg_jct_s is not None), None)
        if bound is not None:
            ax.hlines(bound / 3600, k - 0.45, k + 0.45, colors="black", linewidth=2,
                      label="_nolegend_" if labelled else "lower bound")
            labelled = True
    ax.set_xticks(x, workloads, rotation=30 if len(workloads) > 4 else 0)
    ax.set_ylabel("average JCT (hours)")
    ax.set_title("average JCT per workload, and the lower bound")
    ax.grid(False, axis="x")
    _legend_outside(ax)
    return _save(fig, path)


@_styled
def plot_team_jct(records: Sequence[RunRecord], path: Path) -> Path:
    """Average JCT per team (pooled over workloads: the mean of each run's team figure),
    one bar per policy."""
    policies = list(dict.fromkeys(r.policy for r in records if r.teams))
    teams = list(dict.fromkeys(t for r in records for t in (r.teams or {})))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(teams) + 2), 4.5))
    width = 0.8 / max(len(policies), 1)
    x = np.arange(len(teams))
    colors = policy_colors(policies)
    for i, policy in enumerate(policies):
        values = [np.nanmean([r.teams[t].avg_jct_s / 3600 for r in records
                              if r.policy == policy and r.teams and t in r.teams] or [np.nan])
                  for t in teams]
        ax.bar(x - 0.4 + width * (i + 0.5), values, width, label=policy, color=colors[policy])
    ax.set_xticks(x, teams)
    ax.set_ylabel("average JCT (hours)")
    ax.set_title("average JCT per team")
    ax.grid(False, axis="x")
    _legend_outside(ax)
    return _save(fig, path)


@_styled
def plot_gpus_over_time(workload: str, timelines: Sequence[tuple[str, Timeline]],
                        path: Path) -> Path:
    """GPUs allocated over time, one line per policy, for one workload."""
    fig, ax = plt.subplots(figsize=(8, 4))
    num_gpus = 0
    colors = policy_colors([policy for policy, _ in timelines])
    for policy, timeline in timelines:
        num_gpus = max(num_gpus, timeline.num_gpus)
        ax.step(np.asarray(timeline.times_s) / 3600.0, timeline.gpus_allocated, where="post",
                label=policy, linewidth=1.0, color=colors[policy])
    if num_gpus:
        ax.axhline(num_gpus, color="gray", linestyle="--", linewidth=0.8, label="cluster")
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("GPUs allocated")
    ax.set_ylim(0, max(num_gpus, 1) * 1.05)
    ax.set_title(f"GPUs allocated over time: {workload}")
    _legend_outside(ax)
    return _save(fig, path)


@_styled
def plot_cluster_size(workload: str, timelines: Sequence[tuple[str, Timeline]],
                      path: Path) -> Path:
    """Nodes over time, one line per run: ready nodes (solid) and nodes paid for, ready or
    provisioning (dotted)."""
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, timeline in timelines:
        hours = np.asarray(timeline.times_s) / 3600.0
        line = ax.step(hours, timeline.num_nodes, where="post", linewidth=1.2,
                       label=f"{label} (ready)")[0]
        ax.step(hours, timeline.num_billed_nodes, where="post", linewidth=0.8,
                linestyle=":", color=line.get_color(), label=f"{label} (billed)")
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("nodes")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"cluster size over time: {workload}")
    _legend_outside(ax)
    return _save(fig, path)


@_styled
def plot_job_timeline(policy: str, workload: str, timeline: Timeline, path: Path, *,
                      end_h: float | None = None, max_gpus: int | None = None) -> Path:
    """One row per job (submission order): grey while waiting, coloured by GPUs held.

    ``end_h`` (time axis) and ``max_gpus`` (colour scale) default to this run's own; give
    the largest over the runs compared so that their figures share both scales.
    """
    jobs = timeline.jobs
    end = timeline.times_s[-1] if timeline.times_s else 0.0
    waiting, segments, colors = [], [], []
    for row, job in enumerate(jobs):
        done = job.completion_s if job.completion_s is not None else end
        waiting.append([(job.submission_s / 3600, row), (done / 3600, row)])
        times = list(job.times_s) + [done]
        for i, gpus in enumerate(job.gpus):
            if gpus > 0 and times[i + 1] > times[i]:
                segments.append([(times[i] / 3600, row), (min(times[i + 1], done) / 3600, row)])
                colors.append(gpus)
    height = min(max(4.0, len(jobs) * 0.04), 30.0)
    fig, ax = plt.subplots(figsize=(9, height))
    width = max(0.5, min(4.0, 400.0 / max(len(jobs), 1)))
    ax.add_collection(LineCollection(waiting, colors="0.85", linewidths=width))
    if segments:
        lines = LineCollection(segments, cmap=TIMELINE_CMAP, linewidths=width)
        lines.set_array(np.asarray(colors, dtype=np.float64))
        top = max_gpus if max_gpus is not None else max(colors)
        lines.set_clim(1, max(top, 2))
        ax.add_collection(lines)
        fig.colorbar(lines, ax=ax, label="GPUs allocated", pad=0.02)
    ax.set_xlim(0, max(end_h if end_h is not None else end / 3600, 1e-3))
    ax.set_ylim(len(jobs), -1)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("job (submission order)")
    ax.set_title(f"per-job GPUs over time: {policy} on {workload} (grey: waiting)")
    ax.grid(False)
    return _save(fig, path)


def save_plots(records: Sequence[RunRecord], timelines: Sequence[Timeline | None],
               directory: str | Path) -> list[Path]:
    """Every figure for a set of runs (``timelines[i]`` belongs to ``records[i]``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_jct_cdf(records, out / "jct_cdf.png"),
             plot_avg_jct(records, out / "avg_jct.png")]
    if any(getattr(r, "teams", None) for r in records):  # records of runs with teams
        paths.append(plot_team_jct(records, out / "team_jct.png"))
    by_workload: dict[str, list[tuple[str, Timeline]]] = {}
    for record, timeline in zip(records, timelines):
        if timeline is not None:
            by_workload.setdefault(record.workload, []).append((record.policy, timeline))
    for workload, items in by_workload.items():
        # the policies' timelines of one workload share their time axis and colour scale
        end_h = max((t.times_s[-1] if t.times_s else 0.0) for _, t in items) / 3600
        max_gpus = max((max(g, default=0) for _, t in items for job in t.jobs
                        for g in [job.gpus]), default=1)
        for policy, timeline in items:
            paths.append(plot_job_timeline(policy, workload, timeline,
                                           out / f"timeline-{policy}-{workload}.png",
                                           end_h=end_h, max_gpus=max_gpus))
    for workload, items in by_workload.items():
        paths.append(plot_gpus_over_time(workload, items, out / f"gpus-{workload}.png"))
        if any(timeline.autoscaler != "none" for _, timeline in items):
            labelled = [(f"{policy} + {timeline.autoscaler} autoscaler"
                         if timeline.autoscaler != "none" else policy, timeline)
                        for policy, timeline in items]
            paths.append(plot_cluster_size(workload, labelled, out / f"nodes-{workload}.png"))
    return paths
