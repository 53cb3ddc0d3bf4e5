"""Plugin specs: a registered name with options, ``name(key=value,...)``.

    pollux(p=-0.5,exploration_factor=4)       -> ("pollux", {"p": -0.5, "exploration_factor": 4})
    sia,pollux(p=-0.5,move_discount=both)     -> two specs (commas inside parentheses kept)

Values are read without evaluating anything: integers, floats (``1e-3``, ``inf``),
``true``/``false``, ``none``, quoted strings (``'a,b'``), and bare words as strings.
:func:`format_spec` writes the canonical form back, so a spec read and written again is
the same text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum

from pollux.errors import ConfigError

OptionValue = int | float | bool | str | None
"""What an option may hold."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BARE = re.compile(r"[A-Za-z0-9_.+-]+")
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|nan)",
                    re.IGNORECASE)
_WORDS: Mapping[str, OptionValue] = {"true": True, "false": False, "none": None}
FIX = "write NAME or NAME(key=value,...), e.g. pollux(p=-0.5,exploration_factor=4)"


def split_specs(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses and quotes; empty items dropped."""
    items, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise ConfigError("policy", text, f"')' without '(' at {i + 1}; {FIX}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth or quote:
        raise ConfigError("policy", text, f"unclosed {'quote' if quote else '('}; {FIX}")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def parse_value(text: str) -> OptionValue:
    """One option value (see the module docstring); never evaluates code."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.lower() in _WORDS:
        return _WORDS[text.lower()]
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if _BARE.fullmatch(text):
        return text
    raise ConfigError("option value", text,
                      "use a number, true/false, none, a word, or a quoted string")


def parse_spec(text: str) -> tuple[str, dict[str, OptionValue]]:
    """``name(key=value,...)`` -> (name, options in the order written)."""
    text = text.strip()
    name, paren, rest = text.partition("(")
    name = name.strip()
    if not _NAME.fullmatch(name) or (paren and not rest.endswith(")")):
        raise ConfigError("policy", text, FIX)
    options: dict[str, OptionValue] = {}
    for item in split_specs(rest[:-1]) if paren else []:
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or not _KEY.fullmatch(key):
            raise ConfigError("policy", text, f"option {item!r} is not key=value; {FIX}")
        if key in options:
            raise ConfigError("policy", text, f"option {key!r} is given twice; keep one")
        options[key] = parse_value(value)
    return name, options


def format_value(value: object) -> str:
    """The spec text of one option value (read back by :func:`parse_value` as an equal value)."""
    if isinstance(value, Enum):
        value = value.value
    if value is None or isinstance(value, bool):
        return {None: "none", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    text = str(value)
    plain = _BARE.fullmatch(text) and isinstance(parse_value(text), str)
    return text if plain else "'" + text.replace("'", "") + "'"


def format_spec(name: str, options: Mapping[str, object]) -> str:
    """The canonical spec: ``name`` alone, or ``name(key=value,...)`` in the given order."""
    if not options:
        return name
    return f"{name}({','.join(f'{k}={format_value(v)}' for k, v in options.items())})"
