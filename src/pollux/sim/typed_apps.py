"""Applications measured on several GPU types, with the reference simulator's settings.

The Sia artifact (docs/research/data.md) gives, per application, one
placements and one scalability file per GPU type and validation files shared by every
type. Each (application, type) pair is a :class:`~pollux.sim.applications.TraceApplication`
with that type's step times and batch limits; what differs from the homogeneous Pollux
reference is gathered here as facts of the data (the simulator's other differences are
:mod:`pollux.sim.semantics`):

* the local batch bounds are the type's measured range (deepspeech2 on rtx at most 57),
  and at a measured placement the largest atomic batch is the largest measured there;
* the 1-GPU throughput of a type (largest local batch over the slowest 1-replica step)
  gives the speed ratios that project a job's model onto types it has not run on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from pollux.errors import ConfigError, WorkloadError
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.sim.applications import Application, ApplicationSpec, TraceApplication
from pollux.sim.placement import Placement, canonical_placement
from pollux.sim.traces import application_dirs, read_trace_dir

MAX_LOCAL_BSZ_OVERRIDE = MappingProxyType({("deepspeech2", "rtx"): 57})
"""Largest atomic batch where GPU memory is below the measured range."""


class TypedTraceApplication(TraceApplication):
    """One application's measurements on one GPU type."""

    def __init__(self, app_dir: Path, gpu_type: str) -> None:
        trace = read_trace_dir(app_dir, gpu_type)
        super().__init__(trace)
        self.gpu_type = gpu_type
        max_local = MAX_LOCAL_BSZ_OVERRIDE.get((trace.name, gpu_type), trace.max_local_bsz)
        self.spec = replace(self.spec, min_local_bsz=trace.min_local_bsz,
                            max_local_bsz=int(max_local))
        self._placement_max: dict[Placement, int] = {}

    def max_local_bsz_at(self, placement: Placement) -> int:
        """Largest atomic batch at a placement: the largest measured there (or, for a
        placement not measured exactly, at any larger scale), within the type's bound."""
        canon = canonical_placement(placement)
        found = self._placement_max.get(canon)
        if found is None:
            exact = self.trace.placements.get(canon)
            if exact is not None:
                found = int(exact.local_bsz.max())
            else:
                points = self.trace.scale_points
                larger = points[(points[:, 0] >= len(canon)) & (points[:, 1] >= sum(canon))]
                found = int(larger[:, 2].max()) if len(larger) else self.spec.max_local_bsz
            found = min(found, self.spec.max_local_bsz)
            self._placement_max[canon] = found
        return found

    def one_gpu_throughput(self) -> float:
        """Samples per second of one GPU: largest local batch over the slowest step among
        the 1-replica measurements (the speed the projections compare)."""
        ones = [trace for placement, trace in self.trace.placements.items()
                if sum(placement) == 1]
        if not ones:
            raise WorkloadError(self.name, None, f"placements-{self.gpu_type}.csv",
                                "no 1-replica measurements; the speed ratio needs them")
        return (max(float(t.local_bsz.max()) for t in ones)
                / max(float(t.step_time.max()) for t in ones))


@dataclass(frozen=True)
class TypedApplication:
    """One application on every GPU type of a cluster."""

    name: str
    by_type: Mapping[str, Application]

    @classmethod
    def of(cls, app: Application, gpu_type: str = DEFAULT_GPU_TYPE) -> TypedApplication:
        """An application measured on one type (a homogeneous cluster's)."""
        return cls(app.name, MappingProxyType({gpu_type: app}))

    def type_speeds(self) -> dict[str, float]:
        """Type -> 1-GPU throughput (samples/s); ratios of these project models."""
        return {t: app.one_gpu_throughput() for t, app in self.by_type.items()
                if isinstance(app, TypedTraceApplication)}

    @property
    def spec(self) -> ApplicationSpec:
        """The reference type's spec (batch sizes and epochs are the same on every type)."""
        return self.reference().spec

    def reference(self) -> Application:
        """The type-independent parts (epochs, gradient statistics) of any type."""
        return next(iter(self.by_type.values()))


def load_typed_applications(traces_dir: str | Path, gpu_types: Sequence[str]
                            ) -> dict[str, TypedApplication]:
    """Every application of a per-type trace directory, on each of ``gpu_types``.

    Raises :class:`~pollux.errors.WorkloadError` naming the missing file when an
    application has no measurements for one of the types.
    """
    root = Path(traces_dir)
    if not root.is_dir():
        raise WorkloadError(str(root), None, "--traces", "not a directory")
    found: dict[str, TypedApplication] = {}
    for child in sorted(root.iterdir()):
        if not child.is_dir():
            continue
        have = {path.name for path in child.glob("placements-*.csv")}
        if not have:
            continue
        missing = [t for t in gpu_types if f"placements-{t}.csv" not in have]
        if missing:
            raise WorkloadError(str(child), None, f"placements-{missing[0]}.csv",
                                "no measurements for this GPU type; types measured: "
                                + ", ".join(sorted(h[len("placements-"):-4] for h in have)))
        found[child.name] = TypedApplication(
            child.name, MappingProxyType({t: TypedTraceApplication(child, t) for t in gpu_types}))
    if not found:
        raise WorkloadError(str(root), None, "--traces", "no application directories with "
                            "per-type files (placements-<type>.csv); untyped traces: "
                            f"{', '.join(application_dirs(root)) if _has_untyped(root) else '-'}")
    return found


def _has_untyped(root: Path) -> bool:
    return any((child / "placements.csv").is_file() for child in root.iterdir()
               if child.is_dir())


def typed_on(app: Application | TypedApplication, gpu_types: Sequence[str]
             ) -> TypedApplication:
    """``app`` on the cluster's types: a plain application is the one type's."""
    if isinstance(app, TypedApplication):
        return app
    if len(gpu_types) != 1:
        raise ConfigError("traces", app.name, "a typed cluster needs per-type traces "
                          "(<app>/placements-<type>.csv), e.g. the Sia artifact's "
                          "sia-simulator/traces (docs/research/data.md)")
    return TypedApplication.of(app, gpu_types[0])
