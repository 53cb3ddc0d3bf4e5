"""Scheduling hints: what a job's agent reports to the scheduler about itself.

The agent (``pollux.torch``) writes these as JSON; the service reads them to build the
job's speedup function for the policy. Pure data, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
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
    profile_from_dict,
    profile_to_dict,
)
from pollux.resources import DEFAULT_GPU_TYPE

MAX_GPU_TYPE_CHARS = 100

_REQUIRED = object()
"""Marker of a field with no default."""


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
        """Parse JSON hints; a bad or missing field raises ConfigError naming the field."""
        if not isinstance(data, dict):
            raise ConfigError("hints", type(data).__name__, "send a JSON object")

        def field(key: str, convert: Any, default: Any = _REQUIRED) -> Any:
            raw = data.get(key, default)
            if raw is _REQUIRED:
                raise ConfigError(key, None, "this field is required")
            if raw is None:
                return None
            try:
                return convert(raw)
            except ConfigError:
                raise
            except (TypeError, ValueError, KeyError) as exc:
                raise ConfigError(key, raw, f"malformed value ({exc})") from exc

        def bounds(raw: Any) -> tuple[int, int]:
            lo, hi = raw
            return int(lo), int(hi)

        def stats(raw: Any) -> GradientStats:
            return GradientStats(float(raw["sqr"]), float(raw["var"]))

        def gpu_type_name(raw: Any) -> str:
            return check_gpu_type("gpu_type", raw)

        def profiles(raw: Any) -> dict[str, TypeProfile]:
            if not isinstance(raw, dict):
                raise TypeError("expected an object of GPU type -> profile")
            return {check_gpu_type("type_profiles", name):
                    profile_from_dict(value, f"type_profiles[{name!r}]")
                    for name, value in raw.items()}

        def flag(raw: Any) -> bool:
            if not isinstance(raw, bool):
                raise TypeError("expected true or false")
            return raw

        return cls(
            init_batch_size=field("init_batch_size", int),
            max_batch_size=field("max_batch_size", int),
            local_bsz_bounds=field("local_bsz_bounds", bounds),
            accumulation=field("accumulation", flag, True),
            throughput_params=field("throughput_params", ThroughputParams.from_dict, None),
            grad_stats=field("grad_stats", stats, None),
            max_profiled_replicas=field("max_profiled_replicas", int, 0),
            batch_size=field("batch_size", int, None),
            local_bsz=field("local_bsz", int, None),
            accum_steps=field("accum_steps", int, None),
            epoch=field("epoch", int, 0),
            progress=field("progress", float, 0.0),
            gpu_type=field("gpu_type", gpu_type_name, None),
            type_profiles=field("type_profiles", profiles, {}),
        )

    def goodput_function(self) -> GoodputFunction | None:
        """The job's goodput model, or None while it has no profile yet."""
        if self.throughput_params is None:
            return None
        stats = self.grad_stats if self.grad_stats is not None else GradientStats(1.0, 0.0)
        return GoodputFunction(self.throughput_params, stats, self.init_batch_size)

    def speedup_function(self) -> SpeedupFunction | None:
        """Speedup over one replica, or None while the job has no profile yet."""
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
