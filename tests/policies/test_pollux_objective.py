"""The Pollux objective: power mean, fair-share speedups, restart penalty."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.policies.pollux import (
    FairShareRounding,
    PolluxObjective,
    PolluxOptions,
    build_problem,
    power_mean,
    restart_factor,
)
from pollux.policies.pollux.objective import mean_of, utility
from tests.policies.pollux_builders import job, nodes

speedups = st.lists(st.floats(0.0, 50.0, allow_nan=False), min_size=1, max_size=12)
exponents = st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0])
"""(Much lower p makes eps^p swamp the rest in floating point, e.g. 1e-3^-4 = 1e12.)"""


@settings(max_examples=200, deadline=None)
@given(values=speedups, p=exponents, data=st.data())
def test_power_mean_increases_with_every_speedup(values: list[float], p: float,
                                                 data: st.DataObject) -> None:
    s = np.array(values)
    j = data.draw(st.integers(0, len(s) - 1))
    bump = data.draw(st.floats(1e-3, 10.0))
    higher = s.copy()
    higher[j] += bump
    eps = 1e-3
    assert power_mean(higher + eps, p) > power_mean(s + eps, p)
    # The sum of utilities (what the optimizers maximize) orders states the same way.
    assert utility(higher + eps, p).sum() > utility(s + eps, p).sum()
    assert np.isclose(mean_of(utility(s + eps, p).mean(), p), power_mean(s + eps, p))


def test_a_job_without_gpus_counts_through_epsilon() -> None:
    # p = -1: mean of reciprocals; a zero speedup adds 1/eps instead of zeroing the mean.
    value = power_mean(np.array([1.0, 0.0]) + 1e-3, -1.0)
    assert value == pytest.approx(2 / (1 / 1.001 + 1 / 1e-3))
    assert 0 < value < power_mean(np.array([1.0, 0.5]) + 1e-3, -1.0)


def test_restart_factor_math() -> None:
    assert restart_factor(100.0, 1, 30.0) == pytest.approx(70 / 130)
    assert restart_factor(3600.0, 0, 30.0) == pytest.approx(3600 / 3630)
    assert restart_factor(50.0, 3, 30.0) == 0.0  # restarted more than its age allows
    assert restart_factor(0.0, 0, 0.0) == 1.0  # nothing to lose
    assert np.allclose(restart_factor([100.0, 200.0], [1, 2], [30.0, 10.0]),
                       [70 / 130, 180 / 210])


def _objective(jobs: list, cluster: list, previous: dict, **config: object) -> PolluxObjective:
    return PolluxObjective(build_problem(jobs, cluster, previous), PolluxOptions(**config))


def test_restart_penalty_applies_only_to_changed_jobs() -> None:
    jobs = [job("a", seed=None, age_s=100.0, num_restarts=1),
            job("b", seed=None, age_s=100.0, num_restarts=1)]
    cluster = nodes(2, 4)
    previous = {"a": ("node-00",) * 2, "b": ("node-01",) * 2}
    obj = _objective(jobs, cluster, previous)
    kept = obj.problem.base_state.copy()
    moved = kept.copy()
    moved[1, 1] = 3  # b grows: restart
    s_kept = obj.state_speedups(kept[None])[0]
    s_moved = obj.state_speedups(moved[None])[0]
    assert s_moved[0] == pytest.approx(s_kept[0])
    # Optimistic job (no speedup function): speedup = replicas / fair share (4 replicas).
    assert s_kept[1] == pytest.approx(2 / 4)
    assert s_moved[1] == pytest.approx(3 / 4 * 70 / 130)


def test_first_start_penalty_is_configurable() -> None:
    jobs = [job("new", seed=None, age_s=30.0, num_restarts=0)]
    cluster = nodes(1, 4)
    state = np.array([[[2]]])
    penalized = _objective(jobs, cluster, {}).state_speedups(state)[0, 0]
    free = _objective(jobs, cluster, {}, penalize_first_start=False).state_speedups(state)[0, 0]
    assert free == pytest.approx(2 / 4)
    assert penalized == pytest.approx(2 / 4 * 30 / 60)


@pytest.mark.parametrize("rounding, expected", [
    (FairShareRounding.INTERPOLATE, 64 / 24), (FairShareRounding.CEIL, 3.0)])
def test_fair_share_divides_the_cluster_by_dominant_resource(
        rounding: FairShareRounding, expected: float) -> None:
    # 24 jobs on 64 GPUs: 2.67 GPUs each; the optimistic speedup is linear in replicas.
    jobs = [job(f"j{i:02d}", seed=None) for i in range(24)]
    obj = _objective(jobs, nodes(16, 4), {}, fair_share=rounding)
    assert obj.fair_replicas == pytest.approx(np.full(24, 64 / 24))
    assert obj.fair_speedup == pytest.approx(np.full(24, expected))


def test_dominant_resource_sets_the_fair_share() -> None:
    # CPU-heavy jobs: 32 CPUs per replica of 256 is 1/8 of the cluster, more than 1/64 GPUs.
    jobs = [job("cpu-heavy", seed=None, resources={"gpu": 1, "cpu": 32}),
            job("light", seed=None, resources={"gpu": 1, "cpu": 1})]
    obj = _objective(jobs, nodes(16, 4, cpus=16), {})
    assert obj.fair_replicas == pytest.approx([4.0, 32.0])


def test_speedup_normalizes_by_the_fair_share_of_the_speedup_function() -> None:
    jobs = [job(f"j{i}", seed=i) for i in range(4)]
    obj = _objective(jobs, nodes(4, 4), {})
    fn = jobs[0].on().speedup_fn
    assert fn is not None
    j = [p.name for p in obj.problem.jobs].index("j0")
    assert obj.fair_speedup[j] == pytest.approx(float(fn(1, 4)))
    assert obj.speedup(j, 2, 8) == pytest.approx(float(fn(2, 8)) / float(fn(1, 4)))


def test_preemptible_nodes_cost_a_little() -> None:
    jobs = [job("a", seed=None)]
    cluster = nodes(2, 4, preemptible=1)
    obj = _objective(jobs, cluster, {})
    regular = np.array([[[4, 0]]])
    spot = np.array([[[0, 4]]])
    assert obj.evaluate(regular)[0] > obj.evaluate(spot)[0]


def test_bad_configuration_names_the_field() -> None:
    with pytest.raises(ConfigError, match="epsilon"):
        PolluxOptions(epsilon=0.0)
    with pytest.raises(ConfigError, match="p="):
        PolluxOptions(p=float("nan"))


def test_remaining_weight_favours_jobs_close_to_done() -> None:
    jobs = [job("short", seed=1, remaining_s=100.0), job("long", seed=1, remaining_s=10_000.0),
            job("unknown", seed=1)]
    paper = _objective(jobs, nodes(4, 4), {})
    weighted = PolluxObjective(build_problem(jobs, nodes(4, 4), {}),
                               PolluxOptions(remaining_weight=1.0))
    index = {p.name: i for i, p in enumerate(weighted.problem.jobs)}
    assert paper.job_scale == pytest.approx([1.0, 1.0, 1.0])
    # equal speedup functions: the scale is the remaining time over the median (100 and
    # 10,000 s: median 5,050 s); a job reporting nothing keeps 1
    assert weighted.job_scale[index["short"]] == pytest.approx(100 / 5050)
    assert weighted.job_scale[index["long"]] == pytest.approx(10_000 / 5050)
    assert weighted.job_scale[index["unknown"]] == 1.0
    # with p = -1 a GPU more is worth more to the short job than to the long one
    gain = {name: float(weighted.utility(weighted.speedup(j, 1, 2))
                        - weighted.utility(weighted.speedup(j, 1, 1)))
            for name, j in index.items()}
    assert gain["short"] > gain["long"]
    with pytest.raises(ConfigError, match="remaining_weight"):
        PolluxOptions(remaining_weight=-1.0)


def test_remaining_guard_rounding_and_admission() -> None:
    jobs = [job("short", seed=1, remaining_s=100.0), job("mid", seed=1, remaining_s=1_000.0),
            job("long", seed=1, remaining_s=10_000.0)]
    cluster = nodes(4, 4)

    def scale(**config: object) -> dict[str, float]:
        obj = _objective(jobs, cluster, {}, remaining_weight=1.0, **config)
        return {p.name: float(s) for p, s in zip(obj.problem.jobs, obj.job_scale)}

    assert scale() == pytest.approx({"short": 0.1, "mid": 1.0, "long": 10.0})
    # the guard: no job weighs less than the median one
    assert scale(remaining_max_ratio=1.0) == pytest.approx({"short": 0.1, "mid": 1.0,
                                                            "long": 1.0})
    # rounding to powers of 4: 0.1 -> 4^-2, 10 -> 4^2
    assert scale(remaining_step=4.0) == pytest.approx({"short": 1 / 16, "mid": 1.0,
                                                       "long": 16.0})
    # admission: leaving the long job without GPUs costs 10x less than the paper's eps^p
    obj = _objective(jobs, cluster, {}, remaining_weight=1.0, remaining_admission=True)
    j = [p.name for p in obj.problem.jobs].index("long")
    empty = obj.utility(obj.speedup(j, 0, 0))
    assert float(empty) == pytest.approx(-1 / (10 * obj.config.epsilon))
    with pytest.raises(ConfigError, match="remaining_max_ratio"):
        PolluxOptions(remaining_max_ratio=0.0)
    # ratios above 100 are clipped by default; a higher bound keeps the longest in order
    longest = [job(name, seed=1, remaining_s=t) for name, t in
               (("a", 100.0), ("b", 1_000.0), ("c", 1_000.0), ("d", 2e5), ("e", 4e5))]
    for extra, expected in (({}, [0.1, 1, 1, 100, 100]),
                            ({"remaining_max_ratio": 1e6}, [0.1, 1, 1, 200, 400])):
        obj = _objective(longest, nodes(8, 4), {}, remaining_weight=1.0, **extra)
        by_name = {q.name: float(v) for q, v in zip(obj.problem.jobs, obj.job_scale)}
        assert [by_name[n] for n in "abcde"] == pytest.approx(expected)
    with pytest.raises(ConfigError, match="remaining_max_ratio"):
        PolluxOptions(remaining_max_ratio=1e7)
    with pytest.raises(ConfigError, match="remaining_step"):
        PolluxOptions(remaining_step=-2.0)


@pytest.mark.parametrize("p", [-1.0, -0.5])
def test_remaining_guard_keeps_long_jobs_weight_up_to_their_fair_share(p: float) -> None:
    # 3 jobs on 16 GPUs: a fair share of 5.33 replicas; 1-2 replicas are below it, 6-8
    # on two nodes above it
    jobs = [job("short", seed=1, remaining_s=100.0), job("mid", seed=1, remaining_s=1_000.0),
            job("long", seed=1, remaining_s=10_000.0)]
    config = {"p": p, "epsilon": 1e-12}
    paper = _objective(jobs, nodes(4, 4), {}, **config)
    weighted = _objective(jobs, nodes(4, 4), {}, remaining_weight=1.0, **config)
    guarded = _objective(jobs, nodes(4, 4), {}, remaining_weight=1.0, remaining_guard=1.0,
                         **config)
    index = {q.name: i for i, q in enumerate(guarded.problem.jobs)}

    def gain(obj: PolluxObjective, name: str, k0: int, k1: int, n: int = 1) -> float:
        j = index[name]
        return float(obj.utility(obj.speedup(j, n, k1)) - obj.utility(obj.speedup(j, n, k0)))

    long = index["long"]
    assert float(paper.speedup(long, 1, 2)) < 1 < float(paper.speedup(long, 2, 6))
    # below its fair share the long job gains what the paper's objective gives it ...
    assert gain(guarded, "long", 1, 2) == pytest.approx(gain(paper, "long", 1, 2))
    assert gain(guarded, "long", 1, 2) > 2 * gain(weighted, "long", 1, 2)
    # ... beyond it, what the weights make of it (its scale is 10: 10^p of the paper's)
    assert gain(guarded, "long", 6, 8, n=2) == pytest.approx(
        10 ** p * gain(paper, "long", 6, 8, n=2))
    # the short job (scale < 1) and the median job are weighted as without the guard
    for name in ("short", "mid"):
        assert gain(guarded, name, 1, 3) == pytest.approx(gain(weighted, name, 1, 3))
    # a guard at a fraction of the fair share: the paper's gains below it, weighted above
    low = float(paper.speedup(long, 1, 1))
    half = _objective(jobs, nodes(4, 4), {}, remaining_weight=1.0, remaining_guard=low,
                      **config)
    assert gain(half, "long", 1, 2) == pytest.approx(10 ** p * gain(paper, "long", 1, 2))
    assert float(half.speedup(long, 1, 1)) == pytest.approx(low)
    with pytest.raises(ConfigError, match="remaining_guard"):
        PolluxOptions(remaining_guard=-1.0)


def test_unweighted_restarts_charge_long_jobs_the_papers_loss() -> None:
    jobs = [job("short", seed=1, remaining_s=100.0), job("mid", seed=1, remaining_s=1_000.0),
            job("long", seed=1, remaining_s=10_000.0)]
    config = {"min_restart_gain": 0.2, "epsilon": 1e-12}  # every change keeps 80%
    paper = _objective(jobs, nodes(4, 4), {}, **config)
    weighted = _objective(jobs, nodes(4, 4), {}, remaining_weight=1.0, **config)
    fixed = _objective(jobs, nodes(4, 4), {}, remaining_weight=1.0, unweighted_restarts=True,
                       **config)
    index = {q.name: i for i, q in enumerate(fixed.problem.jobs)}

    def loss(obj: PolluxObjective, name: str) -> float:
        j = index[name]
        return float(obj.utility(obj.speedup(j, 1, 2, False))
                     - obj.utility(obj.speedup(j, 1, 2, True)))

    assert loss(paper, "long") > 0
    # the weights cut the long job's restart cost 10x; the option restores the paper's
    assert loss(weighted, "long") == pytest.approx(loss(paper, "long") / 10)
    assert loss(fixed, "long") == pytest.approx(loss(paper, "long"))
    # unchanged allocations and the other jobs are as the weights make them
    j = index["long"]
    assert float(fixed.speedup(j, 1, 2)) == pytest.approx(float(weighted.speedup(j, 1, 2)))
    for name in ("short", "mid"):
        assert loss(fixed, name) == pytest.approx(loss(weighted, name))


def test_efficient_boost_weights_a_short_job_up_to_its_efficient_size_only() -> None:
    def sqrt_speedup(num_nodes: object, replicas: object) -> np.ndarray:
        return np.sqrt(np.asarray(replicas, dtype=np.float64))  # per replica: 1 / sqrt(k)

    jobs = [job(name, speedup_fn=sqrt_speedup, remaining_s=t)
            for name, t in (("short", 100.0), ("mid", 1_000.0), ("long", 10_000.0))]
    config = {"remaining_weight": 1.0, "epsilon": 1e-12}
    paper = _objective(jobs, nodes(4, 4), {}, epsilon=1e-12)
    weighted = _objective(jobs, nodes(4, 4), {}, **config)
    capped = _objective(jobs, nodes(4, 4), {}, efficient_boost=0.5, **config)
    index = {q.name: i for i, q in enumerate(capped.problem.jobs)}

    def gain(obj: PolluxObjective, name: str, k0: int, k1: int) -> float:
        j = index[name]
        n0, n1 = -(-k0 // 4), -(-k1 // 4)
        return float(obj.utility(obj.speedup(j, n1, k1)) - obj.utility(obj.speedup(j, n0, k0)))

    # efficient size: 4 replicas (sqrt(4) / 4 = 0.5); the limit is its fair-share speedup
    short = index["short"]
    assert capped.boost_limit[short] == pytest.approx(2.0 / capped.fair_speedup[short])
    assert np.isinf(capped.boost_limit[index["mid"]])
    assert np.isinf(capped.boost_limit[index["long"]])
    # up to 4 replicas the short job is favoured as the weights say ...
    assert gain(capped, "short", 1, 4) == pytest.approx(gain(weighted, "short", 1, 4))
    # ... beyond, its gains count as in the paper's objective (10x less than weighted)
    assert gain(capped, "short", 6, 8) == pytest.approx(gain(paper, "short", 6, 8))
    assert gain(weighted, "short", 6, 8) == pytest.approx(10 * gain(paper, "short", 6, 8))
    assert gain(capped, "short", 4, 5) < gain(weighted, "short", 4, 5)
    for name in ("mid", "long"):
        assert gain(capped, name, 1, 8) == pytest.approx(gain(weighted, name, 1, 8))
    with pytest.raises(ConfigError, match="efficient_boost"):
        PolluxOptions(efficient_boost=1.5)


def test_remaining_restart_factor_spares_jobs_close_to_done() -> None:
    # two identical jobs on one node each, old enough that Pollux's own factor is ~1; the
    # one with 60 s of training left would lose half its remaining time to a 30 s restart
    jobs = [job("ending", seed=1, age_s=1e6, remaining_s=60.0),
            job("long", seed=1, age_s=1e6, remaining_s=1e9), job("unknown", seed=1, age_s=1e6)]
    previous = {"ending": ("node-00",), "long": ("node-01",), "unknown": ("node-02",)}
    paper = _objective(jobs, nodes(4, 4), previous)
    aware = _objective(jobs, nodes(4, 4), previous, remaining_restart=True)
    index = {p.name: i for i, p in enumerate(aware.problem.jobs)}

    def ratio(obj: PolluxObjective, name: str) -> float:
        j = index[name]
        return float(obj.speedup(j, 1, 2, True) / obj.speedup(j, 1, 2, False))

    assert ratio(paper, "ending") == pytest.approx(ratio(paper, "long"), rel=1e-9)
    raw = float(aware.raw_speedup(index["ending"], 1, 2))
    left_s = 60.0 / raw
    assert ratio(aware, "ending") == pytest.approx(left_s / (left_s + 30.0))
    assert ratio(aware, "long") == pytest.approx(ratio(paper, "long"))
    assert ratio(aware, "unknown") == pytest.approx(ratio(paper, "unknown"))
    # hysteresis: every change is worth at most 1 - min_restart_gain of its speedup
    damped = _objective(jobs, nodes(4, 4), previous, min_restart_gain=0.2)
    assert ratio(damped, "long") == pytest.approx(0.8)
    with pytest.raises(ConfigError, match="min_restart_gain"):
        PolluxOptions(min_restart_gain=1.0)
    # the hysteresis only for jobs holding more than 1 replica: the one-replica jobs here
    # keep Pollux's factor alone
    small_free = _objective(jobs, nodes(4, 4), previous, min_restart_gain=0.2,
                            min_restart_gain_replicas=1)
    assert ratio(small_free, "long") == pytest.approx(ratio(paper, "long"))
    with pytest.raises(ConfigError, match="min_restart_gain_replicas"):
        PolluxOptions(min_restart_gain_replicas=-1)


def test_remaining_factor_can_replace_the_age_based_one() -> None:
    # a young job (Pollux's factor 60 / 90) with a long way to go: without the age-based
    # factor only the hysteresis and its own remaining time hold it back
    jobs = [job("young", seed=1, age_s=60.0, remaining_s=1e9)]
    previous = {"young": ("node-00",)}
    options = {"remaining_restart": True, "min_restart_gain": 0.2}
    aged = _objective(jobs, nodes(2, 4), previous, **options)
    free = _objective(jobs, nodes(2, 4), previous, age_restart_factor=False, **options)
    assert float(aged.speedup(0, 1, 2, True) / aged.speedup(0, 1, 2, False)) == pytest.approx(
        60 / 90)
    assert float(free.speedup(0, 1, 2, True) / free.speedup(0, 1, 2, False)) == pytest.approx(
        0.8, rel=1e-6)
