"""What a user submits: the job specification, parsed and validated from YAML or flags.

Every invalid field raises :class:`~pollux.errors.JobSpecError` naming the field, the
value and the fix. ``JobSpec.to_dict()`` and ``JobSpec.from_dict()`` round-trip, so the
store keeps specs as JSON.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pollux.errors import JobSpecError
from pollux.resources import CPU, GPU, MEMORY

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV_PREFIX = "POLLUX_"
MEMORY_UNITS: dict[str, float] = {
    "": 1.0, "b": 1.0, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
    "t": 1e12, "tb": 1e12, "ki": 2.0**10, "kib": 2.0**10, "mi": 2.0**20, "mib": 2.0**20,
    "gi": 2.0**30, "gib": 2.0**30, "ti": 2.0**40, "tib": 2.0**40,
}
MEMORY_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*$")


@dataclass(frozen=True)
class ReplicaResources:
    """Resources each replica needs. ``gpu`` is the device slot: a GPU, or a CPU slot
    on a backend without GPUs."""

    gpu: float = 1.0
    cpu: float = 1.0
    memory_bytes: float = 0.0

    def as_policy_resources(self) -> dict[str, float]:
        """The resource mapping a policy's ``JobInfo.resources`` expects (zeros left out,
        so a job asking nothing of a resource fits nodes that do not declare it)."""
        amounts = {GPU: self.gpu, CPU: self.cpu, MEMORY: self.memory_bytes}
        return {name: amount for name, amount in amounts.items() if amount > 0}


@dataclass(frozen=True)
class JobSpec:
    """A job as submitted. Field names are the YAML/JSON keys."""

    name: str
    """Human name; the job id is ``<name>-<sequence number>``."""
    command: tuple[str, ...]
    """Command line each replica runs (argv, no shell)."""
    working_dir: str
    """Absolute directory the replicas start in."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables (names starting with POLLUX_ are reserved)."""
    resources: ReplicaResources = field(default_factory=ReplicaResources)
    min_replicas: int = 1
    max_replicas: int = 1
    preemptible: bool = True
    """False: once running, the job keeps its allocation until it ends."""
    restart_delay_s: float = 30.0
    """Seconds a (re)start costs the job; the policy weighs rescales against it."""
    max_failures: int = 3
    """Replica failures tolerated (each restarts the job from its checkpoint); one more
    and the job is Failed."""
    on_corrupt_checkpoint: str = "fail"
    """When every checkpoint of the job is corrupt: ``fail`` (at once, with the reason)
    or ``fresh`` (set them aside and start over)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": list(self.command),
            "working_dir": self.working_dir,
            "env": dict(self.env),
            "resources": {"gpu": self.resources.gpu, "cpu": self.resources.cpu,
                          "memory": self.resources.memory_bytes},
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "preemptible": self.preemptible,
            "restart_delay_s": self.restart_delay_s,
            "max_failures": self.max_failures,
            "on_corrupt_checkpoint": self.on_corrupt_checkpoint,
        }

    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        """Validate a JSON/YAML mapping; the first bad field raises JobSpecError."""
        if not isinstance(data, Mapping):
            raise JobSpecError("spec", type(data).__name__, "send a mapping (JSON object)")
        unknown = sorted((k for k in data if k not in SPEC_FIELDS), key=str)
        if unknown:
            raise JobSpecError(_field_name(unknown[0]), data[unknown[0]],
                               f"unknown field; valid fields: {', '.join(SPEC_FIELDS)}")
        for required in ("name", "command", "working_dir"):
            if data.get(required) is None:
                raise JobSpecError(required, None, "this field is required")
        min_replicas = _integer(data, "min_replicas", 1, lowest=0)
        max_replicas = _integer(data, "max_replicas", max(1, min_replicas), lowest=1)
        if max_replicas < min_replicas:
            raise JobSpecError("max_replicas", max_replicas,
                               f"must be >= min_replicas ({min_replicas})")
        return cls(
            name=_name(data["name"]),
            command=_command(data["command"]),
            working_dir=_working_dir(data["working_dir"]),
            env=_env(data.get("env")),
            resources=_resources(data.get("resources")),
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            preemptible=_boolean(data, "preemptible", True),
            restart_delay_s=_number(data, "restart_delay_s", 30.0, lowest=0.0),
            max_failures=_integer(data, "max_failures", 3, lowest=0),
            on_corrupt_checkpoint=_choice(data, "on_corrupt_checkpoint",
                                          ON_CORRUPT_CHECKPOINT_CHOICES),
        )

    @classmethod
    def from_yaml(cls, text: str, source: str = "job spec") -> JobSpec:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise JobSpecError(source, None, f"not valid YAML ({exc})") from exc
        return cls.from_dict(data)


SPEC_FIELDS: tuple[str, ...] = (
    "name", "command", "working_dir", "env", "resources", "min_replicas", "max_replicas",
    "preemptible", "restart_delay_s", "max_failures", "on_corrupt_checkpoint")
ON_CORRUPT_CHECKPOINT_CHOICES: tuple[str, ...] = ("fail", "fresh")
"""When every checkpoint is corrupt: fail with the reason (default) or start over."""
MAX_ENV_BYTES = 128 << 10
"""Most bytes of the job's environment (``NAME=value`` strings) and, separately, of its
command line: beyond, exec fails with E2BIG (Linux allows 128 KiB per string)."""
RESOURCE_FIELDS: tuple[str, ...] = ("gpu", "cpu", "memory")
MAX_MEMORY_BYTES = float(2**60)
"""The most memory a replica may ask for (1 EiB)."""
MAX_ENV_NUMBER_DIGITS = 4000
"""Digits an ``env`` value given as a number may have (Python prints at most 4,300)."""


def _field_name(key: Any) -> str:
    """A key as a field name; odd keys (empty, not strings) quoted so they show."""
    return key if isinstance(key, str) and key.strip() == key and key else repr(key)


def _name(value: Any) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise JobSpecError("name", value, "use 1-63 letters, digits, '.', '_' or '-', "
                                          "starting with a letter or digit")
    return value


def _command(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise JobSpecError("command", value, f"cannot split it ({exc})") from exc
    elif isinstance(value, (list, tuple)) and all(isinstance(a, str) for a in value):
        argv = list(value)
    else:
        raise JobSpecError("command", value, "give a string or a list of strings")
    if not argv or not argv[0]:
        raise JobSpecError("command", value, "must name a program to run")
    if any("\x00" in a for a in argv):
        raise JobSpecError("command", value, "must not contain NUL characters")
    size = sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in argv)
    if size > MAX_ENV_BYTES:
        raise JobSpecError("command", f"{size} bytes", f"must be at most {MAX_ENV_BYTES} "
                                                       "bytes; pass large inputs in a file")
    return tuple(argv)


def _working_dir(value: Any) -> str:
    if not isinstance(value, str) or not value or "\x00" in value:
        raise JobSpecError("working_dir", value, "give a directory path")
    if not Path(value).is_absolute():
        raise JobSpecError("working_dir", value, "give an absolute path "
                                                 "(the CLI makes relative paths absolute)")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise JobSpecError("working_dir", value, "must not contain newlines or other "
                                                 "control characters; rename the directory")
    return value


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise JobSpecError("env", value, "give a mapping of variable names to strings")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not ENV_NAME_PATTERN.fullmatch(key):
            raise JobSpecError(f"env.{_field_name(key)}", item, "variable names are letters, digits, "
                                                   "'_', not starting with a digit")
        if key.startswith(RESERVED_ENV_PREFIX):
            raise JobSpecError(f"env.{key}", item, "POLLUX_* variables are set by the "
                                                   "scheduler; rename it")
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise JobSpecError(f"env.{key}", item, "give a string (or a number)")
        if isinstance(item, int) and abs(item) >= 10**MAX_ENV_NUMBER_DIGITS:
            raise JobSpecError(f"env.{key}", _shown(item), "a number this long is refused; "
                                                         "quote it as a string")
        text = str(item)
        if "\x00" in text:
            raise JobSpecError(f"env.{key}", item, "must not contain NUL characters")
        env[key] = text
    size = sum(len(f"{k}={v}".encode("utf-8", "surrogatepass")) + 1 for k, v in env.items())
    if size > MAX_ENV_BYTES:
        raise JobSpecError("env", f"{size} bytes", f"must total at most {MAX_ENV_BYTES} bytes "
                                                   "(NAME=value strings); pass large values "
                                                   "in a file")
    return env


def _choice(data: Mapping[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = data.get(key)
    if value is None:
        return choices[0]
    if value not in choices:
        raise JobSpecError(key, value, f"choose {' or '.join(choices)}")
    return str(value)


def parse_memory(value: Any, field_name: str = "resources.memory") -> float:
    """Bytes from a number or a string with a unit (``"512MiB"``, ``"2G"``)."""
    if isinstance(value, bool):
        raise JobSpecError(field_name, value, "give bytes or a size like '2GiB'")
    if isinstance(value, (int, float)):
        number = _as_float(value, field_name, "must be a size between 0 and 1 EiB")
    elif isinstance(value, str) and (match := MEMORY_PATTERN.match(value)):
        unit = match.group(2).lower()
        if unit not in MEMORY_UNITS:
            raise JobSpecError(field_name, value, "unknown unit; use B, K, M, G, T, KiB, "
                                                  "MiB, GiB or TiB")
        number = _as_float(float(match.group(1)), field_name, "must be a size between 0 and 1 EiB")
        number *= MEMORY_UNITS[unit]
    else:
        raise JobSpecError(field_name, value, "give bytes or a size like '2GiB'")
    if not math.isfinite(number) or number < 0 or number > MAX_MEMORY_BYTES:
        raise JobSpecError(field_name, _shown(value), "must be a size between 0 and 1 EiB")
    return number


def _resources(value: Any) -> ReplicaResources:
    if value is None:
        return ReplicaResources()
    if not isinstance(value, Mapping):
        raise JobSpecError("resources", value, "give a mapping with gpu, cpu, memory")
    unknown = sorted((k for k in value if k not in RESOURCE_FIELDS), key=str)
    if unknown:
        raise JobSpecError(f"resources.{_field_name(unknown[0])}", value[unknown[0]],
                           f"unknown resource; valid: {', '.join(RESOURCE_FIELDS)}")
    gpu = _number(value, "gpu", 1.0, lowest=0.0, prefix="resources.")
    cpu = _number(value, "cpu", 1.0, lowest=0.0, prefix="resources.")
    if gpu == 0 and cpu == 0:
        raise JobSpecError("resources", dict(value), "a replica needs gpu > 0 or cpu > 0")
    memory = 0.0 if value.get("memory") is None else parse_memory(value["memory"])
    return ReplicaResources(gpu=gpu, cpu=cpu, memory_bytes=memory)


def _shown(value: Any) -> Any:
    """``value`` as an error message shows it: an int too long to print whole (Python
    prints at most 4,300 digits) is named by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**40:
        return f"an integer of about {int(abs(value).bit_length() * 0.30103) + 1} digits"
    return value


def _as_float(value: int | float, field_name: str, fix: str) -> float:
    """``value`` as a float; an int too large for one (309 digits or more) is refused,
    naming the field, instead of raising OverflowError."""
    try:
        return float(value)
    except OverflowError:
        raise JobSpecError(field_name, _shown(value), fix) from None


def _integer(data: Mapping[str, Any], key: str, default: int, lowest: int) -> int:
    value = data.get(key)
    if value is None:
        return default
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and (not math.isfinite(value)
                                              or value != int(value)))):
        raise JobSpecError(key, _shown(value), "give a whole number")
    if value < lowest or value > 10**6:  # exact for ints of any size (no float overflow)
        raise JobSpecError(key, _shown(value), f"must be between {lowest} and 1000000")
    return int(value)


def _number(data: Mapping[str, Any], key: str, default: float, lowest: float,
            prefix: str = "") -> float:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise JobSpecError(prefix + key, value, "give a number")
    number = _as_float(value, prefix + key, f"must be a finite number in [{lowest}, 1e9]")
    if not math.isfinite(number) or number < lowest or number > 1e9:
        raise JobSpecError(prefix + key, _shown(value),
                           f"must be a finite number in [{lowest}, 1e9]")
    return number


def _boolean(data: Mapping[str, Any], key: str, default: bool) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise JobSpecError(key, value, "give true or false")
    return value
