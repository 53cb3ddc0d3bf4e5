"""Pollux with teams on a typed cluster (``TypedPollux.optimize_teams``): Sia's program
with team weights and a price for a team held below its guarantee while another
borrows."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from pollux.cluster_spec import parse_cluster_spec
from pollux.policies.pollux import PolluxPolicy
from pollux.teams import parse_teams
from tests.policies.test_sia import job

SPEC = parse_cluster_spec("aws:2x4,rtx:2x8")
NODES = SPEC.node_infos()
TYPE_OF = {node.name: node.gpu_type for node in NODES}
TEAMS = parse_teams({"teams": {"a": {"quota_gpus": {"aws": 4, "rtx": 8}},
                               "b": {"quota_gpus": {"aws": 4, "rtx": 8}}}}, cluster=SPEC)


def _round(num_a: int) -> tuple[Counter[tuple[str, str]], dict[str, tuple[str, ...]]]:
    """Team a submits ``num_a`` jobs, team b eight: GPUs held per (team, type)."""
    jobs = ([replace(job(f"a{i}", age_s=600.0), team="a") for i in range(num_a)]
            + [replace(job(f"b{i}", age_s=600.0), team="b") for i in range(8)])
    decision = PolluxPolicy().optimize_teams(jobs, NODES, {}, TEAMS)
    held: Counter[tuple[str, str]] = Counter()
    for j in jobs:
        for node in decision.allocations.get(j.name, ()):
            held[j.team, TYPE_OF[node]] += 1
    return held, dict(decision.allocations)


def test_a_team_outnumbered_four_to_one_holds_its_quota_over_all_types() -> None:
    """Team-blind, b's eight jobs would take most of the 24 GPUs; with teams a's two
    jobs hold a's 12 (its quota over both types), every GPU is used, and each job runs
    on one type."""
    held, allocations = _round(2)
    assert held["a", "aws"] + held["a", "rtx"] >= 12
    assert sum(held.values()) == 24
    assert all(len({TYPE_OF[n] for n in alloc}) <= 1 for alloc in allocations.values())
    blind = Counter()
    jobs = ([replace(job(f"a{i}", age_s=600.0), team="a") for i in range(2)]
            + [replace(job(f"b{i}", age_s=600.0), team="b") for i in range(8)])
    for name, alloc in PolluxPolicy().optimize(jobs, NODES, {}).allocations.items():
        blind[name[0]] += len(alloc)
    assert blind["a"] < 12


@pytest.mark.xfail(strict=True, reason="known gap (#32): the typed program prices a team's "
                   "guarantee over all types together, so two teams may swap types (a "
                   "borrows rtx while b borrows aws); a per-type guarantee is not met")
def test_every_team_holds_its_quota_of_each_type() -> None:
    held, _ = _round(2)
    for team in ("a", "b"):
        for gpu_type, quota in (("aws", 4), ("rtx", 8)):
            assert held[team, gpu_type] >= quota
