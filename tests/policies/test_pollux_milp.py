"""Sia's program on a one-type cluster, fed by the jobs' own speedups."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pollux.policies.pollux import PolluxPolicy
from pollux.policies.pollux.typed import OneTypeProgram
from pollux.policies.sia import INVALID_GOODPUT, Config
from tests.policies.pollux_builders import job, nodes


def OneTypeMilpPolicy(**options: object) -> OneTypeProgram:
    """``pollux-paper(optimizer=typed,p=-0.5)``'s one-type program."""
    program = PolluxPolicy(base="paper", optimizer="typed", p=-0.5, **options).optimizer
    assert isinstance(program, OneTypeProgram)
    return program


def test_rows_are_speedups_and_respect_the_cap() -> None:
    policy = OneTypeMilpPolicy()
    configs = [Config("gpu", 1, k) for k in (1, 2, 3)] + [Config("gpu", 2, 8)]
    capped = job("a", seed=1, max_replicas=3)
    row = policy.goodput_row(capped, configs)
    expected = capped.on().speedup_fn(np.array([1, 1, 1]), np.array([1, 2, 3]))
    assert row[:3] == pytest.approx(np.asarray(expected) / float(np.min(expected)))
    assert row[3] == INVALID_GOODPUT
    # no model: one GPU only
    assert list(policy.goodput_row(job("b", seed=None), configs)) == [1.0] + [
        INVALID_GOODPUT] * 3


def test_allocations_fit_and_short_jobs_get_more_with_weights() -> None:
    jobs = [job("short", seed=1, remaining_s=100.0), job("long", seed=1, remaining_s=1e5),
            job("mid", seed=1, remaining_s=3e3)]
    cluster = nodes(2, 4)
    plain = OneTypeMilpPolicy().optimize(jobs, cluster, {}).allocations
    weighted = OneTypeMilpPolicy(remaining_exponent=1.0).optimize(jobs, cluster, {}).allocations
    for allocations in (plain, weighted):
        used = Counter(n for alloc in allocations.values() for n in alloc)
        assert all(count <= 4 for count in used.values())
        assert set(allocations) == {"short", "long", "mid"}
    # identical speedups: without weights the long and the short job are interchangeable
    assert len(weighted["short"]) >= len(weighted["long"])
    assert len(weighted["short"]) > len(plain["short"]) or len(weighted["long"]) < len(
        plain["long"])


def test_growth_rule_is_an_option() -> None:
    from pollux.errors import ConfigError

    assert OneTypeMilpPolicy().exploration_factor is None
    assert OneTypeMilpPolicy(exploration_factor=4).exploration_factor == 4.0
    with pytest.raises(ConfigError, match="exploration_factor"):
        OneTypeMilpPolicy(exploration_factor=0.5)
