"""A decision is checked against its snapshot: what cannot be applied is returned as
infeasible with the reason (never raised, never silently dropped)."""

from __future__ import annotations

from pollux.policies.base import JobInfo, NodeInfo, PolicyDecision, facts_by_type
from pollux.policies.decision import check_decision
from pollux.policies.snapshot import Snapshot

NODES = (NodeInfo("a", {"gpu": 4.0}), NodeInfo("b", {"gpu": 4.0}),
         NodeInfo("t", {"gpu": 4.0}, gpu_type="t4"))


def snapshot(*jobs: JobInfo) -> Snapshot:
    return Snapshot(0.0, tuple(jobs), NODES)


def test_feasible_allocations_pass_unchanged() -> None:
    jobs = (JobInfo("x", {"gpu": 1.0}, by_type=facts_by_type(4)), JobInfo("y", {"gpu": 2.0}))
    decision = PolicyDecision({"x": ("a", "a", "b"), "y": ("a",)})
    checked = check_decision(decision, snapshot(*jobs))
    assert checked.allocations == {"x": ("a", "a", "b"), "y": ("a",)}
    assert checked.infeasible == {}


def test_what_cannot_be_applied_is_returned_with_the_reason() -> None:
    jobs = (JobInfo("first", {"gpu": 3.0}), JobInfo("over", {"gpu": 2.0}),
            JobInfo("ghost", {"gpu": 1.0}), JobInfo("many", {"gpu": 1.0}, by_type=facts_by_type(2)),
            JobInfo("mixed", {"gpu": 1.0}), JobInfo("few", {"gpu": 1.0}, min_replicas=2))
    decision = PolicyDecision({
        "first": ("a",), "over": ("a",), "ghost": ("z",), "many": ("b", "b", "b"),
        "mixed": ("b", "t"), "few": ("b",), "gone": ("b",)},
        infeasible={"policy-said": "no room"})
    checked = check_decision(decision, snapshot(*jobs))
    assert checked.allocations == {"first": ("a",), "over": (), "ghost": (), "many": (),
                                   "mixed": (), "few": ()}
    reasons = dict(checked.infeasible)
    assert reasons.pop("policy-said") == "no room"  # the policy's own entries are kept
    assert reasons == {
        "over": "1 replicas on 'a' need 2 gpu, 1 left",
        "ghost": "placed on unknown node 'z'",
        "many": "3 replicas, outside [0, 2]",
        "mixed": "allocation spans GPU types 'default' and 't4' (node 't'); a job's "
                 "replicas must all run on one type",
        "few": "1 replicas, outside [2, 64]"}
