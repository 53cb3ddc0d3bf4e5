"""Scheduling hints: what a job's agent reports to the scheduler about itself.

The agent (``pollux.torch``) writes these as JSON; the service reads them to build the
job's speedup function for the policy. Pure data, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from dataclasses import field as dataclass_field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from pollux.errors import ConfigError
from pollux.models.efficiency import GradientStats
from pollux.models.goodput import GoodputFunction, check_batch_bounds
from pollux.models.speedup import SpeedupFunction
from pollux.models.throughput import ThroughputParams
from pollux.models.typed import (
    TypedGoodput,
    TypeProfile,
    profile_to_dict,
)
from pollux.resources import DEFAULT_GPU_TYPE

MAX_GPU_TYPE_CHARS = 100
MAX_TYPE_PROFILES = 64
"""Most GPU types one job's hints may carry a profile for."""

_REQUIRED = object()
"""Marker of a field with no default."""

MAX_HINT_BATCH_SIZE = 1 << 30
"""Largest batch size (total or per replica) hints may state."""
MAX_HINT_COUNT = 1 << 30
"""Largest count (replicas profiled, accumulation steps, epoch) hints may state."""
MAX_HINT_PROGRESS = 1e18
"""Largest statistical progress hints may state."""
MAX_THROUGHPUT_PARAM = 1e6
"""Largest value of a fitted step-time parameter (seconds, or seconds per sample)."""
MAX_GRADIENT_STAT = 1e30
"""Largest gradient statistic (sqr or var) hints may state."""


def _whole(key: str, raw: Any, lowest: int, highest: int) -> int:
    """A JSON integer (not a bool, float or string) in [lowest, highest]."""
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ConfigError(key, raw, "give a whole number (a JSON integer)")
    if not lowest <= raw <= highest:
        raise ConfigError(key, raw, f"must be between {lowest} and {highest}")
    return raw


def _real(key: str, raw: Any, lowest: float, highest: float) -> float:
    """A finite JSON number (not a bool or string) in [lowest, highest]."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ConfigError(key, raw, "give a number")
    try:
        value = float(raw)
    except OverflowError as exc:
        raise ConfigError(key, raw, f"must be between {lowest} and {highest}") from exc
    if not (math.isfinite(value) and lowest <= value <= highest):
        raise ConfigError(key, raw, f"must be a finite number between {lowest} and {highest}")
    return value


@dataclass(frozen=True)
class JobHints:
    """A job's self-report; JSON field names are those of this dataclass."""

    init_batch_size: int
    """Initial (smallest) total batch size, M0."""
    max_batch_size: int
    """Largest total batch size the job accepts."""
    local_bsz_bounds: tuple[int, int]
    """Smallest and largest per-replica atomic batch size."""
    accumulation: bool = True
    """Whether gradient accumulation is allowed."""
    throughput_params: ThroughputParams | None = None
    """Fitted step-time model; None before any profile exists."""
    grad_stats: GradientStats | None = None
    """Latest gradient statistics at the initial batch size; None before measured."""
    max_profiled_replicas: int = 0
    """Largest replica count the job has run with (bounds exploration)."""
    batch_size: int | None = None
    """Current total batch size."""
    local_bsz: int | None = None
    """Current atomic batch size."""
    accum_steps: int | None = None
    """Current gradient-accumulation steps."""
    epoch: int = 0
    """Current epoch."""
    progress: float = 0.0
    """Statistical progress so far (optimizer steps at the initial batch size)."""
    gpu_type: str | None = None
    """GPU type the job runs on now (the agent's device name); None: not reported."""
    type_profiles: Mapping[str, TypeProfile] = dataclass_field(
        default_factory=lambda: MappingProxyType({}))
    """GPU type -> the job's step-time model there, for every type it has run on. Hints
    without it (older agents) have one profile: ``throughput_params`` on ``gpu_type``."""

    def __post_init__(self) -> None:
        if self.gpu_type is not None:
            check_gpu_type("gpu_type", self.gpu_type)
        for name, profile in dict(self.type_profiles).items():
            check_gpu_type("type_profiles", name)
            if not isinstance(profile, TypeProfile):
                raise ConfigError(f"type_profiles[{name!r}]", profile, "use a TypeProfile")
        object.__setattr__(self, "type_profiles", MappingProxyType(dict(self.type_profiles)))
        bounds = tuple(int(v) for v in self.local_bsz_bounds)
        if len(bounds) != 2:
            raise ConfigError("local_bsz_bounds", self.local_bsz_bounds, "give [lo, hi]")
        object.__setattr__(self, "local_bsz_bounds", bounds)
        if self.init_batch_size < 1:
            raise ConfigError("init_batch_size", self.init_batch_size, "must be >= 1")
        check_batch_bounds(self.init_batch_size, self.max_batch_size, bounds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "init_batch_size": self.init_batch_size,
            "max_batch_size": self.max_batch_size,
            "local_bsz_bounds": list(self.local_bsz_bounds),
            "accumulation": self.accumulation,
            "throughput_params": (None if self.throughput_params is None
                                  else self.throughput_params.to_dict()),
            "grad_stats": (None if self.grad_stats is None
                           else {"sqr": self.grad_stats.sqr, "var": self.grad_stats.var}),
            "max_profiled_replicas": self.max_profiled_replicas,
            "batch_size": self.batch_size,
            "local_bsz": self.local_bsz,
            "accum_steps": self.accum_steps,
            "epoch": self.epoch,
            "progress": self.progress,
            "gpu_type": self.gpu_type,
            "type_profiles": {name: profile_to_dict(profile)
                              for name, profile in self.type_profiles.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobHints:
        """Parse JSON hints strictly: every field of its JSON type and within its bounds
        (see ``HINT_BOUNDS``), no unknown keys; the first bad field raises ConfigError
        naming it. Hints come from a job's own process, so nothing here is trusted."""
        if not isinstance(data, dict):
            raise ConfigError("hints", type(data).__name__, "send a JSON object")
        unknown = sorted((k for k in data if k not in HINT_FIELDS), key=str)
        if unknown:
            key = unknown[0]
            name = key if isinstance(key, str) and key and key.strip() == key else repr(key)
            raise ConfigError(name, data[key],
                              f"unknown hints field; valid fields: {', '.join(HINT_FIELDS)}")

        def field(key: str, convert: Any, default: Any = _REQUIRED) -> Any:
            raw = data.get(key, default)
            if raw is _REQUIRED:
                raise ConfigError(key, None, "this field is required")
            if raw is None:
                return None
            return convert(key, raw)

        def bounds(key: str, raw: Any) -> tuple[int, int]:
            if not isinstance(raw, list) or len(raw) != 2:
                raise ConfigError(key, raw, "give [lo, hi], two whole numbers")
            return (_whole(f"{key}[0]", raw[0], 1, MAX_HINT_BATCH_SIZE),
                    _whole(f"{key}[1]", raw[1], 1, MAX_HINT_BATCH_SIZE))

        def params(key: str, raw: Any) -> ThroughputParams:
            names = [f.name for f in fields(ThroughputParams)]
            if not isinstance(raw, dict) or sorted(raw) != sorted(names):
                raise ConfigError(key, raw, f"give an object with exactly {', '.join(names)}")
            return ThroughputParams(*(_real(f"{key}.{name}", raw[name], 0.0,
                                            MAX_THROUGHPUT_PARAM) for name in names))

        def stats(key: str, raw: Any) -> GradientStats:
            if not isinstance(raw, dict) or sorted(raw) != ["sqr", "var"]:
                raise ConfigError(key, raw, "give an object with exactly sqr and var")
            return GradientStats(_real(f"{key}.sqr", raw["sqr"], 0.0, MAX_GRADIENT_STAT),
                                 _real(f"{key}.var", raw["var"], 0.0, MAX_GRADIENT_STAT))

        def gpu_type_name(key: str, raw: Any) -> str:
            return check_gpu_type(key, raw)

        def profiles(key: str, raw: Any) -> dict[str, TypeProfile]:
            if not isinstance(raw, dict) or len(raw) > MAX_TYPE_PROFILES:
                raise ConfigError(key, raw, "give an object of GPU type -> profile, at most "
                                            f"{MAX_TYPE_PROFILES} types")
            parsed = {}
            for name, value in raw.items():
                where = f"{key}[{check_gpu_type(key, name)!r}]"
                if not isinstance(value, dict) or not set(value) <= {
                        "throughput_params", "max_profiled_replicas"}:
                    raise ConfigError(where, value, "give an object with throughput_params "
                                                    "and max_profiled_replicas")
                raw_params = value.get("throughput_params")
                parsed[name] = TypeProfile(
                    None if raw_params is None else params(f"{where}.throughput_params",
                                                           raw_params),
                    count(f"{where}.max_profiled_replicas",
                          value.get("max_profiled_replicas", 0)))
            return parsed

        def flag(key: str, raw: Any) -> bool:
            if not isinstance(raw, bool):
                raise ConfigError(key, raw, "give true or false")
            return raw

        def batch(low: int) -> Any:
            return lambda key, raw: _whole(key, raw, low, MAX_HINT_BATCH_SIZE)

        def count(key: str, raw: Any) -> int:
            return _whole(key, raw, 0, MAX_HINT_COUNT)

        def progress(key: str, raw: Any) -> float:
            return _real(key, raw, 0.0, MAX_HINT_PROGRESS)

        return cls(
            init_batch_size=field("init_batch_size", batch(1)),
            max_batch_size=field("max_batch_size", batch(1)),
            local_bsz_bounds=field("local_bsz_bounds", bounds),
            accumulation=field("accumulation", flag, True),
            throughput_params=field("throughput_params", params, None),
            grad_stats=field("grad_stats", stats, None),
            max_profiled_replicas=field("max_profiled_replicas", count, 0),
            batch_size=field("batch_size", batch(1), None),
            local_bsz=field("local_bsz", batch(1), None),
            accum_steps=field("accum_steps", count, None),
            epoch=field("epoch", count, 0),
            progress=field("progress", progress, 0.0),
            gpu_type=field("gpu_type", gpu_type_name, None),
            type_profiles=field("type_profiles", profiles, {}),
        )

    def goodput_function(self) -> GoodputFunction | None:
        """The job's goodput model, or None while it has no profile yet. Built once per
        hints object (hints never change): every reader of these hints shares it."""
        return self._goodput

    def speedup_function(self) -> SpeedupFunction | None:
        """Speedup over one replica, or None while the job has no profile yet. Built once
        per hints object, with its memo table; raises ConfigError (each call) for hints
        that allow no feasible batch size."""
        return self._speedup

    @cached_property
    def _goodput(self) -> GoodputFunction | None:
        if self.throughput_params is None:
            return None
        stats = self.grad_stats if self.grad_stats is not None else GradientStats(1.0, 0.0)
        return GoodputFunction(self.throughput_params, stats, self.init_batch_size)

    @cached_property
    def _speedup(self) -> SpeedupFunction | None:
        goodput = self.goodput_function()
        if goodput is None:
            return None
        return SpeedupFunction(goodput, self.max_batch_size, self.local_bsz_bounds,
                               self.accumulation)

    def profiles_by_type(self) -> dict[str, TypeProfile]:
        """Every type's profile; hints of older agents (no ``type_profiles``) give their one
        ``throughput_params`` as the profile of ``gpu_type`` (or the default type)."""
        if self.type_profiles:
            return dict(self.type_profiles)
        if self.throughput_params is None:
            return {}
        return {self.gpu_type or DEFAULT_GPU_TYPE:
                TypeProfile(self.throughput_params, self.max_profiled_replicas)}

    def typed_goodput(self, type_speeds: Mapping[str, float] | None = None
                      ) -> TypedGoodput | None:
        """Goodput per (GPU type, nodes, replicas), projected onto the types of
        ``type_speeds`` the job has not run on; None while it has no profile."""
        profiles = self.profiles_by_type()
        if not any(p.throughput_params is not None for p in profiles.values()):
            return None
        stats = self.grad_stats if self.grad_stats is not None else GradientStats(1.0, 0.0)
        return TypedGoodput(profiles, stats, self.init_batch_size, self.max_batch_size,
                            self.local_bsz_bounds, self.accumulation, type_speeds)


def check_gpu_type(field_name: str, value: object) -> str:
    """A GPU type name: a non-empty string of at most MAX_GPU_TYPE_CHARS characters."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_GPU_TYPE_CHARS:
        raise ConfigError(field_name, value,
                          f"a GPU type is a non-empty name of at most {MAX_GPU_TYPE_CHARS} "
                          "characters")
    return value


HINT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(JobHints))
"""The JSON fields of hints (those of :class:`JobHints`)."""
