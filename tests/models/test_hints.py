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
          "throughput_params": {"alpha_c": 1}}, "throughput_params"),
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


VALID = {"init_batch_size": 64, "max_batch_size": 128, "local_bsz_bounds": [8, 16]}


@pytest.mark.parametrize(
    ("key", "value"),
    [("init_batch_size", 2**64), ("init_batch_size", "32"), ("init_batch_size", 32.9),
     ("init_batch_size", True), ("init_batch_size", 32.0), ("max_batch_size", 1e30),
     ("max_batch_size", 2**64), ("epoch", -5), ("local_bsz_bounds", [8, 2**70]),
     ("local_bsz_bounds", "816"), ("batch_size", -1), ("accum_steps", 1.5),
     ("progress", float("inf")), ("progress", 10**400), ("max_profiled_replicas", 2**40),
     ("grad_stats", {"sqr": 1.0, "var": True}), ("grad_stats", {"sqr": 1, "var": 1, "x": 1}),
     ("throughput_params", {"alpha_c": 1e300, "beta_c": 0, "alpha_n": 0, "beta_n": 0,
                            "alpha_r": 0, "beta_r": 0, "gamma": 1}),
     ("surprise", 1)],
)
def test_hints_out_of_bounds_or_of_the_wrong_type_are_refused(key: str, value: object) -> None:
    """Defect 1: an unbounded int() let 2**64 (and "32", 32.9, true, 1e30, -5, unknown
    keys) through, and every later scheduling round failed on the stored hints."""
    with pytest.raises(ConfigError, match=key):
        JobHints.from_dict({**VALID, key: value})


def test_the_agents_own_hints_roundtrip_strictly() -> None:
    hints = JobHints(64, 4096, (16, 256), True, TRUE_PARAMS, GradientStats(1.0, 20.0), 4,
                     batch_size=256, local_bsz=64, accum_steps=0, epoch=3, progress=12.5)
    import json
    assert JobHints.from_dict(json.loads(json.dumps(hints.to_dict()))) == hints
