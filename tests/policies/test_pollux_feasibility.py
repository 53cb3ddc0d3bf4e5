"""Every allocation either Pollux optimizer returns is feasible, on random snapshots."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from pollux.policies.base import Allocation, JobInfo, NodeInfo
from pollux.policies.pollux import PolluxPolicy, build_problem, repair
from pollux.policies.pollux import violations as state_violations
from tests.policies.pollux_builders import snapshots, violations

Snapshot = tuple[list[JobInfo], list[NodeInfo], dict[str, Allocation]]
SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _policy(kind: str, interference: bool) -> PolluxPolicy:
    if kind == "ga":
        return PolluxPolicy(seed=1, optimizer="ga", population_size=16, num_generations=6,
                            interference_avoidance=interference)
    return PolluxPolicy(interference_avoidance=interference)


@pytest.mark.parametrize("interference", [True, False])
@pytest.mark.parametrize("kind", ["marginal", "ga"])
@SETTINGS
@given(snapshot=snapshots())
def test_allocations_are_feasible(kind: str, interference: bool, snapshot: Snapshot) -> None:
    jobs, cluster, previous = snapshot
    policy = _policy(kind, interference)
    decision = policy.optimize(jobs, cluster, previous)
    assert violations(jobs, cluster, previous, decision.allocations, interference) == []
    # A second round from the first decision stays feasible too (GA population carried).
    again = policy.optimize(jobs, cluster, decision.allocations)
    assert violations(jobs, cluster, decision.allocations, again.allocations,
                      interference) == []
    assert np.isfinite(decision.info["objective"])


@SETTINGS
@given(snapshot=snapshots())
def test_repair_maps_any_state_onto_a_feasible_one(snapshot: Snapshot) -> None:
    jobs, cluster, previous = snapshot
    problem = build_problem(jobs, cluster, previous)
    rng = np.random.default_rng(0)
    states = rng.integers(0, 6, size=(8, *problem.shape))
    repaired = repair(problem, states, rng, interference_avoidance=True)
    for state in repaired:
        assert state_violations(problem, state, interference_avoidance=True) == []
    # Feasible states are fixed points of repair.
    base = repair(problem, problem.base_state[None], rng)[0]
    assert np.array_equal(repair(problem, base[None], rng)[0], base)
    decided = PolluxPolicy().optimize(jobs, cluster, previous).allocations
    index = {node.name: n for n, node in enumerate(problem.nodes)}
    state = np.zeros(problem.shape, dtype=np.int64)
    for j, info in enumerate(problem.jobs):
        for name in decided[info.name]:
            state[j, index[name]] += 1
    for small_first in (False, True):
        assert np.array_equal(repair(problem, state[None], rng, True, small_first)[0], state)


def test_repair_keeps_single_node_jobs_beside_distributed_ones() -> None:
    # Two distributed jobs meet on node 0; the one-node job after them is not in conflict.
    cluster = [NodeInfo(f"n{i}", {"gpu": 4}) for i in range(3)]
    jobs = [JobInfo(name=f"j{i}", resources={"gpu": 1}, submission_time_s=float(i))
            for i in range(3)]
    problem = build_problem(jobs, cluster, {})
    state = np.array([[[1, 1, 0], [1, 0, 1], [1, 0, 0]]])
    repaired = repair(problem, state, np.random.default_rng(0))[0]
    assert repaired.tolist() == [[1, 1, 0], [0, 0, 1], [1, 0, 0]]
