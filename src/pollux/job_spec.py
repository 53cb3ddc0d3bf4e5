"""What a user submits: the job specification, parsed and validated from YAML or flags.

Every invalid field raises :class:`~pollux.errors.JobSpecError` naming the field, the
value and the fix. ``JobSpec.to_dict()`` and ``JobSpec.from_dict()`` round-trip, so the
store keeps specs as JSON. Each field declares its description and bounds once
(:class:`FieldRule`): the checks here and the API's published JSON schema read them.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from pollux.errors import JobSpecError
from pollux.resources import CPU, GPU, MEMORY
from pollux.teams import MAX_PRIORITY, MIN_PRIORITY

END = r"(?![\s\S])"
"""End of the text, in Python's ``re`` and in ECMA-262 (JSON Schema's patterns) alike:
Python's ``$`` also matches before a final newline."""
NAME_REGEX = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}" + END
ENV_NAME_REGEX = r"^[A-Za-z_][A-Za-z0-9_]*" + END
WORKING_DIR_REGEX = r"^/[^\x00-\x1f\x7f]*" + END
"""An absolute path without control characters."""
NO_NUL = {"not": {"pattern": r"\x00"}}
"""A string without NUL characters, as a JSON schema (linear for any validator)."""
NAME_PATTERN = re.compile(NAME_REGEX)
ENV_NAME_PATTERN = re.compile(ENV_NAME_REGEX)
RESERVED_ENV_PREFIX = "POLLUX_"
MEMORY_UNITS: dict[str, float] = {
    "": 1.0, "b": 1.0, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
    "t": 1e12, "tb": 1e12, "ki": 2.0**10, "kib": 2.0**10, "mi": 2.0**20, "mib": 2.0**20,
    "gi": 2.0**30, "gib": 2.0**30, "ti": 2.0**40, "tib": 2.0**40,
}
MEMORY_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*$")
MEMORY_REGEX = (r"^\s*[0-9]+(\.[0-9]*)?\s*(("
                + "|".join("".join(f"[{c.upper()}{c}]" for c in unit)
                           for unit in sorted(MEMORY_UNITS, key=len, reverse=True) if unit)
                + r")\s*)?" + END)
"""What :data:`MEMORY_PATTERN` matches with a known unit (any case), as one pattern."""
MAX_MEMORY_BYTES = float(2**60)
"""The most memory a replica may ask for (1 EiB)."""
MAX_COUNT = 10**6
"""The largest replica or failure count a spec may give."""
MAX_SPEC_NUMBER = 1e9
"""The largest resource amount or delay a spec may give."""


@dataclass(frozen=True)
class FieldRule:
    """How one field of a spec reads from JSON or YAML. The validation below and the
    published JSON schema (:func:`pollux.service.http.openapi.spec_schema`) are both made
    from these, with the field's type and default."""

    description: str
    key: str | None = None
    """Its JSON key when that is not the attribute's name."""
    lowest: float | None = None
    highest: float | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    """A string's form, one regular expression for Python and JSON Schema alike."""
    json_form: Mapping[str, Any] | None = None
    """Its JSON schema where its JSON forms are wider than its type (a command: a string
    or a list)."""
    examples: tuple[Any, ...] = ()


def spec_field(description: str, default: Any = MISSING, **rule: Any) -> Any:
    """A dataclass field with its :class:`FieldRule`; a dict or a class default is a
    factory."""
    metadata = {"rule": FieldRule(description, **rule)}
    if isinstance(default, dict) or isinstance(default, type):
        return field(default_factory=default if isinstance(default, type) else dict,
                     metadata=metadata)
    return field(default=default, metadata=metadata)


def rules_of(cls: type) -> Mapping[str, FieldRule]:
    """Attribute name -> rule, for a dataclass declared with :func:`spec_field`."""
    return MappingProxyType({f.name: f.metadata["rule"] for f in fields(cls)})


@dataclass(frozen=True)
class ReplicaResources:
    """Resources each replica needs. ``gpu`` is the device slot: a GPU, or a CPU slot
    on a backend without GPUs."""

    gpu: float = spec_field("Device slots per replica: GPUs, or CPU slots on a backend "
                            "without GPUs.", 1.0, lowest=0.0, highest=MAX_SPEC_NUMBER)
    cpu: float = spec_field("CPUs per replica.", 1.0, lowest=0.0, highest=MAX_SPEC_NUMBER)
    memory_bytes: float = spec_field(
        "Bytes, or a size with a unit: '2GiB', '512M'.", 0.0, key="memory",
        json_form={"oneOf": [{"type": "number", "minimum": 0, "maximum": int(MAX_MEMORY_BYTES)},
                             {"type": "string", "pattern": MEMORY_REGEX}]})

    def as_policy_resources(self) -> dict[str, float]:
        """The resource mapping a policy's ``JobInfo.resources`` expects (zeros left out,
        so a job asking nothing of a resource fits nodes that do not declare it)."""
        amounts = {GPU: self.gpu, CPU: self.cpu, MEMORY: self.memory_bytes}
        return {name: amount for name, amount in amounts.items() if amount > 0}


@dataclass(frozen=True)
class JobSpec:
    """A training job: the command each replica runs and how far it may scale. Field
    names are the YAML/JSON keys; unknown fields are refused."""

    name: str = spec_field("Human name; the job id is <name>-<sequence number>.",
                           pattern=NAME_REGEX, examples=("digits",))
    command: tuple[str, ...] = spec_field(
        "Command line each replica runs: a string split like a shell would, or an argv "
        "list (no shell).", examples=(["python", "train.py", "--epochs", "20"],),
        json_form={"oneOf": [
            {"type": "string", "pattern": r"[^ \t\r\n]", **NO_NUL},
            {"type": "array", "minItems": 1, "items": {"type": "string", **NO_NUL},
             "prefixItems": [{"type": "string", "minLength": 1, **NO_NUL}]}]})
    working_dir: str = spec_field("Absolute directory the replicas start in.",
                                  pattern=WORKING_DIR_REGEX, examples=("/home/me/project",))
    env: Mapping[str, str] = spec_field(
        "Extra environment variables; POLLUX_* names are reserved.", {},
        json_form={"type": "object",
                   "propertyNames": {"pattern": ENV_NAME_REGEX,
                                     "not": {"pattern": f"^{RESERVED_ENV_PREFIX}"}},
                   "additionalProperties": {"anyOf": [
                       {"type": "string", **NO_NUL}, {"type": "number"}]}})
    resources: ReplicaResources = spec_field(
        "What each replica needs; a replica needs gpu > 0 or cpu > 0.", ReplicaResources)
    min_replicas: int = spec_field("Fewest replicas the job runs with.", 1, lowest=0,
                                   highest=MAX_COUNT)
    max_replicas: int = spec_field("Most replicas the job runs with; at least "
                                   "min_replicas.", 1, lowest=1, highest=MAX_COUNT)
    preemptible: bool = spec_field("False: once running, the job keeps its allocation "
                                   "until it ends.", True)
    restart_delay_s: float = spec_field(
        "Seconds a (re)start costs the job; the policy weighs rescales against it.", 30.0,
        lowest=0.0, highest=MAX_SPEC_NUMBER)
    max_failures: int = spec_field(
        "Replica failures tolerated (each restarts the job from its checkpoint); one more "
        "and the job is Failed.", 3, lowest=0, highest=MAX_COUNT)
    on_corrupt_checkpoint: str = spec_field(
        "When every checkpoint is corrupt: fail at once with the reason, or start over "
        "(set them aside).", "fail", choices=("fail", "fresh"))
    priority: int = spec_field(
        "Order within the job's team: when the team must shrink, its jobs of lower "
        "priority shrink first.", 0, lowest=MIN_PRIORITY, highest=MAX_PRIORITY)

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
            "priority": self.priority,
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
        for required in REQUIRED_FIELDS:
            if data.get(required) is None:
                raise JobSpecError(required, None, "this field is required")
        rules = SPEC_RULES
        min_replicas = _integer(data, "min_replicas", cls.min_replicas, rules["min_replicas"])
        max_replicas = _integer(data, "max_replicas", max(cls.max_replicas, min_replicas),
                                rules["max_replicas"])
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
            preemptible=_boolean(data, "preemptible", cls.preemptible),
            restart_delay_s=_number(data, "restart_delay_s", cls.restart_delay_s,
                                    rules["restart_delay_s"]),
            max_failures=_integer(data, "max_failures", cls.max_failures,
                                  rules["max_failures"]),
            on_corrupt_checkpoint=_choice(data, "on_corrupt_checkpoint",
                                          rules["on_corrupt_checkpoint"].choices),
            priority=_integer(data, "priority", cls.priority, rules["priority"]),
        )

    @classmethod
    def from_yaml(cls, text: str, source: str = "job spec") -> JobSpec:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise JobSpecError(source, None, f"not valid YAML ({exc})") from exc
        return cls.from_dict(data)


SPEC_RULES = rules_of(JobSpec)
RESOURCE_RULES = rules_of(ReplicaResources)
SPEC_FIELDS: tuple[str, ...] = tuple(rule.key or name for name, rule in SPEC_RULES.items())
REQUIRED_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(JobSpec) if f.default is MISSING and f.default_factory is MISSING)
RESOURCE_FIELDS: tuple[str, ...] = tuple(rule.key or name
                                         for name, rule in RESOURCE_RULES.items())
ON_CORRUPT_CHECKPOINT_CHOICES: tuple[str, ...] = SPEC_RULES["on_corrupt_checkpoint"].choices
"""When every checkpoint is corrupt: fail with the reason (default) or start over."""
MAX_ENV_BYTES = 128 << 10
"""Most bytes of the job's environment (``NAME=value`` strings) and, separately, of its
command line: beyond, exec fails with E2BIG (Linux allows 128 KiB per string)."""
MAX_ENV_NUMBER_DIGITS = 4000
"""Digits an ``env`` value given as a number may have (Python prints at most 4,300)."""


def _field_name(key: Any) -> str:
    """A key as a field name; odd keys (empty, not strings) quoted so they show."""
    return key if isinstance(key, str) and key.strip() == key and key else repr(key)


def _name(value: Any) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
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
    gpu = _number(value, "gpu", ReplicaResources.gpu, RESOURCE_RULES["gpu"], "resources.")
    cpu = _number(value, "cpu", ReplicaResources.cpu, RESOURCE_RULES["cpu"], "resources.")
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


def _integer(data: Mapping[str, Any], key: str, default: int, rule: FieldRule) -> int:
    lowest, highest = int(rule.lowest or 0), int(rule.highest or 0)
    value = data.get(key)
    if value is None:
        return default
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and (not math.isfinite(value)
                                              or value != int(value)))):
        raise JobSpecError(key, _shown(value), "give a whole number")
    if value < lowest or value > highest:  # exact for ints of any size (no float overflow)
        raise JobSpecError(key, _shown(value), f"must be between {lowest} and {highest}")
    return int(value)


def _number(data: Mapping[str, Any], key: str, default: float, rule: FieldRule,
            prefix: str = "") -> float:
    lowest, highest = float(rule.lowest or 0.0), float(rule.highest or 0.0)
    fix = f"must be a finite number in [{lowest}, {highest:.0e}]".replace("e+0", "e")
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise JobSpecError(prefix + key, value, "give a number")
    number = _as_float(value, prefix + key, fix)
    if not math.isfinite(number) or number < lowest or number > highest:
        raise JobSpecError(prefix + key, _shown(value), fix)
    return number


def _boolean(data: Mapping[str, Any], key: str, default: bool) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise JobSpecError(key, value, "give true or false")
    return value
