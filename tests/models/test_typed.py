"""Per-GPU-type goodput models and the bootstrap onto unseen types."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.models import GoodputFunction, GradientStats, JobHints, SpeedupFunction
from pollux.models.typed import TypedGoodput, TypeProfile, project_params
from tests.models.profiles import TRUE_PARAMS

STATS = GradientStats(1.0, 20.0)


def test_projection_scales_every_time_not_gamma() -> None:
    fast = project_params(TRUE_PARAMS, 4.0)
    assert fast.alpha_c == pytest.approx(TRUE_PARAMS.alpha_c / 4)
    assert fast.beta_n == pytest.approx(TRUE_PARAMS.beta_n / 4)
    assert fast.gamma == TRUE_PARAMS.gamma
    with pytest.raises(ConfigError, match="speed_ratio"):
        project_params(TRUE_PARAMS, 0.0)


@settings(max_examples=30, deadline=None)
@given(st.floats(0.2, 12.0), st.integers(1, 4), st.integers(1, 8))
def test_projected_goodput_is_the_source_times_the_ratio(ratio: float, nodes: int,
                                                         per_node: int) -> None:
    """Sia's bootstrap: same GPU count, goodput times the 1-GPU speed ratio."""
    model = TypedGoodput({"t4": TypeProfile(TRUE_PARAMS, 2)}, STATS, 64, 4096, (16, 256),
                         type_speeds={"t4": 1.0, "a100": ratio})
    assert model.projected_from == {"a100": "t4"}
    replicas = nodes * per_node
    assert float(model.goodput("a100", nodes, replicas)) == pytest.approx(
        ratio * float(model.goodput("t4", nodes, replicas)), rel=1e-9)


def test_fitted_types_are_kept_and_speedups_share_one_scale() -> None:
    slow = project_params(TRUE_PARAMS, 0.5)
    model = TypedGoodput({"t4": TypeProfile(slow, 1), "a100": TypeProfile(TRUE_PARAMS, 8)},
                         STATS, 64, 4096, {"t4": (16, 128), "a100": (16, 256), "rtx": (16, 64)},
                         type_speeds={"t4": 1.0, "a100": 1.0, "rtx": 3.0})
    assert model.projected_from == {"rtx": "a100"}  # most replicas run: the best scaling data
    assert model.params["t4"] == slow
    # 1.0 is one GPU of the slowest modelled type (t4 here, half as fast as the a100)
    assert float(model.speedup("t4", 1, 1)) == pytest.approx(1.0)
    assert float(model.speedup("a100", 1, 1)) == pytest.approx(2.0, rel=0.05)
    single = SpeedupFunction(GoodputFunction(TRUE_PARAMS, STATS, 64), 4096, (16, 256), True)
    ratio = float(model.speedup("a100", 2, 8)) / float(model.speedup("a100", 1, 1))
    assert ratio == pytest.approx(float(single(2, 8)))
    good, bsz, steps = model.best_batch("t4", 1, 4)
    assert good > 0 and 16 <= bsz <= 128 and steps >= 0
    with pytest.raises(ConfigError, match="gpu_type"):
        model.goodput("v100", 1, 1)


def test_no_speed_table_means_no_projection() -> None:
    model = TypedGoodput({"t4": TypeProfile(TRUE_PARAMS, 1)}, STATS, 64, 4096, (16, 256))
    assert model.gpu_types == ("t4",)
    assert not model.has_model("a100")
    assert np.all(model.speedup("t4", [0, 1], [0, 2]) >= [0, 1])


def test_hints_carry_type_profiles_and_stay_backward_compatible() -> None:
    old = {"init_batch_size": 64, "max_batch_size": 4096, "local_bsz_bounds": [16, 256],
           "throughput_params": TRUE_PARAMS.to_dict(), "max_profiled_replicas": 4}
    hints = JobHints.from_dict(old)
    assert hints.gpu_type is None and dict(hints.type_profiles) == {}
    assert hints.profiles_by_type() == {"default": TypeProfile(TRUE_PARAMS, 4)}
    typed = JobHints(64, 4096, (16, 256), grad_stats=STATS, gpu_type="a100",
                     type_profiles={"a100": TypeProfile(TRUE_PARAMS, 8),
                                    "t4": TypeProfile(None, 0)})
    again = JobHints.from_dict(typed.to_dict())
    assert again == typed
    model = again.typed_goodput({"a100": 6.9, "t4": 1.0})
    assert model is not None and model.projected_from == {"t4": "a100"}
    assert JobHints(64, 4096, (16, 256)).typed_goodput() is None


@pytest.mark.parametrize(("extra", "field"), [
    ({"gpu_type": 3}, "gpu_type"),
    ({"gpu_type": ""}, "gpu_type"),
    ({"type_profiles": []}, "type_profiles"),
    ({"type_profiles": {"": {}}}, "type_profiles"),
    ({"type_profiles": {"a100": 1}}, "type_profiles"),
    ({"type_profiles": {"a100": {"max_profiled_replicas": -1}}}, "max_profiled_replicas"),
    ({"type_profiles": {"a100": {"max_profiled_replicas": True}}}, "max_profiled_replicas"),
    ({"type_profiles": {"a100": {"speed": 2}}}, "speed"),
    ({"type_profiles": {"a100": {"throughput_params": {"alpha_c": 1}}}}, "throughput_params"),
    ({"type_profiles": {"a100": {"throughput_params": [1, 2]}}}, "throughput_params"),
])
def test_bad_type_fields_name_the_field(extra: dict, field: str) -> None:
    data = {"init_batch_size": 64, "max_batch_size": 4096, "local_bsz_bounds": [16, 256],
            **extra}
    with pytest.raises(ConfigError, match=field):
        JobHints.from_dict(data)
