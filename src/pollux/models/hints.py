"""Scheduling hints: what a job's agent reports to the scheduler about itself.

The agent (``pollux.torch``) writes these as JSON; the service reads them to build the
job's speedup function for the policy. Pure data, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pollux.errors import ConfigError
from pollux.models.efficiency import GradientStats
from pollux.models.goodput import GoodputFunction, check_batch_bounds
from pollux.models.speedup import SpeedupFunction
from pollux.models.throughput import ThroughputParams


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

    def __post_init__(self) -> None:
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
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobHints:
        """Parse JSON hints; bad or missing fields raise ConfigError naming the field."""
        if not isinstance(data, dict):
            raise ConfigError("hints", type(data).__name__, "send a JSON object")
        for key in ("init_batch_size", "max_batch_size", "local_bsz_bounds"):
            if key not in data:
                raise ConfigError(key, None, "this field is required")
        try:
            params = data.get("throughput_params")
            stats = data.get("grad_stats")
            return cls(
                init_batch_size=int(data["init_batch_size"]),
                max_batch_size=int(data["max_batch_size"]),
                local_bsz_bounds=tuple(data["local_bsz_bounds"]),
                accumulation=bool(data.get("accumulation", True)),
                throughput_params=None if params is None else ThroughputParams.from_dict(params),
                grad_stats=None if stats is None else GradientStats(float(stats["sqr"]),
                                                                    float(stats["var"])),
                max_profiled_replicas=int(data.get("max_profiled_replicas", 0)),
                batch_size=None if data.get("batch_size") is None else int(data["batch_size"]),
                local_bsz=None if data.get("local_bsz") is None else int(data["local_bsz"]),
                accum_steps=(None if data.get("accum_steps") is None
                             else int(data["accum_steps"])),
                epoch=int(data.get("epoch", 0)),
                progress=float(data.get("progress", 0.0)),
            )
        except (TypeError, KeyError) as exc:
            raise ConfigError("hints", data, f"malformed field ({exc})") from exc

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
