"""How the server wires the Ray backend in (no Ray needed): the CLI flags become backend
options, Ray flags without ``--backend ray`` are refused, and a backend with a
``request_cluster_size`` that refuses does not stop scheduling."""

from __future__ import annotations

import argparse

import pytest

from pollux.backends.fake import FakeBackend
from pollux.cli.server import add_server_arguments, config_from_args
from pollux.errors import ConfigError
from pollux.service.config import AutoscalingConfig, PolicyConfig, ServerConfig
from pollux.service.server import build_service
from tests.service.e2e_helpers import EQUAL_SHARE
from tests.service.service_builders import make_nodes, make_spec


def parse(*argv: str) -> ServerConfig:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_ray_flags_become_backend_options(tmp_path):
    config = parse("--data-dir", str(tmp_path), "--backend", "ray", "--ray-address",
                   "10.0.0.1:6379", "--ray-slot-resource", "GPU", "--ray-autoscale",
                   "--advertise-address", "10.0.0.2")
    assert config.backend.options() == {"address": "10.0.0.1:6379", "slot_resource": "GPU",
                                        "autoscale": True, "log_budget_bytes": 64 << 20}
    assert config.http.advertise_host == "10.0.0.2"
    assert parse("--data-dir", str(tmp_path), "--backend", "ray", "--log-budget",
                 "1MiB").backend.options() == {
        "address": None, "slot_resource": "auto", "autoscale": False,
        "log_budget_bytes": 1 << 20}
    assert parse("--data-dir", str(tmp_path)).backend.options() == {
        "num_nodes": 1, "slots_per_node": None, "device": "auto", "virtual_nodes": None,
        "log_budget_bytes": 64 << 20}
    with pytest.raises(ConfigError, match="--ray-address needs --backend ray"):
        parse("--data-dir", str(tmp_path), "--ray-address", "auto")
    typed = parse("--data-dir", str(tmp_path), "--backend", "ray", "--ray-gpu-type-prefix",
                  "gpu_kind:")
    assert typed.backend.options()["gpu_type_prefix"] == "gpu_kind:"


def test_typed_virtual_nodes_are_a_local_backend_flag(tmp_path):
    config = parse("--data-dir", str(tmp_path), "--virtual-nodes", "aws:2x2,rtx:1x4")
    assert config.backend.local.virtual_nodes == "aws:2x2,rtx:1x4"
    assert config.backend.name == "local"
    with pytest.raises(ConfigError, match="need --backend local") as info:
        parse("--data-dir", str(tmp_path), "--backend", "ray", "--virtual-nodes", "a:1x1")
    assert info.value.field == "virtual_nodes"
    with pytest.raises(ConfigError, match="type:NODESxGPUS") as info:
        parse("--data-dir", str(tmp_path), "--virtual-nodes", "aws:2")
    assert info.value.field == "virtual_nodes"


class RefusingBackend(FakeBackend):
    def request_cluster_size(self, num_nodes: int | None) -> None:
        raise RuntimeError("no autoscaler")


def test_a_backend_refusing_the_size_does_not_stop_scheduling(tmp_path, caplog):
    backend = RefusingBackend(make_nodes())
    config = ServerConfig(data_dir=tmp_path, policy=PolicyConfig(EQUAL_SHARE),
                          autoscaling=AutoscalingConfig("pollux"))
    service = build_service(config, None, backend)
    try:
        job = service.submit(make_spec("a", working_dir=str(tmp_path)).to_dict())
        service.allocator.tick(1.0)
        assert "cannot pass the desired cluster size on" in caplog.text
        assert service.store.get_job(job["id"]).allocation  # launched all the same
    finally:
        service.store.close()
