"""A griffe extension for the API reference: the package's docstrings are reST-flavoured
prose (``code``, ``>>>`` examples, ``::`` literal blocks); this makes them Markdown that
renders as the reader expects, without touching the source.

- a run of ``>>>``/``...`` lines with the output after it becomes a ``pycon`` code block;
- a paragraph ending in ``::`` followed by an indented block becomes a code block;
- ````code```` becomes ```code```; ``:mod:`x```, ``:class:`x```, ``:func:`x``` and
  ``:meth:`x``` become ```x```.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|obj|exc):`~?([^`]+)`")
DOUBLE = re.compile(r"``([^`]+)``")


def _doctests(lines: list[str]) -> list[str]:
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        stripped = line.lstrip()
        if not stripped.startswith(">>>"):
            out.append(line)
            index += 1
            continue
        indent = line[: len(line) - len(stripped)]
        block = []
        while index < len(lines) and lines[index].strip():
            block.append(lines[index][len(indent):] if lines[index].startswith(indent)
                         else lines[index].strip())
            index += 1
        out += ["```pycon", *block, "```"]
    return out


def _literal_blocks(lines: list[str]) -> list[str]:
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.rstrip().endswith("::") and not line.strip().startswith(">>>"):
            text = line.rstrip()[:-1]  # "sample::" -> "sample:"
            out.append(text if text.strip() != ":" else "")
            index += 1
            while index < len(lines) and not lines[index].strip():
                index += 1
            base = len(line) - len(line.lstrip())
            block = []
            while index < len(lines) and (not lines[index].strip()
                                          or len(lines[index]) - len(lines[index].lstrip()) > base):
                block.append(lines[index])
                index += 1
            while block and not block[-1].strip():
                block.pop()
            if block:
                cut = min(len(b) - len(b.lstrip()) for b in block if b.strip())
                out += ["", "```python", *(b[cut:] for b in block), "```", ""]
            continue
        out.append(line)
        index += 1
    return out


def markdown(text: str) -> str:
    """``text``, a docstring, as Markdown."""
    lines = _literal_blocks(_doctests(text.splitlines()))
    fenced = False
    result = []
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        result.append(line if fenced else DOUBLE.sub(r"`\1`", ROLE.sub(r"`\1`", line)))
    return "\n".join(result)


class ReSTToMarkdown(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
