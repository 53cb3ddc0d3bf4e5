"""Fair share between teams in the Pollux policy: guarantees met, lending reclaimed in one
round, a flood of jobs buys no team more than its share."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from pollux.policies.base import GPU, JobInfo, NodeInfo, facts_by_type
from pollux.policies.registry import make_policy
from pollux.policies.team_shares import entitlements, team_shares
from pollux.teams import Teams, parse_teams
from tests.policies.builders import gpu_nodes


def _sqrt_speedup(num_nodes: object, num_replicas: object) -> np.ndarray:
    """sqrt(replicas); refuses more nodes than replicas, as the goodput model does."""
    nodes, replicas = np.asarray(num_nodes), np.asarray(num_replicas, dtype=np.float64)
    if np.any(nodes > replicas):
        raise ValueError("invalid num_nodes: need 1 <= num_nodes <= num_replicas")
    return np.sqrt(replicas)


def _job(name: str, team: str, *, age_s: float = 3600.0, priority: int = 0,
         max_replicas: int = 16, submitted_s: float = 0.0) -> JobInfo:
    return JobInfo(name=name, resources={GPU: 1.0},
                   by_type=facts_by_type(max_replicas, _sqrt_speedup), team=team,
                   priority=priority, age_s=age_s, submission_time_s=submitted_s)


def _held(decision_allocations: dict[str, tuple[str, ...]], jobs: list[JobInfo]
          ) -> Counter[str]:
    held: Counter[str] = Counter()
    for job in jobs:
        held[job.team] += len(decision_allocations.get(job.name, ()))
    return held


TEAMS = parse_teams({"teams": {"a": {"quota_gpus": 8}, "b": {"quota_gpus": 8}}})


def test_entitlements_fill_guarantees_then_share_by_weight() -> None:
    guarantee = {"a": 8.0, "b": 2.0, "c": 0.0}
    demand = {"a": 30.0, "b": 2.0, "c": 30.0}
    out = entitlements(guarantee, demand, {"a": 1.0, "b": 1.0, "c": 3.0}, 32.0)
    assert out["b"] == 2.0  # capped at its demand
    assert out["a"] == pytest.approx(8 + 22 / 4) and out["c"] == pytest.approx(22 * 3 / 4)
    assert sum(out.values()) == pytest.approx(32.0)


def test_a_flooding_team_gets_no_more_than_its_share() -> None:
    """Team b submits 8 jobs, team a one: team-blind Pollux gives b most of the cluster;
    with teams a keeps its quota of 8 GPUs (of 16)."""
    nodes = gpu_nodes(4, 4)
    jobs = [_job("a0", "a")] + [_job(f"b{i}", "b") for i in range(8)]
    blind = make_policy("pollux", seed=0).optimize(jobs, nodes, {})
    assert _held(blind.allocations, jobs)["a"] < 8
    fair = make_policy("pollux", seed=0).optimize_teams(jobs, nodes, {}, TEAMS)
    held = _held(fair.allocations, jobs)
    assert held["a"] >= 8 and held["b"] >= 8


def test_idle_quota_is_lent_and_reclaimed_within_one_round() -> None:
    nodes = gpu_nodes(4, 4)
    lenders = [_job(f"b{i}", "b") for i in range(4)]
    policy = make_policy("pollux", seed=0)
    lent = policy.optimize_teams(lenders, nodes, {}, TEAMS)
    assert _held(lent.allocations, lenders)["b"] == 16  # a's idle quota is lent to b
    owner = [_job("a0", "a", age_s=60.0, submitted_s=3600.0, max_replicas=8)]
    back = policy.optimize_teams(lenders + owner, nodes, lent.allocations, TEAMS)
    assert _held(back.allocations, lenders + owner)["a"] == 8  # the very next round


def test_priority_orders_who_shrinks_first_when_a_team_gives_back() -> None:
    nodes = gpu_nodes(2, 4)
    teams = parse_teams({"teams": {"a": {"quota_gpus": 4}, "b": {"quota_gpus": 4}}})
    low = _job("b-low", "b", priority=0, max_replicas=4)
    high = _job("b-high", "b", priority=5, max_replicas=4)
    previous = {"b-low": ("node-00",) * 4, "b-high": ("node-01",) * 4}
    owner = _job("a0", "a", age_s=60.0, submitted_s=3600.0, max_replicas=4)
    decision = make_policy("pollux", seed=0).optimize_teams([low, high, owner], nodes,
                                                            previous, teams)
    assert len(decision.allocations["a0"]) == 4
    # b gives 4 GPUs back; its low-priority job gives more of them than the high one
    assert len(decision.allocations["b-high"]) > len(decision.allocations["b-low"])


def test_priorities_order_a_teams_own_jobs_and_weigh_nothing_against_other_teams() -> None:
    """A team that gives its jobs priorities 0..3 must not outweigh a team whose jobs
    have none: within the team the weights are 1:4:16:64, the team's total as before."""
    jobs = ([_job(f"a{p}", "a", priority=p) for p in range(4)]
            + [_job(f"b{i}", "b") for i in range(4)])
    shares = team_shares(jobs, [4] * 8, 16.0, TEAMS)
    weights = dict(zip((j.name for j in jobs), shares.weights))
    assert sum(weights[f"a{p}"] for p in range(4)) == pytest.approx(
        sum(weights[f"b{i}"] for i in range(4)))
    assert [weights[f"a{p}"] / weights["a0"] for p in range(4)] == pytest.approx(
        [1, 4, 16, 64])
    nodes = gpu_nodes(4, 4)
    held = _held(make_policy("pollux", seed=0).optimize_teams(jobs, nodes, {}, TEAMS)
                 .allocations, jobs)
    assert held["b"] >= 8  # b keeps its quota however a weighs its own jobs


def test_team_shares_refuse_a_job_of_an_unknown_team() -> None:
    with pytest.raises(ValueError, match="choose from: a, b"):
        team_shares([_job("x", "c")], [1], 16.0, TEAMS)


def test_without_teams_a_policy_decides_as_before() -> None:
    """The default optimize_teams of a team-blind policy is its optimize."""
    nodes = gpu_nodes(2, 4)
    jobs = [replace(_job(f"j{i}", "a"), tuned=None) for i in range(3)]
    policy = make_policy("fifo", seed=0)
    assert (policy.optimize_teams(jobs, nodes, {}, Teams(TEAMS.teams)).allocations
            == make_policy("fifo", seed=0).optimize(jobs, nodes, {}).allocations)
    assert isinstance(nodes[0], NodeInfo)


def test_the_guarantee_step_reclaims_from_a_borrower_spread_over_nodes() -> None:
    """A borrower holding one replica on each of two nodes gives one back (its node count
    shrinks with it) so that the short team gets its guarantee."""
    from pollux.policies.pollux.guarantee import meet_guarantees
    from pollux.policies.pollux.objective import PolluxObjective
    from pollux.policies.pollux.options import ONE_TYPE, PolluxOptions
    from pollux.policies.pollux.problem import build_problem

    nodes = gpu_nodes(2, 2)
    teams = parse_teams({"teams": {"a": {"quota_gpus": 2}, "b": {"quota_gpus": 2}}})
    jobs = [_job("a0", "a", max_replicas=2), _job("b0", "b", max_replicas=2),
            _job("b1", "b", max_replicas=2)]
    previous = {"b0": ("node-00", "node-01"), "b1": ("node-00", "node-01")}
    problem = build_problem(jobs, nodes, previous)
    shares = team_shares(problem.jobs, [int(b) for b in problem.max_replicas], 4.0, teams)
    objective = PolluxObjective(problem, PolluxOptions.resolve(ONE_TYPE, "best", {}), shares)
    order = [job.team for job in problem.jobs]
    state = meet_guarantees(objective, problem.base_state, order, np.ones(len(order)))
    held = {t: int(sum(state[j].sum() for j in range(len(order)) if order[j] == t))
            for t in ("a", "b")}
    assert held == {"a": 2, "b": 2}
