"""The batch size of a stationary job does not go back and forth (issue #25 item 3:
64 -> 124 -> 64 within seconds): the confidence rule with hysteresis of
:mod:`pollux.torch.batch_decider`, as a property over noisy estimates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.models import GradientStats, ThroughputParams
from pollux.torch.batch_decider import BatchDecider, DecisionRule
from pollux.torch.batch_size import (
    BatchConfig,
    BatchLimits,
    carried_batch_config,
    choose_batch_config,
    initial_batch_config,
)
from pollux.torch.profiler import MicroStepTiming, StepProfiler

AGREEMENTS = 60
LIMITS = BatchLimits(64, 2048, (16, 512), accumulation=False)


def true_params(alpha_c: float, beta_c: float) -> ThroughputParams:
    return ThroughputParams(alpha_c=alpha_c, beta_c=beta_c, alpha_n=0.0, beta_n=0.0,
                            alpha_r=0.0, beta_r=0.0, gamma=1.5)


def noisy_estimates(params: ThroughputParams, stats: GradientStats, noise: float,
                    seed: int) -> list[tuple[ThroughputParams, GradientStats]]:
    """What the agent sees at each agreement point of a job whose truth never changes:
    the gradient statistics and the per-sample compute time off by independent
    log-normal factors (``noise`` is their standard deviation in log space)."""
    rng = np.random.default_rng(seed)
    factors = np.exp(noise * np.clip(rng.standard_normal((AGREEMENTS, 3)), -3, 3))
    return [(ThroughputParams(**{**params.to_dict(), "beta_c": params.beta_c * f[0]}),
             GradientStats(sqr=stats.sqr * f[1], var=stats.var * f[2]))
            for f in factors]


def totals(decide: object, estimates: list[tuple[ThroughputParams, GradientStats]]
           ) -> list[int]:
    """The total batch size after each agreement point, from the initial configuration
    (as a job starts: at ``M0`` until the first estimates arrive)."""
    current = initial_batch_config(LIMITS, 1)
    sizes = []
    for params, stats in estimates:
        current = decide(LIMITS, params, stats, 1, 1, current)  # type: ignore[operator]
        sizes.append(current.total(1))
    return sizes


def reversals(sizes: list[int]) -> int:
    """How often the batch size changed direction (up then down, or down then up)."""
    moves = [np.sign(b - a) for a, b in zip(sizes, sizes[1:]) if b != a]
    return sum(1 for a, b in zip(moves, moves[1:]) if a != b)


@settings(max_examples=100, deadline=None)
@given(alpha_c=st.floats(1e-3, 0.05), beta_c=st.floats(1e-5, 1e-3),
       noise_scale=st.floats(16, 4096), sqr=st.floats(0.01, 100.0),
       noise=st.floats(0.0, 0.3), seed=st.integers(0, 2**32 - 1))
def test_a_stationary_job_never_changes_its_batch_size_back_and_forth(
        alpha_c: float, beta_c: float, noise_scale: float, sqr: float, noise: float,
        seed: int) -> None:
    """Estimates off by up to +-35% (noise 0.1, 3 sigma) each, independently at every
    agreement point, up to +-150% (noise 0.3): the batch size moves one way only."""
    stats = GradientStats(sqr=sqr, var=sqr * noise_scale / LIMITS.init_batch_size)
    estimates = noisy_estimates(true_params(alpha_c, beta_c), stats, noise, seed)
    sizes = totals(BatchDecider(DecisionRule()).decide, estimates)
    assert reversals(sizes) == 0, sizes


def test_the_old_rule_went_back_and_forth_on_the_same_estimates() -> None:
    """The property has teeth: acting on every agreement point with the 5% gain alone
    (the rule before) reverses on noisy estimates of a stationary job."""
    stats = GradientStats(sqr=1.0, var=1.0 * 400 / LIMITS.init_batch_size)
    estimates = noisy_estimates(true_params(0.01, 1e-4), stats, 0.3, seed=0)

    def old(limits, params, grad_stats, nodes, replicas, current):  # type: ignore[no-untyped-def]
        return choose_batch_config(limits, params, grad_stats, nodes, replicas, current, 0.05)

    assert reversals(totals(old, estimates)) > 0
    assert reversals(totals(BatchDecider(DecisionRule()).decide, estimates)) == 0


def test_a_real_change_is_made_after_the_confirmations() -> None:
    stats = GradientStats(sqr=1.0, var=1.0 * 2000 / LIMITS.init_batch_size)
    params = true_params(0.01, 1e-4)
    decider = BatchDecider(DecisionRule(confirmations=3))
    first = decider.decide(LIMITS, None, None, 1, 1, None)
    assert first.total(1) == 64
    sizes = [decider.decide(LIMITS, params, stats, 1, 1, first).total(1) for _ in range(3)]
    assert sizes[:2] == [64, 64] and sizes[2] > 64  # the third agreement point acts


def test_the_rule_is_checked() -> None:
    with pytest.raises(ConfigError, match="batch_change_confirmations"):
        DecisionRule(confirmations=0)
    with pytest.raises(ConfigError, match="batch_reversal_gain"):
        DecisionRule(reversal_gain=-0.1)


def test_a_relaunch_does_not_act_on_a_fit_that_only_extrapolates() -> None:
    """As in a demo run (128 -> 36 -> 128 within 2 s after a rescale 2 -> 1; the first
    agreement points come every step): the first fits after a relaunch have no step
    time at the new replica count, and their extrapolation (here a per-sample time 20x
    too high) makes small batches look best until measurements there correct it. With
    the total carried over and no change before the fit covers the placement, the
    batch size stays until then, and then moves one way only."""
    limits = BatchLimits(32, 512, (8, 256), accumulation=False)
    stats = GradientStats(sqr=1.0, var=1.0 * 600 / limits.init_batch_size)
    truth = true_params(0.02, 1e-4)
    biased = ThroughputParams(**{**truth.to_dict(), "alpha_c": 1e-4, "beta_c": 2e-3})
    before = BatchConfig(64)  # 128 in all, chosen on 2 replicas
    fits = [(biased, False)] * 4 + [(truth, True)] * 6  # (fit, measured here)

    def run(first: BatchConfig | None, use_measured: bool) -> list[int]:
        decider = BatchDecider(DecisionRule())
        decider.decide(limits, truth, stats, 1, 2, before)  # on 2 replicas before
        current, sizes = first, []
        for params, measured in fits:
            current = decider.decide(limits, params, stats, 1, 1, current,
                                     measured or not use_measured)
            sizes.append(current.total(1))
        return sizes

    carried = carried_batch_config(limits, before, 2, 1)
    assert carried == BatchConfig(128)
    at_once = run(None, use_measured=False)  # the optimum at once (before)
    assert at_once[0] < 128 and reversals([128, *at_once]) == 1, at_once
    confirmed_only = run(carried, use_measured=False)  # 4 bad fits pass 3 confirmations
    assert reversals([128, *confirmed_only]) == 1, confirmed_only
    sizes = run(carried, use_measured=True)
    assert sizes[:4] == [128] * 4 and reversals([128, *sizes]) == 0, sizes


def test_the_fit_covers_only_the_configurations_it_measured_enough() -> None:
    profiler = StepProfiler(torch.device("cpu"))
    clock = profiler.clock
    for key, steps in (((1, 2, 16), 3), ((1, 2, 64), 12)):
        for _ in range(steps):
            for optimizer_step in (False, True):
                start = clock.mark()
                sum(range(20000))
                profiler.record(MicroStepTiming(key, optimizer_step, start, clock.mark()))
    profiler.collect()
    assert not profiler.fit_covers((1, 2, 64))  # no fit yet
    assert profiler.maybe_refit(force=True)
    profiler.wait_for_fit()
    assert profiler.fit_covers((1, 2, 64), 10) and not profiler.fit_covers((1, 2, 16), 10)
    assert profiler.fit_covers((1, 2, 16), 3) and not profiler.fit_covers((1, 1, 64))
    restored = StepProfiler(torch.device("cpu"))
    restored.load_state_dict(profiler.state_dict())
    assert restored.fit_covers((1, 2, 64), 10) and not restored.fit_covers((2, 2, 64))


def test_the_carried_total_respects_the_limits() -> None:
    limits = BatchLimits(32, 512, (8, 256), accumulation=True)
    assert carried_batch_config(limits, BatchConfig(100), 4, 1) == BatchConfig(200, 1)
    assert carried_batch_config(limits, BatchConfig(200), 4, 1) is None  # 800 > 512
    assert carried_batch_config(limits, BatchConfig(16), 2, 4) == BatchConfig(8)
    assert carried_batch_config(limits, BatchConfig(8), 2, 4) is None  # 4 < 8 per replica
    assert carried_batch_config(limits, None, 2, 4) is None
    no_accumulation = BatchLimits(32, 512, (8, 256), accumulation=False)
    assert carried_batch_config(no_accumulation, BatchConfig(100), 4, 1) is None
