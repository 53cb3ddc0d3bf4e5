"""Behaviour of the Pollux policies (``pollux`` and ``pollux-ga``) on small snapshots."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pollux.errors import ConfigError
from pollux.policies import make_policy
from pollux.policies.pollux import (
    PolluxObjective,
    PolluxOptions,
    PolluxPolicy,
    build_problem,
)
from pollux.policies.pollux import violations as state_violations
from tests.policies.pollux_builders import job, nodes, speedup_function, violations

POLICIES = {
    "pollux": lambda: PolluxPolicy(),
    "pollux-ga": lambda: PolluxGAPolicy(seed=3, population_size=50, num_generations=60),
}


def PolluxGAPolicy(**options: object) -> PolluxPolicy:
    return PolluxPolicy(base="paper", optimizer="ga", **options)


def test_registry_builds_the_family() -> None:
    assert isinstance(make_policy("pollux"), PolluxPolicy)
    ga = make_policy("pollux-ga", seed=1)
    assert ga.one.optimizer == "ga" and ga.least_service_first  # type: ignore[attr-defined]
    with pytest.warns(FutureWarning, match="'pollux-remaining' is deprecated: write 'pollux"):
        remaining = make_policy("pollux-remaining")
    assert isinstance(remaining, PolluxPolicy)
    assert remaining.one.remaining_weight == 0.5
    assert remaining.one.remaining_restart
    assert remaining.one.min_restart_gain == 0.2
    assert remaining.optimizer.shrink_whole_nodes  # type: ignore[union-attr]
    several = remaining.several  # type: ignore[attr-defined]
    assert (several.move_discount, several.initial_replicas) == ("both", 4)  # pollux's
    paper = make_policy("pollux")
    assert paper.one == PolluxOptions()  # the paper's objective on one type (README rule)
    assert not paper.optimizer.shrink_whole_nodes


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("max_replicas, expected", [(64, 16), (6, 6)])
def test_a_lone_job_gets_all_it_can_use(name: str, max_replicas: int, expected: int) -> None:
    def spread_costs(num_nodes: object, num_replicas: object) -> np.ndarray:
        k = np.asarray(num_replicas, dtype=np.float64)
        return k * (1.0 - 0.05 * (np.asarray(num_nodes) - 1))

    cluster = nodes(4, 4)
    lone = job("lone", seed=None, max_replicas=max_replicas, speedup_fn=spread_costs)
    decision = POLICIES[name]().optimize([lone], cluster, {})
    assert len(decision.allocations["lone"]) == expected
    # On as few nodes as possible.
    assert len(set(decision.allocations["lone"])) == -(-expected // 4)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_lone_job_stops_where_its_speedup_peaks(name: str) -> None:
    # Speedup grows up to 8 replicas, then falls: more GPUs would only slow it down.
    def peaked(num_nodes: object, num_replicas: object) -> np.ndarray:
        k = np.asarray(num_replicas, dtype=np.float64)
        return np.minimum(k, 16.0 - k)

    lone = job("lone", seed=None, speedup_fn=peaked)
    decision = POLICIES[name]().optimize([lone], nodes(4, 4), {})
    assert len(decision.allocations["lone"]) == 8


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_job_is_decided_and_waiting_jobs_get_gpus(name: str) -> None:
    jobs = [job(f"j{i}", seed=i) for i in range(6)]
    cluster = nodes(4, 4)
    decision = POLICIES[name]().optimize(jobs, cluster, {})
    assert set(decision.allocations) == {j.name for j in jobs}
    assert all(len(a) >= 1 for a in decision.allocations.values())
    assert violations(jobs, cluster, {}, decision.allocations) == []
    assert decision.info["objective"] > 0


def test_default_keeps_a_good_allocation_unchanged() -> None:
    jobs = [job(f"j{i}", seed=i) for i in range(5)]
    cluster = nodes(4, 4)
    policy = PolluxPolicy()
    first = policy.optimize(jobs, cluster, {})
    second = policy.optimize(jobs, cluster, first.allocations)
    assert second.allocations == first.allocations
    assert second.info["num_changed"] == 0


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_non_preemptible_running_job_keeps_its_allocation(name: str) -> None:
    cluster = nodes(2, 4)
    stuck = job("stuck", seed=1, preemptible=False)
    others = [job(f"j{i}", seed=i + 2) for i in range(3)]
    previous = {"stuck": ("node-00", "node-01", "node-01")}
    decision = POLICIES[name]().optimize([stuck, *others], cluster, previous)
    assert sorted(decision.allocations["stuck"]) == sorted(previous["stuck"])
    assert violations([stuck, *others], cluster, previous, decision.allocations) == []


def test_preemptible_nodes_are_used_last() -> None:
    cluster = nodes(4, 4, preemptible=2)
    jobs = [job("a", seed=None, max_replicas=4), job("b", seed=None, max_replicas=4)]
    decision = PolluxPolicy().optimize(jobs, cluster, {})
    used = {n for alloc in decision.allocations.values() for n in alloc}
    assert used == {"node-00", "node-01"}


def test_interference_avoidance_is_switchable() -> None:
    # Two jobs of 6 replicas on 3 nodes of 4: with the rule they cannot both spread.
    cluster = nodes(3, 4)
    jobs = [job(n, seed=None, max_replicas=6) for n in ("a", "b")]
    strict = PolluxPolicy().optimize(jobs, cluster, {})
    loose = PolluxPolicy(interference_avoidance=False).optimize(jobs, cluster, {})
    assert violations(jobs, cluster, {}, strict.allocations, True) == []
    assert sorted(len(a) for a in loose.allocations.values()) == [6, 6]
    assert sum(len(a) for a in strict.allocations.values()) < 12


def test_ga_is_reproducible_for_a_seed() -> None:
    jobs = [job(f"j{i}", seed=i) for i in range(8)]
    cluster = nodes(4, 4)

    def run(seed: int) -> list[dict[str, tuple[str, ...]]]:
        policy = PolluxGAPolicy(seed=seed, population_size=20, num_generations=10)
        decisions, previous = [], {}
        for _ in range(3):
            previous = policy.optimize(jobs, cluster, previous).allocations
            decisions.append(previous)
        return decisions

    assert run(7) == run(7)


def _brute_force_best(jobs: list, cluster: list) -> float:
    """Best objective over every feasible state of a tiny problem."""
    problem = build_problem(jobs, cluster, {})
    objective = PolluxObjective(problem, PolluxOptions())
    ranges = [range(int(c) + 1) for c in problem.max_per_node.ravel()]
    states = np.array(list(itertools.product(*ranges))).reshape(-1, *problem.shape)
    feasible = [s for s in states if not state_violations(problem, s)]
    return float(objective.evaluate(np.array(feasible)).max())


@pytest.mark.parametrize("seed", range(4))
def test_default_optimizer_is_near_optimal_on_tiny_problems(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cluster = nodes(2, 2)
    jobs = [job(f"j{i}", seed=int(rng.integers(1000)), age_s=float(rng.uniform(60, 3600)),
                max_replicas=int(rng.integers(1, 5))) for i in range(3)]
    best = _brute_force_best(jobs, cluster)
    found = PolluxPolicy().optimize(jobs, cluster, {}).info["objective"]
    assert found >= 0.97 * best


def test_checker_catches_broken_allocations() -> None:
    cluster = nodes(2, 2)
    jobs = [job("a", seed=None, max_replicas=2), job("b", seed=None, min_replicas=2)]
    assert violations(jobs, cluster, {}, {"a": ("node-00",) * 3, "b": ("node-01",)})


def test_bad_options_name_the_field() -> None:
    with pytest.raises(ConfigError, match="fair_share"):
        PolluxPolicy(fair_share="median")
    with pytest.raises(ConfigError, match="population_size"):
        PolluxGAPolicy(population_size=1)
    with pytest.raises(ConfigError, match="exploration_factor"):
        PolluxPolicy(exploration_factor=0.5)
    assert PolluxPolicy(exploration_factor=4).exploration_factor == 4.0
    assert PolluxPolicy().exploration_factor is None  # the paper's rule
    assert PolluxGAPolicy().exploration_factor is None
    with pytest.raises(ConfigError, match="JobInfo"):
        PolluxPolicy().optimize([job("a", seed=None), job("a", seed=None)], nodes(1), {})


def test_speedup_function_of_builders_is_plausible() -> None:
    fn = speedup_function(0)
    values = fn(np.array([1, 1, 2]), np.array([1, 4, 8]))
    assert values[0] == pytest.approx(1.0) and values[1] > 1.0


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_degenerate_snapshots(name: str) -> None:
    free_rider = job("free", seed=None, resources={}, max_replicas=3)
    unusable = job("zero", seed=None, max_replicas=0)
    plain = job("plain", seed=None)
    policy = POLICIES[name]()
    assert policy.optimize([], nodes(1), {}).allocations == {}
    assert policy.optimize([plain, free_rider], [], {}).allocations == {"plain": (),
                                                                      "free": ()}
    decision = policy.optimize([plain, free_rider, unusable], nodes(1, 2), {})
    assert len(decision.allocations["free"]) == 3  # needs nothing, so only its max limits
    assert decision.allocations["zero"] == ()
    assert len(decision.allocations["plain"]) == 2


def test_ga_raise_mutation_spreads_each_node_over_its_jobs() -> None:
    # As in the reference, a node's raise chance is shared by the jobs that fit on it:
    # about one raise per empty node (to 0..4 replicas: 4 in 5 non-zero), not one per job
    # and node (the old rule: 20 jobs x 1/4 of the nodes, 4 per node).
    from pollux.policies.pollux import GAConfig, GeneticOptimizer

    problem = build_problem([job(f"j{i}", seed=None) for i in range(20)], nodes(4, 4), {})
    config = GAConfig(reset_probability=0.0, clear_row_probability=0.0)
    ga = GeneticOptimizer(config, np.random.default_rng(0))
    empty = np.zeros((2000, *problem.shape), dtype=np.int64)
    raised = (ga._mutate(problem, empty) > 0).sum(axis=1)
    assert 0.7 < raised.mean() < 0.9
    # a raised entry goes up to what the node holds, whatever the job's own bound
    assert ga._mutate(problem, empty).max() == 4


def test_ga_orders_jobs_by_attained_service() -> None:
    jobs = [job("old", seed=None, submission_time_s=0.0, attained_service_s=500.0),
            job("new", seed=None, submission_time_s=10.0, attained_service_s=0.0)]
    assert [j.name for j in build_problem(jobs, nodes(1), {}).jobs] == ["old", "new"]
    assert [j.name for j in build_problem(jobs, nodes(1), {}, True).jobs] == ["new", "old"]


def test_a_shrinking_distributed_job_keeps_whole_nodes_only() -> None:
    # a job on four full nodes must give way to three newcomers: by default it gives up
    # single replicas (a restart of all its GPUs each time later arrivals need one);
    # shrink_whole_nodes takes a whole node at once, the rest staying free
    big = job("big", seed=None, age_s=1e5, max_replicas=16)
    previous = {"big": tuple(f"node-{i:02d}" for i in range(4) for _ in range(4))}
    newcomers = [job(f"new-{i}", seed=None, age_s=1e5, max_replicas=1) for i in range(3)]
    cluster = nodes(4, 4)
    for whole, expected in ((False, 13), (True, 12)):
        decision = PolluxPolicy(shrink_whole_nodes=whole).optimize([big, *newcomers],
                                                                   cluster, previous)
        counts = {name: len(alloc) for name, alloc in decision.allocations.items()}
        assert counts == {"big": expected, "new-0": 1, "new-1": 1, "new-2": 1}
        assert not violations([big, *newcomers], cluster, previous, decision.allocations)
        per_node = np.unique(decision.allocations["big"], return_counts=True)[1]
        assert whole is False or set(per_node) == {4}


def test_the_growth_rule_on_several_types_is_the_typed_optimizers() -> None:
    """Drivers ask the policy for its growth rule on the cluster they have: ``pollux``
    grows 4x on several types and starts jobs on 4 GPUs there (its typed defaults), and
    keeps the paper's rule on one type; options given apply on both kinds."""
    assert PolluxPolicy().growth_rule(["a", "b"]) == (4.0, 4)
    assert PolluxPolicy().growth_rule(["a"]) == (None, 1)
    assert PolluxPolicy(base="paper").growth_rule(["a", "b"]) == (None, 1)
    assert PolluxPolicy(base="paper", exploration_factor=3).growth_rule(["a", "b"]) == (3.0, 1)
    assert PolluxPolicy(exploration_factor=3).growth_rule(["a", "b"]) == (3.0, 4)
    assert PolluxGAPolicy().growth_rule(["x", "y"]) == (None, 1)


def test_every_option_is_documented_and_checked() -> None:
    from dataclasses import fields

    from pollux.policies.pollux.options import field_docs

    docs = field_docs()
    assert set(docs) == {f.name for f in fields(PolluxOptions)}
    assert all(len(text) > 10 for text in docs.values())
    with pytest.raises(ConfigError, match="move_discount"):
        PolluxPolicy(move_discount="never")
    with pytest.raises(ConfigError, match="p=0.5"):
        PolluxPolicy(p=0.5)  # Sia's program on several types needs p < 0
