"""Cluster utility and the autoscalers (policy layer): bounds, the utility band, no useless
growth, smoothing, the throughput baseline, and the registry."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError, UnknownPluginError
from pollux.models import GoodputFunction, GradientStats, SpeedupFunction, ThroughputParams
from pollux.policies.autoscaling import (
    THROUGHPUT_SPEEDUP_KEY,
    Autoscaler,
    AutoscalerConfig,
    NodeTemplate,
    PolluxAutoscaler,
    Proposal,
    ThroughputAutoscaler,
    autoscaler_names,
    cluster_utility,
    make_autoscaler,
    throughput_speedup_function,
)
from pollux.policies.base import JobInfo
from tests.policies.pollux_builders import GPU, job, nodes

TEMPLATE = NodeTemplate({GPU: 4.0, "cpu": 64.0}, price_per_hour=2.0)
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def config(min_nodes: int = 1, max_nodes: int = 8, window_rounds: int = 1) -> AutoscalerConfig:
    return AutoscalerConfig(TEMPLATE, min_nodes, max_nodes, window_rounds)


def power_law_speedup(exponent: float):  # type: ignore[no-untyped-def]
    """``S(n, k) = k ** exponent``: perfect scaling at 1, diminishing below."""
    def speedup(num_nodes: object, num_replicas: object) -> np.ndarray:
        return np.asarray(num_replicas, dtype=np.float64) ** exponent
    return speedup


def goodput_fn(noise: float) -> GoodputFunction:
    params = ThroughputParams(alpha_c=0.05, beta_c=1e-3, alpha_n=0.2, beta_n=0.01,
                              alpha_r=0.02, beta_r=0.002, gamma=2.0)
    return GoodputFunction(params, GradientStats(1.0, noise), 64)


jobs_strategy = st.lists(
    st.tuples(st.integers(0, 40), st.integers(1, 48), st.sampled_from([1.0, 2.0])),
    min_size=0, max_size=5)


def make_jobs(specs: Sequence[tuple[int, int, float]]) -> list[JobInfo]:
    return [job(f"job-{i}", gpus, seed=seed, max_replicas=cap)
            for i, (seed, cap, gpus) in enumerate(specs)]


# -- utility -----------------------------------------------------------------------------

def test_utility_is_the_share_weighted_scaling_efficiency() -> None:
    cluster = nodes(2)
    a = job("a", seed=None, speedup_fn=power_law_speedup(0.5))  # 4 replicas: 2 / 4
    b = job("b", seed=None)  # no speedup reported: perfect scaling
    alloc = {"a": ("node-00",) * 4, "b": ("node-01",)}
    assert cluster_utility([a, b], alloc, cluster) == pytest.approx((4 * 0.5 + 1 * 1) / 5)
    # a job needing 2 GPUs per replica weighs twice as much per replica
    c = job("c", 2, seed=None, speedup_fn=power_law_speedup(0.0))  # 2 replicas: 1 / 2
    alloc = {"b": ("node-00",), "c": ("node-01",) * 2}
    assert cluster_utility([b, c], alloc, cluster) == pytest.approx((1 * 1 + 4 * 0.5) / 5)
    assert cluster_utility([a, b], {}, cluster) is None


def test_throughput_speedup_ignores_statistical_efficiency() -> None:
    noisy, clean = goodput_fn(1e6), goodput_fn(1.0)
    fast = throughput_speedup_function(noisy, 64 * 32, (16, 256), accumulation=True)
    same = throughput_speedup_function(clean, 64 * 32, (16, 256), accumulation=True)
    counts = np.array([1, 2, 4, 8, 16])
    np.testing.assert_allclose(fast(np.ones(5, int), counts), same(np.ones(5, int), counts))
    goodput = SpeedupFunction(clean, 64 * 32, (16, 256), accumulation=True)
    # without noise large batches are inefficient: goodput scales worse than throughput
    assert goodput(2, 16) < 0.5 * same(2, 16)


# -- the Pollux autoscaler ---------------------------------------------------------------

@SETTINGS
@given(specs=jobs_strategy, bounds=st.tuples(st.integers(1, 4), st.integers(0, 6)),
       current=st.integers(0, 16), name=st.sampled_from(["pollux", "throughput"]),
       window=st.integers(1, 3))
def test_desired_size_stays_within_bounds(specs: list[tuple[int, int, float]],
                                          bounds: tuple[int, int], current: int, name: str,
                                          window: int) -> None:
    low, extra = bounds
    scaler = make_autoscaler(name, config(low, low + extra, window))
    jobs = make_jobs(specs)
    for _ in range(window + 1):
        decision = scaler.decide(jobs, current)
        assert low <= decision.num_nodes <= low + extra
        assert low <= decision.proposed_num_nodes <= low + extra
        current = decision.num_nodes


@SETTINGS
@given(specs=jobs_strategy.filter(bool), current=st.integers(1, 10))
# utility not monotone in size: in the band at 3 nodes, above it at 1, 2 and 4
@example(specs=[(0, 3, 1.0), (0, 3, 1.0), (0, 3, 1.0), (3, 3, 1.0)], current=1)
def test_chosen_size_is_in_the_band_whenever_a_size_in_it_exists(
        specs: list[tuple[int, int, float]], current: int) -> None:
    scaler = PolluxAutoscaler(config(1, 10))
    jobs = make_jobs(specs)
    decision = scaler.decide(jobs, current)
    evaluator = scaler.evaluator(jobs)
    useful = scaler.useful_nodes(evaluator)
    in_band = [n for n in range(1, useful + 1)
               if scaler.in_band(evaluator.estimate(n).utility)]
    if in_band:
        assert scaler.in_band(evaluator.estimate(decision.num_nodes).utility), (
            decision, in_band)
    assert decision.num_nodes <= max(useful, current if current <= 10 else 10)


@SETTINGS
@given(num_jobs=st.integers(1, 8), current=st.integers(1, 4), perfect=st.booleans())
def test_no_growth_when_no_job_can_use_more_nodes(num_jobs: int, current: int,
                                                   perfect: bool) -> None:
    # one replica each and room for all of them: utility 1, far above the band
    num_jobs = min(num_jobs, 4 * current)
    jobs = [job(f"j{i}", seed=None if perfect else i, max_replicas=1) for i in range(num_jobs)]
    for name in ("pollux", "throughput"):
        decision = make_autoscaler(name, config(1, 8)).decide(jobs, current)
        assert decision.num_nodes <= current


def test_grows_for_jobs_that_scale_and_shrinks_for_jobs_that_do_not() -> None:
    scaler = PolluxAutoscaler(config(1, 8))
    linear = [job("a", seed=None, max_replicas=64)]
    assert scaler.decide(linear, 2).num_nodes == 8  # utility 1 everywhere: as big as useful
    # efficiency k ** -0.4: 0.57 on one node, 0.44 on two, 0.33 on four
    poor = [job("b", seed=None, max_replicas=64, speedup_fn=power_law_speedup(0.6))]
    decision = PolluxAutoscaler(config(1, 8), low_util=0.35, high_util=0.65).decide(poor, 8)
    assert decision.num_nodes == 2
    assert decision.utility == pytest.approx(8 ** -0.4)
    # the default band (0.6-0.78) holds no size: the one nearest its middle, one node
    decision = PolluxAutoscaler(config(1, 8)).decide(poor, 8)
    assert decision.num_nodes == 1
    assert decision.utility == pytest.approx(4 ** -0.4)
    # idle nodes go: one job of 4 replicas needs one node
    small = [job("c", seed=None, max_replicas=4)]
    assert PolluxAutoscaler(config(1, 8)).decide(small, 5).num_nodes == 1


def test_no_jobs_shrink_to_the_minimum_and_bad_bands_are_refused() -> None:
    assert PolluxAutoscaler(config(2, 8)).decide([], 6).num_nodes == 2
    with pytest.raises(ConfigError, match="high_util"):
        PolluxAutoscaler(config(), low_util=0.6, high_util=0.5)
    with pytest.raises(ConfigError, match="max_nodes"):
        AutoscalerConfig(TEMPLATE, 4, 2)
    with pytest.raises(ConfigError, match="price_per_hour"):
        NodeTemplate({GPU: 4.0}, price_per_hour=-1.0)


# -- smoothing ---------------------------------------------------------------------------

class Scripted(Autoscaler):
    """Proposes the sizes it is given, one per round."""

    name = "scripted"

    def __init__(self, cfg: AutoscalerConfig, sizes: Sequence[int]) -> None:
        super().__init__(cfg, estimator=None)
        self.sizes = list(sizes)

    def propose(self, jobs: Sequence[JobInfo], num_nodes: int) -> Proposal:
        return Proposal(self.sizes.pop(0), "scripted")


def run_script(sizes: Sequence[int], start: int, window: int,
               grow_window: int | None = None) -> list[int]:
    scaler = Scripted(AutoscalerConfig(TEMPLATE, 1, 16, window, grow_window), sizes)
    out, current = [], start
    for _ in sizes:
        current = scaler.decide([], current).num_nodes
        out.append(current)
    return out


def test_smoothing_needs_a_whole_window_of_agreement() -> None:
    assert run_script([6, 6, 6, 6], start=2, window=3) == [2, 2, 6, 6]
    assert run_script([6, 1, 6, 6, 6], start=2, window=3) == [2, 2, 2, 2, 6]  # no flapping
    assert run_script([8, 5, 7, 7, 7], start=2, window=3) == [2, 2, 5, 5, 7]  # the smallest
    assert run_script([1, 3, 2, 9], start=6, window=3) == [6, 6, 3, 3]  # the largest
    assert run_script([30, 30], start=2, window=1) == [16, 16]  # bounded
    assert run_script([5], start=40, window=4) == [16]  # brought inside the bounds at once
    # growing faster than shrinking
    assert run_script([6, 1, 1, 1], start=2, window=3, grow_window=1) == [6, 6, 6, 1]


# -- the throughput baseline -------------------------------------------------------------

def test_throughput_autoscaler_grows_while_nodes_add_enough_throughput() -> None:
    linear = [job("a", seed=None, max_replicas=64)]
    assert ThroughputAutoscaler(config(1, 8)).decide(linear, 1).num_nodes == 8
    flat = power_law_speedup(0.05)  # another node adds almost nothing
    saturated = [job("b", seed=None, max_replicas=64, speedup_fn=flat)]
    assert ThroughputAutoscaler(config(1, 8)).decide(saturated, 4).num_nodes == 1
    # the throughput speedup in extras wins over the goodput speedup
    both = [job("c", seed=None, max_replicas=64, speedup_fn=flat,
                extras={THROUGHPUT_SPEEDUP_KEY: power_law_speedup(1.0)})]
    assert ThroughputAutoscaler(config(1, 8)).decide(both, 1).num_nodes == 8
    # ... which the Pollux autoscaler ignores: it judges by goodput
    assert PolluxAutoscaler(config(1, 8)).decide(both, 8).num_nodes < 8


# -- registry ----------------------------------------------------------------------------

def test_unknown_autoscaler_lists_the_choices() -> None:
    assert autoscaler_names() == ["none", "pollux", "throughput"]
    with pytest.raises(UnknownPluginError) as err:
        make_autoscaler("polux", config())
    assert str(err.value) == "unknown autoscaler 'polux'; choose from: none, pollux, throughput"
    fixed = make_autoscaler("none", config(1, 4))
    assert fixed.decide([job("a", seed=None)], 7).num_nodes == 7
