from __future__ import annotations

import numpy as np
import pytest

from pollux.sim.applications import TraceApplication, load_trace_applications
from pollux.sim.placement import canonical_placement, packed_placement, placement_of
from pollux.sim.traces import read_trace_dir
from tests.sim.fakes import ARTIFACT, needs_artifact


def test_placement_helpers() -> None:
    assert placement_of(("a", "a", "b", "a")) == (3, 1)
    assert canonical_placement((3, 0, 1)) == (1, 3)
    assert canonical_placement((2, 1, 2)) == (1, 2, 2)
    assert packed_placement(6, 4) == (4, 2)
    assert packed_placement(6, 4, num_nodes=3) == (4, 1, 1)
    assert packed_placement(9, 2, num_nodes=2) == (5, 4)
    assert packed_placement(0, 4) == ()


@pytest.fixture(scope="module")
def trace_apps() -> dict[str, TraceApplication]:
    if not (ARTIFACT / "traces").is_dir():
        pytest.skip(f"the Pollux artifact data is not at {ARTIFACT}")
    return load_trace_applications(ARTIFACT / "traces")  # type: ignore[return-value]


@needs_artifact
def test_specs_follow_the_reference_simulator(trace_apps: dict[str, TraceApplication]) -> None:
    assert sorted(trace_apps) == ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
    yolo = trace_apps["yolov3"].spec
    assert (yolo.init_batch_size, yolo.max_batch_size, yolo.max_local_bsz, yolo.max_epochs) \
        == (8, 512, 8, 50)
    ncf = trace_apps["ncf"].spec
    assert (ncf.pinned_replicas, ncf.pinned_batch_size) == (1, 32768)


@needs_artifact
def test_interpolation_is_exact_at_measured_points(trace_apps: dict[str, TraceApplication]
                                                   ) -> None:
    for name, app in trace_apps.items():
        for placement, meas in app.trace.placements.items():
            for bsz, step, sync in zip(meas.local_bsz, meas.step_time, meas.sync_time):
                assert app.step_sync_time(placement, bsz) == (step, sync), (name, placement)
        # Scalability rows (6+ nodes, never an exact placement) through the Delaunay mesh;
        # a spread sample of them, as each lookup walks the mesh.
        points, values = app.trace.scale_points, app.trace.scale_values
        unique, counts = np.unique(points, axis=0, return_counts=True)
        single = {tuple(p) for p, c in zip(unique, counts) if c == 1}
        rows = [i for i, p in enumerate(points) if p[0] >= 6 and tuple(p) in single]
        assert len(rows) > 100
        for i in rows[:: len(rows) // 20]:
            (nodes, replicas, bsz), (step, sync) = points[i], values[i]
            placement = packed_placement(int(replicas), -(-int(replicas) // int(nodes)),
                                         int(nodes))
            got = app.step_sync_time(placement, bsz)
            assert got == pytest.approx((step, sync), rel=1e-9), (name, nodes, replicas, bsz)


@needs_artifact
def test_statistics_match_the_validation_files(trace_apps: dict[str, TraceApplication]
                                               ) -> None:
    app = trace_apps["cifar10"]
    lo, hi = app.trace.validation[0], app.trace.validation[1]  # 128, 256
    assert app.grad_stats(128, 5) == (lo.grad_sqr[5], lo.grad_var[5])
    sqr, var = app.grad_stats(192, 5)  # halfway between 128 and 256
    assert sqr == pytest.approx((lo.grad_sqr[5] + hi.grad_sqr[5]) / 2)
    assert var == pytest.approx((lo.grad_var[5] + hi.grad_var[5]) / 2)
    expected = min(v.progress[9] for v in app.trace.validation)
    assert app.epoch_progress(10) == expected and app.epoch_progress(0) == 0.0
    assert app.iterations(256, 3) == hi.iteration[3]


@needs_artifact
def test_unmeasured_placements_fall_back_inside_and_outside_the_mesh() -> None:
    app = TraceApplication(read_trace_dir(ARTIFACT / "traces" / "cifar10"))
    step, sync = app.step_sync_time((8,), 64)  # one 8-GPU node: outside the measured hull
    assert np.isfinite(step) and 0 <= sync < step
    step5, _ = app.step_sync_time((4, 4, 4, 4, 4), 64)  # 5 nodes: between 4 and 6
    assert np.isfinite(step5)
