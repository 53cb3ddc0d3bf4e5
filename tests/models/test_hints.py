from __future__ import annotations

import pytest

from pollux.errors import ConfigError
from pollux.models import GradientStats, JobHints
from tests.models.profiles import TRUE_PARAMS


def test_roundtrip_and_speedup() -> None:
    hints = JobHints(64, 4096, (16, 256), True, TRUE_PARAMS, GradientStats(1.0, 20.0), 4,
                     batch_size=256, local_bsz=64, accum_steps=0, epoch=3, progress=12.5)
    again = JobHints.from_dict(hints.to_dict())
    assert again == hints
    speedup = again.speedup_function()
    assert speedup is not None
    assert float(speedup(1, 1)) == pytest.approx(1.0)
    assert float(speedup(1, 4)) > 1.5


def test_no_profile_means_no_speedup_function() -> None:
    assert JobHints(64, 4096, (16, 256)).speedup_function() is None


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"max_batch_size": 10, "local_bsz_bounds": [1, 2]}, "init_batch_size"),
        ({"init_batch_size": 64, "max_batch_size": 10, "local_bsz_bounds": [1, 2]},
         "max_batch_size"),
        ({"init_batch_size": 64, "max_batch_size": 128, "local_bsz_bounds": [8, 2]},
         "local_bsz_bounds"),
        ({"init_batch_size": 64, "max_batch_size": 128, "local_bsz_bounds": [8, 16],
          "throughput_params": {"alpha_c": 1}}, "ThroughputParams"),
    ],
)
def test_bad_hints_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        JobHints.from_dict(data)


@pytest.mark.parametrize(
    ("key", "value"),
    [("init_batch_size", ""), ("epoch", "x"), ("accumulation", "yes"),
     ("grad_stats", {"sqr": 1.0}), ("local_bsz_bounds", [1]), ("progress", [1])],
)
def test_malformed_values_name_their_field(key: str, value: object) -> None:
    data = {"init_batch_size": 64, "max_batch_size": 128, "local_bsz_bounds": [8, 16]}
    data[key] = value
    with pytest.raises(ConfigError, match=key):
        JobHints.from_dict(data)
