"""tiresias, optimus and fifo on typed clusters: one GPU type per job, capacity per type."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings

from pollux.cluster_spec import allocation_gpu_type
from pollux.policies.base import GPU, Allocation, JobInfo, NodeInfo, Policy
from pollux.policies.fifo import FifoPolicy
from pollux.policies.optimus import OptimusPolicy
from pollux.policies.tiresias import TiresiasPolicy
from tests.policies.builders import (
    amdahl_oracle,
    capacity_violations,
    tuned_job,
    typed_tuned_snapshots,
)

BASELINES: dict[str, Callable[[], Policy]] = {
    "tiresias": TiresiasPolicy, "optimus": OptimusPolicy, "fifo": FifoPolicy}
Snapshot = tuple[list[JobInfo], list[NodeInfo], dict[str, Allocation]]


def typed_nodes() -> list[NodeInfo]:
    """Two 4-GPU t4 nodes and one 8-GPU a100 node."""
    return [NodeInfo("t4-0", {GPU: 4.0}, gpu_type="t4"),
            NodeInfo("t4-1", {GPU: 4.0}, gpu_type="t4"),
            NodeInfo("a100-0", {GPU: 8.0}, gpu_type="a100")]


@pytest.mark.parametrize("name", sorted(BASELINES))
@settings(max_examples=80, deadline=None)
@given(snapshot=typed_tuned_snapshots())
def test_allocations_never_span_types(name: str, snapshot: Snapshot) -> None:
    jobs, nodes, previous = snapshot
    policy = BASELINES[name]()
    by_name = {node.name: node for node in nodes}
    for _ in range(2):  # a second round from the first one's decision
        decision = policy.optimize(jobs, nodes, previous)
        assert set(decision.allocations) == {job.name for job in jobs}
        assert capacity_violations(nodes, decision.allocations) == []
        for job in jobs:
            alloc = decision.allocations[job.name]
            gpu_type = allocation_gpu_type(alloc, by_name)  # raises when it spans types
            assert job.tuned is not None
            if name == "optimus":
                assert gpu_type is None or len(alloc) <= job.on(
                    gpu_type).max_replicas
            else:
                assert len(alloc) in (0, job.tuned.num_replicas)
        previous = {n: a for n, a in decision.allocations.items() if a}


def test_tiresias_and_fifo_fill_the_type_with_most_free_gpus() -> None:
    jobs = [tuned_job("a", 6), tuned_job("b", 4, submission_s=1.0),
            tuned_job("c", 4, submission_s=2.0), tuned_job("d", 4, submission_s=3.0)]
    for policy in (TiresiasPolicy(), FifoPolicy()):
        got = policy.optimize(jobs, typed_nodes(), {}).allocations
        # a: the t4s (8 free, as on the a100: tie, the first type); b and c: the a100
        # (8 then 4 free against 2 on the t4s); d fits nowhere.
        assert got["a"] == ("t4-0",) * 4 + ("t4-1",) * 2
        assert got["b"] == got["c"] == ("a100-0",) * 4
        assert got["d"] == ()


def test_running_jobs_keep_their_type_and_nodes() -> None:
    jobs = [tuned_job("a", 2), tuned_job("b", 2)]
    previous = {"a": ("a100-0", "a100-0"), "b": ("t4-1", "t4-1")}
    for policy in (TiresiasPolicy(), FifoPolicy()):
        assert policy.optimize(jobs, typed_nodes(), previous).allocations == previous


def test_optimus_puts_a_job_on_its_fastest_type_and_grows_it_there() -> None:
    fast = {"a100": amdahl_oracle(0.0, 1000.0), "t4": amdahl_oracle(0.0, 7000.0)}
    jobs = [tuned_job("a", 1, oracles=fast)]
    (alloc,) = OptimusPolicy().optimize(jobs, typed_nodes(), {}).allocations.values()
    assert alloc == ("a100-0",) * 8  # the a100s only, never a t4 on top
    # Without per-type oracles it goes to the type with the most GPUs (ties: first).
    plain = [tuned_job("a", 1, remaining_time_fn=amdahl_oracle(0.0, 1000.0))]
    (alloc,) = OptimusPolicy().optimize(plain, typed_nodes(), {}).allocations.values()
    assert set(alloc) == {"t4-0", "t4-1"} and len(alloc) == 8
    # A job already on the t4s stays there while it has a GPU.
    (alloc,) = OptimusPolicy().optimize(jobs, typed_nodes(),
                                        {"a": ("t4-0",)}).allocations.values()
    assert {node[:2] for node in alloc} == {"t4"}
