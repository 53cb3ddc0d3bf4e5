"""Workload files: one job per row, ``name,time,application,num_replicas,batch_size``
and optionally ``team`` and ``priority``.

``time`` is the submission time in seconds from the start of the simulation;
``num_replicas`` and ``batch_size`` are the hand-tuned configuration that baseline policies
run (Pollux jobs ignore them); ``team`` names the team that submitted the job (a file
without the column puts every job in :data:`~pollux.teams.DEFAULT_TEAM`); ``priority``
orders the jobs of one team (a whole number in [-100, 100]; without the column or in an
empty cell: 0). Malformed files raise :class:`~pollux.errors.WorkloadError` naming the
file, the line and the field.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from pollux.errors import WorkloadError
from pollux.sim.job import JobSpec
from pollux.teams import DEFAULT_TEAM, MAX_PRIORITY, MIN_PRIORITY

WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
TEAM_COLUMN = "team"
"""The optional column naming each job's team."""
PRIORITY_COLUMN = "priority"
"""The optional column ordering the jobs of one team."""
_TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Workload:
    """A named list of jobs, in file order (submission order for well-formed files)."""

    name: str
    jobs: tuple[JobSpec, ...]

    def __len__(self) -> int:
        return len(self.jobs)


def _positive_int(path: str, line: int, field: str, text: str | None) -> int:
    try:
        value = float(text) if text is not None and text.strip() else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise WorkloadError(path, line, field, f"got {text!r}; need a whole number >= 1")
    return int(value)


def _priority(path: str, line: int, text: str | None) -> int:
    if text is None or not text.strip():
        return 0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value == int(value)
            and MIN_PRIORITY <= value <= MAX_PRIORITY):
        raise WorkloadError(path, line, PRIORITY_COLUMN, f"got {text!r}; need a whole number "
                            f"in [{MIN_PRIORITY}, {MAX_PRIORITY}] (default 0)")
    return int(value)


def _parse_row(path: str, line: int, row: dict[str, str | None],
               applications: Collection[str] | None) -> JobSpec:
    name = (row.get("name") or "").strip()
    if not name:
        raise WorkloadError(path, line, "name", "empty; every job needs a unique name")
    text = row.get("time")
    try:
        time_s = float(text) if text is not None and text.strip() else math.nan
    except ValueError:
        time_s = math.nan
    if not math.isfinite(time_s) or time_s < 0:
        raise WorkloadError(path, line, "time",
                            f"got {text!r}; need the submission time in seconds, >= 0")
    application = (row.get("application") or "").strip()
    if applications is not None and application not in applications:
        raise WorkloadError(path, line, "application",
                            f"unknown application {application!r}; choose from: "
                            f"{', '.join(sorted(applications))}")
    team = (row.get(TEAM_COLUMN) or DEFAULT_TEAM).strip() or DEFAULT_TEAM
    if not _TEAM.match(team):
        raise WorkloadError(path, line, TEAM_COLUMN, f"got {team!r}; a team is 1-64 letters, "
                            "digits, '.', '_' or '-', starting with a letter or digit")
    return JobSpec(
        name=name,
        submission_time_s=time_s,
        application=application,
        num_replicas=_positive_int(path, line, "num_replicas", row.get("num_replicas")),
        batch_size=_positive_int(path, line, "batch_size", row.get("batch_size")),
        team=team,
        priority=_priority(path, line, row.get(PRIORITY_COLUMN)),
    )


def read_workload(path: str | Path, applications: Collection[str] | None = None) -> Workload:
    """Read and validate a workload CSV; ``applications`` lists the known application names."""
    where = str(path)
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in (reader.fieldnames or [])]
            for col in WORKLOAD_COLUMNS:
                if col not in header:
                    raise WorkloadError(where, 1, col,
                                        f"missing column; the header must be "
                                        f"{','.join(WORKLOAD_COLUMNS)}")
            reader.fieldnames = header
            jobs = []
            seen: dict[str, int] = {}
            for index, row in enumerate(reader):
                line = index + 2
                if None in row:
                    raise WorkloadError(where, line, "row", "more values than columns")
                job = _parse_row(where, line, row, applications)
                if job.name in seen:
                    raise WorkloadError(where, line, "name",
                                        f"{job.name!r} repeats line {seen[job.name]}; "
                                        "names must be unique")
                seen[job.name] = line
                jobs.append(job)
    except OSError as exc:
        raise WorkloadError(where, None, "file", f"cannot read: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise WorkloadError(where, None, "file", f"not a text CSV file: {exc}") from exc
    if not jobs:
        raise WorkloadError(where, None, "rows", "no jobs; add at least one row")
    return Workload(name=Path(path).stem, jobs=tuple(jobs))


def write_workload(workload: Workload, path: str | Path) -> None:
    """Write a workload CSV readable by :func:`read_workload` (with the ``team`` column
    when a job is in a team other than the default, the ``priority`` column when a job
    has a priority other than 0)."""
    teams = any(job.team != DEFAULT_TEAM for job in workload.jobs)
    priorities = any(job.priority != 0 for job in workload.jobs)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(WORKLOAD_COLUMNS + ((TEAM_COLUMN,) if teams else ())
                        + ((PRIORITY_COLUMN,) if priorities else ()))
        for job in workload.jobs:
            time_s = job.submission_time_s
            writer.writerow([job.name, int(time_s) if time_s == int(time_s) else time_s,
                             job.application, job.num_replicas, job.batch_size]
                            + ([job.team] if teams else [])
                            + ([job.priority] if priorities else []))


def workload_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand CSV files and folders of CSVs (sorted) into a list of workload files."""
    files: list[Path] = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            found = sorted(path.glob("*.csv"))
            if not found:
                raise WorkloadError(str(path), None, "WORKLOAD", "folder holds no .csv files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise WorkloadError(str(path), None, "WORKLOAD", "no such file or folder")
    return files
