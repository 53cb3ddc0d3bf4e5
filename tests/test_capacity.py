"""Resource arithmetic (pollux.capacity): one tolerance, one place.

The tolerance absorbs float rounding (three replicas of 0.1 GPU fill 0.3 GPU) and no
more: a thousandth of a GPU too many is refused. Every comparison of resources in the
policies and the drivers goes through this module's tolerance (checked below by
reading the package for a literal ``1e-9`` outside it)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import pollux
from pollux.capacity import RESOURCE_TOLERANCE, fits, subtract, with_slack

FREE = {"a": {"gpu": 1.0, "cpu": 4.0}, "b": {"gpu": 2.0}}


def test_rounding_fits_and_a_real_excess_does_not() -> None:
    tenth = {"gpu": 0.1}
    free = {"a": {"gpu": 0.3}}
    assert subtract(free, [(("a",) * 3, tenth)])["a"]["gpu"] < 0  # what the slack is for
    assert fits(free, ("a",) * 3, tenth)
    assert not fits(free, ("a",) * 3, {"gpu": 0.1001})
    assert not fits(free, ("a",) * 4, tenth)
    assert fits(FREE, ("a",) * 10, tenth)


def test_replicas_count_once_each_and_unknown_nodes_never_fit() -> None:
    left = subtract(FREE, [(("a", "b", "b"), {"gpu": 1.0, "cpu": 1.0}),
                           (("missing",), {"gpu": 1.0})])
    assert left == {"a": {"gpu": 0.0, "cpu": 3.0}, "b": {"gpu": 0.0, "cpu": -2.0}}
    assert not fits(FREE, ("missing",), {"gpu": 0.0})
    assert FREE["a"] == {"gpu": 1.0, "cpu": 4.0}  # not modified


def test_slack_is_relative_and_absolute_for_floats_and_arrays() -> None:
    memory = 192e9
    assert 192e9 + 100.0 <= with_slack(memory)  # bytes: relative slack
    assert not 192e9 * (1 + 1e-8) <= with_slack(memory)
    assert with_slack(0.0) == RESOURCE_TOLERANCE
    assert np.array_equal(with_slack(np.array([0.0, 1.0])),
                          np.array([0.0, 1.0]) * (1 + RESOURCE_TOLERANCE) + RESOURCE_TOLERANCE)


NOT_RESOURCES = {
    # tolerances that compare no resource amounts: utilization, price, division guards,
    # time grids, batch bounds, optimizer gains
    "policies/autoscaling/typed.py", "policies/pollux/typed.py", "policies/pollux/exchange.py",
    "sim/fairness.py", "sim/lower_bound.py", "sim/adaptive.py", "models/goodput.py",
}


def test_no_other_module_writes_the_resource_tolerance() -> None:
    root = Path(pollux.__file__).parent
    found = sorted(str(path.relative_to(root)) for path in root.rglob("*.py")
                   if re.search(r"(?<![\w.])1e-9\b", path.read_text())
                   and path.name != "capacity.py")
    assert set(found) <= NOT_RESOURCES, sorted(set(found) - NOT_RESOURCES)
