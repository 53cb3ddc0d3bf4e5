"""The one exception hierarchy of Pollux.

PolluxError
  +-- ConfigError (ValueError)        bad input: names the field, the value and the fix
  |     +-- WorkloadError              a workload or trace file is malformed (file, line, field)
  |     +-- JobSpecError               a job specification is invalid
  +-- UnknownPluginError (KeyError)   a policy/backend/optimizer name that is not registered
  +-- FitWarning (UserWarning)        a throughput fit that did not converge cleanly

Every ``ConfigError`` is also a ``ValueError`` so callers that only know the standard
library can still catch it.
"""

from __future__ import annotations

from collections.abc import Iterable


class PolluxError(Exception):
    """Base class of every error raised by Pollux on purpose."""


class ConfigError(PolluxError, ValueError):
    """Bad input: the message names the offending field, its value and the fix."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(f"invalid {field}={value!r}: {fix}")


class WorkloadError(PolluxError, ValueError):
    """A workload or trace file is malformed; the message names file, line and field."""

    def __init__(self, path: str, line: int | None, field: str, message: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: field '{field}': {message}")


class JobSpecError(ConfigError):
    """A job specification is invalid."""


class UnknownPluginError(PolluxError, KeyError):
    """A plugin name (policy, backend, ...) that is not registered."""

    def __init__(self, kind: str, name: str, choices: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.choices = sorted(choices)
        self.message = f"unknown {kind} {name!r}; choose from: {', '.join(self.choices)}"
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.message


class FitWarning(UserWarning):
    """A throughput fit that failed or produced non-finite values (best finite kept)."""
