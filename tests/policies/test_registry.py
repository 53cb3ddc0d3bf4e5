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
    assert make_policy(EQUAL_SHARE, seed=3).name == EQUAL_SHARE
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


def test_a_spec_gives_the_policy_its_options_and_a_canonical_name() -> None:
    policy = make_policy(" sia( p = -0.25 , solver=fast ) ", seed=0)
    assert (policy.p, policy.solver) == (-0.25, "fast")  # type: ignore[attr-defined]
    assert policy.name == "sia(p=-0.25,solver=fast)"
    assert make_policy("fifo").name == "fifo"
    assert make_policy("sia", p=-0.75).name == "sia(p=-0.75)"  # keyword options count too
    assert make_policy("sia(p=-0.75)").name == "sia(p=-0.75)"  # what records show
    assert make_policy(EQUAL_SHARE + "()").name == EQUAL_SHARE  # a plugin: its path


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


@pytest.mark.parametrize("spec", ["pollux(p=abc)", "pollux(p=true)", "pollux(initial_replicas=2.5)",
                                  "pollux(weighted_moves=1)", "sia(p=abc)",
                                  "tiresias(queue_threshold_gpu_s=x)", "pollux(base=mine)",
                                  "pollux(optimizer=anneal)"])
def test_a_value_of_the_wrong_kind_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError):
        make_policy(spec)


def test_old_names_warn_with_the_new_spelling_and_mean_the_same() -> None:
    with pytest.warns(FutureWarning, match="'pollux-hetero' is deprecated: write 'pollux-paper'"):
        old = make_policy("pollux-hetero")
    assert old.name == "pollux-paper"
    assert old.several == make_policy("pollux-paper").several  # type: ignore[attr-defined]
    with pytest.warns(FutureWarning):
        assert canonical_spec("pollux-remaining(p=-2)").startswith("pollux(remaining_weight=0.5,")


def test_the_family_lists_its_defaults_per_cluster_kind() -> None:
    from pollux.cli.policies import policy_listing

    best, paper = policy_listing(["pollux"]), policy_listing(["pollux-paper"])
    assert "  initial_replicas = 1 (one type), 4 (several types)\n" in best
    assert "  p = -1 (one type), -0.5 (several types)\n" in paper
    assert "  initial_replicas = 1\n" in paper and "(sets base=paper)" in paper
    assert "Smith's rule" in best  # each option's documentation
