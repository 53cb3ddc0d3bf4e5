"""The GA's vectorized operators give what their straightforward forms give, to the bit.

The references below are the plain numpy forms the GA used before it was made faster
(full-array repair steps, a masked mutation, one objective call per job): with the same
random stream, the fast forms must return the same states and fitness values, so a seed
decides the same allocations as before.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pollux.policies.base import Allocation, JobInfo, NodeInfo
from pollux.policies.pollux import GAConfig, GeneticOptimizer, build_problem, repair
from pollux.policies.pollux.ga import PopulationFitness
from pollux.policies.pollux.objective import PolluxObjective
from pollux.policies.pollux.options import PolluxOptions
from pollux.policies.pollux.problem import AllocationProblem, IntArray, count_along
from tests.policies.pollux_builders import snapshots

Snapshot = tuple[list[JobInfo], list[NodeInfo], dict[str, Allocation]]
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOLERANCE = 1e-9


def reference_repair(problem: AllocationProblem, states: IntArray, rng: np.random.Generator,
                     interference_avoidance: bool, small_first: bool) -> IntArray:
    s = np.clip(np.asarray(states, dtype=np.int64), 0, problem.max_per_node[None])
    pinned = problem.pinned
    s[:, pinned] = problem.base_state[pinned]
    if interference_avoidance:
        distributed = np.count_nonzero(s, axis=2) > 1
        occupied = (s > 0) & distributed[:, :, None]
        conflict = occupied & (np.cumsum(occupied, axis=1) > 1)
        s[conflict & ~pinned[None, :, None]] = 0
    over = s.sum(axis=2) > problem.max_replicas[None, :]
    if over.any():
        rows = s[over]
        order = np.argsort(rng.random(rows.shape), axis=1)
        shuffled = np.take_along_axis(rows, order, axis=1)
        limit = np.broadcast_to(problem.max_replicas[None, :], over.shape)[over]
        capped = np.minimum(np.cumsum(shuffled, axis=1), limit[:, None])
        np.put_along_axis(rows, order, np.diff(capped, axis=1, prepend=0), axis=1)
        s[over] = rows
    if problem.resource_types:
        num_jobs = problem.num_jobs
        key = np.broadcast_to(np.arange(num_jobs, dtype=np.float64), s.shape[:2])
        if small_first:
            key = key + problem.dominant_share[None, :] * s.sum(axis=2) * 1e6 * num_jobs
        key = key + np.where(pinned, -1e18, 0.0)[None, :]
        order = np.argsort(key, axis=1, kind="stable")
        ordered = np.take_along_axis(s, order[:, :, None], axis=1)
        demand = problem.demand[order][:, :, None, :]
        use = ordered[..., None] * demand
        room = np.minimum(np.cumsum(use, axis=1), problem.capacity[None, None])
        granted = np.diff(room, axis=1, prepend=0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(demand > 0, granted / demand, np.inf)
        fits = np.floor(ratio * (1 + TOLERANCE) + TOLERANCE).min(axis=3)
        fits = np.where(np.isfinite(fits), fits, ordered)
        ordered = np.minimum(ordered, np.maximum(fits, 0).astype(np.int64))
        np.put_along_axis(s, order[:, :, None], ordered, axis=1)
    totals = s.sum(axis=2)
    below = (totals < problem.min_replicas[None]) & ~pinned[None]
    s[below] = 0
    s[:, pinned] = problem.base_state[pinned]
    return s


def reference_mutate(config: GAConfig, problem: AllocationProblem, states: IntArray,
                     rng: np.random.Generator) -> IntArray:
    states = states.copy()
    shape = states.shape
    reset = rng.random(shape[:2]) < config.reset_probability
    states = np.where(reset[:, :, None], problem.base_state[None], states)
    clear_rows = rng.random(shape[:2]) < config.clear_row_probability
    clear = clear_rows[:, :, None] & (rng.random(shape) < config.clear_entry_probability)
    states[clear] = 0
    used = np.matmul(states.transpose(0, 2, 1).astype(np.float64), problem.demand)
    free = problem.capacity[None] - used
    room = np.all(problem.demand[None, :, None, :] <= free[:, None, :, :] + 1e-9, axis=3)
    owned = room & (states > 0)
    p_room = room / np.maximum(room.sum(axis=1, keepdims=True), 1)
    p_owned = owned / np.maximum(owned.sum(axis=1, keepdims=True), 1)
    raise_mask = rng.random(shape) < p_room + p_owned - p_room * p_owned
    upper = np.maximum(GeneticOptimizer._node_capacity(problem)[None], states)
    proposal = states + np.floor(rng.random(shape) * (upper - states + 1)).astype(np.int64)
    states[raise_mask] = proposal[raise_mask]
    return states


def _states(problem: AllocationProblem, seed: int, count: int = 24) -> IntArray:
    rng = np.random.default_rng(seed)
    states = rng.integers(-1, 6, size=(count, *problem.shape))
    states[0] = problem.base_state  # unchanged rows, and some all-zero ones
    states[1] = 0
    return states


@pytest.mark.parametrize("small_first", [False, True])
@pytest.mark.parametrize("interference", [True, False])
@SETTINGS
@given(snapshot=snapshots(), seed=st.integers(0, 2**16))
def test_repair_matches_reference(interference: bool, small_first: bool,
                                  snapshot: Snapshot, seed: int) -> None:
    problem = build_problem(*snapshot)
    states = _states(problem, seed)
    fast = repair(problem, states, np.random.default_rng(seed), interference, small_first)
    slow = reference_repair(problem, states, np.random.default_rng(seed), interference,
                            small_first)
    assert np.array_equal(fast, slow)


@SETTINGS
@given(snapshot=snapshots(), seed=st.integers(0, 2**16))
def test_mutation_matches_reference(snapshot: Snapshot, seed: int) -> None:
    problem = build_problem(*snapshot)
    states = repair(problem, _states(problem, seed), np.random.default_rng(0))
    config = GAConfig(reset_probability=0.3, clear_row_probability=0.5,
                      clear_entry_probability=0.5)
    fast_rng, slow_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    fast = GeneticOptimizer(config, fast_rng)._mutate(problem, states)
    assert np.array_equal(fast, reference_mutate(config, problem, states, slow_rng))
    assert fast_rng.random() == slow_rng.random()  # the same draws were consumed


@SETTINGS
@given(snapshot=snapshots(), seed=st.integers(0, 2**16))
def test_population_fitness_matches_objective(snapshot: Snapshot, seed: int) -> None:
    problem = build_problem(*snapshot)
    config = PolluxOptions()
    fitness = PopulationFitness(problem, PolluxObjective(problem, config))
    plain = PolluxObjective(problem, config)
    for generation in range(3):  # new entries, then memoized ones
        states = repair(problem, _states(problem, seed + generation % 2),
                        np.random.default_rng(generation))
        values, speedups = plain.score(states)
        assert np.array_equal(fitness.speedups(states), speedups)
        assert np.array_equal(fitness(states), values)


@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 300, 4), (4, 3, 260)])
def test_count_along_counts_true_entries(shape: tuple[int, int, int]) -> None:
    mask = np.random.default_rng(0).random(shape) < 0.7
    for axis in range(3):
        counted = count_along(mask, axis)
        assert counted.dtype == np.int64
        assert np.array_equal(counted, mask.sum(axis=axis))
