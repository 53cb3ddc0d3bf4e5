"""How the job commands show jobs and nodes: rich tables and one-line summaries (shared
by ``pollux ls``, ``describe``, ``top`` and ``demo``)."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

FINAL_STATES = ("Succeeded", "Failed", "Cancelled")
STATE_STYLES = {"Pending": "yellow", "Starting": "cyan", "Running": "green",
                "Rescaling": "magenta", "Cancelling": "magenta", "Failing": "red",
                "Succeeded": "bold green", "Failed": "bold red",
                "Cancelled": "dim"}


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def run_time_s(row: dict[str, Any], now: float | None = None) -> float | None:
    """Seconds from the first launch to the end (or now); None if never launched."""
    if row.get("run_time_s") is not None:
        return float(row["run_time_s"])
    started = row.get("started_at")
    if started is None:
        return None
    end = row.get("finished_at") or (time.time() if now is None else now)
    return max(0.0, end - started)


def jobs_table(rows: list[dict[str, Any]], title: str | None = None) -> Table:
    """The jobs; a ``gpu type`` column (of each job's current or last launch) appears
    when some job ran on a node of a declared type, ``owner`` and ``team`` columns when
    some job has an owner or a team (users are registered)."""
    typed = any(row.get("gpu_type") for row in rows)
    owned = any(row.get("owner") or row.get("team") for row in rows)
    table = Table(title=title)
    for column in ("job", *(("owner", "team") if owned else ()), "state", "replicas",
                   "nodes", *(("gpu type",) if typed else ()),
                   "batch size", "goodput (samples/s)", "restarts", "age", "run time"):
        table.add_column(column, justify="left" if column in (
            "job", "owner", "team", "state", "gpu type") else "right")
    for row in rows:
        state = row["state"]
        if row.get("cancel_requested") and state not in FINAL_STATES + ("Cancelling",):
            state += " (cancel requested)"
        if row.get("recovering"):
            state += " (recovering)"
        goodput = row.get("goodput")
        ran = run_time_s(row)
        table.add_row(
            row["id"], *((row.get("owner") or "-", row.get("team") or "-") if owned else ()),
            f"[{STATE_STYLES.get(row['state'], '')}]{state}[/]",
            str(row["replicas"]), str(row["nodes"]),
            *((row.get("gpu_type") or "-",) if typed else ()),
            "-" if row.get("batch_size") is None else str(row["batch_size"]),
            "-" if goodput is None else f"{goodput:.1f}", str(row["restarts"]),
            format_duration(row["age_s"]), "-" if ran is None else format_duration(ran))
    return table


def cluster_line(cluster: dict[str, Any]) -> str | None:
    """The autoscaler's latest wish and the GPU type speeds in use; None without either."""
    lines = [line for line in (_autoscaler_line(cluster), _speeds_line(cluster)) if line]
    return "\n".join(lines) or None


def _autoscaler_line(cluster: dict[str, Any]) -> str | None:
    name = cluster.get("autoscaler") or "none"
    if name == "none":
        return None
    desired = cluster.get("desired_num_nodes")
    line = f"cluster: {cluster.get('num_nodes', 0)} nodes; {name} autoscaler "
    if desired is None:
        return line + "has not decided yet"
    line += f"wants {desired}"
    if cluster.get("reason"):
        line += f" ({cluster['reason']})"
    if cluster.get("price_per_hour") is not None:
        line += f", {cluster['price_per_hour']:.2f}/hour"
    return line


def _speeds_line(cluster: dict[str, Any]) -> str | None:
    speeds = cluster.get("gpu_type_speeds") or {}
    if not speeds:
        return None
    return "GPU type speeds (1 GPU, relative): " + ", ".join(
        f"{name} {speed:.3g}" for name, speed in sorted(speeds.items(), key=lambda kv: kv[1]))


def nodes_table(nodes: list[dict[str, Any]]) -> Table:
    """The nodes; a ``gpu type`` column when some node declares one."""
    typed = any(node.get("gpu_type") for node in nodes)
    table = Table(title="nodes")
    table.add_column("node")
    if typed:
        table.add_column("gpu type")
    table.add_column("slots", justify="right")
    table.add_column("jobs (replicas)")
    for node in nodes:
        jobs = ", ".join(f"{job} x{count}" for job, count in sorted(node["jobs"].items()))
        used = sum(node["jobs"].values())
        table.add_row(node["name"], *((node.get("gpu_type") or "-",) if typed else ()),
                      f"{used}/{node['resources'].get('gpu', 0):g}", jobs or "-")
    return table


def failures_text(failures: int, max_failures: int) -> str:
    """``'2 (1 tolerated: failed)'``, ``'1 of 3 tolerated'``."""
    if failures > max_failures:
        return f"{failures} ({max_failures} tolerated: failed)"
    return f"{failures} of {max_failures} tolerated"
