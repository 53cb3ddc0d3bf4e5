from __future__ import annotations

import json
from importlib import resources

import pytest

from pollux.errors import ConfigError
from pollux.sim.applications import load_trace_applications
from pollux.sim.catalog import load_builtin_applications, read_catalog
from pollux.sim.catalog_fit import build_catalog
from tests.sim.fakes import ARTIFACT, needs_artifact


def shipped() -> dict[str, object]:
    text = resources.files("pollux").joinpath("data").joinpath("catalog.json").read_text()
    data: dict[str, object] = json.loads(text)
    return data


def test_builtin_models_behave_like_applications() -> None:
    apps = load_builtin_applications()
    cifar = apps["cifar10"]
    one, _ = cifar.step_sync_time((1,), 128)
    four, sync = cifar.step_sync_time((4,), 128)
    assert 0 < one < four and 0 < sync < four  # synchronization costs time
    sqr, var = cifar.grad_stats(1024, 90)
    assert sqr == 1.0 and var > cifar.grad_stats(1024, 0)[1]  # noise grows in training
    assert cifar.epoch_progress(2) == pytest.approx(2 * cifar.epoch_progress(1))
    assert cifar.iterations(4096, 10) < cifar.iterations(128, 10)


def test_malformed_catalog_names_the_entry() -> None:
    with pytest.raises(ConfigError, match="applications"):
        read_catalog({"apps": {}})
    with pytest.raises(ConfigError, match=r"catalog\['x'\]"):
        read_catalog({"applications": {"x": {"init_batch_size": 1}}})


@needs_artifact
def test_catalog_regenerates_from_the_traces_and_matches_their_specs() -> None:
    rebuilt = build_catalog(ARTIFACT / "traces")["applications"]
    stored = shipped()["applications"]
    assert isinstance(stored, dict) and set(rebuilt) == set(stored)
    for name, entry in rebuilt.items():
        assert _close(json.loads(json.dumps(entry)), stored[name]), name
    traces = load_trace_applications(ARTIFACT / "traces")
    for name, app in load_builtin_applications().items():
        assert app.spec == traces[name].spec


def _close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return bool(a == pytest.approx(b, rel=1e-6, abs=1e-12))
    return a == b
