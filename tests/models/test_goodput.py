from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.models import GoodputFunction, GradientStats, SpeedupFunction, efficiency, gain
from pollux.models.speedup import MAX_MEMO_NODES, MAX_MEMO_REPLICAS, speedup_matrix
from tests.address_space import address_space_limited
from tests.models.profiles import TRUE_PARAMS

stats_strategy = st.builds(
    GradientStats,
    sqr=st.floats(1e-6, 1e3, allow_nan=False),
    var=st.floats(0.0, 1e4, allow_nan=False),
)


@settings(max_examples=200, deadline=None)
@given(stats=stats_strategy, m0=st.integers(1, 512),
       batches=st.lists(st.floats(1.0, 1e5), min_size=2, max_size=20))
def test_efficiency_in_unit_interval_and_non_increasing(
    stats: GradientStats, m0: int, batches: list[float]
) -> None:
    m = np.sort(np.array(batches) * m0)
    m = m[m >= m0]
    eff = efficiency(stats, m0, m)
    assert np.all(eff > 0) and np.all(eff <= 1 + 1e-12)
    assert np.all(np.diff(eff) <= 1e-12)


def test_efficiency_closed_form() -> None:
    stats = GradientStats(sqr=2.0, var=30.0)
    m0, m = 64, np.array([64, 128, 1024])
    phi = m0 * stats.var / stats.sqr
    assert np.allclose(efficiency(stats, m0, m), (phi + m0) / (phi + m))
    assert np.allclose(gain(stats, m0, m), efficiency(stats, m0, m) * m / m0)
    assert stats.noise_scale(m0) == pytest.approx(phi)


goodput_fn = GoodputFunction(TRUE_PARAMS, GradientStats(1.0, 50.0), init_batch_size=64)


@settings(max_examples=150, deadline=None)
@given(
    nodes=st.integers(1, 8), extra=st.integers(0, 24),
    max_mult=st.integers(1, 64), lo=st.integers(1, 64), span=st.integers(0, 256),
    accumulation=st.booleans(),
)
def test_optimize_honours_every_bound(
    nodes: int, extra: int, max_mult: int, lo: int, span: int, accumulation: bool
) -> None:
    replicas = nodes + extra
    m0 = goodput_fn.init_batch_size
    max_bsz = m0 * max_mult
    hi = lo + span
    good, bsz, steps = goodput_fn.optimize(nodes, replicas, max_bsz, (lo, hi), accumulation)
    if good == 0:  # infeasible: nothing fits between the bounds
        assert bsz == 0
        return
    total = replicas * bsz * (steps + 1)
    assert lo <= bsz <= hi
    assert m0 <= total + 1e-9 and total <= max_bsz + 1e-9
    if not accumulation:
        assert steps == 0
    if replicas == 1 and total > m0 and accumulation:
        assert steps >= 1
    # goodput == throughput x efficiency at the returned configuration
    assert good == pytest.approx(float(goodput_fn.evaluate(nodes, replicas, bsz, steps)))
    assert good == pytest.approx(float(goodput_fn.throughput(nodes, replicas, bsz, steps)
                                       * goodput_fn.efficiency(total)))


def test_optimize_shapes_follow_input() -> None:
    n = np.array([[1, 1], [2, 4]])
    k = np.array([[1, 4], [8, 16]])
    good, bsz, steps = goodput_fn.optimize(n, k, 4096, (16, 256), True)
    assert good.shape == bsz.shape == steps.shape == (2, 2)
    assert bsz.dtype == np.int64


def test_optimize_prefers_bigger_batch_when_noise_is_high() -> None:
    noisy = GoodputFunction(TRUE_PARAMS, GradientStats(1.0, 1e4), 64)
    quiet = GoodputFunction(TRUE_PARAMS, GradientStats(1.0, 1e-3), 64)
    args = (2, 8, 8192, (16, 512), True)
    _, b_noisy, s_noisy = noisy.optimize(*args)
    _, b_quiet, s_quiet = quiet.optimize(*args)
    assert b_noisy * (s_noisy + 1) > b_quiet * (s_quiet + 1)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(max_batch_size=32, local_bsz_bounds=(16, 64)), "max_batch_size"),
        (dict(max_batch_size=128, local_bsz_bounds=(64, 16)), "local_bsz_bounds"),
        (dict(max_batch_size=128, local_bsz_bounds=(0, 16)), "local_bsz_bounds"),
    ],
)
def test_bad_bounds_raise(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        goodput_fn.optimize(1, 1, **kwargs)


def test_nodes_above_replicas_raise() -> None:
    with pytest.raises(ConfigError, match="num_nodes"):
        goodput_fn.optimize(3, 2, 128, (16, 64))


@settings(max_examples=50, deadline=None)
@given(base_nodes=st.integers(1, 4), base_extra=st.integers(0, 8))
def test_speedup_is_one_at_base(base_nodes: int, base_extra: int) -> None:
    base_k = base_nodes + base_extra
    speedup = SpeedupFunction(goodput_fn, 8192, (8, 512), True, base_nodes, base_k)
    assert float(speedup(base_nodes, base_k)) == pytest.approx(1.0)


def test_speedup_beyond_the_memo_bound_is_computed_not_stored() -> None:
    """A query's numbers must not size an allocation: (1, 2**30) used to grow the memo to
    2 x 2**30 cells (16 GiB). Far pairs are computed each time, near ones still memoized,
    and both agree with the optimizer."""
    speedup = SpeedupFunction(goodput_fn, 2**40, (1, 512), True)
    n = np.array([1, 2, 1, 0])
    k = np.array([2**30, 2**21, 4, 0])
    with address_space_limited(256 << 20):
        far = speedup(n, k)
        matrix = speedup_matrix([speedup, SpeedupFunction(goodput_fn, 8192, (8, 512), True)],
                                n[:3], k[:3])
    good, _, _ = goodput_fn.optimize(n[:3], k[:3], 2**40, (1, 512), True)
    assert np.allclose(far[:3], good / speedup.base_goodput) and good[1] > 0
    assert far[3] == 0.0
    assert np.array_equal(matrix[0], far[:3])
    assert speedup._table.shape <= (MAX_MEMO_NODES, MAX_MEMO_REPLICAS)
    assert speedup._table[1, 4] == far[2]  # the near pair is memoized


def test_speedup_memoized_matches_cold_and_zero_replicas() -> None:
    speedup = SpeedupFunction(goodput_fn, 8192, (8, 512), True)
    rng = np.random.default_rng(0)
    n = rng.integers(1, 9, 500)
    k = n * rng.integers(1, 5, 500)
    cold = speedup(n, k)
    warm = speedup(n, k)
    assert np.array_equal(cold, warm)
    good, _, _ = goodput_fn.optimize(n[:5], k[:5], 8192, (8, 512), True)
    assert np.allclose(cold[:5], good / speedup.base_goodput)
    assert float(speedup(0, 0)) == 0.0
    with pytest.raises(ConfigError, match="num_nodes"):
        speedup(2, 1)
