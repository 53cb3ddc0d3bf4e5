"""The tables of ``pollux simulate``: policies side by side, and average JCT per workload.

Built as :class:`~pollux.sim.html_report.TextTable` (the HTML report reuses them) and printed
with rich.
"""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from pollux.sim.html_report import TextTable
from pollux.sim.metrics import RunRecord, summarize_policies


def _seconds(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:,.1f} s"


def _ratio(value: float, bound: float) -> str:
    return "-" if not (math.isfinite(value) and math.isfinite(bound) and bound > 0) \
        else f"{value / bound:.2f}x"


def policy_table(records: list[RunRecord]) -> TextTable:
    """Metrics as rows, policies side by side as columns (means over workloads)."""
    summary = summarize_policies(records)
    policies = list(summary)
    runs = {p: [r for r in records if r.policy == p] for p in policies}

    def mean(policy: str, field: str) -> float:
        values = [r.round_s.median if field == "round_median_s" else getattr(r, field)
                  for r in runs[policy]]
        return sum(values) / len(values)

    rows: list[tuple[str, Any]] = [
        ("workloads", lambda p: str(len(runs[p]))),
        ("jobs done", lambda p: f"{sum(r.num_completed for r in runs[p])}"
                                f"/{sum(r.num_jobs for r in runs[p])}"),
        ("avg JCT (mean)", lambda p: _seconds(summary[p]["mean_avg_jct_s"])),
        ("lower bound (mean)", lambda p: _seconds(summary[p]["mean_lower_bound_avg_jct_s"])),
        ("avg JCT / bound", lambda p: _ratio(summary[p]["mean_avg_jct_s"],
                                             summary[p]["mean_lower_bound_avg_jct_s"])),
        ("p50 JCT", lambda p: _seconds(mean(p, "p50_jct_s"))),
        ("p99 JCT", lambda p: _seconds(mean(p, "p99_jct_s"))),
        ("makespan", lambda p: _seconds(mean(p, "makespan_s"))),
        ("GPU utilization", lambda p: f"{mean(p, 'gpu_utilization'):.1%}"),
        ("restarts per job", lambda p: f"{mean(p, 'restarts_per_job'):.2f}"),
        ("GPU-hours per job", lambda p: f"{mean(p, 'gpu_hours_per_job'):.2f}"),
        *([("node-hours", lambda p: f"{summary[p]['mean_node_hours']:.1f}"),
           ("cost", lambda p: f"{summary[p]['mean_cost']:,.2f}")]
          if any(r.autoscaler != "none" for r in records) else []),
        ("max FTF", lambda p: f"{summary[p]['max_ftf']:.2f}"),
        ("unfair jobs (FTF>1)", lambda p: f"{mean(p, 'unfair_fraction'):.1%}"),
        ("policy round p50", lambda p: f"{1e3 * mean(p, 'round_median_s'):.2f} ms"),
        ("policy round max", lambda p: f"{1e3 * max(r.round_s.max for r in runs[p]):.1f} ms"),
        ("wall time", lambda p: f"{sum(r.wall_s for r in runs[p]):.1f} s"),
    ]
    return TextTable("policies side by side (means over workloads)", ("metric", *policies),
                     tuple((label, *(cell(p) for p in policies)) for label, cell in rows))


def workload_table(records: list[RunRecord]) -> TextTable:
    policies = list(dict.fromkeys(r.policy for r in records))
    rows: list[tuple[str, ...]] = []
    by_key = {(r.workload, r.policy): r for r in records}
    for workload in dict.fromkeys(r.workload for r in records):
        cells = []
        for policy in policies:
            record = by_key.get((workload, policy))
            done = record is not None and record.num_completed == record.num_jobs
            cells.append("-" if record is None else
                         f"{record.avg_jct_s:.1f}" + ("" if done else
                                                      f" ({record.num_completed}/"
                                                      f"{record.num_jobs} done)"))
        bounds = [r.lower_bound_avg_jct_s for r in records
                  if r.workload == workload and r.lower_bound_avg_jct_s is not None]
        rows.append((workload, *cells, f"{bounds[0]:.1f}" if bounds else "-"))
    return TextTable("average JCT per workload (s)", ("workload", *policies, "lower bound"),
                     tuple(rows))


def team_table(records: list[RunRecord]) -> TextTable:
    """Per team, for each workload and policy: jobs, JCTs, GPU time against quota and the
    rounds in which the team held less than its guarantee while another team borrowed."""
    rows: list[tuple[str, ...]] = []
    for record in records:
        for team, figures in (record.teams or {}).items():
            rows.append((record.workload, record.policy, team,
                         f"{figures.num_completed}/{figures.num_jobs}",
                         _seconds(figures.avg_jct_s), _seconds(figures.p99_jct_s),
                         f"{figures.share_of_gpu_time:.1%}", f"{figures.quota_share:.1%}",
                         f"{figures.num_rounds_below_guarantee}/"
                         f"{figures.num_rounds_with_demand}"))
    return TextTable("per team", ("workload", "policy", "team", "jobs done", "avg JCT",
                                  "p99 JCT", "GPU time", "quota", "rounds below quota"),
                     tuple(rows))


def rich_table(table: TextTable) -> Table:
    """A TextTable for the terminal: first column left, the others right-aligned."""
    printed = Table(title=table.title)
    for i, column in enumerate(table.columns):
        printed.add_column(column, justify="left" if i == 0 else "right")
    for row in table.rows:
        printed.add_row(*row)
    return printed


def result_tables(records: list[RunRecord]) -> list[TextTable]:
    """The policy table, the per-workload one when there are several workloads, and the
    per-team one when the runs have teams."""
    several = len({r.workload for r in records}) > 1
    teams = any(r.teams for r in records)
    return ([policy_table(records)] + ([workload_table(records)] if several else [])
            + ([team_table(records)] if teams else []))
