"""No measured figure in a docstring: measurements belong to the research pages, written
by the bench scripts (docs/research/results/), where they can be regenerated; a docstring
says what the code does, and stays true when the machine or the workload changes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "pollux"

MEASURED = re.compile(
    r"(?<![\w.])[+-]?\d[\d,]*\.\d+\s?(?:s|ms|h|%|x|CPU-s|GB|MB)(?![\w])"  # 2,269.9 s, 1.6x
    r"|(?<![\w.])[+-]\d+(?:\.\d+)?%"  # +6%, -31%
    r"|(?<![\w.])~?\d[\d,]*\s?(?:ms|CPU-s)(?![\w])"  # 15 ms, 725 CPU-s
    r"|\d+(?:\.\d+)?%\s+(?:fewer|less|more|faster|slower|cheaper|dearer|lower|higher)\b"
    r"|\d+(?:-\d+)?%\s+of\s+a\s+step")
"""A measurement: a decimal with a unit, a signed percentage, a time in ms or CPU-s, or a
percentage compared ("27% fewer"); settings ("5%" as a default, "60 s" rounds) pass."""


def docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string statement in ``path``: module, class, function and
    attribute docstrings."""
    tree = ast.parse(path.read_text())
    return [(node.lineno, node.value.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)]


def test_the_pattern_finds_measurements_and_passes_settings():
    for measured in ("0.895x Sia's average JCT", "p99 +0.9%", "about 1.6x faster",
                     "HiGHS takes ~15 ms", "27% fewer node-hours", "2,269.9 s pooled",
                     "5-11% of a step"):
        assert MEASURED.search(measured), measured
    for setting in ("min_goodput_gain, 5%", "60 s rounds", "rounded to 1%", "16 x 4 GPUs",
                    "at most 0.9 times", "exit code 75", "every 30 s"):
        assert not MEASURED.search(setting), setting


def test_no_measured_figure_in_a_docstring():
    found = [f"{path.relative_to(SRC.parent)}:{line}: {match.group()!r}"
             for path in sorted(SRC.rglob("*.py")) for line, text in docstrings(path)
             for match in MEASURED.finditer(text)]
    assert not found, "measured figures in docstrings (move them to a bench result):\n" \
        + "\n".join(found)


def test_no_docstring_points_outside_the_repository():
    """The API reference renders the docstrings: like the docs, they point at the docs
    (docs/research/data.md says where the artifacts come from), never into ``../``."""
    found = [f"{path.relative_to(SRC.parent)}:{line}" for path in sorted(SRC.rglob("*.py"))
             for line, text in docstrings(path) if "../shared" in text]
    assert not found, found
