from __future__ import annotations

from hypothesis import given, settings

from pollux.policies.base import Allocation, JobInfo, NodeInfo
from pollux.policies.fifo import FifoPolicy
from tests.policies.builders import capacity_violations, gpu_nodes, tuned_job, tuned_snapshots


@settings(max_examples=60, deadline=None)
@given(tuned_snapshots())
def test_capacity_tuned_gpus_no_preemption(
        snapshot: tuple[list[JobInfo], list[NodeInfo], dict[str, Allocation]]) -> None:
    jobs, nodes, previous = snapshot
    decision = FifoPolicy().optimize(jobs, nodes, previous)
    assert capacity_violations(nodes, decision.allocations) == []
    for job in jobs:
        assert job.tuned is not None
        assert len(decision.allocations[job.name]) in (0, job.tuned.num_replicas)
        if job.name in previous:
            assert decision.allocations[job.name] == previous[job.name]


def test_first_come_first_served_with_head_of_line_blocking() -> None:
    jobs = [tuned_job("late", 1, submission_s=30.0), tuned_job("early", 3, submission_s=10.0),
            tuned_job("big", 4, submission_s=20.0)]
    decision = FifoPolicy().optimize(jobs, gpu_nodes(1, 4), {})
    # "early" starts; "big" does not fit and blocks "late" even though "late" would fit.
    assert decision.allocations == {"early": ("node-00",) * 3, "big": (), "late": ()}
