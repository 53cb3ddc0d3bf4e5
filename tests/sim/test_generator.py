from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pollux.errors import ConfigError
from pollux.sim.generator import APPLICATION_COUNTS, TUNED_CONFIG_COUNTS, generate_workload
from pollux.sim.workload import read_workload, write_workload


def test_same_seed_same_workload_other_seed_other_workload() -> None:
    assert generate_workload(160, 8, seed=3) == generate_workload(160, 8, seed=3)
    assert generate_workload(160, 8, seed=3).jobs != generate_workload(160, 8, seed=4).jobs


def test_job_mix_follows_the_study() -> None:
    workload = generate_workload(4000, 8, seed=0)
    times = [job.submission_time_s for job in workload.jobs]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 8 * 3600
    assert len({job.name for job in workload.jobs}) == len(workload)
    counts = Counter(job.application for job in workload.jobs)
    total = sum(APPLICATION_COUNTS.values())
    for app, count in APPLICATION_COUNTS.items():
        assert counts[app] / len(workload) == pytest.approx(count / total, abs=0.03)
    for job in workload.jobs:
        configs = {(k, b) for k, b, _ in TUNED_CONFIG_COUNTS[job.application]}
        assert (job.num_replicas, job.batch_size) in configs
    # The busiest hour of the study (the 6th) stays the busiest.
    per_hour = Counter(int(t // 3600) for t in times)
    assert max(per_hour, key=lambda h: per_hour[h]) == 5


def test_partial_hours_and_bad_arguments(tmp_path: Path) -> None:
    workload = generate_workload(50, 0.5, seed=1)
    assert max(job.submission_time_s for job in workload.jobs) < 1800
    write_workload(workload, tmp_path / "g.csv")
    assert read_workload(tmp_path / "g.csv", APPLICATION_COUNTS.keys()).jobs == workload.jobs
    with pytest.raises(ConfigError, match="num_jobs"):
        generate_workload(0)
    with pytest.raises(ConfigError, match="hours"):
        generate_workload(10, hours=0)
