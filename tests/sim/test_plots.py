"""Simulation figures: the per-policy timelines of a workload share one time axis and one
GPU colour scale; legends sit outside the data."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from pollux.sim import plots
from pollux.sim.runner import JobTimeline, Timeline


def timeline(end_s: float, gpus: int) -> Timeline:
    job = JobTimeline("j", "cifar10", 0.0, end_s, (0.0, end_s / 2), (gpus, gpus))
    return Timeline(num_gpus=16, times_s=(0.0, end_s), gpus_allocated=(gpus, 0), jobs=(job,))


def test_timelines_of_a_workload_share_time_and_colour_scales(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, float | None, int | None]] = []
    original = plots.plot_job_timeline

    def spy(policy, workload, timeline, path, *, end_h=None, max_gpus=None):  # type: ignore[no-untyped-def]
        seen.append((policy, end_h, max_gpus))
        return original(policy, workload, timeline, path, end_h=end_h, max_gpus=max_gpus)

    monkeypatch.setattr(plots, "plot_job_timeline", spy)
    record = type("R", (), {})
    records = []
    for policy in ("fast", "slow"):
        r = record()
        r.policy, r.workload, r.jobs, r.avg_jct_s, r.lower_bound_avg_jct_s = (
            policy, "w", [], 3600.0, None)
        records.append(r)
    monkeypatch.setattr(plots, "plot_jct_cdf", lambda records, path: path)
    paths = plots.save_plots(records, [timeline(3600.0, 2), timeline(7200.0, 8)], tmp_path)
    assert sorted((p, e, g) for p, e, g in seen) == [("fast", 2.0, 8), ("slow", 2.0, 8)]
    assert all(path.exists() for path in paths if path.name != "jct_cdf.png")


def test_legend_is_outside_the_axes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boxes = {}
    original_save = plots._save

    def save(fig, path):  # type: ignore[no-untyped-def]
        fig.canvas.draw()
        ax = fig.axes[0]
        legend = ax.get_legend()
        boxes["legend"] = legend.get_window_extent()
        boxes["axes"] = ax.get_window_extent()
        return original_save(fig, path)

    monkeypatch.setattr(plots, "_save", save)
    plots.plot_gpus_over_time("w", [("a", timeline(3600.0, 2)), ("b", timeline(3600.0, 4))],
                              tmp_path / "gpus.png")
    assert boxes["legend"].x0 >= boxes["axes"].x1  # right of the data, not on it
    plt.close("all")
