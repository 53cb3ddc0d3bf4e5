"""The batch size of a stationary job does not go back and forth (issue #25 item 3:
64 -> 124 -> 64 within seconds): the confidence rule with hysteresis of
:mod:`pollux.torch.batch_decider`, as a property over noisy estimates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.models import GradientStats, ThroughputParams
from pollux.torch.batch_decider import BatchDecider, DecisionRule
from pollux.torch.batch_size import BatchLimits, choose_batch_config, initial_batch_config

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
