"""How the server wires the Ray backend in (no Ray needed): the CLI flags become backend
options, Ray flags without ``--backend ray`` are refused, and a backend with a
``request_cluster_size`` hook gets the policy's desired cluster size every round."""

from __future__ import annotations

import argparse

import pytest

from pollux.backends.fake import FakeBackend
from pollux.cli.server import add_server_arguments, config_from_args
from pollux.errors import ConfigError
from pollux.policies.base import PolicyDecision
from pollux.service.server import ClusterSizeRelay, ServerConfig, build_service
from tests.service.service_builders import make_nodes, make_spec
from tests.service.service_test_policies import EqualSharePolicy


def parse(*argv: str) -> ServerConfig:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_ray_flags_become_backend_options(tmp_path):
    config = parse("--data-dir", str(tmp_path), "--backend", "ray", "--ray-address",
                   "10.0.0.1:6379", "--ray-slot-resource", "GPU", "--ray-autoscale",
                   "--advertise-address", "10.0.0.2")
    assert dict(config.backend_options) == {"address": "10.0.0.1:6379",
                                            "slot_resource": "GPU", "autoscale": True}
    assert config.advertise_host == "10.0.0.2"
    assert dict(parse("--data-dir", str(tmp_path), "--backend", "ray").backend_options) == {
        "address": None, "slot_resource": "auto", "autoscale": False}
    assert dict(parse("--data-dir", str(tmp_path)).backend_options) == {}
    with pytest.raises(ConfigError, match="--ray-address needs --backend ray"):
        parse("--data-dir", str(tmp_path), "--ray-address", "auto")


class SizedBackend(FakeBackend):
    def __init__(self) -> None:
        super().__init__(make_nodes())
        self.requested: list[int | None] = []

    def request_cluster_size(self, num_nodes: int | None) -> None:
        self.requested.append(num_nodes)


class WantsThreeNodes(EqualSharePolicy):
    def optimize(self, jobs, nodes, previous_allocations) -> PolicyDecision:
        decision = super().optimize(jobs, nodes, previous_allocations)
        return PolicyDecision(decision.allocations, desired_num_nodes=3)


def test_the_desired_cluster_size_reaches_the_backend(tmp_path):
    backend = SizedBackend()
    config = ServerConfig(data_dir=tmp_path, policy=f"{__name__}:WantsThreeNodes")
    service = build_service(config, None, backend)
    try:
        assert isinstance(service.allocator.policy, ClusterSizeRelay)
        service.submit(make_spec("a", working_dir=str(tmp_path)).to_dict())
        service.allocator.tick()
        assert backend.requested == [3]
    finally:
        service.store.close()


def test_a_failing_hook_does_not_stop_scheduling(caplog):
    def refuse(num_nodes: int | None) -> None:
        raise RuntimeError("no autoscaler")

    relay = ClusterSizeRelay(WantsThreeNodes(), refuse)
    decision = relay.optimize([], make_nodes(), {})
    assert decision.desired_num_nodes == 3
    assert "cannot pass the desired cluster size on" in caplog.text


def test_backends_without_the_hook_keep_the_bare_policy(tmp_path):
    service = build_service(ServerConfig(data_dir=tmp_path, policy="fifo"), None,
                            FakeBackend(make_nodes()))
    try:
        policy = service.allocator.policy
        while hasattr(policy, "policy"):          # wrappers that only observe the call
            assert not isinstance(policy, ClusterSizeRelay)
            policy = policy.policy
        assert policy.name == "fifo"
    finally:
        service.store.close()
