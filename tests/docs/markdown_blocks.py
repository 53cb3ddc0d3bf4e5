"""The fenced code blocks of a docs page, in order, as the tests run them.

A block opened with a title (```` ```python title="train.py" ````) is a file the reader
saves under that name; a ``bash`` block without a title is a command the reader runs. A
block right after a line ``<!-- not run: REASON -->`` is shown but not run (it needs a
cluster, a GPU, or more time than a test may take); every other block is run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r'^```(\w+)(?:\s+title="([^"]+)")?\s*$')
NOT_RUN = re.compile(r"^<!-- not run: .+ -->$")


@dataclass(frozen=True)
class Block:
    language: str
    title: str | None
    text: str
    line: int
    """1-based line of the opening fence."""
    run: bool


def blocks(path: Path) -> list[Block]:
    """Every fenced block of the Markdown file ``path``."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        start = index
        index += 1
        body = []
        while not lines[index].startswith("```"):
            body.append(lines[index])
            index += 1
        previous = lines[start - 1].strip() if start else ""
        found.append(Block(match.group(1), match.group(2), "\n".join(body) + "\n", start + 1,
                           run=NOT_RUN.match(previous) is None))
        index += 1
    return found


def write_files(page: list[Block], directory: Path) -> None:
    """Save every titled block of ``page`` under its title in ``directory``."""
    for block in page:
        if block.title is not None:
            (directory / block.title).write_text(block.text)


def script(page: list[Block]) -> str:
    """The page's commands as one bash script (every untitled bash block that runs)."""
    commands = [f"# line {b.line}\n{b.text}" for b in page
                if b.language == "bash" and b.title is None and b.run]
    return "set -euo pipefail\n" + "\n".join(commands)
