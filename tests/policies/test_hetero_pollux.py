"""The project's Pollux on typed clusters (``pollux`` hands typed snapshots to its typed optimizer)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pollux.cluster_spec import allocation_gpu_type, parse_cluster_spec
from pollux.errors import ConfigError
from pollux.policies.base import TYPE_SPEEDS_KEY, typed_facts
from pollux.policies.pollux import PolluxPolicy
from pollux.policies.pollux.typed import TypedPollux
from tests.policies.test_sia import BY_NAME, NODES, job


def typed(**options: object) -> TypedPollux:
    """The typed optimizer of ``pollux-paper`` with ``options``."""
    return PolluxPolicy(base="paper", **options).typed


def test_pollux_hands_typed_snapshots_to_the_typed_optimizer() -> None:
    jobs = [job(f"j{i}", age_s=600.0) for i in range(20)]
    decision = PolluxPolicy().optimize(jobs, NODES, {})
    assert "num_configs" in decision.info  # the typed program answered
    used: dict[str, int] = {}
    for alloc in decision.allocations.values():
        allocation_gpu_type(alloc, BY_NAME)
        for node in alloc:
            used[node] = used.get(node, 0) + 1
    assert all(count <= BY_NAME[node].num_gpus for node, count in used.items())
    assert sum(used.values()) > 32


def test_sub_node_jobs_stay_on_one_node() -> None:
    nodes = parse_cluster_spec("aws:3x4,rtx:1x8").node_infos()
    policy = typed()
    free = {n.name: n.num_gpus for n in nodes if n.gpu_type == "aws"}
    placed = policy._fill([(2, 0), (3, 1), (2, 2), (1, 3), (4, 4)], free,
                          sorted(free), 4)
    for alloc in placed.values():
        assert len(set(alloc)) == 1
    assert sum(len(a) for a in placed.values()) == 12


def test_shorter_remaining_work_weighs_more() -> None:
    jobs = [replace(job("short"), remaining_s=100.0), replace(job("long"), remaining_s=1e5),
            replace(job("mid"), remaining_s=1000.0), job("unknown")]
    weights = typed(remaining_exponent=0.5)._job_weights(jobs)
    assert weights[0] > weights[2] > weights[1]
    assert weights[3] == 1.0
    assert 0.25 <= weights.min() and weights.max() <= 4.0
    assert list(typed()._job_weights(jobs)) == [1.0] * 4  # off by default
    boosted = typed(remaining_exponent=0.5, min_weight=1.0)._job_weights(jobs)
    assert boosted[0] == weights[0] and boosted[1] == 1.0  # long jobs keep weight 1


def _moved(policy: TypedPollux, remaining_s: float) -> bool:
    """Does a young job alone on 1 aws GPU move to a faster configuration?"""
    lone = replace(job("a", age_s=30.0), remaining_s=remaining_s, restart_delay_s=250.0)
    before = {"a": ("aws-0",)}
    return policy.optimize([lone], NODES, before).allocations["a"] != ("aws-0",)


def test_a_job_near_its_end_is_not_moved_for_a_restart_it_cannot_repay() -> None:
    # Sia's factor is 1 for a job younger than its restart delay: it moves either way
    assert _moved(typed(move_discount="age"), 60.0)
    assert _moved(typed(move_discount="age"), 1e5)
    for policy in (typed(move_discount="remaining"),
                   typed(move_discount="both", remaining_exponent=0.5)):
        assert not _moved(policy, 60.0)
        assert _moved(policy, 1e5)


def test_an_unknown_move_discount_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="move_discount"):
        typed(move_discount="never")


def test_weighted_moves_charge_a_light_job_its_restart_as_a_full_weight_job() -> None:
    long = replace(job("long", age_s=2000.0, restarts=3), remaining_s=1e6,
                   restart_delay_s=250.0)
    short = [replace(job(f"s{i}", age_s=2000.0), remaining_s=100.0) for i in range(2)]
    before = {"long": ("aws-0",)}

    def moved(policy: TypedPollux) -> bool:
        return policy.optimize([long, *short], NODES, before).allocations["long"] != (
            "aws-0",)

    assert moved(typed(remaining_exponent=0.5))  # weight 1/4, delay 250 s
    assert not moved(typed(remaining_exponent=0.5, weighted_moves=True))
    policy = typed(remaining_exponent=0.5, weighted_moves=True)
    policy.optimize([long, *short], NODES, before)
    assert policy._penalty_s(long) == 250.0  # the round's weights do not outlive it


def test_the_exploration_factor_is_checked_and_kept_for_the_driver() -> None:
    assert typed().exploration_factor is None  # the reference's growth cap
    assert typed(exploration_factor=4).exploration_factor == 4.0
    for bad in (0.5, -2.0, float("nan")):
        with pytest.raises(ConfigError, match="exploration_factor"):
            typed(exploration_factor=bad)


def test_fast_growth_only_for_jobs_a_restart_matters_to() -> None:
    # profiled 4 replicas on aws, never ran elsewhere; the driver's 4x caps
    caps = {"aws": 16, "dgx-ext": 1, "rtx": 1}
    short, long = job("short"), job("long")
    short = replace(short, remaining_s=2000.0, restart_delay_s=50.0,
                    by_type={**short.by_type, **typed_facts(caps, short.typed_goodput)})
    long = replace(long, remaining_s=1e7, restart_delay_s=50.0,
                   by_type={**long.by_type, **typed_facts(caps, long.typed_goodput)})
    before = {"short": ("aws-0",) * 4, "long": ("aws-1",) * 4}
    policy = typed(exploration_factor=4, fast_growth_share=0.02)
    kept_short, slowed_long = policy._slow_growth_for_long_jobs([short, long], NODES, before)
    assert kept_short.own_caps() == caps  # its restart is >2% of what is left
    assert slowed_long.own_caps() == {"aws": 8, "dgx-ext": 1, "rtx": 1}  # 2x
    new = replace(short, name="new")  # no allocation yet: the reference's cap
    (slowed_new,) = policy._slow_growth_for_long_jobs([new], NODES, {})
    assert slowed_new.own_caps()["aws"] == 8
    decision = policy.optimize([long], NODES, {"long": ("aws-1",) * 4})
    assert len(decision.allocations["long"]) <= 8
    with pytest.raises(ConfigError, match="fast_growth_share"):
        typed(fast_growth_share=-1.0)


def test_tail_jobs_keep_at_least_the_tail_weight() -> None:
    jobs = [replace(job(f"short{i}", age_s=100.0), remaining_s=100.0) for i in range(8)]
    jobs += [replace(job("long", age_s=100.0), remaining_s=1e6),
             replace(job("old", age_s=1e6), remaining_s=300.0)]
    before = {j.name: (f"aws-{i % 6}",) for i, j in enumerate(jobs)}
    policy = typed(remaining_exponent=0.5, tail_share=0.2)
    # latest predicted completions (age + remaining at the current allocation)
    tail = policy._tail_jobs(jobs, NODES, before)
    assert tail == {"long", "old"}
    plain = policy._job_weights(jobs)
    assert plain[-2] == 0.25  # Smith's weight of the long job
    policy._tail = tail
    weights = policy._job_weights(jobs)
    assert weights[-2] == 1.0 and weights[-1] == 1.0 > plain[-1]  # both raised to 1
    assert list(weights[:8]) == list(plain[:8])
    assert policy._tail_jobs(jobs, NODES, {}) == frozenset()  # nothing allocated: no tail
    for name, bad in (("tail_share", 1.0), ("tail_weight", 0.0), ("gpu_price", -1.0),
                      ("restart_scale", 0.0)):
        with pytest.raises(ConfigError, match=name):
            typed(**{name: bad})


def test_a_gpu_price_trims_allocations_that_buy_little() -> None:
    jobs = [replace(job(f"j{i}", age_s=600.0), remaining_s=1e4) for i in range(3)]
    free = sum(len(a) for a in typed().optimize(jobs, NODES, {})
               .allocations.values())
    priced = sum(len(a) for a in typed(gpu_price=0.02).optimize(jobs, NODES, {})
                 .allocations.values())
    assert 3 <= priced < free


def test_the_restart_scale_multiplies_the_restart_delay_counted() -> None:
    lone = replace(job("a"), restart_delay_s=50.0)
    assert typed()._penalty_s(lone) == 50.0
    assert typed(restart_scale=3.0)._penalty_s(lone) == 150.0


def test_a_new_job_starts_big_on_its_fastest_type_when_allowed() -> None:
    speeds = {"aws": 1.0, "dgx-ext": 6.9, "rtx": 2.27}
    new = replace(job("new", modelled=False, cap=4),
                  extras={"application": "cifar10", TYPE_SPEEDS_KEY: speeds})
    start = typed(initial_replicas=4).optimize([new], NODES, {}).allocations
    assert len(start["new"]) == 4
    assert allocation_gpu_type(start["new"], BY_NAME) == "dgx-ext"
    # the reference: a job without a model gets 1 GPU, with or without its speeds
    assert len(typed().optimize([new], NODES, {}).allocations["new"]) == 1
    with pytest.raises(ConfigError, match="initial_replicas"):
        typed(initial_replicas=0)
