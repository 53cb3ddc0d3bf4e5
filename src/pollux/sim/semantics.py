"""The reference semantics: where the Pollux and the Sia artifacts' simulators differ.

One simulator reproduces both published artifacts; what their reference simulators do
differently is a named option here, and the trace set picks the preset
(:data:`POLLUX_ARTIFACT` for the Pollux artifact's traces and the built-in catalog,
:data:`SIA_ARTIFACT` for per-type traces). Command-line options override single fields
(``--restart-delay`` on a typed cluster replaces the per-application delays).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from pollux.errors import ConfigError


class SchedulerModel(str, Enum):
    """What the scheduler sees of an adaptive job (:attr:`ReferenceSemantics.
    scheduler_model`)."""

    HINTS = "hints"
    """The agent's report: its fitted model and measured gradient statistics; growth by
    the snapshot's exploration rule (Pollux)."""
    TYPED_GOODPUT = "typed_goodput"
    """Its goodput per GPU type from per-type fits and the true gradient statistics, with
    per-type growth caps and remaining time (Sia)."""


@dataclass(frozen=True)
class ReferenceSemantics:
    """What the reference simulator of an artifact does (field docs say which)."""

    name: str
    restart_delays_s: Mapping[str, float] | None = None
    """Seconds of checkpoint-restore per application on every placement change (the first
    start included), the default for others ``default_restart_delay_s``; None: the
    cluster's one ``restart_delay_s`` for every job (Pollux)."""
    default_restart_delay_s: float = 30.0
    calibration_slowdown: Mapping[str, float] = field(default_factory=dict)
    """A job's progress rate is divided by its application's slowdown (Sia: real runs
    were slower than the traces); none by default."""
    charge_whole_rounds: bool = False
    """GPU-hours per job count every round a job held GPUs in full (Sia); False: the
    seconds held while training or restoring (Pollux)."""
    restart_on_node_change: bool = True
    """A job restarts when its set of nodes changes (Pollux); False: only when its shape
    (replicas per node) or GPU type changes, so the same shape on other nodes of the same
    type is free (Sia)."""
    scheduler_model: SchedulerModel = SchedulerModel.HINTS
    """What the scheduler sees of an adaptive job (:class:`SchedulerModel`; its value
    names it too)."""
    placement_batch_limits: bool = False
    """The largest atomic batch at a placement is the largest measured there (Sia)."""

    def __post_init__(self) -> None:
        # plain dict copies: picklable (runs go to worker processes), and nobody else's
        for name in ("restart_delays_s", "calibration_slowdown"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, dict(value))
        try:
            object.__setattr__(self, "scheduler_model", SchedulerModel(self.scheduler_model))
        except ValueError:
            raise ConfigError("scheduler_model", self.scheduler_model,
                              f"choose from: {', '.join(m.value for m in SchedulerModel)}"
                              ) from None

    def restart_delay_s(self, application: str, cluster_delay_s: float) -> float:
        """The restart delay of a job of ``application``."""
        if self.restart_delays_s is None:
            return cluster_delay_s
        return self.restart_delays_s.get(application, self.default_restart_delay_s)

    def calibration(self, application: str) -> float:
        """Factor on the simulated progress rate (1 / slowdown)."""
        return 1.0 / self.calibration_slowdown.get(application, 1.0)


POLLUX_ARTIFACT = ReferenceSemantics("pollux-artifact")
"""The Pollux artifact's reference simulator (OSDI'21)."""
SIA_ARTIFACT = ReferenceSemantics(
    "sia-artifact",
    restart_delays_s=MappingProxyType({
        "cifar10": 50.0, "deepspeech2": 25.0, "bert": 120.0, "yolov3": 80.0,
        "imagenet": 250.0, "ncf": 15.0}),
    calibration_slowdown=MappingProxyType({
        "cifar10": 1.8, "ncf": 1.5, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2,
        "deepspeech2": 1.2}),
    charge_whole_rounds=True, restart_on_node_change=False,
    scheduler_model=SchedulerModel.TYPED_GOODPUT, placement_batch_limits=True)
"""The Sia artifact's reference simulator (its data: docs/research/data.md)."""
