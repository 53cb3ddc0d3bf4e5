"""The one-configuration-per-job program: feasibility of both solvers, the exact one
against brute force, and the fast one's gap to the exact optimum."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.policies.assignment import objective_value, solve_exact, solve_fast

Instance = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def instance(seed: int, num_jobs: int, num_types: int, forced_share: float = 0.0,
             max_nodes: int = 4) -> Instance:
    """Configurations like a typed cluster's (1..node-1 GPUs, then whole nodes); values
    ``speedup ** -0.5 - 1.1`` with speedups growing sublinearly in GPUs; a fifth of the
    entries forbidden; capacity one type's largest configuration (contended)."""
    rng = np.random.default_rng(seed)
    kind: list[int] = []
    size: list[int] = []
    capacity = np.zeros(num_types)
    for t in range(num_types):
        per_node, nodes = int(rng.choice([2, 4, 8])), int(rng.integers(1, max_nodes + 1))
        sizes = [*range(1, per_node), *(per_node * k for k in range(1, nodes + 1))]
        kind += [t] * len(sizes)
        size += sizes
        capacity[t] = per_node * nodes
    k, s = np.array(kind), np.array(size, dtype=np.float64)
    speed = rng.uniform(0.3, 3.0, (num_jobs, num_types))[:, k]
    values = (speed * s[None, :] ** rng.uniform(0.2, 0.9, (num_jobs, 1))) ** -0.5 - 1.1
    values[rng.random(values.shape) < 0.2] = np.inf
    forced = np.full(num_jobs, -1)
    for i in np.flatnonzero(rng.random(num_jobs) < forced_share):
        allowed = np.flatnonzero(np.isfinite(values[i]) & (s <= capacity[k] / 2))
        if allowed.size:
            forced[i] = int(rng.choice(allowed))
    return values, k, s, capacity, forced


def check_feasible(chosen: np.ndarray, inst: Instance) -> None:
    values, kind, size, capacity, forced = inst
    on = chosen >= 0
    assert np.isfinite(values[np.flatnonzero(on), chosen[on]]).all()
    used = np.bincount(kind[chosen[on]], weights=size[chosen[on]], minlength=len(capacity))
    assert (used <= capacity + 1e-9).all()
    forced_rows = np.flatnonzero(forced >= 0)
    forced_use = np.bincount(kind[forced[forced_rows]], weights=size[forced[forced_rows]],
                             minlength=len(capacity))
    if (forced_use <= capacity).all():  # forcing that fits is kept
        assert (chosen[forced_rows] == forced[forced_rows]).all()


def brute_force(inst: Instance) -> float:
    values, kind, size, capacity, forced = inst
    rows = np.flatnonzero(forced >= 0)
    if (np.bincount(kind[forced[rows]], weights=size[forced[rows]], minlength=len(capacity))
            > capacity).any():  # the solvers' rule: forcing that cannot fit is dropped
        rows = rows[:0]
    best = np.inf
    options = [range(-1, values.shape[1])] * values.shape[0]
    for chosen in itertools.product(*options):
        c = np.array(chosen)
        on = c >= 0
        if not np.isfinite(values[np.flatnonzero(on), c[on]]).all():
            continue
        if (np.bincount(kind[c[on]], weights=size[c[on]], minlength=len(capacity))
                > capacity).any():
            continue
        if rows.size and not (c[rows] == forced[rows]).all():
            continue
        best = min(best, objective_value(values, c))
    return best


def lp_bound(inst: Instance) -> float:
    """What dropping the (at most one per type) jobs the relaxation splits can cost."""
    values = inst[0]
    per_job = np.where(np.isfinite(values), np.minimum(values, 0.0), 0.0).min(axis=1)
    return len(inst[3]) * float(-per_job.min(initial=0.0))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 3), st.integers(1, 2))
@example(4832, 3, 1)  # forced jobs that together exceed the capacity: forcing dropped
def test_exact_matches_brute_force(seed: int, num_jobs: int, num_types: int) -> None:
    inst = instance(seed, num_jobs, num_types, forced_share=0.3, max_nodes=2)
    chosen = solve_exact(*inst, mip_rel_gap=1e-9)
    check_feasible(chosen, inst)
    assert objective_value(inst[0], chosen) == pytest.approx(brute_force(inst), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 40), st.integers(1, 3),
       st.sampled_from([0.0, 0.2]), st.sampled_from([0, 10**6]))
def test_fast_is_feasible_and_near_the_optimum(seed: int, num_jobs: int, num_types: int,
                                               forced_share: float, max_lp: int) -> None:
    """Both paths (prices: max_lp 0; relaxation: 10**6) are feasible, keep forced jobs,
    and lose at most what dropping one job per type can cost."""
    inst = instance(seed, num_jobs, num_types, forced_share)
    chosen = solve_fast(*inst, max_lp_entries=max_lp)
    check_feasible(chosen, inst)
    exact = objective_value(inst[0], solve_exact(*inst, mip_rel_gap=1e-9))
    assert objective_value(inst[0], chosen) <= exact + lp_bound(inst) + 1e-9


@pytest.mark.parametrize(("max_lp", "mean_gap", "p90_gap"), [(10**6, 0.005, 0.01),
                                                              (0, 0.01, 0.02)])
def test_fast_gap_on_random_instances(max_lp: int, mean_gap: float, p90_gap: float) -> None:
    """Relative gap to the exact optimum over 80 seeded instances of 5-40 jobs, 1-3 types
    (measured: relaxation mean 0.1%, p90 0.2%; prices mean 0.4%, p90 1.1%)."""
    gaps = []
    for seed in range(80):
        inst = instance(seed, 5 + seed % 36, 1 + seed % 3)
        exact = objective_value(inst[0], solve_exact(*inst, mip_rel_gap=1e-9))
        fast = objective_value(inst[0], solve_fast(*inst, max_lp_entries=max_lp))
        gaps.append((fast - exact) / abs(exact))
    assert min(gaps) >= -1e-9
    assert np.mean(gaps) <= mean_gap
    assert np.percentile(gaps, 90) <= p90_gap


def test_forcing_that_cannot_fit_is_dropped() -> None:
    values = np.array([[-1.0, -2.0], [-1.0, -2.0]])
    kind, size, capacity = np.array([0, 0]), np.array([1.0, 2.0]), np.array([2.0])
    forced = np.array([1, 1])  # 4 GPUs forced on 2
    for solve in (solve_exact, solve_fast):
        chosen = solve(values, kind, size, capacity, forced)
        assert objective_value(values, chosen) == pytest.approx(-2.0)


def test_a_forced_job_keeps_a_losing_entry() -> None:
    values = np.array([[5.0, -1.0]])
    for solve in (solve_exact, solve_fast):
        chosen = solve(values, [0, 0], [1, 2], [2], forced=[0])
        assert chosen.tolist() == [0]


@pytest.mark.parametrize(("args", "field"), [
    (([1.0, 2.0], [0], [1], [1]), "values"),
    (([[1.0, 2.0]], [0], [1, 1], [1]), "kind/size"),
    (([[1.0, 2.0]], [0, 3], [1, 1], [1]), "kind"),
    (([[np.nan, 2.0]], [0, 0], [1, 1], [1]), "values"),
    (([[1.0, np.inf]], [0, 0], [1, 1], [1], [1]), "forced"),
])
def test_bad_input_names_the_field(args: tuple, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as error:
        solve_fast(*args)
    assert error.value.field == field


def test_highs_prints_nothing_to_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    """HiGHS printf()s a debug line on this instance (seed 2) unless silenced."""
    solve_exact(*instance(2, 7, 3), mip_rel_gap=1e-9)
    assert capfd.readouterr().out == ""


def test_solves_in_two_threads_leave_stdout_working(capfd: pytest.CaptureFixture[str]
                                                    ) -> None:
    """The second thread to silence stdout saved the first one's /dev/null and put it
    back last: stdout stayed silenced for the rest of the process."""
    import os
    import threading
    import time

    from pollux.policies.assignment import _highs_printf_silenced

    def hold(delay_s: float, hold_s: float) -> None:
        time.sleep(delay_s)
        with _highs_printf_silenced():
            time.sleep(hold_s)

    threads = [threading.Thread(target=hold, args=(0.0, 0.2)),
               threading.Thread(target=hold, args=(0.05, 0.3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.write(1, b"still here\n")
    assert capfd.readouterr().out == "still here\n"
