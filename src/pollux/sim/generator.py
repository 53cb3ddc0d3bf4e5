"""Generating workloads with the job mix of the Pollux study.

The figures below summarize the paper's 8 evaluation workloads (1,280 jobs sampled from
Microsoft's Philly trace): which applications jobs run, the hand-tuned configurations
(GPUs, total batch size) users picked for each, and how arrivals spread over the hours of
the 8-hour window. A generated workload draws each job independently from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from pollux.errors import ConfigError
from pollux.sim.job import JobSpec
from pollux.sim.workload import Workload
from pollux.teams import MAX_PRIORITY, MIN_PRIORITY

APPLICATION_COUNTS = MappingProxyType({
    "ncf": 503, "cifar10": 495, "deepspeech2": 111, "bert": 86, "yolov3": 59, "imagenet": 26,
})
"""Jobs per application over the 8 workloads of the study (application shares)."""

TUNED_CONFIG_COUNTS = MappingProxyType({
    "bert": ((6, 384, 23), (8, 384, 18), (12, 384, 20), (16, 384, 25)),
    "cifar10": ((6, 2048, 134), (8, 2048, 119), (12, 4096, 133), (16, 4096, 109)),
    "deepspeech2": ((6, 320, 34), (8, 320, 34), (12, 640, 43)),
    "imagenet": ((24, 3200, 9), (32, 6400, 9), (48, 6400, 8)),
    "ncf": ((1, 32768, 503),),
    "yolov3": ((4, 64, 59),),
})
"""Per application: (num_replicas, batch_size, jobs) of each tuned configuration seen."""

HOURLY_ARRIVAL_COUNTS = (144, 142, 92, 146, 197, 287, 148, 124)
"""Jobs submitted in each hour of the 8-hour window (the day's pattern, repeated for
longer workloads)."""


def generate_workload(num_jobs: int = 160, hours: float = 8.0, seed: int = 0,
                      name: str | None = None,
                      teams: Mapping[str, float] | None = None,
                      priorities: Mapping[int, float] | None = None) -> Workload:
    """A workload of ``num_jobs`` jobs arriving over ``hours`` hours, reproducible by seed.

    Each job picks its application by the study's shares, a tuned configuration by how
    often it was used for that application, an hour by the arrival pattern, and a second
    uniformly within that hour. Jobs are named ``<application>-<index>`` in arrival order.
    With ``teams`` (team -> share of the jobs), each job then draws its team by the
    shares, from a stream of its own: the jobs are the same as without teams. With
    ``priorities`` (priority -> share of the jobs), each job draws its priority likewise,
    from another stream of its own.
    """
    if not (isinstance(num_jobs, int) and num_jobs >= 1):
        raise ConfigError("num_jobs", num_jobs, "use a whole number >= 1")
    if not (np.isfinite(hours) and hours > 0):
        raise ConfigError("hours", hours, "use a number of hours > 0")
    rng = np.random.default_rng(seed)
    apps = sorted(APPLICATION_COUNTS)
    app_p = np.array([APPLICATION_COUNTS[a] for a in apps], dtype=np.float64)
    chosen = rng.choice(len(apps), size=num_jobs, p=app_p / app_p.sum())
    span_s = hours * 3600.0
    num_slots = int(np.ceil(hours))
    weights = np.array([HOURLY_ARRIVAL_COUNTS[h % len(HOURLY_ARRIVAL_COUNTS)]
                        for h in range(num_slots)], dtype=np.float64)
    weights[-1] *= hours - (num_slots - 1)  # a partial last hour gets its share
    slots = rng.choice(num_slots, size=num_jobs, p=weights / weights.sum())
    slot_ends = np.minimum((slots + 1) * 3600.0, span_s)
    times = np.floor(slots * 3600.0 + rng.random(num_jobs) * (slot_ends - slots * 3600.0))
    rows = []
    for app_index, time_s in zip(chosen, times):
        app = apps[int(app_index)]
        configs = TUNED_CONFIG_COUNTS[app]
        counts = np.array([c[2] for c in configs], dtype=np.float64)
        replicas, batch, _ = configs[int(rng.choice(len(configs), p=counts / counts.sum()))]
        rows.append((float(time_s), app, replicas, batch))
    rows.sort(key=lambda r: r[0])
    jobs = tuple(JobSpec(f"{app}-{i}", time_s, app, replicas, batch)
                 for i, (time_s, app, replicas, batch) in enumerate(rows))
    if teams:
        jobs = assign_teams(jobs, teams, seed)
    if priorities:
        jobs = assign_priorities(jobs, priorities, seed)
    return Workload(name=name or f"generated-{num_jobs}jobs-{hours:g}h-seed{seed}", jobs=jobs)


def assign_teams(jobs: tuple[JobSpec, ...], shares: Mapping[str, float], seed: int = 0
                 ) -> tuple[JobSpec, ...]:
    """``jobs`` with teams drawn by ``shares`` (team -> share; normalized), reproducibly
    from ``seed`` on a stream apart from the workload's own."""
    names = list(shares)
    weights = np.array([float(shares[t]) for t in names], dtype=np.float64)
    if not names or not np.all(np.isfinite(weights)) or np.any(weights <= 0):
        raise ConfigError("teams", dict(shares), "give each team a share > 0, e.g. "
                          "vision:0.5,nlp:0.3,speech:0.2")
    rng = np.random.default_rng([seed, 0x7EA45])
    picks = rng.choice(len(names), size=len(jobs), p=weights / weights.sum())
    return tuple(replace(job, team=names[int(k)]) for job, k in zip(jobs, picks))


def assign_priorities(jobs: tuple[JobSpec, ...], shares: Mapping[int, float], seed: int = 0
                      ) -> tuple[JobSpec, ...]:
    """``jobs`` with priorities drawn by ``shares`` (priority -> share; normalized),
    reproducibly from ``seed`` on a stream apart from the workload's and the teams'."""
    levels = list(shares)
    weights = np.array([float(shares[p]) for p in levels], dtype=np.float64)
    if (not levels or not np.all(np.isfinite(weights)) or np.any(weights <= 0)
            or not all(isinstance(p, int) and MIN_PRIORITY <= p <= MAX_PRIORITY
                       for p in levels)):
        raise ConfigError("priorities", dict(shares), "give each priority (a whole number "
                          f"in [{MIN_PRIORITY}, {MAX_PRIORITY}]) a share > 0, e.g. 0:0.8,1:0.2")
    rng = np.random.default_rng([seed, 0x9210])
    picks = rng.choice(len(levels), size=len(jobs), p=weights / weights.sum())
    return tuple(replace(job, priority=levels[int(k)]) for job, k in zip(jobs, picks))


def parse_priority_shares(text: str, field: str = "priorities") -> dict[int, float]:
    """``0:0.8,1:0.2`` -> priority -> share (any positive numbers)."""
    each = f"a whole-number priority in [{MIN_PRIORITY}, {MAX_PRIORITY}], each"
    shares: dict[int, float] = {}
    for name, share in _parse_shares(text, field, "PRIORITY", each, "0:0.8,1:0.2").items():
        try:
            level = int(name)
        except ValueError:
            level = MAX_PRIORITY + 1
        if not MIN_PRIORITY <= level <= MAX_PRIORITY or level in shares:
            raise ConfigError(field, f"{name}:{share:g}", f"each entry is PRIORITY:SHARE "
                              f"with {each} once, e.g. 0:0.8,1:0.2")
        shares[level] = share
    return shares


def parse_team_shares(text: str, field: str = "teams") -> dict[str, float]:
    """``vision:0.5,nlp:0.3,speech:0.2`` -> team -> share (any positive numbers)."""
    return _parse_shares(text, field, "TEAM", "each team", "vision:0.5,nlp:0.3,speech:0.2")


def _parse_shares(text: str, field: str, key: str, each: str, example: str
                  ) -> dict[str, float]:
    """``KEY:SHARE,...`` -> key -> share (any positive numbers, each key once)."""
    shares: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition(":")
        try:
            share = float(value) if sep else float("nan")
        except ValueError:
            share = float("nan")
        if not name.strip() or not (np.isfinite(share) and share > 0) or name in shares:
            raise ConfigError(field, part, f"each entry is {key}:SHARE with a share > 0, "
                              f"{each} once, e.g. {example}")
        shares[name.strip()] = share
    if not shares:
        raise ConfigError(field, text, f"give {key}:SHARE entries, e.g. {example}")
    return shares
