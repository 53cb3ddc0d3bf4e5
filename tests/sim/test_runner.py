"""Running many simulations: task order, one load per key, worker processes."""

from __future__ import annotations

import os
import time

from pollux.sim.runner import run_each


def _scaled(task: int, index: int, factor: int | None) -> int:
    """A task for run_each: its value times the loaded factor plus its index."""
    assert factor is not None
    return task * factor + index


def _load_token(task: int) -> tuple[int, int]:
    """What a worker loads: its pid and a unique stamp (one per load)."""
    return os.getpid(), time.perf_counter_ns()


def _with_token(task: int, index: int, token: tuple[int, int] | None) -> tuple[int, int, int]:
    assert token is not None
    time.sleep(0.01)  # long enough that both workers take tasks
    return task + index, *token


def _key_by_parity(task: int) -> int:
    return task % 2


def test_run_each_keeps_task_order_and_loads_once_per_key() -> None:
    loads: list[int] = []

    def load(task: int) -> int:
        loads.append(task)
        return 100

    seen: list[int] = []
    assert run_each([3, 1, 3, 2], _scaled, load, _key_by_parity, 1,
                    seen.append) == [300, 101, 302, 203]
    assert loads == [3, 2] and seen == [300, 101, 302, 203]  # one load per key


def test_run_each_in_processes_loads_each_key_once_per_worker() -> None:
    tasks = list(range(12))
    seen: list[tuple[int, int, int]] = []
    out = run_each(tasks, _with_token, _load_token, _key_by_parity, 2, seen.append)
    assert [value for value, _, _ in out] == [2 * t for t in tasks]  # task order kept
    assert sorted(seen) == sorted(out)
    pids = {pid for _, pid, _ in out}
    assert os.getpid() not in pids  # ran in workers
    loads = {(pid, stamp) for _, pid, stamp in out}
    # each worker loaded each key at most once: at most 2 loads per worker, 12 tasks
    assert len(loads) <= 2 * len(pids) < len(tasks)
