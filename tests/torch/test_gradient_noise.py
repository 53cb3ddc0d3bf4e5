"""Gradient noise scale: the two-batch estimator, its averages, and the real thing."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pollux.errors import ConfigError
from pollux.torch.gradient_noise import GradientNoiseEstimator, two_batch_estimates
from tests.torch.launcher import WORKERS, Replicas


def test_two_batch_estimates_recover_exact_expectations() -> None:
    sqr, trace = 2.0, 30.0
    small_bsz, big_bsz = 8, 32
    est_sqr, est_trace = two_batch_estimates(sqr + trace / small_bsz, small_bsz,
                                             sqr + trace / big_bsz, big_bsz)
    assert float(est_sqr) == pytest.approx(sqr)
    assert float(est_trace) == pytest.approx(trace)


def test_estimator_is_unbiased_on_sampled_gradients() -> None:
    """Per-sample gradients with known mean and covariance, sampled in numpy."""
    rng = np.random.default_rng(0)
    dims, bsz, replicas = 20, 16, 4
    mean = rng.standard_normal(dims) * 0.3
    scales = rng.uniform(0.5, 2.0, dims)  # diagonal covariance
    estimator = GradientNoiseEstimator(smoothing=0.999)
    for _ in range(2000):
        samples = mean + rng.standard_normal((replicas, bsz, dims)) * scales
        per_replica = samples.mean(axis=1)
        small = float((per_replica ** 2).sum(axis=1).mean())
        big = float((per_replica.mean(axis=0) ** 2).sum())
        estimator.update(small, bsz, big, replicas * bsz, scale=1.0)
    stats = estimator.stats(init_batch_size=64)
    assert stats is not None
    true_trace = float((scales ** 2).sum())
    true_sqr = float(mean @ mean)
    assert stats.sqr == pytest.approx(true_sqr, rel=0.1)
    assert stats.var * 64 == pytest.approx(true_trace, rel=0.05)
    assert estimator.noise_scale() == pytest.approx(true_trace / true_sqr, rel=0.12)


def test_bias_correction_and_non_finite_updates_are_skipped() -> None:
    estimator = GradientNoiseEstimator(smoothing=0.99)
    assert estimator.stats(10) is None and estimator.noise_scale() is None
    estimator.update(3.0 + 40.0 / 4, 4, 3.0 + 40.0 / 16, 16)
    stats = estimator.stats(10)
    assert stats is not None  # one update, fully bias-corrected: exactly that estimate
    assert stats.sqr == pytest.approx(3.0) and stats.var * 10 == pytest.approx(40.0)
    before = estimator.raw().clone()
    estimator.update(float("inf"), 4, 1.0, 16)
    estimator.update(torch.tensor(float("nan")), 4, 1.0, 16)
    assert torch.equal(estimator.raw(), before)
    assert estimator.num_updates == 1


def test_negative_estimates_are_clamped_and_state_round_trips() -> None:
    estimator = GradientNoiseEstimator()
    estimator.update(1.0, 4, 2.0, 16)  # small < big: negative variance estimate
    stats = estimator.stats(8)
    assert stats is not None and stats.var == 0.0
    clone = GradientNoiseEstimator()
    clone.load_state_dict(estimator.state_dict())
    assert torch.equal(clone.raw(), estimator.raw())


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.5])
def test_smoothing_must_lie_in_the_open_unit_interval(bad: float) -> None:
    with pytest.raises(ConfigError, match="noise_smoothing"):
        GradientNoiseEstimator(smoothing=bad)


@pytest.mark.parametrize("num_replicas, accum_steps", [(2, 0), (1, 1), (1, 0)])
def test_noise_scale_of_linear_regression_within_15_percent(
        tmp_path: Path, num_replicas: int, accum_steps: int) -> None:
    """Real DDP replicas (gloo; the replicas' norms riding on the last bucket's all-reduce
    or in their own), one replica accumulating two micro-batches, or one replica without
    accumulation (every step's gradient paired with the next one's: one update fewer)."""
    argv = [str(WORKERS / "noise_regression.py"), "--accum-steps", str(accum_steps),
            "--steps", "200"]
    if num_replicas > 1:
        argv.append("--separate-norms")
    job = Replicas(argv, num_replicas, checkpoint_dir=tmp_path / "ckpt",
                   log_dir=tmp_path / "logs")
    assert job.wait(timeout_s=120) == [0] * num_replicas, job.output()
    results = job.json_lines()
    assert len(results) == (2 if num_replicas > 1 else 1)
    for result in results:
        truth = float(result["true_noise_scale"])
        estimate = float(result["est_noise_scale"])
        pairs = num_replicas == 1 and accum_steps == 0
        assert result["updates"] == (199 if pairs else 200)
        assert result["accum_steps"] == accum_steps
        assert math.isfinite(estimate)
        assert abs(estimate - truth) / truth < 0.15, result
        true_trace = float(result["true_trace"])
        assert abs(float(result["est_trace"]) - true_trace) < 0.15 * true_trace, result


def test_one_replica_keeps_measuring_the_noise_at_the_default_intervals(
        tmp_path: Path) -> None:
    """One replica, no accumulation, the default noise and probe intervals (every 4th
    step's gradient paired with the next one's): the estimate keeps tracking, within 1.5x
    of the truth after 700 steps."""
    argv = [str(WORKERS / "noise_regression.py"), "--steps", "700", "--seed", "1",
            "--noise-interval", "4", "--probe-interval", "4"]
    job = Replicas(argv, 1, checkpoint_dir=tmp_path / "ckpt", log_dir=tmp_path / "logs")
    assert job.wait(timeout_s=120) == [0], job.output()
    (result,) = job.json_lines()
    assert result["updates"] == 700 // 4 and result["accum_steps"] == 0, result
    ratio = float(result["est_noise_scale"]) / float(result["true_noise_scale"])
    assert 1 / 1.5 < ratio < 1.5, result
