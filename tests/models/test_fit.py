from __future__ import annotations

import logging

import numpy as np
import pytest

from pollux.errors import ConfigError
from pollux.models import ThroughputObservations, fit_throughput, fit_throughput_params
from pollux.models.fit import _FitDesign, _loss_and_grad
from pollux.models.throughput import compute_time, optimizer_step_time
from tests.models.profiles import TRUE_PARAMS, noisy_observations, realistic_configs

UNSEEN = [(3, 12, 32), (8, 32, 32), (8, 32, 64), (5, 20, 48), (1, 4, 128)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_step_times_on_unseen_configurations(seed: int) -> None:
    obs = noisy_observations(TRUE_PARAMS, realistic_configs(), seed=seed)
    params = fit_throughput_params(obs)
    for n, k, b in UNSEEN:
        predicted = float(optimizer_step_time(params, n, k, b))
        truth = float(optimizer_step_time(TRUE_PARAMS, n, k, b))
        assert predicted == pytest.approx(truth, rel=0.10), (n, k, b)
        assert float(compute_time(params, b)) == pytest.approx(
            float(compute_time(TRUE_PARAMS, b)), rel=0.10)


def test_analytic_gradient_matches_finite_differences() -> None:
    obs = _FitDesign.of(noisy_observations(TRUE_PARAMS, realistic_configs(), seed=3))
    p = TRUE_PARAMS.as_array() * np.array([1.3, 0.7, 1.2, 1.5, 0.8, 2.0, 1.0]) + np.array([0.0] * 6 + [0.4])
    _, grad = _loss_and_grad(p, obs)
    eps = 1e-7
    for i in range(7):
        step = np.zeros(7)
        step[i] = eps * max(abs(p[i]), 1e-3)
        numeric = (_loss_and_grad(p + step, obs)[0] - _loss_and_grad(p - step, obs)[0]) / (
            2 * step[i])
        assert grad[i] == pytest.approx(numeric, rel=1e-4, abs=1e-6), i


def test_single_batch_size_fixes_alpha_c_at_half_mean_compute() -> None:
    obs = noisy_observations(TRUE_PARAMS, realistic_configs(), local_bszs=(32,), seed=0)
    fit = fit_throughput(obs)
    assert "alpha_c" in fit.fixed
    assert fit.params.alpha_c == pytest.approx(float(np.mean(obs.compute_time)) / 2)


def test_single_replica_only_puts_sync_at_lower_bound() -> None:
    obs = noisy_observations(TRUE_PARAMS, [(1, 1)], seed=0)
    fit = fit_throughput(obs)
    p = fit.params
    assert p.alpha_r <= 1e-6 and p.beta_r == 0.0 and p.gamma == 1.0
    # Optimistic: predicted scaling is nearly perfect.
    assert float(optimizer_step_time(p, 4, 16, 32)) == pytest.approx(
        float(compute_time(p, 32)), rel=1e-3)


def test_no_multi_node_data_makes_inter_node_slower_than_intra() -> None:
    obs = noisy_observations(TRUE_PARAMS, [(1, 1), (1, 2), (1, 3), (1, 4)], seed=0)
    p = fit_throughput_params(obs)
    assert p.alpha_n >= 1.1 * p.alpha_r * (1 - 1e-12)
    assert p.beta_n >= 1.1 * p.beta_r * (1 - 1e-12)


def test_at_most_two_replicas_fixes_retrogression() -> None:
    obs = noisy_observations(TRUE_PARAMS, [(1, 1), (1, 2), (2, 2)], seed=0)
    fit = fit_throughput(obs)
    assert {"beta_r", "beta_n"} <= set(fit.fixed)
    assert fit.params.beta_r == 0.0 and fit.params.beta_n == 0.0


def test_non_finite_optimizer_result_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import scipy.optimize

    class Result:
        x = np.full(7, np.nan)
        fun = np.nan
        success = False
        message = "boom"

    monkeypatch.setattr(scipy.optimize, "minimize", lambda *a, **k: Result())
    obs = noisy_observations(TRUE_PARAMS, realistic_configs(), seed=0)
    with caplog.at_level(logging.WARNING):
        fit = fit_throughput(obs)
    assert not fit.converged
    assert np.all(np.isfinite(fit.params.as_array()))
    assert "fit failed" in caplog.text


@pytest.mark.parametrize(
    ("rows", "field"),
    [
        ([], "observations"),
        ([(1, 1, 32, 0.1, -0.2)], "step_time"),
        ([(1, 1, 32, float("nan"), 0.2)], "compute_time"),
        ([(2, 1, 32, 0.1, 0.2)], "num_nodes"),
        ([(1, 1, 0, 0.1, 0.2)], "local_bsz"),
    ],
)
def test_bad_observations_name_the_field(rows: list, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ThroughputObservations.from_records(rows)


def test_records_as_mappings() -> None:
    rows = [dict(num_nodes=1, num_replicas=1, local_bsz=b, compute_time=0.01 * b,
                 step_time=0.01 * b) for b in (8, 16)]
    p = fit_throughput_params(rows)
    assert float(compute_time(p, 12)) == pytest.approx(0.12, rel=0.05)


def test_warm_start_from_a_previous_fit_recovers_the_truth() -> None:
    # A job first profiles one node, then grows: refit from the previous parameters.
    small = noisy_observations(TRUE_PARAMS, [(1, 1), (1, 2), (1, 3), (1, 4)], seed=4)
    previous = fit_throughput_params(small)
    full = noisy_observations(TRUE_PARAMS, realistic_configs(), seed=4)
    warm = fit_throughput(full, initial_params=previous)
    cold = fit_throughput(full)
    assert warm.loss <= cold.loss * 1.02
    for n, k, b in UNSEEN:
        assert float(optimizer_step_time(warm.params, n, k, b)) == pytest.approx(
            float(optimizer_step_time(TRUE_PARAMS, n, k, b)), rel=0.10)


def test_exact_single_observation_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pollux.models.fit"):
        fit = fit_throughput([(1, 1, 32, 0.1, 0.1)])
    assert fit.params.alpha_c == pytest.approx(0.05)
    assert float(compute_time(fit.params, 32)) == pytest.approx(0.1, rel=1e-3)
    assert caplog.text == ""


@pytest.mark.parametrize("seed", [0, 1])
def test_noise_free_profile_is_recovered_exactly(seed: int) -> None:
    # Compute times exactly on a line make the compute RMSLE 0 at the initial guess; the
    # fit must still move the sync parameters (it once stalled there, loss ~0.1).
    obs = noisy_observations(TRUE_PARAMS, realistic_configs(), noise=0.0, seed=seed)
    fit = fit_throughput(obs)
    assert fit.converged, fit.message
    assert fit.loss < 0.01
    for n, k, b in UNSEEN:
        assert float(optimizer_step_time(fit.params, n, k, b)) == pytest.approx(
            float(optimizer_step_time(TRUE_PARAMS, n, k, b)), rel=0.02), (n, k, b)
