"""The paper's optimizer: a genetic algorithm over allocation matrices (``pollux-ga``).

Individuals are states (J, N) of replica counts. Each round starts from the population the
previous round ended with (rows matched to jobs and columns to nodes by name; new jobs and
nodes start empty) plus the current allocation, so good solutions carry over as the
cluster evolves. Each generation:

1. *selection*: binary tournaments on fitness pick parents;
2. *crossover*: single point over jobs; a child takes the rows of jobs before the point
   from one parent and the rest from the other;
3. *mutation*: some job rows return to the current allocation (no restart), some entries
   are cleared, and some entries where a replica still fits are raised to a random count
   up to what the node holds for that job (each node's raise chance is shared by the jobs
   that fit on it, as in the reference);
4. *repair* (:func:`pollux.policies.pollux.constraints.repair`) maps every child onto a
   feasible state;
5. *survival*: the best distinct states of parents and children form the next population.

The answer is the best individual of the last generation. Randomness comes from the
generator the optimizer is given.

Every step works on the whole population at once (one numpy expression per step, no loop
over individuals), and fitness goes through :class:`PopulationFitness`, which memoizes
each job's speedup for the round. A seed gives the same decisions as the plain forms of
these steps (``tests/policies/test_pollux_ga_fast.py`` holds them as references).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pollux.capacity import RESOURCE_TOLERANCE
from pollux.errors import ConfigError
from pollux.policies.pollux.constraints import repair
from pollux.policies.pollux.objective import PolluxObjective
from pollux.policies.pollux.problem import (
    AllocationProblem,
    FloatArray,
    IntArray,
    count_along,
    fitting_replicas,
)


@dataclass(frozen=True)
class GAConfig:
    """Genetic-algorithm settings (defaults: the published ones)."""

    population_size: int = 100
    """Individuals kept from generation to generation (and from round to round)."""
    num_generations: int = 100
    """Generations per scheduling round."""
    reset_probability: float = 0.1
    """Chance that a child's job row returns to the current allocation."""
    clear_row_probability: float = 0.1
    """Chance that a child's job row has some of its entries cleared ..."""
    clear_entry_probability: float = 0.1
    """... each entry of such a row being cleared with this chance."""
    small_first: bool = True
    """Repair gives node capacity to the smallest allocations first (else job order)."""

    def __post_init__(self) -> None:
        if self.population_size < 2:
            raise ConfigError("population_size", self.population_size, "use at least 2")
        if self.num_generations < 0:
            raise ConfigError("num_generations", self.num_generations, "use a count >= 0")
        for name in ("reset_probability", "clear_row_probability", "clear_entry_probability"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ConfigError(name, value, "use a probability in [0, 1]")


class GeneticOptimizer:
    """Keeps its population between rounds; one instance per policy instance."""

    def __init__(self, config: GAConfig, rng: np.random.Generator,
                 interference_avoidance: bool = True) -> None:
        self.config = config
        self.rng = rng
        self.interference_avoidance = interference_avoidance
        self._population: IntArray | None = None
        self._job_names: list[str] = []
        self._node_names: list[str] = []

    # -- population carried across rounds -------------------------------------------------

    def _initial_population(self, problem: AllocationProblem,
                            node_capacity: IntArray) -> IntArray:
        base = problem.base_state[None]
        if self._population is None:
            population = np.repeat(base, self.config.population_size, axis=0)
            population[1:] = self._mutate(problem, population[1:], node_capacity)
        else:
            population = self._adapt(problem, self._population)
            population = np.concatenate([base, population[: self.config.population_size - 1]])
        return repair(problem, population, self.rng, self.interference_avoidance)

    def _adapt(self, problem: AllocationProblem, previous: IntArray) -> IntArray:
        old_jobs = {name: i for i, name in enumerate(self._job_names)}
        old_nodes = {name: i for i, name in enumerate(self._node_names)}
        population = np.zeros((len(previous), *problem.shape), dtype=np.int64)
        jobs_dst = [j for j, job in enumerate(problem.jobs) if job.name in old_jobs]
        jobs_src = [old_jobs[problem.jobs[j].name] for j in jobs_dst]
        nodes_dst = [n for n, node in enumerate(problem.nodes) if node.name in old_nodes]
        nodes_src = [old_nodes[problem.nodes[n].name] for n in nodes_dst]
        if jobs_dst and nodes_dst:
            population[:, np.array(jobs_dst)[:, None], np.array(nodes_dst)[None, :]] = \
                previous[:, np.array(jobs_src)[:, None], np.array(nodes_src)[None, :]]
        return population

    # -- operators ------------------------------------------------------------------------

    def _select(self, fitness: FloatArray, count: int) -> IntArray:
        """Binary tournament: ``count`` parent indices."""
        a = self.rng.integers(len(fitness), size=count)
        b = self.rng.integers(len(fitness), size=count)
        return np.where(fitness[a] >= fitness[b], a, b)

    def _crossover(self, first: IntArray, second: IntArray) -> IntArray:
        num_jobs = first.shape[1]
        points = self.rng.integers(num_jobs + 1, size=(len(first), 1, 1))
        before = np.arange(num_jobs)[None, :, None] < points
        return np.concatenate([np.where(before, first, second), np.where(before, second, first)])

    def _mutate(self, problem: AllocationProblem, states: IntArray,
                node_capacity: IntArray | None = None) -> IntArray:
        """Mutated copies of ``states`` (P, J, N); ``node_capacity`` is
        :meth:`_node_capacity`, computed once a round by :meth:`solve`."""
        cfg = self.config
        rng = self.rng
        shape = states.shape
        reset = rng.random(shape[:2]) < cfg.reset_probability
        # Integer blends instead of np.where and masked stores (several times faster).
        states = states + reset[:, :, None] * (problem.base_state[None] - states)
        clear_rows = rng.random(shape[:2]) < cfg.clear_row_probability
        clear = clear_rows[:, :, None] & (rng.random(shape) < cfg.clear_entry_probability)
        states *= ~clear
        # Raise entries where one more replica still fits on the node. As in the reference,
        # each node's chance is spread over the jobs that fit there (and, separately, over
        # the jobs already on it), and a raised entry goes up to the node's capacity for
        # the job; the job's own bound is left to the repair.
        used = np.matmul(states.transpose(0, 2, 1).astype(np.float64), problem.demand)
        free = problem.capacity[None] - used + RESOURCE_TOLERANCE  # (P, N, R)
        room = (problem.demand[None, :, None, :] <= free[:, None, :, :]).all(axis=3)
        owned = room & (states > 0)
        # Chance p_room + p_owned - p_room * p_owned per entry, p_room = 1 / (jobs that
        # fit on the node) where the job fits, else 0 (and p_owned likewise): the same
        # floating-point values, compared case by case.
        p_room = 1.0 / np.maximum(count_along(room, axis=1), 1)[:, None, :]
        p_owned = 1.0 / np.maximum(count_along(owned, axis=1), 1)[:, None, :]
        draw = rng.random(shape)
        raise_mask = ((owned & (draw < p_room + p_owned - p_room * p_owned))
                      | (room & ~owned & (draw < p_room)))
        if node_capacity is None:
            node_capacity = self._node_capacity(problem)
        upper = np.maximum(node_capacity[None], states)
        step = np.floor(rng.random(shape) * (upper - states + 1)).astype(np.int64)
        states += raise_mask * step
        return states

    @staticmethod
    def _node_capacity(problem: AllocationProblem) -> IntArray:
        """(J, N): replicas of each job a node holds on its own, whatever the job's bound."""
        unbounded = np.full(problem.num_jobs, np.iinfo(np.int32).max, dtype=np.int64)
        return fitting_replicas(problem.demand, problem.free_capacity, unbounded)

    # -- one round ------------------------------------------------------------------------

    def solve(self, problem: AllocationProblem,
              objective: PolluxObjective) -> tuple[IntArray, dict[str, Any]]:
        """Best state found this round, and statistics for ``PolicyDecision.info``."""
        size = self.config.population_size
        node_capacity = self._node_capacity(problem)
        evaluate = PopulationFitness(problem, objective)
        population = self._initial_population(problem, node_capacity)
        fitness = evaluate(population)
        # Distinct states have distinct fingerprints (wrapping int64 dot product) but for
        # vanishingly rare collisions, which only drop a duplicate-looking child.
        weights = self.rng.integers(1, 2**62, size=population[0].size, dtype=np.int64)
        prints = population.reshape(len(population), -1) @ weights
        for _ in range(self.config.num_generations):
            parents = self._select(fitness, 2 * ((size + 1) // 2))
            children = self._crossover(population[parents[0::2]], population[parents[1::2]])
            children = self._mutate(problem, children, node_capacity)
            children = repair(problem, children, self.rng, self.interference_avoidance,
                              self.config.small_first)
            merged = np.concatenate([population, children])
            merged_fitness = np.concatenate([fitness, evaluate(children)])
            merged_prints = np.concatenate([prints, children.reshape(len(children), -1)
                                            @ weights])
            _, first = np.unique(merged_prints, return_index=True)
            keep = first[np.argsort(-merged_fitness[first], kind="stable")][:size]
            population, fitness, prints = merged[keep], merged_fitness[keep], merged_prints[keep]
        self._population = population
        self._job_names = [job.name for job in problem.jobs]
        self._node_names = [node.name for node in problem.nodes]
        stats = {"generations": self.config.num_generations,
                 "population": len(population),
                 "population_fitness_median": float(np.median(fitness))}
        return population[int(np.argmax(fitness))].copy(), stats


class PopulationFitness:
    """Fitness of whole populations for one round, as :meth:`PolluxObjective.score` gives
    it, with each job's penalized speedup memoized by (replicas, nodes, changed).

    A job's speedup in a state depends only on its replica count, its node count and
    whether its row differs from the current allocation, and a population holds few such
    triples per job, most of them already seen in earlier generations. A generation then
    costs one sorted lookup over all (state, job) pairs instead of one objective call per
    job. A job with any unseen triple is sent to the objective with its whole column, as
    :meth:`PolluxObjective.state_speedups` would send it, so the objective sees the same
    queries in the same order and the values are the same to the bit.
    """

    def __init__(self, problem: AllocationProblem, objective: PolluxObjective) -> None:
        self.problem = problem
        self.objective = objective
        self._keys = np.empty(0, dtype=np.int64)
        """Sorted keys ``((replicas * (N + 1) + nodes) * 2 + changed) * J + job``."""
        self._values = np.empty(0, dtype=np.float64)
        self._job_index = np.arange(problem.num_jobs, dtype=np.int64)

    def speedups(self, states: IntArray) -> FloatArray:
        """(P, J) penalized fair-share speedups of states shaped (P, J, N)."""
        problem = self.problem
        nodes = count_along(states != 0, axis=2)
        replicas = np.einsum("pjn->pj", states)
        changed = count_along(states != problem.base_state[None], axis=2) > 0
        keys = (((replicas * (problem.num_nodes + 1) + nodes) * 2 + changed)
                * problem.num_jobs + self._job_index)
        index = np.searchsorted(self._keys, keys)  # the memo's positions, if all are there
        if index.max(initial=0) >= len(self._keys) or not np.array_equal(self._keys[index], keys):
            known = np.isin(keys, self._keys)
            new_keys, new_values = [self._keys], [self._values]
            for j in np.flatnonzero(~known.all(axis=0)):
                new_keys.append(keys[:, j])
                new_values.append(self.objective.speedup(
                    int(j), nodes[:, j], replicas[:, j], changed[:, j]))
            self._keys, first = np.unique(np.concatenate(new_keys), return_index=True)
            self._values = np.concatenate(new_values)[first]
            index = np.searchsorted(self._keys, keys)
        return self._values[index]

    def __call__(self, states: IntArray) -> FloatArray:
        """(P,) fitness of states shaped (P, J, N)."""
        return self.objective.fitness(states, self.speedups(states))
