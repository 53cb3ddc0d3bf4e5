"""Running many simulations: task order, one load per key, worker processes."""

from __future__ import annotations

from pollux.sim.runner import run_each


def _scaled(task: int, index: int, factor: int | None) -> int:
    """A task for run_each: its value times the loaded factor (10 when loaded in a
    worker, where nothing is passed)."""
    return task * (10 if factor is None else factor) + index


def test_run_each_keeps_task_order_loads_once_and_runs_in_processes() -> None:
    loads: list[int] = []

    def load(task: int) -> int:
        loads.append(task)
        return 100

    seen: list[int] = []
    assert run_each([3, 1, 3, 2], _scaled, load, lambda task: task % 2, 1,
                    seen.append) == [300, 101, 302, 203]
    assert loads == [3, 2] and seen == [300, 101, 302, 203]  # one load per key
    seen.clear()
    assert run_each([3, 1, 2], _scaled, load, lambda task: 0, 2, seen.append) == [30, 11, 22]
    assert sorted(seen) == [11, 22, 30] and loads == [3, 2]  # workers load their own
