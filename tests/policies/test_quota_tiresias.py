"""quota-tiresias: Tiresias inside quotas, borrowing idle quota, reclaim by preemption."""

from __future__ import annotations

from pollux.policies.registry import make_policy
from pollux.teams import parse_teams
from tests.policies.builders import gpu_nodes, tuned_job

TEAMS = parse_teams({"teams": {"a": {"quota_gpus": 4}, "b": {"quota_gpus": 4}}})


def test_idle_quota_is_borrowed_and_reclaimed_by_preemption() -> None:
    nodes = gpu_nodes(2, 4)
    policy = make_policy("quota-tiresias", seed=0)
    borrowers = [tuned_job(f"b{i}", 4, team="b", submission_s=float(i)) for i in range(2)]
    first = policy.optimize_teams(borrowers, nodes, {}, TEAMS)
    assert all(len(first.allocations[job.name]) == 4 for job in borrowers)  # b borrows a's
    owner = tuned_job("a0", 4, team="a", submission_s=10.0)
    second = policy.optimize_teams(borrowers + [owner], nodes, first.allocations, TEAMS)
    held_by_b = sum(len(second.allocations[job.name]) for job in borrowers)
    assert len(second.allocations["a0"]) == 4 and held_by_b == 4
    assert second.allocations["b0"] == first.allocations["b0"]  # b's in-quota job kept


def test_plain_tiresias_would_not_reclaim() -> None:
    """The hostile case for the quota: Tiresias alone lets b keep a's GPUs (a waits)."""
    nodes = gpu_nodes(2, 4)
    policy = make_policy("tiresias", seed=0)
    borrowers = [tuned_job(f"b{i}", 4, team="b", submission_s=float(i)) for i in range(2)]
    first = policy.optimize(borrowers, nodes, {})
    owner = tuned_job("a0", 4, team="a", submission_s=10.0)
    assert policy.optimize(borrowers + [owner], nodes, first.allocations).allocations["a0"] == ()
