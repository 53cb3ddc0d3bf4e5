from __future__ import annotations

from hypothesis import given, settings

from pollux.policies.base import Allocation, JobInfo, NodeInfo
from pollux.policies.tiresias import TiresiasPolicy, pack_onto_most_free
from tests.policies.builders import capacity_violations, gpu_nodes, tuned_job, tuned_snapshots

HOURS = 3600.0


@settings(max_examples=60, deadline=None)
@given(tuned_snapshots())
def test_capacity_and_tuned_gpus(snapshot: tuple[list[JobInfo], list[NodeInfo],
                                                 dict[str, Allocation]]) -> None:
    jobs, nodes, previous = snapshot
    decision = TiresiasPolicy().optimize(jobs, nodes, previous)
    assert set(decision.allocations) == {job.name for job in jobs}
    assert capacity_violations(nodes, decision.allocations) == []
    for job in jobs:
        alloc = decision.allocations[job.name]
        assert job.tuned is not None
        assert len(alloc) in (0, job.tuned.num_replicas)
        if alloc and job.name in previous:  # running jobs stay where they are
            assert alloc == previous[job.name]


def test_least_attained_service_queue_and_demotion() -> None:
    policy = TiresiasPolicy()
    nodes = gpu_nodes(1, 4)
    old = tuned_job("old", 4)
    policy.optimize([old], nodes, {})
    new = tuned_job("new", 4)
    # Same queue: first come first served, the old job keeps the GPUs.
    decision = policy.optimize([old, new], nodes, {"old": ("node-00",) * 4})
    assert decision.allocations == {"old": ("node-00",) * 4, "new": ()}
    # After 16 GPU-hours the old job drops to the low queue and is preempted.
    old = tuned_job("old", 4, service_gpu_s=16 * HOURS)
    decision = policy.optimize([old, new], nodes, {"old": ("node-00",) * 4})
    assert decision.allocations == {"old": (), "new": ("node-00",) * 4}


def test_jobs_that_do_not_fit_are_skipped_not_blocking() -> None:
    jobs = [tuned_job("big", 8), tuned_job("small", 2)]
    decision = TiresiasPolicy().optimize(jobs, gpu_nodes(1, 4), {})
    assert decision.allocations == {"big": (), "small": ("node-00",) * 2}


def test_packing_takes_the_nodes_with_most_free_gpus() -> None:
    free = {"a": 1, "b": 3, "c": 3}
    assert pack_onto_most_free(free, 5, ["a", "b", "c"]) == ("b",) * 3 + ("c",) * 2
    assert free == {"a": 1, "b": 0, "c": 1}
    assert pack_onto_most_free(free, 5, ["a", "b", "c"]) == ()


def test_non_preemptible_running_job_is_never_preempted() -> None:
    nodes = gpu_nodes(1, 4)
    policy = TiresiasPolicy()
    stuck = tuned_job("stuck", 4, service_gpu_s=100 * HOURS, preemptible=False)
    policy.optimize([stuck], nodes, {})
    decision = policy.optimize([stuck, tuned_job("fresh", 4)], nodes,
                               {"stuck": ("node-00",) * 4})
    assert decision.allocations["stuck"] == ("node-00",) * 4
    assert decision.allocations["fresh"] == ()
