"""GPU type speeds learned from the jobs that ran on several types."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.models.throughput import ThroughputParams
from pollux.models.type_speeds import estimate_type_speeds, one_gpu_speed
from pollux.models.typed import project_params

TRUE = {"t4": 1.0, "rtx": 2.27, "a100": 6.9}
BASE = ThroughputParams(0.02, 0.004, 0.1, 0.01, 0.05, 0.005, 1.4)


def job_speeds(size: float, types: list[str], speeds: dict[str, float] = TRUE,
               local_bsz: float = 64.0) -> dict[str, float]:
    """A job of ``size`` (its own step times scaled) that ran on ``types``: each type's
    model is the job's own projected by the true speed, as the agent would fit it."""
    own = project_params(BASE, 1.0 / size)
    return {t: one_gpu_speed(project_params(own, speeds[t]), local_bsz) for t in types}


def test_known_speeds_are_recovered_from_jobs_on_several_types() -> None:
    jobs = [job_speeds(1.0, ["t4", "a100"]), job_speeds(3.0, ["rtx", "a100"]),
            job_speeds(0.5, ["t4"])]  # one type only: tells nothing
    found = estimate_type_speeds(jobs)
    assert set(found) == set(TRUE)
    for t, speed in TRUE.items():
        assert found[t] == pytest.approx(speed, rel=0.011)  # rounded to 1%


def test_one_job_with_absurd_profiles_does_not_move_a_type() -> None:
    rng = random.Random(0)
    honest = [job_speeds(rng.uniform(0.2, 5.0), ["t4", "a100"]) for _ in range(4)]
    liar = {"t4": 1.0, "a100": 1e6}
    found = estimate_type_speeds([*honest, liar])
    assert found["a100"] / found["t4"] == pytest.approx(6.9, rel=0.05)


def test_declared_speeds_win_and_set_the_scale() -> None:
    jobs = [job_speeds(1.0, ["t4", "a100"]), job_speeds(2.0, ["t4", "rtx"])]
    found = estimate_type_speeds(jobs, {"t4": 10.0, "h100": 50.0})
    assert found["t4"] == 10.0 and found["h100"] == 50.0  # as given, even unseen
    assert found["a100"] == pytest.approx(69.0, rel=0.011)
    assert found["rtx"] == pytest.approx(22.7, rel=0.011)
    # declared types that no job joins to the learned ones: the learned scale is unknown
    assert estimate_type_speeds(jobs, {"h100": 50.0}) == {"h100": 50.0}


def test_types_no_job_joins_get_no_speed() -> None:
    jobs = [job_speeds(1.0, ["t4", "a100"]), job_speeds(1.0, ["t4", "a100"]),
            {"x": 1.0, "y": 2.0}]
    assert set(estimate_type_speeds(jobs)) == {"t4", "a100"}
    assert estimate_type_speeds([job_speeds(1.0, ["t4"])]) == {}
    assert estimate_type_speeds([{"a": math.inf, "b": 1.0}, {"a": 0.0, "b": 2.0}]) == {}


@pytest.mark.parametrize("declared, field", [({"a": 0.0}, "gpu_type_speeds['a']"),
                                              ({"a": math.nan}, "gpu_type_speeds['a']"),
                                              ({"a": "fast"}, "gpu_type_speeds['a']"),
                                              ({"": 1.0}, "gpu_type_speeds")])
def test_bad_declared_speeds_name_the_field(declared: dict, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as error:
        estimate_type_speeds([], declared)
    assert error.value.field == field


@settings(max_examples=60, deadline=None)
@given(speeds=st.lists(st.floats(0.1, 20.0), min_size=2, max_size=5),
       sizes=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=12),
       seed=st.integers(0, 1000))
def test_exact_profiles_give_the_true_ratios(speeds: list[float], sizes: list[float],
                                             seed: int) -> None:
    """Noise-free profiles: every type joined to the others is recovered to the 1%
    rounding, whatever the jobs' sizes and which types each ran on."""
    true = {f"t{i}": s for i, s in enumerate(speeds)}
    rng = random.Random(seed)
    names = list(true)
    jobs = [job_speeds(size, rng.sample(names, rng.randint(1, len(names))), true)
            for size in sizes]
    jobs.append(job_speeds(1.0, names, true))  # one job ran everywhere: all joined
    found = estimate_type_speeds(jobs)
    assert set(found) == set(true)
    lowest = min(true.values())
    for name, speed in true.items():
        assert found[name] == pytest.approx(speed / lowest, rel=0.011)
