"""One way to build a policy (and every plugin registry read-only)."""

from __future__ import annotations

import numpy as np
import pytest

from pollux.backends.registry import BACKEND_CLASSES
from pollux.errors import ConfigError, UnknownPluginError
from pollux.policies.autoscaling.registry import AUTOSCALER_CLASSES
from pollux.policies.registry import POLICY_CLASSES, make_policy
from tests.service.e2e_helpers import EQUAL_SHARE


def test_policies_by_name_or_path() -> None:
    assert make_policy(EQUAL_SHARE, seed=3).name == "equal-share"
    assert make_policy("fifo", seed=0).name == "fifo"
    with pytest.raises(UnknownPluginError, match="choose from"):
        make_policy("tiresas")
    with pytest.raises(ConfigError, match="cannot load"):
        make_policy("no_such_module:Policy")
    with pytest.raises(ConfigError, match="subclass of pollux.policies.Policy"):
        make_policy("pollux.policies.base:TunedConfig")


def test_the_seed_reaches_the_policy() -> None:
    policy = make_policy("pollux", seed=7)
    drawn = policy.rng.integers(1 << 30)  # type: ignore[attr-defined]
    assert drawn == np.random.default_rng(7).integers(1 << 30)


@pytest.mark.parametrize("registry", [POLICY_CLASSES, BACKEND_CLASSES, AUTOSCALER_CLASSES])
def test_registries_are_read_only(registry) -> None:
    with pytest.raises(TypeError):
        registry["mine"] = "my.module:Mine"


@pytest.mark.parametrize("name", sorted(POLICY_CLASSES))
def test_every_registered_policy_takes_a_seed(name: str) -> None:
    assert make_policy(name, seed=1).name == name
