"""SIGKILLs of a real ``pollux server`` at random instants while two-replica jobs
launch, run and finish, and the count that says whether any job ran twice.

Each job is a shell script run by both replicas: it ignores SIGTERM (so a replica once
started always runs to its end, as a job with nothing left to do would), appends
``<job> <rank> <launch>`` to ``runs.txt`` when it starts and again, with ``done``, when
it ends, and exits 0. A job *ran* in a launch when both replicas of that launch wrote
``done``. The harness kills the server ``num_kills`` times, each after a random pause
(seeded) from its start, restarts it on the same data directory, and in the end checks,
from the jobs' own lines and the server's answers: every job Succeeded, ran in exactly
one launch, and no replica process of the data directory is left running. Used by the
tests (a small slice) and by ``bench/crash_launches.py`` (the big counts)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.service.e2e_helpers import FINAL_STATES, ServerProcess, wait_until


@dataclass
class CrashReport:
    jobs: int
    kills: int
    states: dict[str, str]
    complete_runs: dict[str, int]
    """Job id -> launches in which both replicas ran to their end."""
    started_runs: dict[str, int]
    """Job id -> launches in which any replica started."""
    left_running: list[int]
    elapsed_s: float
    kill_instants_s: list[float] = field(default_factory=list)

    @property
    def ran_twice(self) -> list[str]:
        return sorted(j for j, n in self.complete_runs.items() if n > 1)

    @property
    def not_succeeded(self) -> list[str]:
        return sorted(j for j, s in self.states.items() if s != "Succeeded")

    def ok(self) -> bool:
        return (not self.ran_twice and not self.not_succeeded and not self.left_running
                and all(self.complete_runs.get(j) == 1 for j in self.states))

    def summary(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "kills": self.kills, "elapsed_s": round(self.elapsed_s, 1),
                "succeeded": sum(s == "Succeeded" for s in self.states.values()),
                "ran_once": sum(n == 1 for n in self.complete_runs.values()),
                "ran_twice": self.ran_twice, "not_succeeded": self.not_succeeded,
                "relaunched_after_partial_start": sum(
                    self.started_runs.get(j, 0) > 1 for j in self.states),
                "left_running": self.left_running}


def job_spec(name: str, runs: Path, work_s: float, working_dir: Path,
             resources: dict[str, float] | None = None) -> dict[str, Any]:
    script = (f"trap '' TERM; echo \"$POLLUX_JOB_ID $POLLUX_RANK $POLLUX_NUM_RESTARTS\" "
              f">> {runs}; sleep {work_s}; "
              f"echo \"$POLLUX_JOB_ID $POLLUX_RANK $POLLUX_NUM_RESTARTS done\" >> {runs}")
    spec: dict[str, Any] = {"name": name, "command": ["/bin/sh", "-c", script],
                            "working_dir": str(working_dir), "min_replicas": 2,
                            "max_replicas": 2, "max_failures": 50}
    if resources is not None:
        spec["resources"] = resources
    return spec


def count_runs(runs: Path) -> tuple[dict[str, int], dict[str, int]]:
    done: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    started: dict[str, set[str]] = defaultdict(set)
    lines = runs.read_text().splitlines() if runs.exists() else []
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            started[parts[0]].add(parts[2])
        elif len(parts) == 4 and parts[3] == "done":
            done[parts[0]][parts[2]].add(parts[1])
    complete = {job: sum(len(ranks) == 2 for ranks in launches.values())
                for job, launches in done.items()}
    return complete, {job: len(launches) for job, launches in started.items()}


def run_crashes(server: ServerProcess, workdir: Path, num_jobs: int, num_kills: int,
                seed: int, max_pause_s: float, work_s: float = 0.2,
                timeout_s: float = 600.0, resources: dict[str, float] | None = None,
                left_running: Callable[[], list[int]] | None = None) -> CrashReport:
    """Submit ``num_jobs`` jobs, SIGKILL the server ``num_kills`` times (each after a
    random pause in [0, ``max_pause_s``) from its start), then let every job end."""
    rng = np.random.default_rng(seed)
    runs = workdir / "runs.txt"
    began = time.monotonic()
    client = server.start()
    ids = [client.submit(job_spec(f"c{i}", runs, work_s, workdir, resources))["id"]
           for i in range(num_jobs)]
    instants = []
    for _ in range(num_kills):
        pause_s = float(rng.uniform(0.0, max_pause_s))
        time.sleep(pause_s)
        instants.append(pause_s)
        server.kill()
        client = server.start()
    deadline_s = max(60.0, timeout_s - (time.monotonic() - began))

    def all_final() -> dict[str, str] | None:
        states = {job["id"]: job["state"] for job in client.jobs()}
        return states if all(states.get(j) in FINAL_STATES for j in ids) else None

    states = wait_until(all_final, deadline_s, "every job to end", interval_s=0.5)
    server.stop()
    complete, started = count_runs(runs)
    return CrashReport(num_jobs, num_kills, {j: states[j] for j in ids},
                       {j: complete.get(j, 0) for j in ids}, started,
                       [] if left_running is None else left_running(),
                       time.monotonic() - began, instants)
