from __future__ import annotations

import numpy as np
import pytest

from pollux.errors import ConfigError
from pollux.models import ThroughputParams, iteration_time, sync_time, throughput
from pollux.models.throughput import compute_time, optimizer_step_time

PARAMS = ThroughputParams(0.1, 0.01, 0.5, 0.05, 0.2, 0.02, 1.0)


def test_formulas_by_hand() -> None:
    assert compute_time(PARAMS, 10) == pytest.approx(0.2)
    assert sync_time(PARAMS, 1, 1) == 0.0
    assert sync_time(PARAMS, 1, 2) == pytest.approx(0.2)
    assert sync_time(PARAMS, 1, 4) == pytest.approx(0.2 + 0.02 * 2)
    assert sync_time(PARAMS, 2, 4) == pytest.approx(0.5 + 0.05 * 2)
    # gamma = 1: no overlap, T_o = T_c + T_s.
    assert optimizer_step_time(PARAMS, 2, 4, 10) == pytest.approx(0.2 + 0.6)
    # Two accumulation steps: T_iter = 2 T_c + T_o; throughput = K b (s+1) / T_iter.
    assert iteration_time(PARAMS, 2, 4, 10, 2) == pytest.approx(0.4 + 0.8)
    assert throughput(PARAMS, 2, 4, 10, 2) == pytest.approx(4 * 10 * 3 / 1.2)


def test_large_gamma_approaches_max_and_does_not_overflow() -> None:
    params = ThroughputParams(0.1, 0.01, 0.5, 0.05, 0.2, 0.02, 10.0)
    t = optimizer_step_time(params, 2, 4, 1000)
    assert np.isfinite(t)
    assert t == pytest.approx(max(0.1 + 10.0, 0.6), rel=1e-3)


def test_broadcasting() -> None:
    out = throughput(PARAMS, np.array([[1], [2]]), np.array([[2], [4]]), np.array([8, 16, 32]))
    assert out.shape == (2, 3)
    assert np.all(np.diff(out, axis=1) > 0)  # bigger batches -> more samples/s


def test_params_validation_names_field() -> None:
    with pytest.raises(ConfigError, match="gamma"):
        ThroughputParams(0.1, 0.01, 0.5, 0.05, 0.2, 0.02, 0.5)
    with pytest.raises(ConfigError, match="alpha_c"):
        ThroughputParams(float("nan"), 0.01, 0.5, 0.05, 0.2, 0.02, 1.0)


def test_params_roundtrip() -> None:
    assert ThroughputParams.from_dict(PARAMS.to_dict()) == PARAMS
    assert ThroughputParams.from_array(PARAMS.as_array()) == PARAMS
