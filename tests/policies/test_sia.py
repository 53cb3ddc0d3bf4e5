"""Sia's policy: configurations, restart factor, the MILP's constraints and choices."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.cluster_spec import allocation_gpu_type, parse_cluster_spec
from pollux.errors import ConfigError
from pollux.models import GradientStats, ThroughputParams
from pollux.models.typed import TypedGoodput, TypeProfile
from pollux.policies.base import JobInfo
from pollux.policies.sia import Config, SiaPolicy, restart_factor, type_configs
from tests.policies.builders import by_type

NODES = parse_cluster_spec("aws:6x4,dgx-ext:2x8,rtx:3x8").node_infos()
BY_NAME = {node.name: node for node in NODES}
PARAMS = ThroughputParams(alpha_c=0.05, beta_c=0.002, alpha_n=0.15, beta_n=0.01,
                          alpha_r=0.04, beta_r=0.004, gamma=1.8)
SPEEDS = {"aws": 1.0, "dgx-ext": 6.9, "rtx": 2.27}


def job(name: str, speeds: dict[str, float] | None = SPEEDS, cap: int = 64, age_s: float = 0.0,
        restarts: int = 0, restart_left_s: float = 0.0, modelled: bool = True,
        noise: float = 20.0) -> JobInfo:
    model = None
    if modelled:
        model = TypedGoodput({"aws": TypeProfile(PARAMS, 4)}, GradientStats(1.0, noise), 64,
                             4096, (16, 256), True, speeds)
    return JobInfo(name=name, resources=MappingProxyType({"gpu": 1.0}),
                   by_type=by_type(cap, caps={t: cap for t in SPEEDS}, model=model),
                   age_s=age_s, num_restarts=restarts,
                   restart_left_s=restart_left_s, extras={"application": "cifar10"})


def test_configurations_per_type() -> None:
    aws = [n for n in NODES if n.gpu_type == "aws"]
    rtx = [n for n in NODES if n.gpu_type == "rtx"]
    assert [c.num_gpus for c in type_configs("aws", aws)] == [1, 2, 4, 8, 12, 16, 20, 24]
    assert [c.num_gpus for c in type_configs("rtx", rtx)] == [1, 2, 4, 8, 16, 24]
    assert type_configs("rtx", rtx)[-1] == Config("rtx", 3, 24)


def test_restart_factor() -> None:
    young = job("a", age_s=10.0, restarts=3)
    assert restart_factor(young, 30.0) == 1.0
    old = job("a", age_s=600.0, restarts=2)
    assert restart_factor(old, 30.0) == pytest.approx((600 - 60) / 630)
    assert restart_factor(job("a", age_s=100.0, restarts=9), 30.0) == 0.0


def test_a_job_without_a_model_gets_one_gpu() -> None:
    decision = SiaPolicy().optimize([job("new", modelled=False)], NODES, {})
    assert len(decision.allocations["new"]) == 1


def test_the_job_that_gains_most_gets_the_fast_gpus() -> None:
    fast = job("fast")  # 6.9x on the A100s
    slow = job("slow", speeds={"aws": 1.0, "dgx-ext": 1.05, "rtx": 1.0})
    jobs = [fast, slow] + [job(f"filler-{i}", speeds={"aws": 1.0, "dgx-ext": 1.0, "rtx": 1.0})
                           for i in range(40)]
    allocations = SiaPolicy().optimize(jobs, NODES, {}).allocations
    assert allocation_gpu_type(allocations["fast"], BY_NAME) == "dgx-ext"


def test_a_restoring_job_keeps_its_configuration() -> None:
    previous = {"a": ("rtx-0",) * 4}
    restoring = job("a", age_s=600.0, restart_left_s=20.0)
    others = [job(f"b{i}", age_s=600.0) for i in range(30)]
    allocations = SiaPolicy().optimize([restoring, *others], NODES, previous).allocations
    assert allocations["a"] == previous["a"]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.booleans(), st.floats(0.0, 4000.0)),
                min_size=1, max_size=30), st.integers(0, 2**16))
def test_decisions_fit_each_type_and_never_span_types(specs: list[tuple[int, bool, float]],
                                                      seed: int) -> None:
    jobs = [job(f"j{i}", cap=cap, modelled=modelled, age_s=age)
            for i, (cap, modelled, age) in enumerate(specs)]
    policy = SiaPolicy()
    first = policy.optimize(jobs, NODES, {}).allocations
    second = policy.optimize(jobs, NODES, first).allocations
    for allocations in (first, second):
        used: dict[str, int] = {}
        for j, alloc in zip(jobs, [allocations[j.name] for j in jobs]):
            allocation_gpu_type(alloc, BY_NAME)  # raises when it spans types
            cap = j.max_replicas if j.typed_goodput is not None else 1
            assert len(alloc) <= max(cap, 1)
            for node in alloc:
                used[node] = used.get(node, 0) + 1
        assert all(count <= BY_NAME[node].num_gpus for node, count in used.items())


def test_a_restart_factor_of_zero_costs_the_cap_without_warnings() -> None:
    from pollux.policies.pollux import PolluxPolicy

    churned = job("a", age_s=100.0, restarts=9)  # factor 0: every other entry is 0
    others = [job(f"b{i}", age_s=600.0) for i in range(3)]
    for policy in (SiaPolicy(), PolluxPolicy(base="paper").typed):
        allocations = policy.optimize([churned, *others], NODES,
                                      {"a": ("aws-0",)}).allocations
        assert allocations["a"] in ((), ("aws-0",))


def test_sia_solves_exactly_and_pollux_fast_and_an_unknown_solver_is_refused() -> None:
    from pollux.policies.pollux import PolluxPolicy

    assert SiaPolicy().solver == "milp"
    assert PolluxPolicy().typed.solver == "fast"
    with pytest.raises(ConfigError, match="choose from: milp, fast"):
        SiaPolicy(solver="cplex")


def test_a_job_without_an_application_is_charged_its_own_restart_delay() -> None:
    """The service's jobs name no application: Sia's table (others 30 s) does not apply,
    the job's own restart delay does; simulated jobs keep the table."""
    from dataclasses import replace

    policy = SiaPolicy()
    configs = [Config("aws", 1, 1), Config("aws", 1, 2)]
    old = job("a", age_s=1000.0, restarts=2)  # cifar10: 30 s in Sia's table
    row = np.array([2.0, 3.0])
    moved = policy._discount_moves(old, configs, row, 0)
    assert moved[1] == pytest.approx(3.0 * restart_factor(old, 30.0)) and moved[0] == 2.0
    own = replace(old, extras={}, restart_delay_s=300.0)
    assert policy._discount_moves(own, configs, row, 0)[1] == pytest.approx(
        3.0 * restart_factor(old, 300.0))
    tabled = replace(old, restart_delay_s=300.0)  # an application: the table wins
    assert policy._discount_moves(tabled, configs, row, 0)[1] == moved[1]
