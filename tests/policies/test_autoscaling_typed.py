"""The typed autoscaler's rules, on jobs without a goodput model yet (they ask their cap
on the type of the most 1-GPU speed per dollar): a job waits when its best type is full,
and the nodes asked and kept stay within the types' bounds, ``max_nodes`` and the budget
``max_price_per_hour``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.policies.autoscaling import AutoscalerConfig, NodeTemplate, TypedAutoscaler
from pollux.policies.base import GPU, TYPE_SPEEDS_KEY, JobInfo, facts_by_type

PRICES = {"a": 8.0, "b": 4.0}  # per node: a has 8 GPUs, b 4; both 1 per GPU-hour


def sized(max_a: int = 4, max_b: int = 4, max_nodes: int = 8,
          budget: float = math.inf, window: int = 1) -> TypedAutoscaler:
    templates = {"a": NodeTemplate({GPU: 8.0}, PRICES["a"]),
                 "b": NodeTemplate({GPU: 4.0}, PRICES["b"])}
    config = AutoscalerConfig(template=templates["a"], min_nodes=0, max_nodes=max_nodes,
                              window_rounds=window)
    return TypedAutoscaler(config, templates, {"a": max_a, "b": max_b},
                           max_price_per_hour=budget)


def new_job(name: str, replicas: int, speeds: dict[str, float]) -> JobInfo:
    """A job without a goodput model yet: it asks ``replicas`` by 1-GPU speed per dollar."""
    return JobInfo(name, {GPU: 1.0}, by_type=facts_by_type(replicas), extras={TYPE_SPEEDS_KEY: speeds})


def test_a_job_asks_on_its_best_type_and_waits_when_that_is_full() -> None:
    jobs = [new_job(f"j{i}", 8, {"a": 1.0, "b": 0.95}) for i in range(2)]
    assert sized().propose_by_type(jobs) == {"a": 2, "b": 0}
    # a full: the second job waits rather than take b, nearly as good per dollar
    assert sized(max_a=1).propose_by_type(jobs) == {"a": 1, "b": 0}
    # b is the best of a job that trains faster there per dollar
    assert sized(max_a=1).propose_by_type([*jobs, new_job("c", 4, {"a": 1.0, "b": 1.2})]) \
        == {"a": 1, "b": 1}


def test_the_budget_bounds_the_nodes_asked_and_kept() -> None:
    jobs = [new_job(f"j{i}", 8, {"a": 1.0, "b": 0.5}) for i in range(3)]
    small = new_job("small", 4, {"a": 1.0, "b": 2.0})
    # 12 per hour: one node of a (8) and one of b (4); a second of a would cost 20
    assert sized(budget=12.0).propose_by_type([*jobs, small]) == {"a": 1, "b": 1}
    assert sized(budget=12.0).decide_by_type([*jobs, small], {"a": 0, "b": 0}) \
        .num_nodes_by_type == {"a": 1, "b": 1}
    # a cluster over the budget (the budget lowered) sheds nodes at once
    decision = sized(budget=8.0).decide_by_type(jobs, {"a": 3, "b": 0})
    assert decision.num_nodes_by_type == {"a": 1, "b": 0}
    assert decision.price_per_hour == 8.0
    with pytest.raises(ConfigError, match="max_price_per_hour"):
        sized(budget=0.0)


jobs_st = st.lists(st.tuples(st.integers(1, 24), st.floats(0.1, 10.0), st.floats(0.1, 10.0)),
                   max_size=8)


@settings(max_examples=60, deadline=None)
@given(jobs_st, st.floats(4.0, 80.0), st.integers(1, 10), st.integers(0, 4),
       st.integers(0, 6))
def test_nodes_asked_and_kept_stay_within_every_bound(
        specs: list[tuple[int, float, float]], budget: float, max_nodes: int,
        now_a: int, now_b: int) -> None:
    scaler = sized(max_a=3, max_b=5, max_nodes=max_nodes, budget=budget)
    jobs = [new_job(f"j{i}", k, {"a": sa, "b": sb}) for i, (k, sa, sb) in enumerate(specs)]
    proposed = scaler.propose_by_type(jobs)
    decided = scaler.decide_by_type(jobs, {"a": now_a, "b": now_b}).num_nodes_by_type
    for nodes in (proposed, decided):
        assert 0 <= nodes["a"] <= 3 and 0 <= nodes["b"] <= 5
        assert sum(nodes.values()) <= max_nodes
        assert scaler.price(nodes) <= budget + 1e-9
    # when every job's ask on its best type fits every bound, that is the proposal
    asked = {"a": 0, "b": 0}
    for k, sa, sb in specs:
        asked["a" if sa > sb else "b"] += k
    whole = {"a": math.ceil(asked["a"] / 8), "b": math.ceil(asked["b"] / 4)}
    if whole["a"] <= 3 and whole["b"] <= 5 and sum(whole.values()) <= max_nodes \
            and scaler.price(whole) <= budget:
        assert proposed == whole
