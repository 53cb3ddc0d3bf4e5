"""One way to build a policy (and every plugin registry read-only)."""

from __future__ import annotations

import numpy as np
import pytest

from pollux.backends.registry import BACKEND_CLASSES
from pollux.errors import ConfigError, UnknownPluginError
from pollux.policies.autoscaling.registry import AUTOSCALER_CLASSES
from pollux.policies.registry import (
    NAMED_POLICIES,
    POLICY_CLASSES,
    canonical_spec,
    make_policy,
)
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
    assert make_policy(name, seed=1).spec == name


def test_a_spec_gives_the_policy_its_options_and_a_canonical_name() -> None:
    policy = make_policy(" sia( p = -0.25 , solver=fast ) ", seed=0)
    assert (policy.p, policy.solver) == (-0.25, "fast")  # type: ignore[attr-defined]
    assert policy.spec == "sia(p=-0.25,solver=fast)"
    assert make_policy("fifo").spec == "fifo"
    assert make_policy("sia", p=-0.75).spec == "sia(p=-0.75)"  # keyword options count too
    assert make_policy("sia(p=-0.75)").name == "sia(p=-0.75)"  # what records show
    assert make_policy(EQUAL_SHARE + "()").name == "equal-share"  # a plugin: its own name


def test_unknown_options_are_refused_naming_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"sia option='q'.*sia takes: p, lambda_n.*policies"):
        make_policy("sia(q=1)")
    with pytest.raises(ConfigError, match="fifo takes: no options"):
        canonical_spec("fifo(x=1)")
    with pytest.raises(UnknownPluginError, match="choose from"):
        canonical_spec("tiresas(x=1)")


def test_every_named_policy_lists_options_with_defaults() -> None:
    from pollux.cli.policies import policy_listing

    text = policy_listing()
    for name in NAMED_POLICIES:
        assert f"\n{name}: " in f"\n{text}"
    assert "  p = -0.5\n" in text and "solver = milp" in text  # sia's, from its signature
